// A log file that grows by appending (metrics.jsonl, TensorBoard's event
// file), built on the durable-file helpers (util/durable_file). Rewriting a
// growing file whole at every row, as metrics.csv does, costs O(rows²); these
// files are appended to instead, and made durable (fsync) at the points where
// it matters: an epoch's end, a checkpoint, the end of the run. A crash can
// lose only rows after the last such point, and never a row a checkpoint
// counts: a resumed run cuts the file back to the length its checkpoint
// recorded (dropping rows logged after it, and any torn last row), so every
// row appears exactly once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

#include "util/durable_file.hpp"

namespace kiln {

class AppendFile {
 public:
  // A fresh file (`keep_bytes` < 0: an existing one is emptied), or, for a
  // resumed run, the existing file cut back to its first `keep_bytes` bytes.
  // A file shorter than `keep_bytes` (or missing) is kept as it is:
  // continued_whole() then says false. Errors: std::runtime_error,
  // "cannot write <file>: <step>: <errno text>".
  AppendFile(std::filesystem::path file, int64_t keep_bytes);
  AppendFile(AppendFile&&) = default;
  AppendFile& operator=(AppendFile&&) = default;

  // Appends all of `bytes` (no fsync). On a failure the file is cut back to
  // where it was, so no torn row stays behind.
  void append(std::string_view bytes);
  // fsync, if anything was appended since the last one.
  void sync();
  // The file's length: what a checkpoint records.
  int64_t size() const { return size_; }
  bool continued_whole() const { return continued_whole_; }
  const std::filesystem::path& file() const { return file_; }

 private:
  [[noreturn]] void fail(const char* step, int err) const;
  std::filesystem::path file_;
  Fd fd_;
  int64_t size_ = 0;
  bool dirty_ = false;
  bool continued_whole_ = true;
};

}  // namespace kiln
