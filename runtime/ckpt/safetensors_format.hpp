// The safetensors file format, written without a dependency
// (https://github.com/huggingface/safetensors#format):
//
//   u64 little-endian N        the header's length in bytes
//   N bytes of JSON            {"<name>": {"dtype": "F32", "shape": [..],
//                               "data_offsets": [begin, end]}, ...,
//                               "__metadata__": {"<key>": "<string>", ...}}
//                              padded with spaces to a multiple of 8
//   the tensors' bytes         row-major, little-endian, back to back;
//                              offsets count from the end of the header
//
// Tensors are laid out largest element first, so each one's bytes start at
// a multiple of its element size (readers may map them without copying).
// No LibTorch here: dtypes are named as LibTorch names them ("Float").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

struct SafetensorsEntry {
  std::string name;            // "fc1.weight"
  std::string dtype;           // as c10::toString names it: "Float", "BFloat16", "Long", ...
  std::vector<int64_t> shape;
  std::string_view data;       // numel * element size bytes, row-major, little-endian
};

// The safetensors dtype ("F32") of a LibTorch dtype name ("Float"), or ""
// for one safetensors has no name for (complex, quantized).
std::string safetensors_dtype(const std::string& torch_dtype);

// The whole file. Throws std::invalid_argument for a dtype safetensors
// cannot hold, or bytes that do not match dtype and shape (naming the tensor).
std::string safetensors_file(const std::vector<SafetensorsEntry>& tensors,
                             const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace kiln
