#include "ckpt/run_state.hpp"

#include <cmath>
#include <cstdio>

#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/retention.hpp"
#include "util/errors.hpp"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <system_error>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include "train/optim_registry.hpp"
#include "train/param_groups.hpp"

namespace kiln {

namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

// A tensor section: "<dtype> <d0,d1,...>\n" then the contiguous CPU bytes.
void add_tensor(CheckpointWriter& writer, const std::string& name, const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  std::string sizes;
  for (int64_t d = 0; d < t.dim(); ++d) sizes += (d ? "," : "") + std::to_string(t.size(d));
  const std::string header = std::string(c10::toString(t.scalar_type())) + " " + sizes + "\n";
  writer.add(name, header, t.data_ptr(), t.numel() * t.element_size());
}

struct TensorSection {
  std::string dtype;
  std::vector<int64_t> sizes;
  std::string_view data;
};

// The element size of a dtype named as c10::toString names it, or 0 for a
// name that is not a plain (non-quantized) dtype.
size_t element_size(const std::string& dtype) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (type == c10::ScalarType::Undefined || c10::isQIntType(type) || dtype != c10::toString(type)) continue;
    return c10::elementSize(type);
  }
  return 0;
}

// Parses "<dtype> <d0,d1,...>\n<bytes>" and checks that the bytes are exactly
// what dtype and shape need: whatever a caller allocates from `sizes` is then
// bounded by the section's size, so by the file's.
TensorSection parse_tensor(const CheckpointFile& file, const std::string& name) {
  const std::string_view raw = file.section(name);
  const std::string where = file.path().string() + ": section '" + name + "'";
  const size_t newline = raw.find('\n');
  const size_t space = raw.substr(0, newline).find(' ');
  if (newline == std::string_view::npos || space == std::string_view::npos)
    throw CheckpointError(where + " is not a tensor");
  TensorSection out;
  out.dtype = std::string(raw.substr(0, space));
  const size_t item = element_size(out.dtype);
  if (item == 0) throw CheckpointError(where + " has an unknown dtype " + shown(out.dtype));
  std::string_view sizes = raw.substr(space + 1, newline - space - 1);
  int64_t numel = 1;
  while (!sizes.empty()) {
    const size_t comma = sizes.find(',');
    const int64_t n = parse_count(file, "a dimension of section '" + name + "'", sizes.substr(0, comma));
    out.sizes.push_back(n);
    if (__builtin_mul_overflow(numel, n, &numel)) throw CheckpointError(where + " has a shape too large to hold");
    if (comma == std::string_view::npos) break;
    sizes.remove_prefix(comma + 1);
    if (sizes.empty()) throw CheckpointError(where + " is not a tensor (its shape ends with a comma)");
  }
  out.data = raw.substr(newline + 1);
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(item), &bytes) || out.data.size() != static_cast<uint64_t>(bytes))
    throw CheckpointError(where + " has the wrong number of bytes");
  return out;
}

// The plain dtype c10::toString names `dtype` (parse_tensor has checked it is one).
c10::ScalarType scalar_type_named(const std::string& dtype) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (type != c10::ScalarType::Undefined && !c10::isQIntType(type) && dtype == c10::toString(type)) return type;
  }
  throw std::logic_error("no dtype named " + dtype);
}

// Copies section `name` into `target` after checking dtype and shape.
void restore_tensor(const CheckpointFile& file, const std::string& name, const std::string& what, at::Tensor& target) {
  const TensorSection s = parse_tensor(file, name);
  const std::string dtype = c10::toString(target.scalar_type());
  if (s.sizes != target.sizes().vec())
    throw CheckpointError(file.path().string() + ": shape of '" + what + "' is " + shape_text(s.sizes) +
                          " in the checkpoint but " + shape_text(target.sizes()) + " in the model");
  if (s.dtype != dtype)
    throw CheckpointError(file.path().string() + ": dtype of '" + what + "' is " + s.dtype + " in the checkpoint but " +
                          dtype + " in the model");
  if (s.data.size() != static_cast<size_t>(target.numel() * target.element_size()))
    throw CheckpointError(file.path().string() + ": section '" + name + "' has the wrong number of bytes");
  at::Tensor source = at::empty(s.sizes, target.options().device(at::kCPU));
  std::memcpy(source.data_ptr(), s.data.data(), s.data.size());
  at::NoGradGuard no_grad;
  target.copy_(source);
}

at::Tensor load_tensor(const CheckpointFile& file, const std::string& name, const at::Tensor& like) {
  at::Tensor t = at::empty_like(like);
  restore_tensor(file, name, name, t);
  return t;
}

// The optimizer's per-parameter state, as sections "optim/<i>/<field>" with
// the fields its registry entry gives.
void save_optimizer(CheckpointWriter& writer, torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  const OptimizerEntry* entry = optimizer_entry_of(optimizer);
  if (!entry) throw std::logic_error("checkpoint: the optimizer was not built by kiln's optimizer registry");
  auto& states = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = states.find(optimizer_state_key(params[i]));
    if (it == states.end()) continue;  // no step taken yet for this parameter
    const std::string prefix = "optim/" + std::to_string(i) + "/";
    const ParamStateFields fields = entry->save_state(*it->second);
    for (const auto& [name, text] : fields.texts) writer.add(prefix + name, text);
    for (const auto& [name, tensor] : fields.tensors) add_tensor(writer, prefix + name, tensor);
  }
}

// One parameter's "optim/<i>/" sections.
class SectionFields : public ParamStateReader {
 public:
  SectionFields(const CheckpointFile& file, size_t index, const at::Tensor& param)
      : file_(file), prefix_("optim/" + std::to_string(index) + "/"), param_(param) {}
  bool has(const std::string& field) const override { return file_.has(prefix_ + field); }
  at::Tensor tensor(const std::string& field) const override { return load_tensor(file_, prefix_ + field, param_); }
  int64_t count(const std::string& field) const override {
    return parse_count(file_, "section '" + prefix_ + field + "'", file_.section(prefix_ + field));
  }

 private:
  const CheckpointFile& file_;
  std::string prefix_;
  const at::Tensor& param_;
};

void restore_optimizer(const CheckpointFile& file, torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& params) {
  const OptimizerEntry* entry = optimizer_entry_of(optimizer);
  if (!entry) throw std::logic_error("checkpoint: the optimizer was not built by kiln's optimizer registry");
  auto& states = optimizer.state();
  states.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const SectionFields fields(file, i, params[i]);
    if (fields.has(entry->state_marker)) {
      states[optimizer_state_key(params[i])] = entry->load_state(fields);
      continue;
    }
    for (const auto& other : optimizer_registry()) {
      if (fields.has(other.state_marker))
        throw CheckpointError(file.path().string() + ": the checkpoint holds " + other.state_name +
                              " state, but the optimizer is " + option_name(entry->name) +
                              " (optimizer.name differs from the checkpointed run's)");
    }
  }
}

// "scale <g>\ngrowth_tracker <n>\nskipped <n>\n", as save_run_state writes it.
ScalerState read_scaler(const CheckpointFile& file) {
  const std::string text(file.section("amp/scaler"));
  const std::string where = file.path().string() + ": section 'amp/scaler'";
  ScalerState state;
  double scale = 0;
  long long growth = -1, skipped = -1;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "scale %lg growth_tracker %lld skipped %lld%n", &scale, &growth, &skipped, &consumed) !=
          3 ||
      !(scale > 0) || !std::isfinite(scale) || growth < 0 || skipped < 0)
    throw CheckpointError(where + " is not a gradient scaler's state (" + printable(text) + ")");
  state.scale = scale;
  state.growth_tracker = growth;
  state.skipped = skipped;
  return state;
}

}  // namespace

at::Tensor read_tensor_section(const CheckpointFile& file, const std::string& name) {
  const TensorSection s = parse_tensor(file, name);
  at::Tensor t = at::empty(s.sizes, at::TensorOptions().dtype(scalar_type_named(s.dtype)));
  if (s.data.size() != static_cast<size_t>(t.numel()) * t.element_size())
    throw CheckpointError(file.path().string() + ": section '" + name + "' has the wrong number of bytes");
  if (!s.data.empty()) std::memcpy(t.data_ptr(), s.data.data(), s.data.size());
  return t;
}

void save_run_state(const std::filesystem::path& file, const RunStateView& s) {
  CheckpointWriter writer(file);
  writer.add("meta", meta_text(s.position, s.monitor, s.monitored, s.saved_by));
  writer.add("manifest", s.manifest_text);
  for (const auto& [name, t] : *s.params) add_tensor(writer, "param/" + name, t);
  for (const auto& [name, t] : *s.buffers) add_tensor(writer, "buffer/" + name, t);
  if (s.optimizer && s.trainable) save_optimizer(writer, *s.optimizer, *s.trainable);
  if (s.optimizer && !s.optimizer_groups.empty()) writer.add("optim/groups", s.optimizer_groups);
  {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    add_tensor(writer, "rng/cpu", generator.get_state());
  }
  if (s.device.is_cuda()) {
    at::Generator generator = at::globalContext().defaultGenerator(s.device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    add_tensor(writer, "rng/cuda", generator.get_state());
  }
  for (const auto& [id, blobs] : s.plugin_states)
    for (const auto& [key, bytes] : blobs) writer.add("plugin/" + id + "/" + key, bytes);
  if (s.scaler) {
    char text[128];
    std::snprintf(text, sizeof text, "scale %.17g\ngrowth_tracker %lld\nskipped %lld\n", s.scaler->scale,
                  static_cast<long long>(s.scaler->growth_tracker), static_cast<long long>(s.scaler->skipped));
    writer.add("amp/scaler", text);
  }
  writer.add("metrics/latest", s.metrics_latest);
  writer.add("metrics/pending", s.metrics_pending);
  for (size_t r = 0; r < s.metrics_state.size(); ++r) writer.add("metrics/state/" + std::to_string(r), s.metrics_state[r]);
  for (size_t r = 0; r < s.tensor_metrics_state.size(); ++r)
    writer.add("metrics/tensor_state/" + std::to_string(r), s.tensor_metrics_state[r]);
  writer.add("metrics/csv", s.csv);
  if (!s.loggers.empty()) writer.add("metrics/loggers", s.loggers);  // absent: csv only, as before
  writer.commit();
}

void restore_run_state(const CheckpointFile& file, RunStateView& s) {
  const std::string where = file.path().string();
  // Names first, parameters and buffers alike: a checkpoint of another model
  // is named as such, not as a shape error on its first tensor.
  auto same_names = [&](const std::string& prefix, const NamedTensors& model, const char* what) {
    std::set<std::string> in_file, in_model;
    for (const auto& name : file.names())
      if (name.rfind(prefix, 0) == 0) in_file.insert(name.substr(prefix.size()));
    for (const auto& [name, t] : model) in_model.insert(name);
    for (const auto& name : in_model)
      if (!in_file.count(name))
        throw CheckpointError(where + ": the model's " + what + " '" + name +
                              "' is not in the checkpoint (a checkpoint of another model?)");
    for (const auto& name : in_file)
      if (!in_model.count(name))
        throw CheckpointError(where + ": the checkpoint's " + what + " '" + name +
                              "' is not in the model (a checkpoint of another model?)");
  };
  same_names("param/", *s.params, "parameter");
  same_names("buffer/", *s.buffers, "buffer");
  // The same optimization, or none of it: groups, their parameters and
  // options as the checkpointed run had them (checkpoints from before
  // parameter groups had one group and no "optim/groups").
  if (s.optimizer && !s.optimizer_groups.empty()) {
    if (file.has("optim/groups")) {
      if (auto difference = param_groups_difference(std::string(file.section("optim/groups")), s.optimizer_groups))
        throw CheckpointError(where + ": the optimizer differs from the checkpointed run's: " + *difference +
                              " (resume with the optimizer settings the run was started with)");
    } else if (s.optimizer_groups.find("group optimizer.groups[") != std::string::npos) {
      throw CheckpointError(where + ": the checkpoint has no [[optimizer.groups]] (it was written before kiln had "
                                    "parameter groups) but the manifest has some (resume without them)");
    }
  }

  for (auto& [name, t] : *s.params) restore_tensor(file, "param/" + name, name, t);
  for (auto& [name, t] : *s.buffers) restore_tensor(file, "buffer/" + name, name, t);
  if (s.optimizer && s.trainable) restore_optimizer(file, *s.optimizer, *s.trainable);

  const TensorSection rng = parse_tensor(file, "rng/cpu");
  at::Tensor state = at::empty(rng.sizes, at::kByte);
  if (rng.data.size() != static_cast<size_t>(state.numel()))
    throw CheckpointError(where + ": the RNG state section has the wrong size");
  std::memcpy(state.data_ptr(), rng.data.data(), rng.data.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the default generator
  std::lock_guard<std::mutex> lock(generator.mutex());
  // LibTorch checks the state's size and version; its refusal is a damaged
  // checkpoint to report in one line, not a crash.
  try {
    generator.set_state(state);
  } catch (const c10::Error& e) {
    throw CheckpointError(where + ": the RNG state is not one this LibTorch accepts (" + e.what_without_backtrace() + ")");
  }

  if (s.device.is_cuda() && file.has("rng/cuda")) {
    const TensorSection cuda = parse_tensor(file, "rng/cuda");
    at::Tensor cuda_state = at::empty(cuda.sizes, at::kByte);
    if (cuda.data.size() != static_cast<size_t>(cuda_state.numel()))
      throw CheckpointError(where + ": the CUDA RNG state section has the wrong size");
    std::memcpy(cuda_state.data_ptr(), cuda.data.data(), cuda.data.size());
    at::Generator cuda_generator = at::globalContext().defaultGenerator(s.device);
    std::lock_guard<std::mutex> cuda_lock(cuda_generator.mutex());
    try {
      cuda_generator.set_state(cuda_state);
    } catch (const c10::Error& e) {
      throw CheckpointError(where + ": the CUDA RNG state is not one this LibTorch accepts (" +
                            e.what_without_backtrace() + ")");
    }
  }

  const CheckpointMeta meta = read_meta(file);
  s.position = meta.position;
  s.saved_by = meta.saved_by;
  s.monitored = meta.monitored;
  s.plugin_states.clear();
  for (const auto& name : file.names()) {
    if (name.rfind("plugin/", 0) != 0) continue;
    const size_t slash = name.find('/', 7);
    if (slash == std::string::npos) continue;
    s.plugin_states[name.substr(7, slash - 7)][name.substr(slash + 1)] = std::string(file.section(name));
  }
  if (s.scaler && file.has("amp/scaler")) *s.scaler = read_scaler(file);
  s.metrics_latest = std::string(file.section("metrics/latest"));
  s.metrics_pending = std::string(file.section("metrics/pending"));
  s.metrics_state.clear();
  s.tensor_metrics_state.clear();
  for (size_t r = 0; file.has("metrics/state/" + std::to_string(r)); ++r) {
    const std::string tensors = "metrics/tensor_state/" + std::to_string(r);
    if (!file.has(tensors)) throw CheckpointError(where + ": section '" + tensors + "' is missing");
    s.metrics_state.emplace_back(file.section("metrics/state/" + std::to_string(r)));
    s.tensor_metrics_state.emplace_back(file.section(tensors));
  }
  if (!s.metrics_state.empty() && meta.saved_by.world_size > 0 &&
      s.metrics_state.size() != static_cast<size_t>(meta.saved_by.world_size))
    throw CheckpointError(where + ": it holds the metrics of " + std::to_string(s.metrics_state.size()) +
                          " ranks but was saved by " + std::to_string(meta.saved_by.world_size));
  s.csv = std::string(file.section("metrics/csv"));
  s.loggers = file.has("metrics/loggers") ? std::string(file.section("metrics/loggers")) : "";
}

}  // namespace kiln
