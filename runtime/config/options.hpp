// The closed sets of the manifest: every option whose value is one name out
// of a fixed list is an enum here, with its names in enum order. The schema
// (config/manifest_schema.cpp) offers exactly these names, so past the
// manifest the runtime switches on enums and never compares option names.
//
// No LibTorch here. Optimizers and schedules are built in runtime/train from
// a registry indexed by OptimizerName / SchedulerName; it refuses to compile
// when it lacks an entry for a name listed here.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace kiln {

enum class LogLevel { debug, info, warn, error };
enum class GradientClipAlgorithm { norm, value };
enum class ProgressMode { automatic, bar, lines, none };
enum class OptimizerName { sgd, adam, adamw, rmsprop, adagrad };
enum class SchedulerName { none, step, cosine, linear_warmup };
enum class SchedulerInterval { epoch, step };
enum class MonitorMode { min, max };
enum class PreemptSignal { sigterm, sigusr1, none };
enum class DistributedBackend { automatic, gloo, nccl };
// How ranks on one host reduce CPU gradients: through a shared-memory
// segment (auto: when every rank maps it) or over the Gloo group.
enum class IntraHost { automatic, shm, gloo };
// The dtype gradients travel in (DDP's compression hooks); the optimizer
// keeps float32.
enum class GradientCompression { none, bf16, fp16 };
// distributed.shard: what each rank holds of the training state
// (optim/sharded_step.hpp): everything, its part of the optimizer's state,
// of the reduced gradients too, or of the parameters too
// (optim/sharded_parameters.hpp).
enum class ShardMode { none, optimizer, gradients, parameters };
// Lightning's names: full float32, bfloat16 autocast, float16 autocast with a
// gradient scaler, and the model itself in bfloat16 (the optimizer steps
// float32 copies of its trainable weights: optim/master_weights.hpp).
enum class Precision { fp32, bf16_mixed, fp16_mixed, bf16_true };
// What a non-finite training loss or gradient norm does (optim/nonfinite_watch.hpp).
enum class NonfiniteMode { off, warn, raise };
// Where the fit's time went (profiling/profiler.hpp): nothing, a table at the
// end, or a Chrome trace per rank.
enum class ProfilerKind { none, simple, trace };
// Averaged weights kept beside the trained ones (optim/weight_averaging.hpp).
enum class AveragingKind { none, ema, swa };

// The names a manifest writes, index = the enum's value.
template <class Option>
struct OptionNames;
template <>
struct OptionNames<LogLevel> {
  static constexpr std::array<const char*, 4> names{"debug", "info", "warn", "error"};
};
template <>
struct OptionNames<GradientClipAlgorithm> {
  static constexpr std::array<const char*, 2> names{"norm", "value"};
};
template <>
struct OptionNames<ProgressMode> {
  static constexpr std::array<const char*, 4> names{"auto", "bar", "lines", "none"};
};
template <>
struct OptionNames<OptimizerName> {
  static constexpr std::array<const char*, 5> names{"sgd", "adam", "adamw", "rmsprop", "adagrad"};
};
template <>
struct OptionNames<SchedulerName> {
  static constexpr std::array<const char*, 4> names{"none", "step", "cosine", "linear_warmup"};
};
template <>
struct OptionNames<SchedulerInterval> {
  static constexpr std::array<const char*, 2> names{"epoch", "step"};
};
template <>
struct OptionNames<MonitorMode> {
  static constexpr std::array<const char*, 2> names{"min", "max"};
};
template <>
struct OptionNames<PreemptSignal> {
  static constexpr std::array<const char*, 3> names{"SIGTERM", "SIGUSR1", "none"};
};
template <>
struct OptionNames<DistributedBackend> {
  static constexpr std::array<const char*, 3> names{"auto", "gloo", "nccl"};
};

template <>
struct OptionNames<IntraHost> {
  static constexpr std::array<const char*, 3> names{"auto", "shm", "gloo"};
};
template <>
struct OptionNames<GradientCompression> {
  static constexpr std::array<const char*, 3> names{"none", "bf16", "fp16"};
};
template <>
struct OptionNames<ShardMode> {
  static constexpr std::array<const char*, 4> names{"none", "optimizer", "gradients", "parameters"};
};

template <>
struct OptionNames<Precision> {
  static constexpr std::array<const char*, 4> names{"32", "bf16-mixed", "16-mixed", "bf16-true"};
};

template <>
struct OptionNames<NonfiniteMode> {
  static constexpr std::array<const char*, 3> names{"off", "warn", "raise"};
};
template <>
struct OptionNames<ProfilerKind> {
  static constexpr std::array<const char*, 3> names{"none", "simple", "trace"};
};
template <>
struct OptionNames<AveragingKind> {
  static constexpr std::array<const char*, 3> names{"none", "ema", "swa"};
};

// How many values a closed set has (for tables indexed by it).
template <class Option>
constexpr std::size_t option_count() {
  return OptionNames<Option>::names.size();
}

// The name a manifest writes for `value` ("SIGTERM", "auto", ...).
template <class Option>
std::string option_name(Option value) {
  return OptionNames<Option>::names[static_cast<std::size_t>(value)];
}

template <class Option>
std::vector<std::string> option_names() {
  return {OptionNames<Option>::names.begin(), OptionNames<Option>::names.end()};
}

}  // namespace kiln
