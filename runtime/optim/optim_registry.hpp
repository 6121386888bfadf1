// The optimizers and learning-rate schedules kiln offers, one entry each,
// indexed by the names config/options.hpp declares (and the manifest schema
// offers). An entry builds its optimizer and turns one parameter's optimizer
// state into checkpoint fields and back, so checkpoints need no knowledge of
// particular optimizers. Adding an optimizer: its name in config/options.hpp,
// its entry in optim_registry.cpp (the registry does not compile without it).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "config/manifest.hpp"

namespace kiln {

// The key torch::optim files a parameter's state under: its TensorImpl*'s
// printed address in LibTorch 1.13, the TensorImpl* itself in 2.x. Taken
// from the optimizer's own map type, so no version test is needed.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& parameter) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << parameter.unsafeGetTensorImpl();
    return out.str();
  } else {
    return parameter.unsafeGetTensorImpl();
  }
}

// One parameter's optimizer state as a checkpoint holds it.
struct ParamStateFields {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // each shaped like the parameter
  std::vector<std::pair<std::string, std::string>> texts;   // small values ("step" -> "12"); "" marks presence
};

// Reads one parameter's fields back from a checkpoint; throws the
// checkpoint's own error for a field that is missing or malformed.
class ParamStateReader {
 public:
  virtual ~ParamStateReader() = default;
  virtual bool has(const std::string& field) const = 0;
  virtual at::Tensor tensor(const std::string& field) const = 0;  // shaped and typed like the parameter
  virtual int64_t count(const std::string& field) const = 0;      // a non-negative integer
};

// One parameter group as an optimizer is built with it.
struct OptimizerGroup {
  std::vector<at::Tensor> params;
  OptimizerConfig options;  // the group's (the optimizer's name is the entry's)
};

struct OptimizerEntry {
  OptimizerName name;
  std::type_index type;     // the torch::optim class `build` makes
  const char* state_name;   // "Adam": optimizers whose state reads the same share it
  const char* state_marker; // the field every saved state of this kind has
  // One torch parameter group per entry of `groups`, in order, with its
  // options; `defaults` are the optimizer's own ([optimizer]'s).
  std::unique_ptr<torch::optim::Optimizer> (*build)(const std::vector<OptimizerGroup>& groups,
                                                    const OptimizerConfig& defaults);
  // `state` is the state of an optimizer `build` made.
  ParamStateFields (*save_state)(const torch::optim::OptimizerParamState& state);
  std::unique_ptr<torch::optim::OptimizerParamState> (*load_state)(const ParamStateReader& fields);
};

using OptimizerRegistry = std::array<OptimizerEntry, option_count<OptimizerName>()>;
const OptimizerRegistry& optimizer_registry();  // in OptimizerName order
const OptimizerEntry& optimizer_entry(OptimizerName name);
// The entry whose `build` made `optimizer`; nullptr for one it did not.
const OptimizerEntry* optimizer_entry_of(const torch::optim::Optimizer& optimizer);

// A schedule is a pure function of the period (an epoch or a step), like
// LambdaLR: any period's rate is computed directly, so it has no state to
// checkpoint.
struct ScheduleEntry {
  SchedulerName name;
  double (*lr)(const SchedulerConfig& config, double base_lr, int64_t total_periods, int64_t period);
};

using ScheduleRegistry = std::array<ScheduleEntry, option_count<SchedulerName>()>;
const ScheduleRegistry& schedule_registry();  // in SchedulerName order
const ScheduleEntry& schedule_entry(SchedulerName name);

}  // namespace kiln
