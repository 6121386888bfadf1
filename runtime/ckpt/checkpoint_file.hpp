// Reading and verifying a checkpoint file (the layout: checkpoint_format;
// writing one: checkpoint_writer). No LibTorch here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint_format.hpp"

namespace kiln {

// A validated checkpoint, read whole into memory.
class CheckpointFile {
 public:
  // Reads and validates; throws CheckpointError naming the file and problem.
  static CheckpointFile read(const std::filesystem::path& path);
  // Validates only the header, trailer and checksum (streaming, no section
  // copies kept); returns the problem, or nullopt when valid.
  static std::optional<std::string> check(const std::filesystem::path& path);

  bool has(std::string_view name) const;
  // The section's bytes; throws CheckpointError naming file and section when absent.
  std::string_view section(std::string_view name) const;
  // Section names in file order.
  std::vector<std::string> names() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::string bytes_;
  std::vector<std::pair<std::string, std::pair<size_t, size_t>>> index_;  // name -> (offset, size)
};

// What listing a checkpoint directory needs of one file, read without its
// tensor data: the header (magic, format), the "meta" section (the first one
// kiln writes) and the trailer's end-of-sections marker and end magic, so a
// truncated or foreign file is refused. The checksum is NOT verified: a
// listing (`--resume last|best`, retention at start-up) must not read every
// byte of every checkpoint in the directory. The one file then used is read
// with CheckpointFile::check/read, checksum included.
struct CheckpointHead {
  std::filesystem::path path;
  uint64_t size = 0;  // bytes
  std::string meta;   // the "meta" section's bytes
};

// Throws CheckpointError naming the file and the problem.
CheckpointHead read_checkpoint_head(const std::filesystem::path& path);

}  // namespace kiln
