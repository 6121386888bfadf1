// Facts about this process worth printing at the start of a run.
#pragma once

#include <string>

namespace kiln {

// The BLAS library this process has mapped (e.g. ".../openblas-openmp/libblas.so.3"),
// read from /proc/self/maps; BLAS decides CPU training speed ~20x either way.
std::string mapped_blas();

// Seconds since this process started, from its start time in /proc/self/stat
// (clock ticks, 0.01 s here), so it includes what runs before main: loading
// LibTorch's libraries and their static initialisers. For the start-up debug
// lines (a user's view of where start-up goes); NaN where /proc cannot tell.
double seconds_since_start();

}  // namespace kiln
