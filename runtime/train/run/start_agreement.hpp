// The start-up agreement (after any resume, before the loops): every rank
// runs the same manifest, plugin builds, model shapes, resume point and
// split lengths, or the run ends on every rank naming the difference and
// the ranks; then rank 0's weights (the resumed ones) are broadcast, so all
// ranks start equal (sharded parameters: a bucket at a time as they are
// sharded, optim/sharded_parameters.hpp).
#pragma once

#include <string>
#include <vector>

#include "train/run/run_checkpoints.hpp"

namespace kiln {

class PluginInstance;
class ProcessGroup;

struct StartFacts {
  const std::string& manifest_text;
  std::vector<const PluginInstance*> plugins;
  std::string resume_point;  // "" for a fresh start
  std::string split_lengths;  // "<split> split length <n>" lines
  // distributed.shard = "parameters": the parameters are not broadcast here
  // (ShardedParameters::shard takes rank 0's a bucket at a time), the buffers are.
  bool parameters_sharded = false;
};

void agree_on_start(ProcessGroup& group, const StartFacts& facts, TrainingState& state);

}  // namespace kiln
