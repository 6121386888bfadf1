#include "train/run/model_state.hpp"

#include <spdlog/spdlog.h>

#include "plugin/proxies.hpp"
#include "train/model_parameters.hpp"
#include "util/errors.hpp"

namespace kiln {

void collect_model_state(ModelProxy& model, c10::Device device, Command command, TrainingState& state, bool bf16,
                         bool sharded) {
  ModelProxy::Tensors tensors = model.parameters();
  if (tensors.params.empty() && command == Command::fit)
    throw HookError(model.id(), "model", "parameters", "the model has no parameters to train");
  // set_data: the plugin holds the same tensors, and sees them moved and cast.
  for (auto* list : {&tensors.params, &tensors.buffers})
    for (auto& [name, tensor] : *list) {
      if (tensor.device() != device) tensor.set_data(tensor.to(device));
      if (bf16 && at::isFloatingType(tensor.scalar_type()) && tensor.scalar_type() != at::kBFloat16)
        tensor.set_data(tensor.to(at::kBFloat16));
    }
  state.params = std::move(tensors.params);
  state.buffers = std::move(tensors.buffers);
  state.trainable.clear();
  state.trainable_names.clear();
  int64_t count = 0;
  for (auto& [name, tensor] : state.params) {
    if (tensor.requires_grad()) {
      state.trainable.push_back(tensor);
      state.trainable_names.push_back(name);
    }
    count += tensor.numel();
  }
  spdlog::info("model '{}': {} parameter tensors ({} values), {} buffers", model.id(), state.params.size(), count,
               state.buffers.size());
  if (command == Command::fit)
    for (const std::string& line : model_summary(parameter_infos(state.params))) spdlog::info("  {}", line);
  if (spdlog::should_log(spdlog::level::debug) && !sharded) {
    // A like-for-like marker: bench/ compares it with a hand-written loop.
    double sum = 0;
    for (auto& [name, tensor] : state.params) sum += tensor.sum().item<double>();
    spdlog::debug("initial parameter sum {:.6f}", sum);
  }
}

}  // namespace kiln
