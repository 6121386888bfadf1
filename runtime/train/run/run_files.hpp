// Plugins' own files in the run directory (kiln_host.run_file_write):
// <run.dir>/<plugin id>/<name>, written by rank 0 only. Until the run
// directory is opened (after the start-up agreement, so a refused run leaves
// the disk as it was) they are held in memory; afterwards each is written at
// once. Every write replaces its file atomically (util/durable_file.hpp).
// No LibTorch here.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>

namespace kiln {

class RunFiles {
 public:
  // "" or why `name` is refused (a path, a name that is not one file's).
  std::string save(const std::string& plugin_id, const std::string& name, std::string bytes);
  // Writes what was held when `writes` (rank 0); later saves are written
  // at once, or dropped on the other ranks.
  void open(const std::filesystem::path& run_dir, bool writes);

 private:
  void write(const std::string& plugin_id, const std::string& name, const std::string& bytes) const;

  bool open_ = false, writes_ = false;
  std::filesystem::path dir_;
  std::map<std::pair<std::string, std::string>, std::string> held_;
};

// "" or why `name` cannot be a run file's name.
std::string run_file_name_problem(const std::string& name);

}  // namespace kiln
