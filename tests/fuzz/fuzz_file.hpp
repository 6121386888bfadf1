// The parsers under test read files: each input is written to a file in
// /dev/shm (memory, not disk) that lives for one run of the target.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace kiln_fuzz {

inline std::string input_file(const char* suffix, const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/kiln-fuzz-" + std::to_string(::getpid()) + suffix;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  return path;
}

}  // namespace kiln_fuzz
