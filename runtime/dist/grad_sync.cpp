#include "dist/grad_sync.hpp"

#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "dist/c10d_compat.hpp"
#include "dist/process_group.hpp"

namespace kiln {

namespace {
constexpr size_t kBucketBytes = 25u << 20;       // DDP's default bucket_cap_mb = 25
constexpr size_t kFirstBucketBytes = 1u << 20;   // DDP's first bucket: start reducing early
}  // namespace

GradSync::GradSync(ProcessGroup& group, const std::vector<at::Tensor>& parameters,
                   const std::vector<std::string>& names) {
  reducer_ = c10d_compat::make_reducer(parameters, names, group.group(), kBucketBytes, kFirstBucketBytes);
}

GradSync::~GradSync() = default;

void GradSync::before_forward() { reducer_->prepare_for_forward(); }

void GradSync::before_backward(const at::Tensor& loss, bool sync) {
  if (sync) reducer_->prepare_for_backward({loss});
}

}  // namespace kiln
