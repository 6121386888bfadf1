// A checkpoint's state as bytes per section, for tests that compare two
// runs' files: every section but the manifest's text (which holds the
// overrides) and metrics.csv's rows so far (which hold wall-clock timings).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "ckpt/checkpoint_file.hpp"

namespace kiln::test {

inline std::map<std::string, std::string> state_sections(const std::filesystem::path& file) {
  const CheckpointFile f = CheckpointFile::read(file);
  std::map<std::string, std::string> out;
  for (const auto& name : f.names())
    if (name != "manifest" && name != "metrics/csv") out[name] = std::string(f.section(name));
  return out;
}

}  // namespace kiln::test
