#include "ckpt/checkpoint_file.hpp"

#include "util/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

namespace kiln {

using namespace ckpt_format;

namespace {

// The streaming check reads through a buffer this large.
constexpr size_t kReadBuffer = 1 << 20;

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
  void take(char* out, size_t n, Checksum* hash) {
    std::memcpy(out, bytes_.data() + pos_, n);
    if (hash != nullptr) hash->update(out, n);
    pos_ += n;
  }
  void skip(uint64_t n, Checksum* hash) {
    if (hash != nullptr && n > 0) hash->update(bytes_.data() + pos_, static_cast<size_t>(n));
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
  void take(char* out, size_t n, Checksum* hash) {
    consume(n, [&](const char* p, size_t k) {
      std::memcpy(out, p, k);
      out += k;
      if (hash != nullptr) hash->update(p, k);
    });
  }
  void skip(uint64_t n, Checksum* hash) {
    consume(n, [&](const char* p, size_t k) {
      if (hash != nullptr) hash->update(p, k);
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

std::string hex64(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(v));
  return text;
}

const char* const kNoTrailer = "is truncated (it ends before the checkpoint trailer)";

// The magic and the format version.
template <class Source>
void parse_header(const std::filesystem::path& path, Source& in, Checksum& hash) {
  // Magic: a prefix of it is a truncated checkpoint, anything else is not a
  // checkpoint at all.
  char magic[8];
  const size_t magic_size = static_cast<size_t>(std::min<uint64_t>(8, in.remaining()));
  in.take(magic, magic_size, &hash);
  if (std::memcmp(magic, kMagic, magic_size) != 0)
    corrupt(path, "is not a kiln checkpoint (it does not start with \"KILNCKPT\")");
  if (magic_size < 8 || in.remaining() < 4) corrupt(path, "is truncated (it ends inside the header)");

  char word[4];
  in.take(word, 4, &hash);
  // Checked before anything else about the layout: a newer format may lay
  // out everything after the version differently.
  const uint32_t version = get_u32(word);
  if (version != kCheckpointFormat)
    corrupt(path, "was written by checkpoint format " + std::to_string(version) + "; this kiln reads format " +
                      std::to_string(kCheckpointFormat));
}

// The section frames up to the end-of-sections marker; returns how many.
template <class Source, class OnSection>
uint64_t parse_sections(const std::filesystem::path& path, Source& in, Checksum& hash, OnSection& on_section) {
  char word[8];
  std::set<std::string, std::less<>> seen;
  uint64_t count = 0;
  while (true) {
    if (in.remaining() < 4) corrupt(path, kNoTrailer);
    in.take(word, 4, &hash);
    const uint32_t name_size = get_u32(word);
    if (name_size == kEndOfSections) return count;
    if (name_size > in.remaining())
      corrupt(path, "is truncated or corrupt (a section name of " + std::to_string(name_size) +
                        " bytes runs past the end of the file)");
    if (name_size > kMaxSectionName)
      corrupt(path, "is corrupt (a section name of " + std::to_string(name_size) + " bytes at offset " +
                        std::to_string(in.position() - 4) + ")");
    std::string name(name_size, '\0');
    in.take(name.data(), name_size, &hash);
    if (in.remaining() < 8)
      corrupt(path, "is truncated (it ends inside the header of section '" + printable(name) + "')");
    in.take(word, 8, &hash);
    const uint64_t data_size = get_u64(word);
    if (data_size > in.remaining())
      corrupt(path, "is truncated or corrupt (section '" + printable(name) + "' runs past the end of the file)");
    if (!seen.insert(name).second) corrupt(path, "is corrupt (section '" + printable(name) + "' appears twice)");
    on_section(std::move(name), in, data_size, &hash);
    ++count;
  }
}

// What follows the end-of-sections marker: the count, the checksum, the end
// magic and nothing else.
template <class Source>
void parse_trailer(const std::filesystem::path& path, Source& in, Checksum& hash, uint64_t count) {
  char word[8];
  if (in.remaining() < 8) corrupt(path, kNoTrailer);
  in.take(word, 8, &hash);
  const uint64_t stored_count = get_u64(word);
  if (stored_count != count)
    corrupt(path, "is corrupt (its trailer counts " + std::to_string(stored_count) + " sections, the file holds " +
                      std::to_string(count) + ")");

  const uint64_t computed = hash.digest();
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

// Validates the whole layout from `in`; calls on_section(name, in, size) for
// each section, which must take or skip exactly `size` bytes with `hash`.
// Throws CheckpointError with a one-line message naming `path`.
template <class Source, class OnSection>
void parse(const std::filesystem::path& path, Source& in, OnSection on_section) {
  Checksum hash;
  if (in.remaining() == 0) corrupt(path, "is empty");
  parse_header(path, in, hash);
  const uint64_t count = parse_sections(path, in, hash, on_section);
  parse_trailer(path, in, hash, count);
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
  parse(path, in, [&](std::string name, MemorySource& src, uint64_t data_size, Checksum* hash) {
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
    parse(path, in, [](std::string, StreamSource& src, uint64_t data_size, Checksum* hash) {
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

}  // namespace

namespace {

// The header, and the trailer's end-of-sections marker and end magic, read
// with pread; returns where the end-of-sections marker is.
uint64_t check_head_frame(const std::filesystem::path& path, int fd, uint64_t size) {
  if (size == 0) corrupt(path, "is empty");

  // The same checks, in the same order and words, as parse() for the header.
  char word[12];
  const size_t magic_size = static_cast<size_t>(std::min<uint64_t>(8, size));
  if (!read_exactly_at(path, fd, 0, word, magic_size)) corrupt(path, "is truncated (it shrank while being read)");
  if (std::memcmp(word, kMagic, magic_size) != 0)
    corrupt(path, "is not a kiln checkpoint (it does not start with \"KILNCKPT\")");
  if (magic_size < 8 || size < 12) corrupt(path, "is truncated (it ends inside the header)");
  if (!read_exactly_at(path, fd, 8, word, 4)) corrupt(path, "is truncated (it shrank while being read)");
  const uint32_t version = get_u32(word);
  if (version != kCheckpointFormat)
    corrupt(path, "was written by checkpoint format " + std::to_string(version) + "; this kiln reads format " +
                      std::to_string(kCheckpointFormat));

  // The trailer: a file cut short anywhere (a copy that did not finish, a
  // full disk outside kiln's commit) does not end with it.
  if (size < 12 + kTrailerSize) corrupt(path, "is truncated (it ends before the checkpoint trailer)");
  char trailer[kTrailerSize];
  if (!read_exactly_at(path, fd, size - kTrailerSize, trailer, kTrailerSize))
    corrupt(path, "is truncated (it shrank while being read)");
  if (get_u32(trailer) != kEndOfSections || std::memcmp(trailer + 20, kEndMagic, 8) != 0)
    corrupt(path, "is truncated or corrupt (it does not end with the checkpoint trailer)");
  return size - kTrailerSize;
}

// The "meta" section's bytes. Section frames from the start until "meta":
// kiln writes it first, so this is one frame; only the frames' headers are
// read, never their data.
std::string read_meta_section(const std::filesystem::path& path, int fd, uint64_t sections_end) {
  char word[8];
  uint64_t at = 12;
  while (true) {
    if (at + 4 > sections_end) corrupt(path, "is corrupt (it has no 'meta' section)");
    if (!read_exactly_at(path, fd, at, word, 4)) corrupt(path, "is truncated (it shrank while being read)");
    const uint32_t name_size = get_u32(word);
    if (name_size == kEndOfSections) corrupt(path, "is corrupt (it has no 'meta' section)");
    if (name_size > kMaxSectionName || at + 4 + name_size + 8 > sections_end)
      corrupt(path, "is corrupt (a section name of " + std::to_string(name_size) + " bytes at offset " +
                        std::to_string(at) + ")");
    std::string name(name_size, '\0');
    if (!read_exactly_at(path, fd, at + 4, name.data(), name_size) ||
        !read_exactly_at(path, fd, at + 4 + name_size, word, 8))
      corrupt(path, "is truncated (it shrank while being read)");
    const uint64_t data_size = get_u64(word);
    const uint64_t data_at = at + 4 + name_size + 8;
    if (data_size > sections_end - data_at)
      corrupt(path, "is truncated or corrupt (section '" + printable(name) + "' runs past the end of the file)");
    if (name == "meta") {
      if (data_size > kMaxMetaSection)
        corrupt(path, "is corrupt (its 'meta' section is " + std::to_string(data_size) + " bytes)");
      std::string meta(static_cast<size_t>(data_size), '\0');
      if (!read_exactly_at(path, fd, data_at, meta.data(), meta.size()))
        corrupt(path, "is truncated (it shrank while being read)");
      return meta;
    }
    at = data_at + data_size;
  }
}

}  // namespace

CheckpointHead read_checkpoint_head(const std::filesystem::path& path) {
  auto [fd, size] = open_for_reading(path);
  CheckpointHead head;
  head.path = path;
  head.size = size;
  const uint64_t sections_end = check_head_frame(path, fd.get(), size);  // where the end-of-sections marker is
  head.meta = read_meta_section(path, fd.get(), sections_end);
  return head;
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

}  // namespace kiln
