// The per-sample seeds of kiln_batch_request (ABI 1.4): a pure function of
// (run.seed, split, epoch, sample index), so a data module's random
// transforms do not depend on which worker, rank or run (a resumed one)
// builds the sample. Chained splitmix64 finalisers; docs/data.md gives the
// same function in Python.
#pragma once

#include <cstdint>

namespace kiln {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The part shared by an epoch's samples of one split.
inline uint64_t sample_seed_key(uint64_t run_seed, int32_t split, int64_t epoch) {
  uint64_t h = splitmix64(run_seed);
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(split)));
  return splitmix64(h ^ static_cast<uint64_t>(epoch));
}

inline uint64_t sample_seed(uint64_t key, int64_t index) { return splitmix64(key ^ static_cast<uint64_t>(index)); }

}  // namespace kiln
