// Facts about this process worth printing at the start of a run.
#pragma once

#include <cstdint>
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

// This process's peak resident memory so far (VmHWM in /proc/self/status:
// its anonymous pages and the file pages it mapped and read), in MB; -1
// where /proc cannot tell. For the start-up debug lines: what the model
// cost each rank before training (sharded parameters keep it to a part).
int64_t peak_resident_mb();

}  // namespace kiln
