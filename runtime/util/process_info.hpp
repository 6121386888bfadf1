// Facts about this process worth printing at the start of a run.
#pragma once

#include <string>

namespace kiln {

// The BLAS library this process has mapped (e.g. ".../openblas-openmp/libblas.so.3"),
// read from /proc/self/maps; BLAS decides CPU training speed ~20x either way.
std::string mapped_blas();

}  // namespace kiln
