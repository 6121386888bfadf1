// The DLPack intake (kiln_host.tensor_from_dlpack), the door a plain-C data
// module's batches come through. Input bytes describe a DLTensor: dtype,
// device, ndim, shape, strides, byte offset. Where the description has a
// computable extent, the harness backs it with a buffer of exactly that size
// (the producer's promise the ABI relies on); otherwise it passes a small
// one. The contract: a tensor of the described shape and strides starting at
// data + byte_offset, whose every element lies inside the buffer, or an
// error — and the producer's deleter runs exactly once either way.
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <dlpack/dlpack.h>

#include "kiln/tensor.hpp"
#include "plugin/host_services.hpp"
#include "plugin/run_services.hpp"

namespace {

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  template <class T>
  T take() {
    T value{};
    const size_t n = std::min(sizeof(T), size - std::min(at, size));
    std::memcpy(&value, data + std::min(at, size), n);
    at += sizeof(T);
    return value;
  }
};

struct Producer {
  DLManagedTensor managed{};
  std::vector<int64_t> shape, strides;
  std::vector<uint8_t> buffer;
  int* deleted;
};

// The extent in bytes the description reaches, or -1 when it has none.
int64_t extent(const DLTensor& t) {
  if (t.ndim < 0 || t.ndim > 16 || t.dtype.lanes != 1 || t.dtype.bits == 0 || t.dtype.bits % 8) return -1;
  const int64_t item = t.dtype.bits / 8;
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > (1 << 20)) return -1;
    if (t.shape[i] == 0) return static_cast<int64_t>(t.byte_offset);
    const int64_t stride = t.strides ? t.strides[i] : 1;
    if (stride < 0 || stride > (1 << 20)) return -1;
    last += (t.shape[i] - 1) * (t.strides ? stride : 0);
  }
  if (!t.strides) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) {
      n *= t.shape[i];  // at most 2^22 * 2^20: no overflow
      if (n > (1 << 22)) return -1;
    }
    last = n - 1;
  }
  const int64_t bytes = static_cast<int64_t>(t.byte_offset) + (last + 1) * item;
  return bytes <= (1 << 22) ? bytes : -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kiln::PluginHost host("fuzz.dlpack", nullptr, /*sees_ranks=*/false);
  Reader in{data, size};
  int deleted = 0;
  auto* p = new Producer();
  p->deleted = &deleted;
  DLTensor& t = p->managed.dl_tensor;
  t.dtype.code = in.take<uint8_t>() % 8;
  t.dtype.bits = in.take<uint8_t>();
  t.dtype.lanes = in.take<uint8_t>() % 3;
  t.device.device_type = static_cast<DLDeviceType>(in.take<uint8_t>() % 16);
  t.device.device_id = in.take<int8_t>();
  t.ndim = in.take<int8_t>() % 12;
  const bool with_strides = in.take<uint8_t>() & 1;
  t.byte_offset = in.take<uint8_t>();
  const bool null_shape = in.take<uint8_t>() == 0xFF;
  for (int i = 0; i < std::max(0, static_cast<int>(t.ndim)); ++i) {
    p->shape.push_back(in.take<int16_t>());
    p->strides.push_back(in.take<int16_t>());
  }
  t.shape = null_shape || p->shape.empty() ? nullptr : p->shape.data();
  t.strides = with_strides && !p->strides.empty() ? p->strides.data() : nullptr;
  const int64_t bytes = t.shape || t.ndim == 0 ? extent(t) : -1;
  p->buffer.assign(bytes >= 0 ? static_cast<size_t>(bytes) + 1 : 16, 0x5A);
  t.data = p->buffer.data();
  p->managed.manager_ctx = p;
  p->managed.deleter = [](DLManagedTensor* self) {
    auto* producer = static_cast<Producer*>(self->manager_ctx);
    ++*producer->deleted;
    delete producer;
  };

  // What the tensor must be, taken before the producer hands it over.
  const std::vector<int64_t> shape = t.shape ? p->shape : std::vector<int64_t>();
  const std::vector<int64_t> strides = t.strides ? p->strides : std::vector<int64_t>();
  const uintptr_t first = reinterpret_cast<uintptr_t>(p->buffer.data()) + t.byte_offset;

  kiln_error* error = nullptr;
  const kiln_host* table = host.table();
  kiln_tensor* handle = table->tensor_from_dlpack(table, &p->managed, &error);
  if (handle != nullptr) {
    if (error != nullptr) __builtin_trap();
    {
      const at::Tensor tensor = kiln::borrow_tensor(handle);
      if (!tensor.device().is_cpu()) __builtin_trap();  // batches are host memory
      // The tensor is the description: its shape, its strides, and its first
      // element at data + byte_offset (LibTorch 1.13 alone ignores the offset).
      if (tensor.sizes().vec() != shape) __builtin_trap();
      for (size_t i = 0; i < strides.size(); ++i)
        if (shape[i] > 1 && tensor.stride(static_cast<int64_t>(i)) != strides[i]) __builtin_trap();
      if (tensor.numel() > 0 && reinterpret_cast<uintptr_t>(tensor.data_ptr()) != first) __builtin_trap();
      // Reads every element (ASan sees any byte outside the buffer); a
      // stride-0 view of a huge shape is legal but not worth copying.
      // Only a description the harness could back with a buffer is read: the
      // ABI leaves the extent to the producer, and no host can check it.
      if (bytes >= 0 && tensor.numel() <= (1 << 16)) (void)tensor.clone();
    }
    table->tensor_release(table, handle);
  } else {
    if (error == nullptr) __builtin_trap();
    (void)kiln::take_error(error);
  }
  if (deleted != 1) __builtin_trap();  // ownership: the deleter runs exactly once
  return 0;
}
