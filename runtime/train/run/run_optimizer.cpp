#include "train/run/run_optimizer.hpp"

#include <spdlog/spdlog.h>

#include "distributed/grad_sync.hpp"
#include "distributed/process_group.hpp"
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
  if (shard == ShardMode::none) {
    state_.optimizer = make_optimizer(m_.optimizer, groups, state_.trainable);
    checkpoints.register_optimizer();
    return;
  }
  // ZeRO-1/2: the optimizer over the elements this rank owns, every rank's
  // all-gathered after each step.
  std::vector<int64_t> numels;
  for (const auto& p : state_.trainable) numels.push_back(p.numel());
  shard_layout_.emplace(std::move(numels), world_size, rank);
  owned_ = ShardedStep::owned_views(state_.trainable, *shard_layout_);
  state_.optimizer = make_optimizer(m_.optimizer, groups, owned_);
  checkpoints.register_sharded_optimizer(owned_, *shard_layout_, group_);
  int64_t elements = 0;
  for (const auto& v : owned_) elements += v.numel();
  spdlog::info("distributed.shard = {}: rank {} holds the optimizer's state{} for {} of the {} trained "
               "values ({} per rank with padding; replicated: all {})",
               option_name(shard), rank, shard == ShardMode::gradients ? " and reduced gradients" : "", elements,
               shard_layout_->total(), shard_layout_->shard_size(), shard_layout_->total());
  if (group_ && group_->reduce_scatter_is_all_reduce())
    spdlog::info("distributed.shard: the ranks are not all on one host sharing memory, and {}'s reduce-scatter "
                 "needs shard-aligned buckets: the gradients are all-reduced (twice a reduce-scatter's traffic)",
                 group_->gradient_transport());
}

RunOptimizer::~RunOptimizer() = default;

std::unique_ptr<OptimizerStep> RunOptimizer::step(GradScaler* scaler, NonfiniteWatch* nonfinite,
                                                  WeightAveraging* averaging, Profiler* profiler) {
  if (group_ && !shard_layout_ && !grad_sync_)  // a sharded step reduce-scatters the gradients itself
    grad_sync_ = std::make_unique<GradSync>(*group_, state_.trainable, state_.trainable_names,
                                            m_.distributed.gradient_compression);
  const ReplicatedStep::Parts parts{
      *state_.optimizer, state_.trainable,
      GradientClipping{m_.trainer.gradient_clip_val, m_.trainer.gradient_clip_algorithm == GradientClipAlgorithm::value},
      grad_sync_.get(), scaler, nonfinite, averaging, profiler};
  if (shard_layout_)
    return std::make_unique<ShardedStep>(parts, owned_, *shard_layout_, group_,
                                         m_.distributed.shard == ShardMode::gradients);
  return std::make_unique<ReplicatedStep>(parts);
}

}  // namespace kiln
