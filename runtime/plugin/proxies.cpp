#include "plugin/proxies.hpp"

#include <fmt/format.h>

#include "kiln/tensor.hpp"
#include "plugin/host_objects.hpp"
#include "util/activity.hpp"

namespace kiln {

namespace {

using EvalHook = decltype(&kiln_model_hooks::validation_step);
using CallbackHook = kiln_callback_hook kiln_callback_hooks::*;

CallbackHook hook_of(Event event) {
  switch (event) {
    case Event::fit_start: return &kiln_callback_hooks::on_fit_start;
    case Event::train_epoch_start: return &kiln_callback_hooks::on_train_epoch_start;
    case Event::train_batch_end: return &kiln_callback_hooks::on_train_batch_end;
    case Event::train_epoch_end: return &kiln_callback_hooks::on_train_epoch_end;
    case Event::validation_start: return &kiln_callback_hooks::on_validation_start;
    case Event::validation_end: return &kiln_callback_hooks::on_validation_end;
    case Event::test_end: return &kiln_callback_hooks::on_test_end;
    case Event::fit_end: return &kiln_callback_hooks::on_fit_end;
  }
  return nullptr;
}

}  // namespace

bool ModelProxy::has_step(kiln_split split) const {
  const kiln_model_hooks& hooks = model_.plugin().model_hooks();
  switch (split) {
    case KILN_SPLIT_TRAIN: return hooks.training_step != nullptr;
    case KILN_SPLIT_VAL: return hooks.validation_step != nullptr;
    case KILN_SPLIT_TEST: return hooks.test_step != nullptr;
    default: return hooks.predict_step != nullptr;
  }
}

at::Tensor ModelProxy::training_step(kiln_batch& batch, int64_t batch_index) {
  kiln_tensor* handle = nullptr;
  {
    InHook in(activity_, "training_step");
    model_.check(model_.plugin().model_hooks().training_step(model_.instance(), &batch, batch_index, &handle),
                 "training_step");
  }
  if (handle == nullptr) throw HookError(id(), "model", "training_step", "returned no loss");
  at::Tensor loss = adopt_tensor(handle);
  if (loss.numel() != 1)
    throw HookError(id(), "model", "training_step", fmt::format("the loss must be a scalar, got {} values", loss.numel()));
  if (!loss.requires_grad())
    throw HookError(id(), "model", "training_step",
                    "the loss does not require grad (was it computed under NoGradGuard or detached?)");
  return loss;
}

void ModelProxy::evaluation_step(kiln_split split, kiln_batch& batch, int64_t batch_index) {
  const bool is_val = split == KILN_SPLIT_VAL;
  const char* name = is_val ? "validation_step" : "test_step";
  const EvalHook hook = is_val ? &kiln_model_hooks::validation_step : &kiln_model_hooks::test_step;
  InHook in(activity_, name);
  model_.check((model_.plugin().model_hooks().*hook)(model_.instance(), &batch, batch_index), name);
}

at::Tensor ModelProxy::predict_step(kiln_batch& batch, int64_t batch_index) {
  kiln_tensor* out = nullptr;
  {
    InHook in(activity_, "predict_step");
    model_.check(model_.plugin().model_hooks().predict_step(model_.instance(), &batch, batch_index, &out),
                 "predict_step");
  }
  if (out == nullptr) throw HookError(id(), "model", "predict_step", "returned no output");
  return adopt_tensor(out);
}

void ModelProxy::on_epoch_end(kiln_split split, const kiln_batch& collected) {
  const auto hook = model_.plugin().model_on_epoch_end();
  if (hook == nullptr) return;
  InHook in(activity_, "on_epoch_end");
  model_.check(hook(model_.instance(), split, &collected), "on_epoch_end");
}

void ModelProxy::check_batch(kiln_split split, const kiln_batch& sample) {
  const auto hook = model_.plugin().model_check_batch();
  if (hook == nullptr) return;
  InHook in(activity_, "check_batch");
  model_.check(hook(model_.instance(), split, &sample), "check_batch");
}

ModelProxy::Tensors ModelProxy::parameters() {
  struct Visit {
    Tensors tensors;
    std::string error;
  } visit;
  auto visitor = [](void* context, const char* name, kiln_tensor* tensor, uint32_t flags) noexcept {
    auto* v = static_cast<Visit*>(context);
    try {
      auto& list = flags == KILN_TENSOR_BUFFER ? v->tensors.buffers : v->tensors.params;
      list.emplace_back(name ? name : "", borrow_tensor(tensor));
    } catch (const std::exception& e) {
      v->error = e.what();
    }
  };
  {
    InHook in(activity_, "parameters");
    model_.check(model_.plugin().model_hooks().parameters(model_.instance(), &visit, visitor), "parameters");
  }
  if (!visit.error.empty()) throw std::runtime_error("reading the model's parameters: " + visit.error);
  return std::move(visit.tensors);
}

int64_t DataModuleProxy::length(kiln_split split) {
  int64_t n = 0;
  data_.check(data_.plugin().data_hooks().length(data_.instance(), split, &n), "length");
  if (n < 0) refuse("length", "returned a negative length");
  return n;
}

void DataModuleProxy::refuse(const std::string& hook, const std::string& message) const {
  throw HookError(data_.id(), "data", hook, message);
}

CallbackSet::CallbackSet(const std::vector<std::unique_ptr<PluginInstance>>& callbacks, Activity* activity)
    : activity_(activity) {
  for (size_t e = 0; e < hooked_.size(); ++e) {
    const CallbackHook hook = hook_of(static_cast<Event>(e));
    for (const auto& cb : callbacks)
      if (kiln_callback_hook fn = cb->plugin().callback_hooks().*hook) hooked_[e].push_back({cb.get(), fn});
  }
  for (const auto& cb : callbacks)
    if (cb->plugin().callback_on_epoch_collected()) collected_.push_back(cb.get());
}

void CallbackSet::epoch_collected(const kiln_progress& progress, kiln_split split, const kiln_batch& collected) {
  for (PluginInstance* cb : collected_) {
    InHook in(activity_, "on_epoch_collected");
    cb->check(cb->plugin().callback_on_epoch_collected()(cb->instance(), &progress, split, &collected),
              "on_epoch_collected");
  }
}

void CallbackSet::notify(Event event, const kiln_progress& progress) {
  const auto& hooked = hooked_[static_cast<size_t>(event)];
  if (hooked.empty()) return;
  const char* name = event_name(event);
  for (const Hooked& h : hooked) {
    InHook in(activity_, name);
    h.callback->check(h.hook(h.callback->instance(), &progress), name);
  }
}

std::map<std::string, std::string> save_plugin_state(const PluginInstance& plugin) {
  kiln_state_writer writer;
  if (auto fn = plugin.plugin().lifecycle().state_save)
    plugin.check(fn(plugin.instance(), &writer), "state_save");
  return writer.blobs;
}

void load_plugin_state(const PluginInstance& plugin, const std::map<std::string, std::string>& blobs) {
  auto fn = plugin.plugin().lifecycle().state_load;
  if (!fn) return;
  kiln_state_reader reader;
  reader.blobs = &blobs;
  plugin.check(fn(plugin.instance(), &reader), "state_load");
}

}  // namespace kiln
