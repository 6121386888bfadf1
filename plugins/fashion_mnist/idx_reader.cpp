#include "idx_reader.hpp"

#include <zlib.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

namespace kiln_fashion_mnist {
namespace {

// A corrupt header could claim any size; no IDX file we read comes close.
constexpr int64_t kMaxBytes = int64_t{1} << 31;
constexpr int64_t kReadChunk = int64_t{16} << 20;
constexpr int64_t kFirstChunk = int64_t{64} << 10;

struct GzClose {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IdxError("'" + path + "' " + what);
}

// zlib reports its own errors through gzerror, plain I/O errors through errno.
std::string read_error(gzFile file) {
  int code = Z_OK;
  const char* message = gzerror(file, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return message ? message : "unknown zlib error";
}

// Reads exactly `size` bytes; false on a clean end of file before that.
bool read_exactly(gzFile file, const std::string& path, void* out, int64_t size) {
  auto* cursor = static_cast<unsigned char*>(out);
  while (size > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(size, INT_MAX));
    const int got = gzread(file, cursor, chunk);
    if (got < 0) fail(path, "could not be read: " + read_error(file));
    if (got == 0) return false;
    cursor += got;
    size -= got;
  }
  return true;
}

uint32_t big_endian(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

}  // namespace

at::Tensor read_idx(const std::string& path, uint32_t expected_magic) {
  errno = 0;
  // gzopen reads an uncompressed file transparently, so unpacked copies work too.
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file)
    fail(path,
         std::string("could not be opened: ") + (errno ? std::strerror(errno) : "out of memory"));
  gzbuffer(file.get(), 1 << 17);

  unsigned char word[4];
  if (!read_exactly(file.get(), path, word, 4)) fail(path, "is empty or truncated (no IDX header)");
  const uint32_t magic = big_endian(word);
  if (magic != expected_magic)
    fail(path, "is not the expected IDX file (magic number " + std::to_string(magic) +
                   ", expected " + std::to_string(expected_magic) + ")");

  const int ndims = static_cast<int>(magic & 0xFFu);
  std::vector<int64_t> shape;
  // `span` counts a 0 dimension as 1: the tensor's contiguous strides. An
  // empty tensor of huge other dimensions has strides that overflow (and
  // LibTorch 1.13 then crashes reading them; found by tests/fuzz).
  int64_t total = 1, span = 1;
  for (int i = 0; i < ndims; ++i) {
    if (!read_exactly(file.get(), path, word, 4)) fail(path, "is truncated inside its IDX header");
    shape.push_back(big_endian(word));
    total *= shape.back();
    span *= std::max<int64_t>(shape.back(), 1);
    if (total > kMaxBytes || span > kMaxBytes) fail(path, "has an implausible IDX header (more than 2 GiB of data)");
  }

  // The header's size is a claim: memory grows with the data actually read
  // (doubling from a small first chunk, in steps of at most kReadChunk), so a
  // corrupt or hostile header cannot make a small file allocate more than
  // about twice what it holds, let alone gigabytes.
  std::vector<uint8_t> bytes;
  for (int64_t have = 0; have < total;) {
    const int64_t chunk = std::min({total - have, kReadChunk, std::max(kFirstChunk, have)});
    bytes.resize(static_cast<size_t>(have + chunk));
    if (!read_exactly(file.get(), path, bytes.data() + have, chunk))
      fail(path, "is truncated: its IDX header promises " + std::to_string(total) + " bytes of data");
    have += chunk;
  }
  at::Tensor data = at::empty(shape, at::kByte);
  if (total > 0) std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), static_cast<size_t>(total));
  unsigned char extra = 0;
  if (read_exactly(file.get(), path, &extra, 1))
    fail(path, "is longer than its IDX header says; the file is corrupt");
  return data;
}

}  // namespace kiln_fashion_mnist
