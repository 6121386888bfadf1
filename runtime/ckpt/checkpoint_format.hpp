// The checkpoint file format: its layout, the checksum over it and the error
// a file that breaks it raises. No LibTorch here: a checkpoint is named
// sections of bytes; what they mean is their parts' business (ckpt/checkpoint_parts.hpp). The writer
// (checkpoint_writer) and the reader (checkpoint_file) both build on this.
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

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

// Text from a checkpoint as it may appear in a one-line message: a corrupt
// file can hold any bytes, including newlines, so anything unprintable is
// escaped and text longer than `shown` characters is cut ("...").
std::string printable(std::string_view text, size_t shown = 80);

namespace ckpt_format {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
inline constexpr char kEndMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'D', '\0'};
inline constexpr uint32_t kEndOfSections = 0xFFFFFFFFu;
// Magic and version.
inline constexpr uint64_t kHeaderSize = 8 + 4;
// "\xFF\xFF\xFF\xFF", u64 section count, u64 checksum, "KILNEND\0".
inline constexpr uint64_t kTrailerSize = 4 + 8 + 8 + 8;
// Section names are short identifiers ("model", "optimizer", "plugin/x").
// The bound lets the reader reject a corrupt name length before allocating
// gigabytes for it; the writer enforces the same bound so it never writes a
// file the reader refuses.
inline constexpr size_t kMaxSectionName = 64 * 1024;

// --- Little-endian integers, independent of the host's byte order. --------

inline void put_u32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline void put_u64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline uint32_t get_u32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}
inline uint64_t get_u64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

// The file's checksum: XXH64 with seed 0, fed in file order. update() may
// be called from another thread than the one that made it, one thread at a
// time (the writer hashes large blocks on a helper thread).
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;

  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ckpt_format
}  // namespace kiln
