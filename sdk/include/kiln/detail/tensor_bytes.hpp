// kiln/detail/tensor_bytes.hpp — a tensor as plain bytes, for plugin state in
// checkpoints (StateWriter::write_tensor / StateReader::read_tensor).
//
// Layout, the same as the host's own tensor sections (docs/checkpoints.md):
//   "<dtype> <d0,d1,...>\n" then the tensor's contiguous bytes
// where <dtype> is c10::toString's name ("Float", "Long", ...) and the shape
// is empty for a 0-dim tensor. Reading it runs nothing from the checkpoint
// (no pickle, no TorchScript, unlike torch::load) and allocates exactly what
// the bytes hold: a header that does not match its data is refused first.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <ATen/ATen.h>

namespace kiln::detail {

// Dense, non-quantized tensors on any device (copied to the CPU). Throws
// std::invalid_argument for anything else.
inline std::string tensor_to_bytes(const at::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("write_tensor: the tensor is undefined");
  if (tensor.layout() != at::kStrided || tensor.is_quantized())
    throw std::invalid_argument("write_tensor: only dense, non-quantized tensors can be saved");
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  std::string out = std::string(c10::toString(t.scalar_type())) + " ";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? "," : "") + std::to_string(t.size(d));
  out += '\n';
  const size_t header = out.size();
  const size_t bytes = t.numel() * t.element_size();
  out.resize(header + bytes);
  if (bytes > 0) std::memcpy(&out[header], t.data_ptr(), bytes);
  return out;
}

// The tensor tensor_to_bytes wrote, on the CPU. Throws std::invalid_argument
// naming the problem for anything else (including the torch::save archives
// that earlier SDKs wrote: refused, never unpickled).
inline at::Tensor tensor_from_bytes(std::string_view bytes) {
  auto bad = [](const std::string& what) { return std::invalid_argument("read_tensor: " + what); };
  if (bytes.substr(0, 2) == "PK")
    throw bad("the state is a torch::save archive, which is not loaded (it could run code); save it again");
  const size_t newline = bytes.find('\n');
  const size_t space = bytes.substr(0, newline).find(' ');
  if (newline == std::string_view::npos || space == std::string_view::npos)
    throw bad("the state is not a saved tensor (no \"<dtype> <shape>\" header)");
  const std::string_view name = bytes.substr(0, space);
  at::ScalarType type = at::ScalarType::Undefined;
  for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions); ++i) {
    const auto candidate = static_cast<at::ScalarType>(i);
    if (candidate != at::ScalarType::Undefined && !c10::isQIntType(candidate) && name == c10::toString(candidate))
      type = candidate;
  }
  if (type == at::ScalarType::Undefined) throw bad("unknown dtype in the saved tensor's header");
  std::vector<int64_t> sizes;
  int64_t numel = 1;
  std::string_view shape = bytes.substr(space + 1, newline - space - 1);
  while (!shape.empty()) {
    const size_t comma = shape.find(',');
    const std::string_view part = shape.substr(0, comma);
    int64_t n = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || n < 0)
      throw bad("the saved tensor's shape is not a list of non-negative integers");
    if (sizes.size() >= 64 || __builtin_mul_overflow(numel, n, &numel))
      throw bad("the saved tensor's shape is too large");
    sizes.push_back(n);
    if (comma == std::string_view::npos) break;
    shape.remove_prefix(comma + 1);
    if (shape.empty()) throw bad("the saved tensor's shape ends with a comma");
  }
  const std::string_view data = bytes.substr(newline + 1);
  int64_t size = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(type)), &size) ||
      data.size() != static_cast<uint64_t>(size))
    throw bad("the saved tensor's data is not as long as its header says");
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(type));
  if (size > 0) std::memcpy(out.data_ptr(), data.data(), data.size());
  return out;
}

}  // namespace kiln::detail
