// A checkpoint's sections as bytes, for tests that compare two runs' files.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "ckpt/checkpoint_file.hpp"

namespace kiln::test {

// The state: every section but the manifest's text (which holds the
// overrides) and metrics.csv's rows so far (which hold wall-clock timings).
inline std::map<std::string, std::string> state_sections(const std::filesystem::path& file) {
  const CheckpointFile f = CheckpointFile::read(file);
  std::map<std::string, std::string> out;
  for (const auto& name : f.names())
    if (name != "manifest" && name != "logger/csv" && name != "metrics/csv") out[name] = std::string(f.section(name));
  return out;
}

// The sections whose names start with `prefix` ("param/", "optim/"), by name.
inline std::map<std::string, std::string> sections(const std::filesystem::path& file, const std::string& prefix) {
  const CheckpointFile f = CheckpointFile::read(file);
  std::map<std::string, std::string> out;
  for (const auto& name : f.names())
    if (name.rfind(prefix, 0) == 0) out[name] = std::string(f.section(name));
  return out;
}

}  // namespace kiln::test
