#include "ckpt/checkpoint_file.hpp"

#include "util/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
constexpr char kEndMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'D', '\0'};
constexpr uint32_t kEndOfSections = 0xFFFFFFFFu;
// Section names are short identifiers ("model", "optimizer", "plugin/x").
// The bound lets the reader reject a corrupt name length before allocating
// gigabytes for it; the writer enforces the same bound so it never writes a
// file the reader refuses.
constexpr size_t kMaxSectionName = 64 * 1024;
// Writes go through a buffer this large; anything at least this large is
// written straight from the caller's memory.
constexpr size_t kWriteBuffer = 1 << 20;
constexpr size_t kReadBuffer = 1 << 20;

// --- Little-endian integers, independent of the host's byte order. --------

void put_u32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void put_u64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint32_t get_u32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

std::string hex64(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(v));
  return text;
}


// --- RAII helpers. ----------------------------------------------------------

struct XxhStateDeleter {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};
using XxhState = std::unique_ptr<XXH64_state_t, XxhStateDeleter>;

XxhState new_hash_state() {
  XxhState state(XXH64_createState());
  if (!state) throw std::bad_alloc();
  XXH64_reset(state.get(), 0);
  return state;
}

}  // namespace

std::string printable(std::string_view text, size_t shown) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (text.size() > shown) out += "...";
  return out;
}

// ============================================================================
// Fault injection
// ============================================================================

void fault_point(const char* point) {
  // Read on every call: no global state, and commits are rare enough that a
  // getenv per point costs nothing measurable.
  const char* spec = std::getenv("KILN_FAULT_INJECT");
  if (spec == nullptr || *spec == '\0' || point == nullptr) return;
  const std::string_view wanted(point);
  std::string_view rest(spec);
  while (true) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == wanted) {
      // SIGKILL, not abort() or exit(): nothing may run after this point
      // (no destructors, no atexit handlers, no buffered output), exactly as
      // for a power cut or the OOM killer.
      std::raise(SIGKILL);
    }
    if (comma == std::string_view::npos) return;
    rest.remove_prefix(comma + 1);
  }
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
  XxhState hash = new_hash_state();
  std::unique_ptr<char[]> buffer{new char[kWriteBuffer]};
  size_t buffered = 0;
  uint64_t section_count = 0;
  uint64_t payload_bytes = 0;
  bool mid_write_reached = false;
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
    const int err = write_all(fd.get(), buffer.get(), buffered);
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
      XXH64_update(hash.get(), data, size);
      emit_unhashed(data, size);
      return;
    }
    std::thread hasher([state = hash.get(), data, size] { XXH64_update(state, data, size); });
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
      const int err = write_all(fd.get(), bytes, size);
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
  put_u64(checksum, XXH64_digest(w.hash.get()));
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

namespace {

[[noreturn]] void corrupt(const std::filesystem::path& path, const std::string& what) {
  throw CheckpointError(path.string() + " " + what);
}

// Opens a regular file for reading and returns it with its size.
std::pair<Fd, uint64_t> open_for_reading(const std::filesystem::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    corrupt(path, "cannot be read: " + error_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    corrupt(path, "cannot be read: " + error_text(err));
  }
  if (!S_ISREG(st.st_mode)) corrupt(path, "is not a regular file");
  return {std::move(fd), static_cast<uint64_t>(st.st_size)};
}

// read() up to `size` bytes, retrying on EINTR and short reads; returns the
// number read (less than `size` only at end of file).
size_t read_up_to(const std::filesystem::path& path, int fd, char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      corrupt(path, "cannot be read: " + error_text(err));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// The parser's view of the whole file in memory (CheckpointFile::read).
class MemorySource {
 public:
  explicit MemorySource(const std::string& bytes) : bytes_(bytes) {}
  uint64_t remaining() const { return bytes_.size() - pos_; }
  uint64_t position() const { return pos_; }
  // Copies n bytes (n <= remaining()) and hashes them when `hash` is set.
  void take(char* out, size_t n, XXH64_state_t* hash) {
    std::memcpy(out, bytes_.data() + pos_, n);
    if (hash != nullptr) XXH64_update(hash, out, n);
    pos_ += n;
  }
  void skip(uint64_t n, XXH64_state_t* hash) {
    if (hash != nullptr && n > 0) XXH64_update(hash, bytes_.data() + pos_, static_cast<size_t>(n));
    pos_ += n;
  }

 private:
  const std::string& bytes_;
  uint64_t pos_ = 0;
};

// The parser's view of a file read sequentially through a fixed buffer
// (CheckpointFile::check): memory use does not depend on the file's size.
class StreamSource {
 public:
  StreamSource(std::filesystem::path path, Fd fd, uint64_t size)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        size_(size),
        // No larger than the file: check() is called on many small files too.
        capacity_(static_cast<size_t>(std::clamp<uint64_t>(size, 1, kReadBuffer))),
        buffer_(new char[capacity_]) {}
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t position() const { return pos_; }
  void take(char* out, size_t n, XXH64_state_t* hash) {
    consume(n, [&](const char* p, size_t k) {
      std::memcpy(out, p, k);
      out += k;
      if (hash != nullptr) XXH64_update(hash, p, k);
    });
  }
  void skip(uint64_t n, XXH64_state_t* hash) {
    consume(n, [&](const char* p, size_t k) {
      if (hash != nullptr) XXH64_update(hash, p, k);
    });
  }

 private:
  template <class Sink>
  void consume(uint64_t n, Sink sink) {
    while (n > 0) {
      if (begin_ == end_) {
        begin_ = 0;
        end_ = read_up_to(path_, fd_.get(), buffer_.get(), capacity_);
        // The size came from fstat(); running out earlier means the file
        // shrank under us.
        if (end_ == 0) corrupt(path_, "is truncated (it shrank while being read)");
      }
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, end_ - begin_));
      sink(buffer_.get() + begin_, k);
      begin_ += k;
      pos_ += k;
      n -= k;
    }
  }

  std::filesystem::path path_;
  Fd fd_;
  uint64_t size_;
  uint64_t pos_ = 0;
  size_t capacity_;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0, end_ = 0;
};

// Validates the whole layout from `in`; calls on_section(name, in, size) for
// each section, which must take or skip exactly `size` bytes with `hash`.
// Throws CheckpointError with a one-line message naming `path`.
template <class Source, class OnSection>
void parse(const std::filesystem::path& path, Source& in, OnSection on_section) {
  XxhState hash = new_hash_state();
  if (in.remaining() == 0) corrupt(path, "is empty");

  // Magic: a prefix of it is a truncated checkpoint, anything else is not a
  // checkpoint at all.
  char magic[8];
  const size_t magic_size = static_cast<size_t>(std::min<uint64_t>(8, in.remaining()));
  in.take(magic, magic_size, hash.get());
  if (std::memcmp(magic, kMagic, magic_size) != 0)
    corrupt(path, "is not a kiln checkpoint (it does not start with \"KILNCKPT\")");
  if (magic_size < 8 || in.remaining() < 4) corrupt(path, "is truncated (it ends inside the header)");

  char word[8];
  in.take(word, 4, hash.get());
  // Checked before anything else about the layout: a newer format may lay
  // out everything after the version differently.
  const uint32_t version = get_u32(word);
  if (version != kCheckpointFormat)
    corrupt(path, "was written by checkpoint format " + std::to_string(version) + "; this kiln reads format " +
                      std::to_string(kCheckpointFormat));

  const char* const kNoTrailer = "is truncated (it ends before the checkpoint trailer)";
  std::set<std::string, std::less<>> seen;
  uint64_t count = 0;
  while (true) {
    if (in.remaining() < 4) corrupt(path, kNoTrailer);
    in.take(word, 4, hash.get());
    const uint32_t name_size = get_u32(word);
    if (name_size == kEndOfSections) break;
    if (name_size > in.remaining())
      corrupt(path, "is truncated or corrupt (a section name of " + std::to_string(name_size) +
                        " bytes runs past the end of the file)");
    if (name_size > kMaxSectionName)
      corrupt(path, "is corrupt (a section name of " + std::to_string(name_size) + " bytes at offset " +
                        std::to_string(in.position() - 4) + ")");
    std::string name(name_size, '\0');
    in.take(name.data(), name_size, hash.get());
    if (in.remaining() < 8)
      corrupt(path, "is truncated (it ends inside the header of section '" + printable(name) + "')");
    in.take(word, 8, hash.get());
    const uint64_t data_size = get_u64(word);
    if (data_size > in.remaining())
      corrupt(path, "is truncated or corrupt (section '" + printable(name) + "' runs past the end of the file)");
    if (!seen.insert(name).second) corrupt(path, "is corrupt (section '" + printable(name) + "' appears twice)");
    on_section(std::move(name), in, data_size, hash.get());
    ++count;
  }

  if (in.remaining() < 8) corrupt(path, kNoTrailer);
  in.take(word, 8, hash.get());
  const uint64_t stored_count = get_u64(word);
  if (stored_count != count)
    corrupt(path, "is corrupt (its trailer counts " + std::to_string(stored_count) + " sections, the file holds " +
                      std::to_string(count) + ")");

  const uint64_t computed = XXH64_digest(hash.get());
  if (in.remaining() < 8) corrupt(path, kNoTrailer);
  in.take(word, 8, nullptr);
  const uint64_t stored = get_u64(word);
  if (stored != computed)
    corrupt(path, "checksum mismatch: the file is corrupt (expected " + hex64(stored) + ", computed " +
                      hex64(computed) + ")");

  const size_t end_size = static_cast<size_t>(std::min<uint64_t>(8, in.remaining()));
  in.take(word, end_size, nullptr);
  if (std::memcmp(word, kEndMagic, end_size) != 0) corrupt(path, "is corrupt (wrong end marker)");
  if (end_size < 8) corrupt(path, kNoTrailer);
  if (in.remaining() > 0)
    corrupt(path, "is corrupt (" + std::to_string(in.remaining()) + " unexpected bytes after the end marker)");
}

}  // namespace

CheckpointFile CheckpointFile::read(const std::filesystem::path& path) {
  CheckpointFile file;
  file.path_ = path;
  {
    auto [fd, size] = open_for_reading(path);
    if (size > file.bytes_.max_size()) corrupt(path, "is too large to load");
    file.bytes_.resize(static_cast<size_t>(size));
    // A file that shrank since fstat() is validated as it now is (and so
    // reported as truncated); one that grew is reported as having trailing
    // bytes, because the extra byte read makes the parser see them.
    file.bytes_.resize(read_up_to(path, fd.get(), file.bytes_.data(), file.bytes_.size()));
    char extra;
    if (file.bytes_.size() == size && read_up_to(path, fd.get(), &extra, 1) == 1) file.bytes_ += extra;
  }
  MemorySource in(file.bytes_);
  parse(path, in, [&](std::string name, MemorySource& src, uint64_t data_size, XXH64_state_t* hash) {
    file.index_.emplace_back(std::move(name), std::make_pair(static_cast<size_t>(src.position()),
                                                             static_cast<size_t>(data_size)));
    src.skip(data_size, hash);
  });
  return file;
}

std::optional<std::string> CheckpointFile::check(const std::filesystem::path& path) {
  try {
    auto [fd, size] = open_for_reading(path);
    StreamSource in(path, std::move(fd), size);
    parse(path, in, [](std::string, StreamSource& src, uint64_t data_size, XXH64_state_t* hash) {
      src.skip(data_size, hash);
    });
  } catch (const CheckpointError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

namespace {

// pread() exactly `size` bytes at `offset`, retrying EINTR and short reads;
// false when the file ends first.
bool read_exactly_at(const std::filesystem::path& path, int fd, uint64_t offset, char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      corrupt(path, "cannot be read: " + error_text(err));
    }
    if (n == 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// The "meta" section is a few lines of text; a larger one is a corrupt length,
// which must not make a listing read megabytes.
constexpr uint64_t kMaxMetaSection = 64 * 1024;
// "\xFF\xFF\xFF\xFF", u64 section count, u64 checksum, "KILNEND\0".
constexpr uint64_t kTrailerSize = 4 + 8 + 8 + 8;

}  // namespace

CheckpointHead read_checkpoint_head(const std::filesystem::path& path) {
  auto [fd, size] = open_for_reading(path);
  CheckpointHead head;
  head.path = path;
  head.size = size;
  if (size == 0) corrupt(path, "is empty");

  // The same checks, in the same order and words, as parse() for the header.
  char word[12];
  const size_t magic_size = static_cast<size_t>(std::min<uint64_t>(8, size));
  if (!read_exactly_at(path, fd.get(), 0, word, magic_size)) corrupt(path, "is truncated (it shrank while being read)");
  if (std::memcmp(word, kMagic, magic_size) != 0)
    corrupt(path, "is not a kiln checkpoint (it does not start with \"KILNCKPT\")");
  if (magic_size < 8 || size < 12) corrupt(path, "is truncated (it ends inside the header)");
  if (!read_exactly_at(path, fd.get(), 8, word, 4)) corrupt(path, "is truncated (it shrank while being read)");
  const uint32_t version = get_u32(word);
  if (version != kCheckpointFormat)
    corrupt(path, "was written by checkpoint format " + std::to_string(version) + "; this kiln reads format " +
                      std::to_string(kCheckpointFormat));

  // The trailer: a file cut short anywhere (a copy that did not finish, a
  // full disk outside kiln's commit) does not end with it.
  if (size < 12 + kTrailerSize) corrupt(path, "is truncated (it ends before the checkpoint trailer)");
  char trailer[kTrailerSize];
  if (!read_exactly_at(path, fd.get(), size - kTrailerSize, trailer, kTrailerSize))
    corrupt(path, "is truncated (it shrank while being read)");
  if (get_u32(trailer) != kEndOfSections || std::memcmp(trailer + 20, kEndMagic, 8) != 0)
    corrupt(path, "is truncated or corrupt (it does not end with the checkpoint trailer)");
  const uint64_t sections_end = size - kTrailerSize;  // where the end-of-sections marker is

  // Section frames from the start until "meta": kiln writes it first, so
  // this is one frame; only the frames' headers are read, never their data.
  uint64_t at = 12;
  while (true) {
    if (at + 4 > sections_end) corrupt(path, "is corrupt (it has no 'meta' section)");
    if (!read_exactly_at(path, fd.get(), at, word, 4)) corrupt(path, "is truncated (it shrank while being read)");
    const uint32_t name_size = get_u32(word);
    if (name_size == kEndOfSections) corrupt(path, "is corrupt (it has no 'meta' section)");
    if (name_size > kMaxSectionName || at + 4 + name_size + 8 > sections_end)
      corrupt(path, "is corrupt (a section name of " + std::to_string(name_size) + " bytes at offset " +
                        std::to_string(at) + ")");
    std::string name(name_size, '\0');
    if (!read_exactly_at(path, fd.get(), at + 4, name.data(), name_size) ||
        !read_exactly_at(path, fd.get(), at + 4 + name_size, word, 8))
      corrupt(path, "is truncated (it shrank while being read)");
    const uint64_t data_size = get_u64(word);
    const uint64_t data_at = at + 4 + name_size + 8;
    if (data_size > sections_end - data_at)
      corrupt(path, "is truncated or corrupt (section '" + printable(name) + "' runs past the end of the file)");
    if (name == "meta") {
      if (data_size > kMaxMetaSection)
        corrupt(path, "is corrupt (its 'meta' section is " + std::to_string(data_size) + " bytes)");
      head.meta.resize(static_cast<size_t>(data_size));
      if (!read_exactly_at(path, fd.get(), data_at, head.meta.data(), head.meta.size()))
        corrupt(path, "is truncated (it shrank while being read)");
      return head;
    }
    at = data_at + data_size;
  }
}

bool CheckpointFile::has(std::string_view name) const {
  return std::any_of(index_.begin(), index_.end(), [&](const auto& entry) { return entry.first == name; });
}

std::string_view CheckpointFile::section(std::string_view name) const {
  for (const auto& [entry_name, where] : index_)
    if (entry_name == name) return std::string_view(bytes_).substr(where.first, where.second);
  throw CheckpointError(path_.string() + ": no section '" + printable(name) + "'");
}

std::vector<std::string> CheckpointFile::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& entry : index_) out.push_back(entry.first);
  return out;
}

// ============================================================================
// Sweeping temporaries
// ============================================================================

namespace {

// The pid in ".<anything>.tmp-<pid>", or nothing if `name` is not such a
// name (or the pid is not a plausible positive pid).
std::optional<pid_t> temporary_pid(const std::string& name) {
  static constexpr std::string_view kTag = ".tmp-";
  if (name.size() < 2 || name[0] != '.') return std::nullopt;
  const size_t tag = name.rfind(kTag);
  // tag >= 2: the "<anything>" between the leading dot and the tag is
  // not empty, as it never is for a file this writer creates.
  if (tag == std::string::npos || tag < 2) return std::nullopt;
  const std::string_view digits = std::string_view(name).substr(tag + kTag.size());
  if (digits.empty() || digits.size() > 9) return std::nullopt;  // pid_max is at most 2^22
  pid_t pid = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    pid = pid * 10 + (c - '0');
  }
  // 0 would make kill() address our whole process group.
  if (pid <= 0) return std::nullopt;
  return pid;
}

}  // namespace

std::vector<std::filesystem::path> sweep_temporaries(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return removed;
    throw std::runtime_error("cannot sweep checkpoint temporaries in " + dir.string() + ": " + ec.message());
  }
  const pid_t self = ::getpid();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& path = it->path();
    const std::optional<pid_t> pid = temporary_pid(path.filename().string());
    if (!pid) continue;
    // Only plain files: the writer never creates anything else, and a
    // directory or symlink of that name is somebody else's business.
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    // Our own pid: a writer of this process that died with an exception
    // mid-way cannot have left one (its destructor removes it), so this is a
    // leftover of an earlier process that had the same pid. The caller sweeps
    // at start-up, before any writer of this process exists.
    // Another pid: removed only when no such process exists (ESRCH); EPERM
    // means it lives under another user and may still be writing.
    const bool dead = *pid == self || (::kill(*pid, 0) != 0 && errno == ESRCH);
    if (!dead) continue;
    if (::unlink(path.c_str()) != 0) {
      const int err = errno;
      if (err == ENOENT) continue;  // swept concurrently by someone else
      throw std::runtime_error("cannot remove stale checkpoint temporary " + path.string() + ": " +
                               error_text(err));
    }
    removed.push_back(path);
  }
  if (ec)
    throw std::runtime_error("cannot sweep checkpoint temporaries in " + dir.string() + ": " + ec.message());
  return removed;
}

}  // namespace kiln
