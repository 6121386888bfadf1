// The loggers `[logging] loggers` may name, in the order the manifest
// reference lists them. Header-only: the manifest schema needs the names,
// not the loggers (and the manifest fuzzer links no more than that).
#pragma once

#include <string>
#include <vector>

namespace kiln {

inline const std::vector<std::string>& logger_names() {
  static const std::vector<std::string> names{"csv", "jsonl", "tensorboard"};
  return names;
}

}  // namespace kiln
