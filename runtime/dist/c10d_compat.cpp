#include "dist/c10d_compat.hpp"

#include <stdexcept>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef KILN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
// reducer.hpp includes a distributed-autograd header Debian's package lacks;
// runtime/dist/stub provides the two declarations it needs.
#include <torch/csrc/distributed/c10d/reducer.hpp>

#if TORCH_VERSION_MAJOR >= 2
#define KILN_C10D_BACKENDS 1  // Gloo and NCCL are Backends inside a ProcessGroup
#else
#define KILN_C10D_BACKENDS 0  // Gloo and NCCL are ProcessGroups themselves
#endif

namespace kiln::c10d_compat {

namespace {

#if KILN_C10D_BACKENDS
c10::intrusive_ptr<c10d::ProcessGroup> wrap(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            c10::DeviceType device, c10d::ProcessGroup::BackendType type,
                                            c10::intrusive_ptr<c10d::Backend> backend) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(device, type, backend);
  group->setDefaultBackend(type);
  return group;
}
#endif

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  std::shared_ptr<gloo::transport::Device> device) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(std::move(device));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#if KILN_C10D_BACKENDS
  return wrap(store, rank, size, c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
#else
  return gloo;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
#ifdef KILN_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#if KILN_C10D_BACKENDS
  return wrap(store, rank, size, c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
#else
  return nccl;
#endif
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw std::runtime_error("distributed.backend is nccl (or the device is CUDA), but this kiln was built "
                           "against a LibTorch without NCCL; use backend = \"gloo\"");
#endif
}

std::shared_ptr<c10d::Reducer> make_reducer(std::vector<at::Tensor> params,
                                            std::vector<std::vector<size_t>> buckets,
                                            std::vector<size_t> bucket_limits,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                            std::vector<bool> sparse, size_t bucket_bytes,
                                            std::unordered_map<size_t, std::string> param_names,
                                            size_t first_bucket_bytes) {
#if TORCH_VERSION_MAJOR >= 2
  // 2.x takes no per-bucket limits (an empty bucket_bytes_cap_list lets the
  // Reducer rebuild buckets by its own rule, as DDP does by default).
  (void)bucket_limits;
  return std::make_shared<c10d::Reducer>(std::move(params), std::move(buckets), group, std::move(sparse),
                                         static_cast<int64_t>(bucket_bytes), /*find_unused_parameters=*/false,
                                         /*gradient_as_bucket_view=*/false, std::move(param_names),
                                         static_cast<int64_t>(first_bucket_bytes),
                                         /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
                                         /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
#else
  return std::make_shared<c10d::Reducer>(std::move(params), std::move(buckets), std::move(bucket_limits), group,
                                         std::move(sparse), static_cast<int64_t>(bucket_bytes),
                                         /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
                                         std::move(param_names), static_cast<int64_t>(first_bucket_bytes));
#endif
}

}  // namespace kiln::c10d_compat
