#include "token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kiln_token_stream {

namespace {

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// Closes the descriptor however open_and_map leaves: the mapping keeps the
// file alive on its own.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TokenFile::TokenFile(const std::string& path, int token_bytes) : token_bytes_(token_bytes) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw TokenFileError("cannot open token file " + quoted(path) + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0)
    throw TokenFileError("cannot stat token file " + quoted(path) + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw TokenFileError("token file " + quoted(path) + " is not a regular file");
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ == 0) throw TokenFileError("token file " + quoted(path) + " is empty");
  if (bytes_ % static_cast<size_t>(token_bytes) != 0)
    throw TokenFileError("token file " + quoted(path) + " has " + std::to_string(bytes_) +
                         " bytes, not a whole number of " + std::to_string(token_bytes) +
                         "-byte tokens; is token_bytes right, or was the file cut short?");
  data_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    throw TokenFileError("cannot map token file " + quoted(path) + ": " + std::strerror(errno));
  }
  tokens_ = static_cast<int64_t>(bytes_ / static_cast<size_t>(token_bytes));
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    token_bytes_ = other.token_bytes_;
    tokens_ = std::exchange(other.tokens_, 0);
  }
  return *this;
}

void TokenFile::copy(int64_t first, int64_t count, int64_t* out) const {
  const auto* p = static_cast<const uint8_t*>(data_);
  if (token_bytes_ == 1) {
    for (int64_t i = 0; i < count; ++i) out[i] = p[first + i];
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = at(first + i);
  }
}

void TokenFile::unmap() noexcept {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  tokens_ = 0;
}

}  // namespace kiln_token_stream
