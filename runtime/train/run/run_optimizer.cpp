#include "train/run/run_optimizer.hpp"

#include <algorithm>

#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include "distributed/grad_sync.hpp"
#include "distributed/process_group.hpp"
#include "optim/master_weights.hpp"
#include "optim/optim.hpp"
#include "optim/replicated_step.hpp"
#include "optim/sharded_step.hpp"
#include "util/errors.hpp"

namespace kiln {

RunOptimizer::RunOptimizer(const Manifest& manifest, TrainingState& state, const std::vector<ParamGroup>& groups,
                           RunCheckpoints& checkpoints, ProcessGroup* group, int32_t rank, int32_t world_size)
    : m_(manifest), state_(state), group_(group) {
  const ShardMode shard = m_.distributed.shard;
  if (shard != ShardMode::none && m_.distributed.gradient_compression != GradientCompression::none)
    throw InputError("distributed.gradient_compression is for the replicated all-reduce; distributed.shard = \"" +
                     std::string(option_name(shard)) +
                     "\" reduce-scatters float32 gradients (set one of them to \"none\")");
  const bool masters = steps_float32_masters(m_.trainer);
  // bfloat16 weights stepped without masters: Adam's one pass computes each
  // element in float32 and rounds it once (optim/fused_adam.hpp), the same
  // wherever a shard starts; LibTorch's bfloat16 ops would round a tensor's
  // tail apart from the rest, and each op separately.
  OptimizerConfig optimizer = m_.optimizer;
  if (m_.trainer.precision == Precision::bf16_true && !masters) optimizer.fused = true;
  if (shard == ShardMode::none) {
    if (masters) masters_ = whole_masters(state_.trainable);
    state_.optimizer = make_optimizer(optimizer, groups, masters ? masters_ : state_.trainable);
    checkpoints.register_optimizer(masters ? &masters_ : nullptr);
    return;
  }
  // ZeRO-1/2: the optimizer over the elements this rank owns, every rank's
  // all-gathered after each step.
  std::vector<int64_t> numels;
  for (const auto& p : state_.trainable) numels.push_back(p.numel());
  shard_layout_.emplace(std::move(numels), world_size, rank);
  if (shard == ShardMode::parameters) {
    if (m_.averaging.kind != AveragingKind::none)
      throw InputError("[averaging] keeps whole copies of the weights and updates them after every step; "
                       "distributed.shard = \"parameters\" keeps only 1/N of them on each rank (use "
                       "distributed.shard = \"gradients\", or remove [averaging])");
    std::vector<at::Tensor> frozen;
    for (const auto& [name, p] : state_.params)
      if (std::none_of(state_.trainable.begin(), state_.trainable.end(),
                       [&](const at::Tensor& t) { return t.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); }))
        frozen.push_back(p);
    parameters_.emplace(state_.trainable, *shard_layout_, frozen, group_,
                        static_cast<int64_t>(m_.distributed.bucket_mb * 1024 * 1024), m_.distributed.prefetch);
    checkpoints.hold_whole_weights_while_committing([this, rank] { parameters_->gather_all(/*keep=*/rank == 0); },
                                                    [this] { parameters_->release_all(); });
  }
  owned_ = masters              ? owned_masters(state_.trainable, *shard_layout_)
           : parameters_        ? parameters_->owned_views()
                                : ShardedStep::owned_views(state_.trainable, *shard_layout_,
                                                            m_.trainer.precision == Precision::bf16_true);
  state_.optimizer = make_optimizer(optimizer, groups, owned_);
  checkpoints.register_sharded_optimizer(owned_, *shard_layout_, group_, masters);
  int64_t elements = 0;
  for (const auto& v : owned_) elements += v.numel();
  spdlog::info("distributed.shard = {}: rank {} holds the optimizer's state{}{} for {} of the {} trained "
               "values ({} per rank with padding; replicated: all {})",
               option_name(shard), rank,
               shard == ShardMode::parameters  ? ", the reduced gradients and the parameters"
               : shard == ShardMode::gradients ? " and reduced gradients"
                                               : "",
               masters ? " and float32 master weights" : "", elements,
               shard_layout_->total(), shard_layout_->shard_size(), shard_layout_->total());
  if (group_ && group_->reduce_scatter_is_all_reduce())
    spdlog::info("distributed.shard: the ranks are not all on one host sharing memory, and {}'s reduce-scatter "
                 "needs shard-aligned buckets: the gradients are all-reduced (twice a reduce-scatter's traffic)",
                 group_->gradient_transport());
}

RunOptimizer::~RunOptimizer() = default;

void RunOptimizer::weights_agreed(bool resumed) {
  if (resumed || !steps_float32_masters(m_.trainer)) return;
  at::NoGradGuard no_grad;
  if (!shard_layout_) {
    for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(state_.trainable[i]);
    return;
  }
  const std::vector<at::Tensor> agreed =
      parameters_ ? parameters_->owned_views() : ShardedStep::owned_views(state_.trainable, *shard_layout_, true);
  for (size_t i = 0; i < owned_.size() && i < agreed.size(); ++i)
    if (owned_[i].numel() > 0) owned_[i].detach().copy_(agreed[i].detach());
}

const std::vector<at::Tensor>& RunOptimizer::stepped_weights() const {
  return parameters_ ? owned_ : state_.trainable;
}

std::unique_ptr<OptimizerStep> RunOptimizer::step(GradScaler* scaler, NonfiniteWatch* nonfinite,
                                                  WeightAveraging* averaging, Profiler* profiler) {
  if (group_ && !shard_layout_ && !grad_sync_)  // a sharded step reduce-scatters the gradients itself
    grad_sync_ = std::make_unique<GradSync>(*group_, state_.trainable, state_.trainable_names,
                                            m_.distributed.gradient_compression);
  const bool masters = steps_float32_masters(m_.trainer);
  // A replicated step's optimizer steps the whole masters; a sharded one's
  // its own (owned_), the model's parameters filled by the gather.
  const bool whole_masters = masters && !shard_layout_;
  ReplicatedStep::Parts parts{
      *state_.optimizer, whole_masters ? masters_ : state_.trainable,
      GradientClipping{m_.trainer.gradient_clip_val, m_.trainer.gradient_clip_algorithm == GradientClipAlgorithm::value},
      grad_sync_.get(), scaler, nonfinite, averaging, profiler};
  if (whole_masters) parts.model = &state_.trainable;
  if (shard_layout_)
    return std::make_unique<ShardedStep>(parts, owned_, *shard_layout_, group_,
                                         m_.distributed.shard != ShardMode::optimizer, masters,
                                         parameters_ ? &*parameters_ : nullptr);
  return std::make_unique<ReplicatedStep>(parts);
}

}  // namespace kiln
