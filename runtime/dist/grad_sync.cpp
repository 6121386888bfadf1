#include "dist/grad_sync.hpp"

#include <algorithm>
#include <unordered_map>

// reducer.hpp includes a distributed-autograd header Debian's package lacks;
// runtime/dist/stub provides the two declarations it needs.
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
  const std::vector<bool> sparse(parameters.size(), false);
  // Same order as DDP: assign buckets, then reverse them, because gradients
  // become ready roughly in reverse order of the parameters.
  auto [buckets, limits] =
      c10d::compute_bucket_assignment_by_size(parameters, {kFirstBucketBytes, kBucketBytes}, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names[i] = names[i];
  reducer_ = c10d_compat::make_reducer(parameters, std::move(buckets), std::move(limits), group.group(), sparse,
                                       kBucketBytes, std::move(param_names), kFirstBucketBytes);
}

GradSync::~GradSync() = default;

void GradSync::before_forward() { reducer_->prepare_for_forward(); }

void GradSync::before_backward(const at::Tensor& loss, bool sync) {
  if (sync) reducer_->prepare_for_backward({loss});
}

}  // namespace kiln
