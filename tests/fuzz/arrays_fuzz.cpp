// kiln_arrays' three parsers (plugins/arrays/array_file.hpp), over the same
// bytes: .npy, .safetensors and .npz (zip, zip64, deflate). The contract:
// either an ArrayFileError (one line naming the file), or arrays whose bytes
// lie inside the input (or inside a buffer a deflated .npz member was
// inflated into) and whose byte count is their shape's element count times
// the item size -- what the plugin hands LibTorch's from_blob without
// further checks.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "array_file.hpp"

namespace {

bool inside(const kiln_arrays::ArrayView& a, const unsigned char* begin, size_t size) {
  return a.data >= begin && a.bytes <= size && a.data - begin <= static_cast<std::ptrdiff_t>(size - a.bytes);
}

void check(const kiln_arrays::ArrayView& a, const uint8_t* data, size_t size,
           const std::vector<std::shared_ptr<const kiln_arrays::Buffer>>& inflated = {}) {
  bool found = inside(a, reinterpret_cast<const unsigned char*>(data), size);
  for (const auto& buffer : inflated) found = found || inside(a, buffer->data(), buffer->size());
  if (!found) std::abort();
  unsigned __int128 expected = kiln_arrays::item_size(a.dtype);
  for (const int64_t d : a.shape) {
    if (d < 0) std::abort();
    expected *= static_cast<uint64_t>(d);
  }
  if (expected != a.bytes) std::abort();
}

void one_line(const kiln_arrays::ArrayFileError& e) {
  const std::string what = e.what();
  if (what.empty() || what.find('\n') != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    check(kiln_arrays::parse_npy("fuzz.npy", "fuzz", data, size), data, size);
  } catch (const kiln_arrays::ArrayFileError& e) {
    one_line(e);
  }
  try {
    for (const auto& a : kiln_arrays::parse_safetensors("fuzz.safetensors", data, size)) check(a, data, size);
  } catch (const kiln_arrays::ArrayFileError& e) {
    one_line(e);
  }
  try {
    std::vector<std::shared_ptr<const kiln_arrays::Buffer>> inflated;
    for (const auto& a : kiln_arrays::parse_npz("fuzz.npz", data, size, inflated)) check(a, data, size, inflated);
  } catch (const kiln_arrays::ArrayFileError& e) {
    one_line(e);
  }
  return 0;
}
