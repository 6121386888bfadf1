// Writing a checkpoint file (checkpoint_format) with the crash-safe commit.
// No LibTorch here.
//
// Commit protocol: write to "<dir>/.<name>.tmp-<pid>" in the final
// directory, flush and fsync it, rename it over "<dir>/<name>", fsync the
// directory. On any error the temporary is removed; temporaries left by a
// crash are swept at the next start (sweep_temporaries, checkpoint_dir).
//
// Two ways in: CheckpointWriter streams sections from the caller's memory
// while it is written; commit_checkpoint writes a CheckpointSnapshot that
// owns its sections, so whoever built it may go on changing the live state
// meanwhile (the interface an asynchronous writer calls from its thread).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/checkpoint_format.hpp"

namespace kiln {

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

// One section of a snapshot: `head`, then `size` bytes at `data`. `owner`
// keeps those bytes alive as long as the snapshot: it may be the bytes
// themselves, or anything holding them (a CPU copy of a tensor, captured by
// a deleter).
struct SnapshotSection {
  std::string name;
  std::string head;
  std::shared_ptr<const void> owner;
  const void* data = nullptr;
  size_t size = 0;
};

// Host memory for snapshots' sections, kept from one asynchronous commit to
// the next: a fresh copy of a large state spends about half its time in
// page faults (bench/README.md). A buffer is handed out again only once no
// snapshot holds it (the write that used it has ended). Taken from one
// thread; the snapshots holding buffers may end on another.
class SnapshotBuffers {
 public:
  // `bytes` of 64-byte-aligned memory for the section `name`: the buffer
  // this pool gave that name before, when its size is the same and nothing
  // else holds it; else a new one (which replaces it in the pool).
  std::shared_ptr<void> take(const std::string& name, size_t bytes);

 private:
  struct Buffer {
    size_t bytes = 0;
    std::shared_ptr<void> memory;
  };
  std::map<std::string, Buffer, std::less<>> buffers_;
};

// Everything one checkpoint file holds, built before the write starts and
// owned by it. Sections are written in the order added; names are checked
// (unique, not empty, bounded) when it is written, as CheckpointWriter::add
// checks them.
class CheckpointSnapshot {
 public:
  // `buffers`: where tensor sections take their memory (nullptr: new memory).
  explicit CheckpointSnapshot(SnapshotBuffers* buffers = nullptr) : buffers_(buffers) {}
  SnapshotBuffers* buffers() const { return buffers_; }

  // A section of bytes the snapshot takes.
  void add(std::string name, std::string bytes);
  // `head` followed by `size` bytes at `data`, kept alive by `owner`.
  void add(std::string name, std::string head, std::shared_ptr<const void> owner, const void* data, size_t size);

  // Something to wait for before the sections' bytes may be read: a copy
  // from a device still in flight (pinned memory, non-blocking). The writer
  // calls every one, in order, before it writes.
  void add_wait(std::function<void()> wait) { waits_.push_back(std::move(wait)); }
  void wait_until_ready() const {
    for (const auto& wait : waits_) wait();
  }

  const std::vector<SnapshotSection>& sections() const { return sections_; }
  // The bytes the sections hold: what the snapshot costs in host memory.
  size_t bytes() const;

 private:
  SnapshotBuffers* buffers_ = nullptr;
  std::vector<SnapshotSection> sections_;
  std::vector<std::function<void()>> waits_;
};

// Commits `snapshot` under `final_path`: the same file, the same errors and
// the same fault points as a CheckpointWriter given its sections in order,
// then commit().
void commit_checkpoint(const std::filesystem::path& final_path, const CheckpointSnapshot& snapshot);

// Test hook: when the environment variable KILN_FAULT_INJECT names `point`
// (e.g. KILN_FAULT_INJECT=ckpt:before_rename), the process kills itself with
// SIGKILL there. Points: ckpt:after_open, ckpt:mid_write, ckpt:before_fsync,
// ckpt:before_rename, ckpt:after_rename, ckpt:before_dir_fsync.
void fault_point(const char* point);

// Test hook for a failing disk: KILN_FAULT_INJECT=ckpt:enospc makes every
// checkpoint's write fail with ENOSPC, as a full disk does;
// ckpt:enospc@<file name> only the write of that file (e.g.
// ckpt:enospc@epoch=0-step=6.ckpt), so that earlier commits succeed. The
// failure takes the real error path (temporary removed, one line).
bool injected_enospc(const std::filesystem::path& final_path);

}  // namespace kiln
