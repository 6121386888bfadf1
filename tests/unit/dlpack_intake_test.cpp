// kiln_host.tensor_from_dlpack: a plain-C producer's description is checked
// before LibTorch reads an element, and the producer's deleter runs exactly
// once whether the tensor is taken or refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/dlpack.h>

#include "kiln/tensor.hpp"
#include "plugin/host_services.hpp"

namespace kiln {
namespace {

struct Producer {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  alignas(16) double buffer[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int* deleted = nullptr;
};

// A float64 vector of `n` elements at buffer + byte_offset.
DLManagedTensor* float64_vector(int64_t n, uint64_t byte_offset, int* deleted, uint8_t code = kDLFloat) {
  auto* p = new Producer();
  p->deleted = deleted;
  p->shape = {n};
  DLTensor& t = p->managed.dl_tensor;
  t.data = p->buffer;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{code, 64, 1};
  t.shape = p->shape.data();
  t.byte_offset = byte_offset;
  p->managed.manager_ctx = p;
  p->managed.deleter = [](DLManagedTensor* self) {
    auto* producer = static_cast<Producer*>(self->manager_ctx);
    ++*producer->deleted;
    delete producer;
  };
  return &p->managed;
}

TEST(DlpackIntake, AnAlignedOffsetStartsTheTensorAtTheOffset) {
  PluginHost host("test.dlpack", nullptr, /*sees_ranks=*/false);
  const kiln_host* table = host.table();
  int deleted = 0;
  kiln_error* error = nullptr;
  kiln_tensor* handle = table->tensor_from_dlpack(table, float64_vector(3, 2 * sizeof(double), &deleted), &error);
  ASSERT_NE(handle, nullptr) << take_error(error);
  {
    const at::Tensor tensor = borrow_tensor(handle);
    EXPECT_EQ(tensor.sizes().vec(), std::vector<int64_t>{3});
    EXPECT_DOUBLE_EQ(tensor[0].item<double>(), 2.0);
    EXPECT_DOUBLE_EQ(tensor.clone()[2].item<double>(), 4.0);
  }
  EXPECT_EQ(deleted, 0);
  table->tensor_release(table, handle);
  EXPECT_EQ(deleted, 1);
}

// The fuzzer's finding: a complex128 scalar 6 bytes into its buffer crashed
// LibTorch's copy (aligned vector loads). Any element off its natural
// alignment is refused with the reason, and the producer's memory is freed.
TEST(DlpackIntake, AMisalignedFirstElementIsRefusedNotRead) {
  PluginHost host("test.dlpack", nullptr, /*sees_ranks=*/false);
  const kiln_host* table = host.table();
  for (const uint8_t code : {uint8_t{kDLFloat}, uint8_t{kDLInt}}) {
    for (const uint64_t offset : {1u, 4u, 6u, 12u}) {
      int deleted = 0;
      kiln_error* error = nullptr;
      EXPECT_EQ(table->tensor_from_dlpack(table, float64_vector(2, offset, &deleted, code), &error), nullptr);
      ASSERT_NE(error, nullptr);
      EXPECT_NE(take_error(error).find("is not aligned to its 8-byte size"), std::string::npos) << offset;
      EXPECT_EQ(deleted, 1) << offset;
    }
  }
  // An empty tensor reads nothing: its address does not matter.
  int deleted = 0;
  kiln_error* error = nullptr;
  kiln_tensor* empty = table->tensor_from_dlpack(table, float64_vector(0, 3, &deleted), &error);
  ASSERT_NE(empty, nullptr) << take_error(error);
  table->tensor_release(table, empty);
  EXPECT_EQ(deleted, 1);
}

}  // namespace
}  // namespace kiln
