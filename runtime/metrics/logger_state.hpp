// Reading back a logger's checkpointed state.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kiln {

// The file length an appending logger recorded ("1234"). A checkpoint's
// contents are checksummed, so a malformed value is kiln's own bug.
inline int64_t parse_length_state(const std::string& state, const char* logger) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(state, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != state.size() || v < 0)
    throw std::runtime_error(std::string("checkpoint holds a malformed state for the ") + logger + " logger: '" + state +
                             "'");
  return v;
}

}  // namespace kiln
