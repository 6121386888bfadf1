#include "distributed/c10d_compat.hpp"

#include <algorithm>

#include <torch/version.h>
// reducer.hpp includes a distributed-autograd header Debian's 1.13 package
// lacks; runtime/dist/stub provides the two declarations it needs there.
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "distributed/shm_allreduce.hpp"
#ifdef KILN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace kiln::c10d_compat {

namespace {

#if TORCH_VERSION_MAJOR >= 2
using ShmBase = c10d::Backend;  // 2.x: a ProcessGroup dispatches to per-device Backends
#else
using ShmBase = c10d::ProcessGroup;  // 1.13: a ProcessGroup implements the collectives itself
#endif

// The collective runs to completion inside allreduce() (the shared memory
// needs no progress thread); the work it returns is already done.
class ShmCollectives final : public ShmBase {
 public:
  explicit ShmCollectives(std::shared_ptr<ShmAllReduce> shm)
      : ShmBase(shm->rank(), shm->ranks()), shm_(std::move(shm)) {}

  const std::string getBackendName() const override { return "kiln-shm"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    TORCH_CHECK(options.reduceOp == c10d::ReduceOp::SUM, "kiln's shared-memory group only sums");
    for (at::Tensor& t : tensors) shm_->all_reduce_sum(t);
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors));
    return c10d::Work::create_from_future(future);
  }

 private:
  std::shared_ptr<ShmAllReduce> shm_;
};

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> shm_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 std::shared_ptr<ShmAllReduce> shm) {
  auto backend = c10::make_intrusive<ShmCollectives>(std::move(shm));
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return group;
#else
  (void)store;
  return backend;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options) {
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  // 2.x: a ProcessGroup dispatches each collective to the Backend registered
  // for its tensors' device.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  return backend;  // 1.13: ProcessGroupGloo is a ProcessGroup
#endif
}

#ifdef KILN_WITH_NCCL
c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return group;
#else
  return backend;
#endif
}
#endif

std::shared_ptr<c10d::Reducer> make_reducer(const std::vector<at::Tensor>& parameters,
                                            const std::vector<std::string>& names,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group, size_t bucket_bytes,
                                            size_t first_bucket_bytes) {
  const std::vector<bool> sparse(parameters.size(), false);
  // Same order as DDP: assign buckets, then reverse them, because gradients
  // become ready roughly in reverse order of the parameters.
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(parameters, {first_bucket_bytes, bucket_bytes}, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  // gradient_as_bucket_view: the gradients become views of the buckets, so
  // nothing is copied back after the all-reduce. The loop drops the
  // gradients after each step (set_to_none); the Reducer then divides each
  // new gradient into its bucket in one pass and points the gradient there.
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names[i] = names[i];
#if TORCH_VERSION_MAJOR >= 2
  // 2.x: no per-bucket limits; the unused-parameter, Python-reducer and
  // per-bucket-cap options keep DDP's defaults.
  (void)limits;
  return std::make_shared<c10d::Reducer>(parameters, std::move(buckets), group, sparse,
                                         static_cast<int64_t>(bucket_bytes), /*find_unused_parameters=*/false,
                                         /*gradient_as_bucket_view=*/true, std::move(param_names),
                                         static_cast<int64_t>(first_bucket_bytes),
                                         /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
                                         /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
#else
  return std::make_shared<c10d::Reducer>(parameters, std::move(buckets), std::move(limits), group, sparse,
                                         static_cast<int64_t>(bucket_bytes), /*find_unused_parameters=*/false,
                                         /*gradient_as_bucket_view=*/true, std::move(param_names),
                                         static_cast<int64_t>(first_bucket_bytes));
#endif
}

}  // namespace kiln::c10d_compat
