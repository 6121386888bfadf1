#include "ckpt/checkpoint_writer.hpp"

#include "util/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

namespace kiln {

using namespace ckpt_format;

namespace {

// Writes go through a buffer this large; anything at least this large is
// written straight from the caller's memory.
constexpr size_t kWriteBuffer = 1 << 20;

}  // namespace

// ============================================================================
// Fault injection
// ============================================================================

namespace {

// Whether KILN_FAULT_INJECT's comma-separated list holds `entry`. Read on
// every call: no global state, and commits are rare enough that a getenv
// per point costs nothing measurable.
bool fault_injected(std::string_view entry) {
  const char* spec = std::getenv("KILN_FAULT_INJECT");
  if (spec == nullptr || *spec == '\0') return false;
  std::string_view rest(spec);
  while (true) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == entry) return true;
    if (comma == std::string_view::npos) return false;
    rest.remove_prefix(comma + 1);
  }
}

}  // namespace

void fault_point(const char* point) {
  // SIGKILL, not abort() or exit(): nothing may run after this point (no
  // destructors, no atexit handlers, no buffered output), exactly as for a
  // power cut or the OOM killer.
  if (point != nullptr && fault_injected(point)) std::raise(SIGKILL);
}

bool injected_enospc(const std::filesystem::path& final_path) {
  return fault_injected("ckpt:enospc") || fault_injected("ckpt:enospc@" + final_path.filename().string());
}

// ============================================================================
// Writer
// ============================================================================

struct CheckpointWriter::Impl {
  std::filesystem::path final_path;
  std::filesystem::path temporary;
  Fd fd;
  // True while `temporary` names a file this writer created and still owns:
  // the only file the cleanup paths may ever unlink.
  bool owns_temporary = false;
  bool committed = false;
  bool failed = false;
  Checksum hash;
  std::unique_ptr<char[]> buffer{new char[kWriteBuffer]};
  size_t buffered = 0;
  uint64_t section_count = 0;
  uint64_t payload_bytes = 0;
  bool mid_write_reached = false;
  bool enospc = false;  // injected_enospc: every write fails as on a full disk
  std::set<std::string, std::less<>> names;

  ~Impl() { discard(); }

  // Closes and unlinks the temporary if this writer still owns it. Never
  // throws: used by the destructor and by every error path.
  void discard() noexcept {
    fd.reset();
    if (owns_temporary) {
      ::unlink(temporary.c_str());
      owns_temporary = false;
    }
  }

  // Removes the temporary, then throws the one-line error every failure
  // reports: "cannot write checkpoint <final>: <step>: <strerror>".
  [[noreturn]] void fail(const std::string& step, int err) {
    failed = true;
    discard();
    throw std::runtime_error("cannot write checkpoint " + final_path.string() + ": " + step + ": " +
                             error_text(err));
  }

  void flush_buffer() {
    if (buffered == 0) return;
    const int err = enospc ? ENOSPC : write_all(fd.get(), buffer.get(), buffered);
    buffered = 0;
    if (err != 0) fail("write " + temporary.string(), err);
  }

  // Appends bytes to the file and to the checksum. A large block is hashed
  // on a second thread while this one writes it: the checksum pass was most
  // of the commit's cost over a raw write (bench/README.md). The hash state
  // is touched by one thread at a time, in file order: the helper is joined
  // before emit returns, or throws.
  void emit(const void* data, size_t size) {
    if (size == 0) return;
    if (size < kWriteBuffer) {
      hash.update(data, size);
      emit_unhashed(data, size);
      return;
    }
    std::thread hasher([this, data, size] { hash.update(data, size); });
    struct Join {
      std::thread& t;
      ~Join() { t.join(); }
    } join{hasher};
    emit_unhashed(data, size);
  }

  // Appends bytes that the checksum does not cover (the checksum itself and
  // the end magic).
  void emit_unhashed(const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    if (size <= kWriteBuffer - buffered) {
      std::memcpy(buffer.get() + buffered, bytes, size);
      buffered += size;
      return;
    }
    flush_buffer();
    if (size >= kWriteBuffer) {
      // Large tensors go straight from the caller's memory: no copy, and no
      // second buffer the size of the model.
      const int err = enospc ? ENOSPC : write_all(fd.get(), bytes, size);
      if (err != 0) fail("write " + temporary.string(), err);
      return;
    }
    std::memcpy(buffer.get(), bytes, size);
    buffered = size;
  }

  void require_usable(const char* what) const {
    if (committed) throw std::logic_error(std::string("CheckpointWriter::") + what + " after commit()");
    if (failed) throw std::logic_error(std::string("CheckpointWriter::") + what + " after a failed write");
  }
};

CheckpointWriter::CheckpointWriter(std::filesystem::path final_path)
    : impl_(std::make_unique<Impl>()), final_(std::move(final_path)) {
  if (!final_.has_filename())
    throw std::runtime_error("cannot write checkpoint " + final_.string() + ": not a file name");
  temporary_ = temporary_for(final_);
  impl_->final_path = final_;
  impl_->temporary = temporary_;

  // O_EXCL: never open (and later unlink) a file this writer did not create;
  // EEXIST means another writer of this process is writing the same name.
  // The directory is not created here: a missing directory is the caller's
  // mistake to report, not something to paper over.
  const int fd = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    impl_->failed = true;
    throw std::runtime_error("cannot write checkpoint " + final_.string() + ": create " + temporary_.string() +
                             ": " + error_text(err));
  }
  impl_->fd = Fd(fd);
  impl_->owns_temporary = true;
  impl_->enospc = injected_enospc(final_);
  fault_point("ckpt:after_open");

  char header[12];
  std::memcpy(header, kMagic, 8);
  put_u32(header + 8, kCheckpointFormat);
  impl_->emit(header, sizeof header);
}

// Impl's destructor closes and unlinks an uncommitted temporary.
CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::add(std::string_view name, const void* data, size_t size) { add(name, {}, data, size); }

void CheckpointWriter::add(std::string_view name, std::string_view head, const void* data, size_t size) {
  impl_->require_usable("add()");
  // Argument errors are checked before anything is written, so the writer
  // stays usable after them.
  if (name.empty()) throw std::invalid_argument("checkpoint section name is empty");
  if (name.size() > kMaxSectionName)
    throw std::invalid_argument("checkpoint section name '" + printable(name) + "' is longer than " +
                                std::to_string(kMaxSectionName) + " bytes");
  if (data == nullptr && size > 0)
    throw std::invalid_argument("checkpoint section '" + printable(name) + "' has no data pointer");
  if (impl_->names.count(name) != 0)
    throw std::invalid_argument("duplicate checkpoint section name '" + printable(name) + "' in " +
                                final_.string());
  impl_->names.emplace(name);

  char name_length[4];
  put_u32(name_length, static_cast<uint32_t>(name.size()));
  impl_->emit(name_length, sizeof name_length);
  impl_->emit(name.data(), name.size());
  char data_length[8];
  put_u64(data_length, static_cast<uint64_t>(head.size() + size));
  impl_->emit(data_length, sizeof data_length);
  impl_->emit(head.data(), head.size());
  impl_->emit(data, size);
  ++impl_->section_count;
  impl_->payload_bytes += head.size() + size;

  if (!impl_->mid_write_reached && impl_->payload_bytes > 0) {
    impl_->mid_write_reached = true;
    // Flushed so that a crash injected here leaves a genuinely partial file
    // on disk, which is what this point exists to exercise. One extra
    // write() per checkpoint.
    impl_->flush_buffer();
    fault_point("ckpt:mid_write");
  }
}

void CheckpointWriter::commit() {
  impl_->require_usable("commit()");
  Impl& w = *impl_;

  char trailer[12];
  put_u32(trailer, kEndOfSections);
  put_u64(trailer + 4, w.section_count);
  w.emit(trailer, sizeof trailer);
  char checksum[8];
  put_u64(checksum, w.hash.digest());
  w.emit_unhashed(checksum, sizeof checksum);
  w.emit_unhashed(kEndMagic, sizeof kEndMagic);
  w.flush_buffer();

  // The data must be on stable storage before the rename makes it visible
  // under the final name; otherwise a power cut could leave the new name
  // pointing at a file with missing blocks.
  fault_point("ckpt:before_fsync");
  if (const int err = fsync_retrying(w.fd.get()); err != 0) w.fail("fsync " + temporary_.string(), err);
  // close() can report a deferred write error (NFS and friends).
  if (const int err = w.fd.close_checked(); err != 0) w.fail("close " + temporary_.string(), err);

  fault_point("ckpt:before_rename");
  if (::rename(temporary_.c_str(), final_.c_str()) != 0) {
    const int err = errno;
    w.fail("rename " + temporary_.string() + " to " + final_.string(), err);
  }
  // From here on the temporary name no longer exists: nothing may unlink
  // it (another writer could create that name again), and the final name
  // holds the new, complete, fsync'ed file.
  w.owns_temporary = false;
  w.committed = true;
  fault_point("ckpt:after_rename");

  // The rename is durable only once the directory is. A failure here cannot
  // be undone (the previous file is already replaced, and removing the new
  // one would leave nothing), so it is reported and the complete file stays.
  std::filesystem::path dir = final_.parent_path();
  if (dir.empty()) dir = ".";
  const std::string step = "fsync directory " + dir.string();
  fault_point("ckpt:before_dir_fsync");
  const int err = fsync_directory(dir);
  if (err != 0)
    throw std::runtime_error("cannot write checkpoint " + final_.string() + ": " + step + ": " + error_text(err));
}

// ============================================================================
// Reader

// ============================================================================
// Snapshots
// ============================================================================

void CheckpointSnapshot::add(std::string name, std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  const void* data = owned->data();
  const size_t size = owned->size();
  add(std::move(name), {}, std::move(owned), data, size);
}

void CheckpointSnapshot::add(std::string name, std::string head, std::shared_ptr<const void> owner, const void* data,
                             size_t size) {
  sections_.push_back(SnapshotSection{std::move(name), std::move(head), std::move(owner), data, size});
}

std::shared_ptr<void> SnapshotBuffers::take(const std::string& name, size_t bytes) {
  Buffer& buffer = buffers_[name];
  // use_count 1: only the pool holds it, every snapshot that used it is gone.
  if (buffer.memory && buffer.bytes == bytes && buffer.memory.use_count() == 1) return buffer.memory;
  buffer.memory.reset();
  void* memory = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  if (memory == nullptr) throw std::bad_alloc();
  buffer = Buffer{bytes, std::shared_ptr<void>(memory, [](void* p) { std::free(p); })};
  return buffer.memory;
}

size_t CheckpointSnapshot::bytes() const {
  size_t total = 0;
  for (const SnapshotSection& section : sections_) total += section.head.size() + section.size;
  return total;
}

void commit_checkpoint(const std::filesystem::path& final_path, const CheckpointSnapshot& snapshot) {
  snapshot.wait_until_ready();
  CheckpointWriter writer(final_path);
  for (const SnapshotSection& section : snapshot.sections())
    writer.add(section.name, section.head, section.data, section.size);
  writer.commit();
}

}  // namespace kiln
