// An archive's weights mapped from its file instead of read into memory.
//
// Each weight of a .pt2 package is a stored (uncompressed) zip record, so
// its bytes lie in the file as the tensor holds them. Mapped copy-on-write
// (MAP_PRIVATE), a weight costs no memory until a page of it is read, and a
// write makes a private copy of that page: the tensor behaves as memory of
// its own. So a host that keeps only part of every weight (distributed.shard
// = "parameters": each rank reads its own elements and frees the rest) never
// holds the whole model, and the programs' other copies ("eval",
// "predict"), dropped after setup, cost nothing.
//
// A mapping reads the file as it is when a page is first read: rewritten in
// place meanwhile (the same path exported again), a page would come from
// the new file, or fault past its end. So a mapping lives only through the
// start-up: move_out_of_file() copies whatever still maps into memory of its
// own, which the plugin does at its first step.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include <ATen/Tensor.h>

namespace kiln_exported {

// An open file whose stored records can be mapped. Closed with the object;
// mappings made from it stay valid.
class MappedFile {
 public:
  // nullopt when the file cannot be opened (the caller's reading reports it).
  static std::optional<MappedFile> open(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  ~MappedFile();

  // The record whose data starts at `data_offset`, `bytes` long, whose zip
  // local header is at `header_offset`, as a contiguous CPU tensor of
  // `sizes` and `dtype`; nullopt when it cannot be mapped (compressed, out
  // of the file, misaligned, empty, or mmap failed): read it instead.
  std::optional<at::Tensor> map(size_t header_offset, size_t data_offset, size_t bytes,
                                const std::vector<int64_t>& sizes, at::ScalarType dtype) const;

 private:
  MappedFile(int fd, size_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  size_t size_ = 0;
};

// Copies `t`'s values into memory of its own, in place (the same storage,
// so every tensor sharing it sees the copy), if its memory is still one of
// these mappings, which is released; otherwise does nothing.
void move_out_of_file(const at::Tensor& t);

}  // namespace kiln_exported
