// kiln_arrays' readers: NumPy's .npy and .npz and the .safetensors format,
// memory mapped, without LibTorch (the fuzz target links them alone). A reader
// checks everything its header claims against the file before anything
// points into it; any lie is an ArrayFileError naming the file (and key).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln_arrays {

class ArrayFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, boolean };

size_t item_size(DType dtype);
const char* dtype_name(DType dtype);

// One array inside a file: its bytes stay in the file's mapping.
struct ArrayView {
  std::string key;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  bool fortran_order = false;  // .npy only: the shape's dimensions are stored last-first
  const unsigned char* data = nullptr;
  size_t bytes = 0;
};

// The parsers, over bytes already in memory (`name` is the file for messages).
// parse_npy's `key` is the name the array goes by (the file's stem).
ArrayView parse_npy(const std::string& name, const std::string& key, const unsigned char* bytes, size_t size);
std::vector<ArrayView> parse_safetensors(const std::string& name, const unsigned char* bytes, size_t size);
// A .npz (NumPy's savez and savez_compressed: a zip of .npy members, zip64
// included); a member "x.npy" is the array "x". A stored member's view
// points into `bytes`; a deflated one is inflated into a buffer appended to
// `inflated`, which must outlive the views. Each member's CRC-32 is checked.
using Buffer = std::vector<unsigned char>;
std::vector<ArrayView> parse_npz(const std::string& name, const unsigned char* bytes, size_t size,
                                 std::vector<std::shared_ptr<const Buffer>>& inflated);

// "a, b, c" in sorted order ("none" for none), for messages that list keys.
std::string key_list(std::vector<std::string> keys);

// A file mapped read-only for as long as any holder keeps it, and open for
// pread: rows read with read_at() go through the page cache without being
// mapped into the process (its RSS), where reading them through the mapping
// would count every page touched (docs/data.md, the 4 GiB measurement).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  // `size` bytes at `offset` into `out`; throws ArrayFileError naming the file.
  void read_at(uint64_t offset, void* out, size_t size) const;

 private:
  std::string path_;
  int fd_ = -1;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// A .npy, .npz or .safetensors file (by its extension), mapped, with its
// arrays (a compressed .npz member's bytes in `inflated`).
struct ArrayFile {
  std::string path;
  std::shared_ptr<MappedFile> mapping;
  std::vector<std::shared_ptr<const Buffer>> inflated;
  std::vector<ArrayView> arrays;

  static ArrayFile open(const std::string& path);
};

}  // namespace kiln_arrays
