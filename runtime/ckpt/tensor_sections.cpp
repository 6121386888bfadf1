#include "ckpt/tensor_sections.hpp"

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "ckpt/checkpoint_meta.hpp"

namespace kiln {

namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out + "]";
}

struct TensorSection {
  std::string dtype;
  std::vector<int64_t> sizes;
  std::string_view data;
};

// The plain (non-quantized) dtype c10::toString names `dtype`, if any.
std::optional<c10::ScalarType> dtype_named(const std::string& dtype) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (type != c10::ScalarType::Undefined && !c10::isQIntType(type) && dtype == c10::toString(type)) return type;
  }
  return std::nullopt;
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
  const auto type = dtype_named(out.dtype);
  if (!type) throw CheckpointError(where + " has an unknown dtype " + shown(out.dtype));
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
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(*type)), &bytes) ||
      out.data.size() != static_cast<uint64_t>(bytes))
    throw CheckpointError(where + " has the wrong number of bytes");
  return out;
}

// An RNG state section's bytes, as the byte tensor a generator takes.
at::Tensor read_rng_state(const CheckpointFile& file, const std::string& name, const std::string& what) {
  const TensorSection rng = parse_tensor(file, name);
  at::Tensor state = at::empty(rng.sizes, at::kByte);
  if (rng.data.size() != static_cast<size_t>(state.numel()))
    throw CheckpointError(file.path().string() + ": the " + what + " state section has the wrong size");
  std::memcpy(state.data_ptr(), rng.data.data(), rng.data.size());
  return state;
}

// LibTorch checks the state's size and version; its refusal is a damaged
// checkpoint to report in one line, not a crash.
void set_rng_state(const CheckpointFile& file, at::Generator generator, const at::Tensor& state, const std::string& what) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  try {
    generator.set_state(state);
  } catch (const c10::Error& e) {
    throw CheckpointError(file.path().string() + ": the " + what + " state is not one this LibTorch accepts (" +
                          e.what_without_backtrace() + ")");
  }
}

void add_rng_state(CheckpointSnapshot& snapshot, const std::string& name, at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  add_tensor_section(snapshot, name, generator.get_state());
}

}  // namespace

void add_tensor_section(CheckpointSnapshot& snapshot, const std::string& name, const at::Tensor& tensor) {
  // A copy of its own (even of a contiguous CPU tensor): the live one goes on training.
  const at::Tensor source = tensor.detach();
  std::shared_ptr<at::Tensor> copy;
  if (source.is_cuda()) {
    // Into pinned memory without waiting for the device: the copy is queued
    // on the tensor's stream, before anything the next step does to it, and
    // the writer waits for its event (CheckpointSnapshot::add_wait) before
    // it reads the bytes. The step loop does not wait for the copy.
    copy = std::make_shared<at::Tensor>(
        at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true)));
    copy->copy_(source, /*non_blocking=*/true);
    const c10::impl::VirtualGuardImpl guard(source.device().type());
    auto copied = std::make_shared<c10::Event>(source.device().type());
    copied->record(guard.getStream(source.device()));
    snapshot.add_wait([copied] {
      // query(), not a blocking wait: LibTorch 1.13's Event has no synchronize.
      while (!copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    });
  } else if (SnapshotBuffers* buffers = snapshot.buffers()) {
    // Into memory the previous snapshot of this section used: no page faults.
    std::shared_ptr<void> memory = buffers->take(name, static_cast<size_t>(source.numel()) * source.element_size());
    at::Tensor into = at::from_blob(memory.get(), source.sizes(), source.options().device(at::kCPU));
    into.copy_(source);
    copy = std::shared_ptr<at::Tensor>(new at::Tensor(std::move(into)),
                                       [memory](at::Tensor* t) { delete t; });  // the tensor borrows `memory`
  } else {
    copy = std::make_shared<at::Tensor>(source.to(at::TensorOptions().device(at::kCPU).dtype(source.scalar_type()),
                                                  /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous));
  }
  std::string sizes;
  for (int64_t d = 0; d < copy->dim(); ++d) sizes += (d ? "," : "") + std::to_string(copy->size(d));
  const std::string header = std::string(c10::toString(copy->scalar_type())) + " " + sizes + "\n";
  const void* data = copy->data_ptr();
  const size_t size = copy->numel() * copy->element_size();
  snapshot.add(name, header, std::shared_ptr<const void>(copy, copy.get()), data, size);
}

void restore_tensor_section(const CheckpointFile& file, const std::string& name, const std::string& what,
                            at::Tensor& target, bool convert_floating) {
  const TensorSection s = parse_tensor(file, name);
  const std::string dtype = c10::toString(target.scalar_type());
  if (s.sizes != target.sizes().vec())
    throw CheckpointError(file.path().string() + ": shape of '" + what + "' is " + shape_text(s.sizes) +
                          " in the checkpoint but " + shape_text(target.sizes()) + " in the model");
  const at::ScalarType saved = *dtype_named(s.dtype);  // parse_tensor has checked it is one
  if (s.dtype != dtype && !(convert_floating && at::isFloatingType(saved) && at::isFloatingType(target.scalar_type())))
    throw CheckpointError(file.path().string() + ": dtype of '" + what + "' is " + s.dtype + " in the checkpoint but " +
                          dtype + " in the model");
  if (s.data.size() != static_cast<size_t>(target.numel()) * c10::elementSize(saved))
    throw CheckpointError(file.path().string() + ": section '" + name + "' has the wrong number of bytes");
  at::Tensor source = at::empty(s.sizes, target.options().device(at::kCPU).dtype(saved));
  std::memcpy(source.data_ptr(), s.data.data(), s.data.size());
  at::NoGradGuard no_grad;
  target.copy_(source);
}

at::Tensor read_tensor_section(const CheckpointFile& file, const std::string& name) {
  const TensorSection s = parse_tensor(file, name);
  const auto type = dtype_named(s.dtype);
  if (!type) throw std::logic_error("no dtype named " + s.dtype);  // parse_tensor has checked it is one
  at::Tensor t = at::empty(s.sizes, at::TensorOptions().dtype(*type));
  if (s.data.size() != static_cast<size_t>(t.numel()) * t.element_size())
    throw CheckpointError(file.path().string() + ": section '" + name + "' has the wrong number of bytes");
  if (!s.data.empty()) std::memcpy(t.data_ptr(), s.data.data(), s.data.size());
  return t;
}

void ModelTensorsPart::save(CheckpointSnapshot& snapshot) const {
  for (const auto& [name, t] : tensors_) add_tensor_section(snapshot, prefix_ + name, t);
}

void ModelTensorsPart::check(const CheckpointFile& file) const {
  const std::string where = file.path().string();
  std::set<std::string> in_file, in_model;
  for (const auto& name : file.names())
    if (name.rfind(prefix_, 0) == 0) in_file.insert(name.substr(prefix_.size()));
  for (const auto& [name, t] : tensors_) in_model.insert(name);
  for (const auto& name : in_model)
    if (!in_file.count(name))
      throw CheckpointError(where + ": the model's " + what_ + " '" + name +
                            "' is not in the checkpoint (a checkpoint of another model?)");
  for (const auto& name : in_file)
    if (!in_model.count(name))
      throw CheckpointError(where + ": the checkpoint's " + what_ + " '" + name +
                            "' is not in the model (a checkpoint of another model?)");
}

void ModelTensorsPart::load(const CheckpointFile& file) {
  // A weight saved in another floating-point dtype is cast (a float32
  // checkpoint into a bf16-true model, and back).
  for (auto& [name, t] : tensors_) restore_tensor_section(file, prefix_ + name, name, t, /*convert_floating=*/true);
}

void RngPart::save(CheckpointSnapshot& snapshot) const {
  add_rng_state(snapshot, "rng/cpu", at::detail::getDefaultCPUGenerator());
  if (device_.is_cuda()) add_rng_state(snapshot, "rng/cuda", at::globalContext().defaultGenerator(device_));
}

void RngPart::load(const CheckpointFile& file) {
  // The default generators are shared: setting a copy's state sets theirs.
  set_rng_state(file, at::detail::getDefaultCPUGenerator(), read_rng_state(file, "rng/cpu", "RNG"), "RNG");
  if (device_.is_cuda() && file.has("rng/cuda"))
    set_rng_state(file, at::globalContext().defaultGenerator(device_), read_rng_state(file, "rng/cuda", "CUDA RNG"),
                  "CUDA RNG");
}

}  // namespace kiln
