// kiln_arrays' two header parsers (plugins/arrays/array_file.hpp), over the
// same bytes: .npy and .safetensors. The contract: either an ArrayFileError
// (one line naming the file), or arrays whose bytes lie inside the input and
// whose byte count is their shape's element count times the item size --
// what the plugin hands LibTorch's from_blob without further checks.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "array_file.hpp"

namespace {

void check(const kiln_arrays::ArrayView& a, const uint8_t* data, size_t size) {
  const auto* begin = reinterpret_cast<const unsigned char*>(data);
  if (a.data < begin || a.bytes > size || a.data - begin > static_cast<std::ptrdiff_t>(size - a.bytes)) std::abort();
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
  return 0;
}
