// A file of tokens, memory-mapped read-only: a corpus of any size costs no
// heap and no load time, the page cache holds it once for every rank on a
// machine, and prefetch threads read it concurrently without locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kiln_token_stream {

// The file cannot be used as a token stream (missing, unreadable, empty,
// or a length that is not a whole number of tokens).
class TokenFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TokenFile {
 public:
  TokenFile() = default;
  // token_bytes 1: every byte is a token (uint8). 2: little-endian uint16,
  // the layout numpy's `tofile` writes on every common machine.
  TokenFile(const std::string& path, int token_bytes);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return tokens_; }
  int64_t at(int64_t i) const {
    const auto* p = static_cast<const uint8_t*>(data_);
    if (token_bytes_ == 1) return p[i];
    // Byte by byte, so a big-endian host reads the same tokens.
    return static_cast<int64_t>(p[2 * i]) | (static_cast<int64_t>(p[2 * i + 1]) << 8);
  }
  // tokens [first, first + count) into out[0..count) (int64, for embeddings).
  void copy(int64_t first, int64_t count, int64_t* out) const;

 private:
  void unmap() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  int token_bytes_ = 1;
  int64_t tokens_ = 0;
};

}  // namespace kiln_token_stream
