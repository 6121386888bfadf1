#include "train/run/run_files.hpp"

#include <cctype>

#include "util/durable_file.hpp"

namespace kiln {

std::string run_file_name_problem(const std::string& name) {
  if (name.empty() || name.size() > 128) return "a run file's name has 1 to 128 characters";
  if (name[0] == '.') return "a run file's name does not begin with '.'";
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return "a run file's name has only letters, digits, '.', '_' and '-'";
  return "";
}

std::string RunFiles::save(const std::string& plugin_id, const std::string& name, std::string bytes) {
  if (std::string problem = run_file_name_problem(name); !problem.empty()) return problem;
  if (!open_)
    held_[{plugin_id, name}] = std::move(bytes);
  else if (writes_)
    write(plugin_id, name, bytes);
  return "";
}

void RunFiles::open(const std::filesystem::path& run_dir, bool writes) {
  dir_ = run_dir;
  open_ = true;
  writes_ = writes;
  if (writes_)
    for (const auto& [key, bytes] : held_) write(key.first, key.second, bytes);
  held_.clear();
}

void RunFiles::write(const std::string& plugin_id, const std::string& name, const std::string& bytes) const {
  const std::filesystem::path folder = dir_ / plugin_id;
  std::filesystem::create_directories(folder);
  write_file_durably(folder / name, bytes);
}

}  // namespace kiln
