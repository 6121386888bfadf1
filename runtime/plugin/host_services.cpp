#include "plugin/host_services.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>

#include <ATen/DLConvertor.h>
#include <spdlog/spdlog.h>

#include "kiln/tensor.hpp"
#include "plugin/host_objects.hpp"

struct kiln_error {
  std::string message;
  kiln_error_code code = KILN_ERROR_UNKNOWN;
};

namespace kiln {

kiln_error* make_error(const std::string& message, kiln_error_code code) { return new kiln_error{message, code}; }

std::string take_error(kiln_error* error, kiln_error_code* code) {
  if (code) *code = error ? error->code : KILN_ERROR_UNKNOWN;
  if (error == nullptr) return {};
  std::string message = std::move(error->message);
  delete error;
  return message;
}

void BatchDeleter::operator()(kiln_batch* batch) const { delete batch; }

namespace {

// Every service is noexcept: an exception must never unwind into a plugin's C frames.
const PluginHost& self(const kiln_host* host) { return *static_cast<const PluginHost*>(host->host_data); }

kiln_error* error_new(const kiln_host*, const char* message) noexcept {
  try {
    return make_error(message ? message : "(no message)");
  } catch (...) {
    return nullptr;  // out of memory: the host reports a generic failure
  }
}

kiln_error* error_new_code(const kiln_host*, kiln_error_code code, const char* message) noexcept {
  try {
    // A code this host does not know is UNKNOWN: the list is closed per minor.
    const bool known = code >= KILN_ERROR_UNKNOWN && code <= KILN_ERROR_INTERNAL;
    return make_error(message ? message : "(no message)", known ? code : KILN_ERROR_UNKNOWN);
  } catch (...) {
    return nullptr;
  }
}

void log(const kiln_host* host, kiln_log_level level, const char* message) noexcept {
  try {
    const auto& id = self(host).plugin_id();
    const char* text = message ? message : "";
    switch (level) {
      case KILN_LOG_DEBUG: spdlog::debug("[{}] {}", id, text); break;
      case KILN_LOG_WARN: spdlog::warn("[{}] {}", id, text); break;
      case KILN_LOG_ERROR: spdlog::error("[{}] {}", id, text); break;
      default: spdlog::info("[{}] {}", id, text); break;
    }
  } catch (...) {
  }
}

void log_metric(const kiln_host* host, const char* name, double value, double weight, uint32_t flags) noexcept {
  try {
    if (name == nullptr) return;
    self(host).run()->record_metric(self(host).plugin_id(), name, value, weight, flags);
  } catch (const std::exception& e) {
    spdlog::error("[{}] log_metric('{}') failed: {}", self(host).plugin_id(), name, e.what());
  } catch (...) {
  }
}

// abi.h's [main-thread] rule, checked in debug builds: a plugin that calls
// a main-thread service from its own thread is told so at once.
void assert_main_thread(const kiln_host* host) noexcept {
  assert(self(host).on_main_thread() && "a [main-thread] kiln_host service was called from another thread (abi.h)");
  (void)host;
}

int metric_get(const kiln_host* host, const char* name, double* out) noexcept {
  assert_main_thread(host);
  try {
    return name && out && self(host).run()->metric(name, out) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void log_metric_tensor(const kiln_host* host, const char* name, const kiln_tensor* value, double weight,
                       uint32_t flags) noexcept {
  assert_main_thread(host);
  try {
    if (name == nullptr) return;
    self(host).run()->record_metric_tensor(self(host).plugin_id(), name, borrow_tensor(value), weight, flags);
  } catch (const std::exception& e) {
    spdlog::error("[{}] log_metric_tensor('{}') failed: {}", self(host).plugin_id(), name, e.what());
  } catch (...) {
  }
}

kiln_error* collect(const kiln_host* host, const char* name, const kiln_tensor* rows) noexcept {
  try {
    if (name == nullptr || rows == nullptr) return make_error("collect: the name or the rows are NULL");
    const std::string problem =
        self(host).run()->collect(self(host).plugin_id(), self(host).on_main_thread(), name, borrow_tensor(rows));
    return problem.empty() ? nullptr : make_error(problem, KILN_ERROR_FAILED_PRECONDITION);
  } catch (const std::exception& e) {
    try {
      return make_error(std::string("collect('") + name + "') failed: " + e.what());
    } catch (...) {
      return nullptr;
    }
  } catch (...) {
    return nullptr;
  }
}

// A data module sees one process (abi.h): the host shards, never the data module.
int32_t rank(const kiln_host* host) noexcept { return self(host).sees_ranks() ? self(host).run()->rank() : 0; }
int32_t world_size(const kiln_host* host) noexcept {
  return self(host).sees_ranks() ? self(host).run()->world_size() : 1;
}

void request_stop(const kiln_host* host, const char* reason) noexcept {
  assert_main_thread(host);
  try {
    self(host).run()->request_stop(self(host).plugin_id(), reason ? reason : "");
  } catch (...) {
  }
}

// at::fromDLPack trusts the header. A plain-C producer's mistakes are
// refused here, before LibTorch reads a field or touches an element.
std::string dlpack_problem(const DLTensor& t) {
  // Batches are host memory (abi.h); the host moves them to the run's device.
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    return "device type " + std::to_string(static_cast<int>(t.device.device_type)) +
           " is not host memory (a data module hands over CPU tensors; the host places them)";
  if (t.ndim < 0 || t.ndim > 64) return "ndim " + std::to_string(t.ndim) + " is out of range (0 to 64)";
  if (t.ndim > 0 && t.shape == nullptr) return "shape is NULL for a tensor of " + std::to_string(t.ndim) + " dimensions";
  if (t.dtype.lanes != 1) return "vector dtypes (lanes " + std::to_string(t.dtype.lanes) + ") are not supported";
  // `span` is the product of the sizes with 0 counted as 1: LibTorch's
  // contiguous strides. An empty tensor with huge other dimensions has few
  // elements but strides that overflow (and LibTorch 1.13 then crashes
  // reading them as symbolic sizes).
  int64_t numel = 1, span = 1, last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    const int64_t n = t.shape[i];
    if (n < 0) return "dimension " + std::to_string(i) + " has negative size " + std::to_string(n);
    if (__builtin_mul_overflow(numel, n, &numel) || __builtin_mul_overflow(span, std::max<int64_t>(n, 1), &span))
      return "the shape's element count overflows";
    if (t.strides != nullptr) {
      const int64_t stride = t.strides[i];
      if (stride < 0) return "negative strides are not supported (dimension " + std::to_string(i) + ")";
      int64_t reach = 0;
      if (n > 0 && (__builtin_mul_overflow(n - 1, stride, &reach) || __builtin_add_overflow(last, reach, &last)))
        return "the strides reach past any addressable memory";
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>((t.dtype.bits + 7) / 8), &bytes))
    return "the tensor's size in bytes overflows";
  if (numel > 0 && t.data == nullptr) return "data is NULL for a tensor of " + std::to_string(numel) + " elements";
  uintptr_t first = 0;
  if (t.data != nullptr && __builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), t.byte_offset, &first))
    return "byte_offset " + std::to_string(t.byte_offset) + " reaches past any addressable memory";
  // LibTorch's kernels read elements as their C++ type (vectorised, with
  // aligned loads for complex values): a first element off its natural
  // alignment is a crash in a copy, not an error. Elements of 1 to 16 bytes
  // are aligned to their size; numpy, LibTorch and malloc all give that.
  const uint64_t item = (t.dtype.bits + 7) / 8;
  if (numel > 0 && item > 1 && (item & (item - 1)) == 0 && first % std::min<uint64_t>(item, 16) != 0)
    return "the first element (data + byte_offset " + std::to_string(t.byte_offset) + ") is not aligned to its " +
           std::to_string(item) + "-byte size";
  return "";
}

// What LibTorch 1.13's fromDLPack gets in place of the producer's tensor
// when it would misread it: it ignores byte_offset (the tensor would start at
// `data`, not `data + byte_offset`: the wrong elements, silently) and refuses
// pinned host memory (kDLCUDAHost), which the CPU reads like any other. The
// copy of the header points at the first element, on the CPU; its deleter
// runs the producer's.
struct Rebased {
  DLManagedTensor outer{};
  DLManagedTensor* producer = nullptr;

  static void deleter(DLManagedTensor* self) {
    auto* rebased = static_cast<Rebased*>(self->manager_ctx);
    DLManagedTensor* producer = rebased->producer;
    delete rebased;
    if (producer->deleter != nullptr) producer->deleter(producer);
  }
};

kiln_tensor* tensor_from_dlpack(const kiln_host*, DLManagedTensor* managed, kiln_error** error) noexcept {
  std::string failure;
  try {
    if (managed == nullptr) throw std::invalid_argument("NULL tensor");
    if (std::string problem = dlpack_problem(managed->dl_tensor); !problem.empty())
      throw std::invalid_argument(problem);
    DLManagedTensor* handed = managed;
    std::unique_ptr<Rebased> rebased;
    const DLTensor& t = managed->dl_tensor;
    if (t.byte_offset != 0 || t.device.device_type == kDLCUDAHost) {
      rebased = std::make_unique<Rebased>();
      rebased->outer.dl_tensor = t;
      if (t.data != nullptr) rebased->outer.dl_tensor.data = static_cast<char*>(t.data) + t.byte_offset;
      rebased->outer.dl_tensor.byte_offset = 0;
      rebased->outer.dl_tensor.device = DLDevice{kDLCPU, 0};
      rebased->outer.manager_ctx = rebased.get();
      rebased->outer.deleter = &Rebased::deleter;
      rebased->producer = managed;
      handed = &rebased->outer;
    }
    // fromDLPack takes ownership: the producer's deleter runs when the
    // tensor's storage is freed. Until it returns, a failure leaves the
    // producer's deleter to the catch below (and `rebased` to its unique_ptr).
    at::Tensor tensor = at::fromDLPack(handed);
    rebased.release();  // now owned by the tensor's storage
    return release_tensor(std::move(tensor));  // cannot throw: the tensor is defined
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // The ABI promises ownership even on failure: free the producer's memory.
  // (fromDLPack throws only while checking dtype and device, before it
  // attaches the deleter to a tensor, so this cannot run it twice.)
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  if (error) *error = make_error("tensor_from_dlpack: " + failure);
  return nullptr;
}

DLManagedTensor* tensor_to_dlpack(const kiln_host*, const kiln_tensor* tensor, kiln_error** error) noexcept {
  try {
    if (tensor == nullptr) throw std::invalid_argument("tensor_to_dlpack: NULL tensor");
    at::Tensor t = borrow_tensor(tensor);
    if (t.requires_grad())
      throw std::invalid_argument("tensor_to_dlpack: a tensor that requires grad cannot cross as DLPack");
    return at::toDLPack(t);
  } catch (const c10::Error& e) {
    if (error) *error = make_error(std::string("tensor_to_dlpack: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (error) *error = make_error(e.what());
  }
  return nullptr;
}

kiln_tensor* tensor_retain(const kiln_host*, kiln_tensor* tensor) noexcept {
  if (tensor) c10::raw::intrusive_ptr::incref(reinterpret_cast<c10::TensorImpl*>(tensor));
  return tensor;
}

void tensor_release(const kiln_host*, kiln_tensor* tensor) noexcept {
  if (tensor) c10::raw::intrusive_ptr::decref(reinterpret_cast<c10::TensorImpl*>(tensor));
}

kiln_batch* batch_new(const kiln_host*) noexcept {
  try {
    return new kiln_batch();
  } catch (...) {
    return nullptr;
  }
}

kiln_error* batch_put(const kiln_host*, kiln_batch* batch, const char* name, kiln_tensor* tensor) noexcept {
  try {
    if (tensor == nullptr) return make_error("batch_put: NULL tensor");
    at::Tensor owned = adopt_tensor(tensor);  // ownership is ours even on failure
    if (batch == nullptr || name == nullptr) return make_error("batch_put: NULL batch or name");
    for (const auto& [existing, _] : batch->tensors)
      if (existing == name) return make_error(std::string("batch_put: the batch already has '") + name + "'");
    batch->tensors.emplace_back(name, std::move(owned));
    return nullptr;
  } catch (const std::exception& e) {
    return make_error(std::string("batch_put: ") + e.what());
  }
}

kiln_tensor* batch_get(const kiln_host*, const kiln_batch* batch, const char* name) noexcept {
  if (batch == nullptr || name == nullptr) return nullptr;
  for (const auto& [existing, tensor] : batch->tensors)
    if (existing == name) return reinterpret_cast<kiln_tensor*>(tensor.unsafeGetTensorImpl());
  return nullptr;
}

size_t batch_count(const kiln_host*, const kiln_batch* batch) noexcept { return batch ? batch->tensors.size() : 0; }

const char* batch_name_at(const kiln_host*, const kiln_batch* batch, size_t index) noexcept {
  if (batch == nullptr || index >= batch->tensors.size()) return nullptr;
  return batch->tensors[index].first.c_str();
}

void batch_release(const kiln_host*, kiln_batch* batch) noexcept { delete batch; }

kiln_error* state_write(const kiln_host* host, kiln_state_writer* writer, const char* key, const void* data,
                        size_t size) noexcept {
  assert_main_thread(host);
  try {
    if (writer == nullptr || key == nullptr) return make_error("state_write: NULL writer or key");
    writer->blobs[key] = std::string(static_cast<const char*>(data), size);
    return nullptr;
  } catch (const std::exception& e) {
    return make_error(std::string("state_write: ") + e.what());
  }
}

int state_read(const kiln_host* host, kiln_state_reader* reader, const char* key, const void** data,
               size_t* size) noexcept {
  assert_main_thread(host);
  if (reader == nullptr || reader->blobs == nullptr || key == nullptr) return 0;
  auto it = reader->blobs->find(key);
  if (it == reader->blobs->end()) return 0;
  *data = it->second.data();
  *size = it->second.size();
  return 1;
}

kiln_error* run_file_write(const kiln_host* host, const char* name, const void* data, size_t size) noexcept {
  assert_main_thread(host);
  try {
    if (name == nullptr || (data == nullptr && size > 0)) return make_error("run_file_write: NULL name or data");
    const std::string refused = self(host).run()->write_run_file(
        self(host).plugin_id(), name, std::string(static_cast<const char*>(data), size));
    return refused.empty() ? nullptr : make_error("run_file_write('" + std::string(name) + "'): " + refused);
  } catch (const std::exception& e) {
    return make_error(std::string("run_file_write: ") + e.what());
  }
}

}  // namespace

PluginHost::PluginHost(std::string plugin_id, RunServices* run, bool sees_ranks)
    : plugin_id_(std::move(plugin_id)), run_(run), sees_ranks_(sees_ranks) {
  table_.struct_size = sizeof(kiln_host);
  table_.abi_major = KILN_ABI_VERSION_MAJOR;
  table_.abi_minor = KILN_ABI_VERSION_MINOR;
  table_.kiln_version = KILN_VERSION;
  table_.host_data = this;
  table_.error_new = &error_new;
  table_.log = &log;
  table_.log_metric = &log_metric;
  table_.metric_get = &metric_get;
  table_.rank = &rank;
  table_.world_size = &world_size;
  table_.request_stop = &request_stop;
  table_.tensor_from_dlpack = &tensor_from_dlpack;
  table_.tensor_to_dlpack = &tensor_to_dlpack;
  table_.tensor_retain = &tensor_retain;
  table_.tensor_release = &tensor_release;
  table_.batch_new = &batch_new;
  table_.batch_put = &batch_put;
  table_.batch_get = &batch_get;
  table_.batch_count = &batch_count;
  table_.batch_name_at = &batch_name_at;
  table_.batch_release = &batch_release;
  table_.state_write = &state_write;
  table_.state_read = &state_read;
  table_.error_new_code = &error_new_code;
  table_.log_metric_tensor = &log_metric_tensor;
  table_.collect = &collect;
  table_.run_file_write = &run_file_write;
}

}  // namespace kiln
