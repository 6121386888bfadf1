// The IDX reader of the Fashion-MNIST data module (gzip or plain). The
// contract: a uint8 tensor of the header's shape, or IdxError; a header that
// promises more data than the file holds never makes it allocate that much.
#include <cstdint>
#include <string>

#include "fuzz_file.hpp"
#include "idx_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = kiln_fuzz::input_file(".idx", data, size);
  for (uint32_t magic : {kiln_fashion_mnist::kIdxImagesMagic, kiln_fashion_mnist::kIdxLabelsMagic}) {
    try {
      const at::Tensor t = kiln_fashion_mnist::read_idx(file, magic);
      if (t.scalar_type() != at::kByte || !t.is_contiguous()) __builtin_trap();
      (void)t.sum().item<int64_t>();
    } catch (const kiln_fashion_mnist::IdxError&) {
    }
  }
  return 0;
}
