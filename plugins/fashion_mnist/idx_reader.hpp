// Reading IDX files (the MNIST family's format), gzipped or not.
//
// An IDX file is a big-endian header — a magic number whose last byte is the
// number of dimensions, then one uint32 per dimension — followed by the data.
// Only unsigned-byte data (type code 0x08) is supported, which is all that
// MNIST and Fashion-MNIST use.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

namespace kiln_fashion_mnist {

// Magic numbers of unsigned-byte IDX files: 0x0803 (3-D images), 0x0801 (labels).
constexpr uint32_t kIdxImagesMagic = 2051;
constexpr uint32_t kIdxLabelsMagic = 2049;

// Thrown for a missing, unreadable or malformed file; what() names the file.
class IdxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the whole file into a uint8 tensor shaped as its header says,
// checking that the magic number is `expected_magic` and that the data is
// exactly as long as the header promises.
at::Tensor read_idx(const std::string& path, uint32_t expected_magic);

}  // namespace kiln_fashion_mnist
