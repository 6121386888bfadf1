// The checkpoint file format and its crash-safe commit. No LibTorch here:
// a checkpoint is named sections of bytes; what they mean is checkpoint.cpp's
// business.
//
// Layout (all integers little-endian):
//   "KILNCKPT"                      8 bytes magic
//   u32 format version              kCheckpointFormat
//   sections, each:                 u32 name length, name, u64 data length, data
//   u32 0xFFFFFFFF                  end of sections
//   u64 section count
//   u64 XXH64 (seed 0) of every byte before this field
//   "KILNEND\0"                     8 bytes
// A file is valid only if both magics, the version, the count and the
// checksum agree. Loading never executes anything from the file.
//
// Commit protocol: write to "<dir>/.<name>.tmp-<pid>" in the final
// directory, flush and fsync it, rename it over "<dir>/<name>", fsync the
// directory. On any error the temporary is removed; temporaries left by a
// crash are swept at the next start (sweep_temporaries).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/errors.hpp"

namespace kiln {

inline constexpr uint32_t kCheckpointFormat = 1;

// Thrown for a checkpoint that cannot be used; what() is one line naming the
// file and the problem ("... is truncated", "... checksum mismatch"). It is
// bad input: `kiln` exits 2.
class CheckpointError : public InputError {
 public:
  using InputError::InputError;
};

// Streams sections into a temporary file and commits it atomically.
class CheckpointWriter {
 public:
  // Creates "<final's dir>/.<final's name>.tmp-<pid>". Throws std::runtime_error
  // (with the path and strerror) if it cannot.
  explicit CheckpointWriter(std::filesystem::path final_path);
  // Removes the temporary unless commit() succeeded. Never throws.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends one section. Names are unique; data may be large (written
  // through, not copied whole into memory).
  void add(std::string_view name, const void* data, size_t size);
  void add(std::string_view name, std::string_view data) { add(name, data.data(), data.size()); }
  // One section made of `head` followed by `size` bytes at `data`, without
  // first joining them in memory (a tensor's header and its storage).
  void add(std::string_view name, std::string_view head, const void* data, size_t size);

  // Trailer, fsync, rename, directory fsync. After it returns the checkpoint
  // is durable under its final name. Throws std::runtime_error on failure
  // (the temporary is removed, the previous file of that name is untouched).
  void commit();

  const std::filesystem::path& temporary_path() const { return temporary_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::filesystem::path final_, temporary_;
};

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

// Removes "<dir>/.*.tmp-<pid>" files whose pid is not a live process (or is
// this process's own leftover). Returns the paths removed.
std::vector<std::filesystem::path> sweep_temporaries(const std::filesystem::path& dir);

// Test hook: when the environment variable KILN_FAULT_INJECT names `point`
// (e.g. KILN_FAULT_INJECT=ckpt:before_rename), the process kills itself with
// SIGKILL there. Points: ckpt:after_open, ckpt:mid_write, ckpt:before_fsync,
// ckpt:before_rename, ckpt:after_rename, ckpt:before_dir_fsync.
void fault_point(const char* point);

// Text from a checkpoint as it may appear in a one-line message: a corrupt
// file can hold any bytes, including newlines, so anything unprintable is
// escaped and text longer than `shown` characters is cut ("...").
std::string printable(std::string_view text, size_t shown = 80);

}  // namespace kiln
