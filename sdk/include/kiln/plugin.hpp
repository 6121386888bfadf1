// kiln/plugin.hpp — the C++ SDK: base classes for the three plugin kinds, the
// export macro, and exception capture at the ABI boundary.
//
//   class Mlp : public kiln::Model {
//    public:
//     Mlp(const kiln::Host& host, kiln::Config& config) : kiln::Model(host) { ... }
//     torch::nn::Module& module() override { return *net_; }
//     at::Tensor training_step(const kiln::Batch& batch, int64_t index) override { ... }
//   };
//   KILN_EXPORT_PLUGINS(kiln::describe<Mlp>({"org.example.mlp", "MLP", "1.0"}))
//
// Every C entry point generated here catches every exception and turns it into
// a kiln_error, so nothing unwinds through the host's C frames. A hook the
// plugin class does not override is exported as NULL ("not implemented").
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

#include "kiln/abi.h"
#include "kiln/config.hpp"
#include "kiln/detail/tensor_bytes.hpp"
#include "kiln/tensor.hpp"

#define KILN_SDK_STRINGIFY2(x) #x
#define KILN_SDK_STRINGIFY(x) KILN_SDK_STRINGIFY2(x)
// The LibTorch this plugin is compiled against, as the loader checks it.
#define KILN_SDK_TORCH_VERSION \
  KILN_SDK_STRINGIFY(TORCH_VERSION_MAJOR) "." KILN_SDK_STRINGIFY(TORCH_VERSION_MINOR)

namespace kiln {

enum class Stage : int32_t {
  fit = KILN_STAGE_FIT,
  validate = KILN_STAGE_VALIDATE,
  test = KILN_STAGE_TEST,
  predict = KILN_STAGE_PREDICT
};
enum class Split : int32_t {
  train = KILN_SPLIT_TRAIN,
  val = KILN_SPLIT_VAL,
  test = KILN_SPLIT_TEST,
  predict = KILN_SPLIT_PREDICT
};

// The host's services, seen from C++. Cheap to copy.
class Host {
 public:
  explicit Host(const kiln_host* host) : host_(host) {}

  void debug(const std::string& m) const { host_->log(host_, KILN_LOG_DEBUG, m.c_str()); }
  void info(const std::string& m) const { host_->log(host_, KILN_LOG_INFO, m.c_str()); }
  void warn(const std::string& m) const { host_->log(host_, KILN_LOG_WARN, m.c_str()); }
  void error(const std::string& m) const { host_->log(host_, KILN_LOG_ERROR, m.c_str()); }

  // Records a metric value; see kiln_host.log_metric.
  void log_metric(const std::string& name, double value, double weight = 1.0,
                  uint32_t flags = KILN_METRIC_REDUCE_MEAN) const {
    host_->log_metric(host_, name.c_str(), value, weight, flags);
  }
  // Records a one-element tensor metric without reading it back (ABI 1.1's
  // log_metric_tensor: the host reads it at log points, so a CUDA step never
  // waits for the device). In a 1.0 host, which lacks it, the value is read
  // here and recorded with log_metric: same result, one sync.
  void log_metric(const std::string& name, const at::Tensor& value, double weight = 1.0,
                  uint32_t flags = KILN_METRIC_REDUCE_MEAN) const {
    if (KILN_HAS_FIELD(host_, kiln_host, log_metric_tensor) && host_->log_metric_tensor != nullptr) {
      host_->log_metric_tensor(host_, name.c_str(), reinterpret_cast<const kiln_tensor*>(value.unsafeGetTensorImpl()),
                               weight, flags);
      return;
    }
    host_->log_metric(host_, name.c_str(), value.item<double>(), weight, flags);
  }
  std::optional<double> metric(const std::string& name) const {
    double value = 0;
    if (host_->metric_get(host_, name.c_str(), &value)) return value;
    return std::nullopt;
  }
  int32_t rank() const { return host_->rank(host_); }
  int32_t world_size() const { return host_->world_size(host_); }
  void request_stop(const std::string& reason) const { host_->request_stop(host_, reason.c_str()); }
  // Hands the host one row per sample of the step's batch (ABI 1.2's
  // collect), for a metric over the whole split: the rows of every rank come
  // back, in sample order, to Model::on_epoch_end (docs/metrics.md). Only
  // inside training_step, validation_step and test_step. Throws when the
  // host refuses the rows, or lacks collect (a 1.0 or 1.1 host).
  void collect(const std::string& name, const at::Tensor& rows) const;
  // Saves `bytes` as <run.dir>/<plugin id>/<name> (ABI 1.3's
  // run_file_write; rank 0's is written, after the start-up agreement).
  // False, with nothing saved, in a host that lacks it (1.0 to 1.2); throws
  // when the host refuses the name.
  bool write_run_file(const std::string& name, const std::string& bytes) const;

  const kiln_host* raw() const { return host_; }

 private:
  const kiln_host* host_;
};

// A batch handed to a model hook: named tensors, borrowed from the host.
class Batch {
 public:
  Batch(const kiln_host* host, const kiln_batch* batch) : host_(host), batch_(batch) {}

  bool has(const std::string& name) const { return host_->batch_get(host_, batch_, name.c_str()); }
  // batch["input"] builds no std::string (a step calls this once a tensor).
  at::Tensor operator[](const char* name) const {
    kiln_tensor* handle = host_->batch_get(host_, batch_, name);
    if (handle == nullptr) throw std::runtime_error("batch has no tensor named '" + std::string(name) + "'");
    return borrow_tensor(handle);
  }
  at::Tensor operator[](const std::string& name) const { return (*this)[name.c_str()]; }
  // The batch's names, in the order the data module put them.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    const size_t n = host_->batch_count(host_, batch_);
    for (size_t i = 0; i < n; ++i)
      if (const char* name = host_->batch_name_at(host_, batch_, i)) out.emplace_back(name);
    return out;
  }

 private:
  const kiln_host* host_;
  const kiln_batch* batch_;
};

// The rows every rank collected in an epoch, ordered by sample index, each
// sample once: the names the steps collected, and index() (ABI 1.2).
class Collected : public Batch {
 public:
  using Batch::Batch;
  // The sample index of each row (int64 [N]).
  at::Tensor index() const { return (*this)["kiln.index"]; }
  int64_t size() const { return index().size(0); }
  bool empty() const { return size() == 0; }
};

// What a data module returns from get_batch.
using TensorMap = std::vector<std::pair<std::string, at::Tensor>>;

// An error the host already made (e.g. by a failing service); the boundary
// returns it as-is instead of wrapping it in a new one.
struct HostError {
  kiln_error* error;
};

// Plugin state for checkpoints: named blobs of bytes.
class StateWriter {
 public:
  StateWriter(const kiln_host* host, kiln_state_writer* writer) : host_(host), writer_(writer) {}
  void write(const std::string& key, const std::string& bytes) {
    if (kiln_error* e = host_->state_write(host_, writer_, key.c_str(), bytes.data(), bytes.size()))
      throw HostError{e};
  }
  // A dense tensor as plain bytes (kiln/detail/tensor_bytes.hpp): dtype,
  // shape and data, never a pickle.
  void write_tensor(const std::string& key, const at::Tensor& tensor) { write(key, detail::tensor_to_bytes(tensor)); }

 private:
  const kiln_host* host_;
  kiln_state_writer* writer_;
};

class StateReader {
 public:
  StateReader(const kiln_host* host, kiln_state_reader* reader) : host_(host), reader_(reader) {}
  std::optional<std::string> read(const std::string& key) const {
    const void* data = nullptr;
    size_t size = 0;
    if (!host_->state_read(host_, reader_, key.c_str(), &data, &size)) return std::nullopt;
    return std::string(static_cast<const char*>(data), size);
  }
  // What write_tensor wrote, as a CPU tensor. Nothing in the checkpoint is
  // executed (no torch::load: a TorchScript archive can carry code), and a
  // header that does not match its data throws std::invalid_argument.
  std::optional<at::Tensor> read_tensor(const std::string& key) const {
    auto bytes = read(key);
    if (!bytes) return std::nullopt;
    return detail::tensor_from_bytes(*bytes);
  }

 private:
  const kiln_host* host_;
  kiln_state_reader* reader_;
};

struct ExceptionInfo {
  kiln_failure_reason reason;
  std::string message;
  std::string plugin_id;  // empty when the host failed
  std::string hook;       // empty when the host failed
  int32_t rank;
};

// What every plugin kind shares. Override what you need; the constructor is
// `T(const kiln::Host&, kiln::Config&)` and does the work of `create`.
class Plugin {
 public:
  explicit Plugin(const Host& host) : host_(host) {}
  virtual ~Plugin() = default;
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  virtual void setup(Stage) {}
  virtual void teardown(Stage, bool /*failed*/) {}
  virtual void on_exception(const ExceptionInfo&) {}
  virtual void state_save(StateWriter&) {}
  virtual void state_load(const StateReader&) {}

  const Host& host() const { return host_; }

 private:
  Host host_;
};

class Model : public Plugin {
 public:
  using Plugin::Plugin;
  // The module whose parameters and buffers the host trains and places.
  virtual torch::nn::Module& module() = 0;
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_index) = 0;
  virtual void validation_step(const Batch&, int64_t) {}
  virtual void test_step(const Batch&, int64_t) {}
  virtual at::Tensor predict_step(const Batch&, int64_t) { return {}; }
  // The end of an epoch of `split` (train, val, test) on every rank, with
  // every rank's collected rows (ABI 1.2): compute a whole-split metric and
  // log it; every rank gets the same rows, so no sync is needed.
  virtual void on_epoch_end(Split, const Collected&) {}
  // A sample of `split`'s batches (its first samples, on the CPU), before
  // anything runs or is written (ABI 1.5): throw InvalidInput, naming what
  // this model expects and what the batch holds, for data it cannot take;
  // `kiln` then exits 2 and writes nothing. Must not change the model.
  virtual void check_batch(Split, const Batch&) {}
};

// The batch a data module is asked for (kiln_batch_request, ABI 1.4).
struct BatchRequest {
  Split split;
  const int64_t* indices;
  size_t count;
  const uint64_t* sample_seeds;  // NULL from a 1.0-1.3 host
  int64_t epoch;                 // -1 from a 1.0-1.3 host
  // The sample Model::check_batch looks at before anything runs, not a
  // step's batch (ABI 1.5; false from an older host): serve it, and leave
  // no trace of it (nothing counted, logged or cached; docs/abi.md).
  bool for_check = false;

  // The seed of sample i's random transforms: the host's (the same with any
  // number of data workers or processes, and after a resume). A 1.0-1.3
  // host sends none: then one derived from the sample's index alone, the
  // same in every epoch.
  uint64_t seed(size_t i) const {
    if (sample_seeds != nullptr) return sample_seeds[i];
    uint64_t x = static_cast<uint64_t>(indices[i]) + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
};

class DataModule : public Plugin {
 public:
  using Plugin::Plugin;
  virtual void prepare_data() {}
  virtual int64_t length(Split split) = 0;
  // Called on host prefetch threads (see kiln_data_hooks.get_batch). A data
  // module overrides this one or get_batch_seeded.
  virtual TensorMap get_batch(Split, const int64_t*, size_t) {
    throw std::logic_error("this data module implements neither get_batch nor get_batch_seeded");
  }
  // The same, with the epoch and a seed per sample (ABI 1.4): override this
  // one for random transforms (kiln_data_hooks.get_batch_seeded).
  virtual TensorMap get_batch_seeded(const BatchRequest& request) {
    return get_batch(request.split, request.indices, request.count);
  }
};

class Callback : public Plugin {
 public:
  using Plugin::Plugin;
  virtual void on_fit_start(const kiln_progress&) {}
  virtual void on_fit_end(const kiln_progress&) {}
  virtual void on_train_epoch_start(const kiln_progress&) {}
  virtual void on_train_epoch_end(const kiln_progress&) {}
  virtual void on_train_batch_end(const kiln_progress&) {}
  virtual void on_validation_start(const kiln_progress&) {}
  virtual void on_validation_end(const kiln_progress&) {}
  virtual void on_test_end(const kiln_progress&) {}
  // After the model's on_epoch_end, with the same rows (ABI 1.2); only when
  // the epoch collected something.
  virtual void on_epoch_collected(const kiln_progress&, Split, const Collected&) {}
};

// Identity of one exported plugin.
struct PluginInfo {
  const char* id;
  const char* name;
  const char* version;
  const char* description = nullptr;
  uint64_t flags = 0;
};

namespace detail {

// The instance behind a kiln_instance*: the host pointer and the C++ object.
template <class T>
struct Instance {
  const kiln_host* host;
  std::unique_ptr<T> object;
};

template <class T>
T& self(kiln_instance* instance) {
  return *reinterpret_cast<Instance<T>*>(instance)->object;
}
template <class T>
const kiln_host* host_of(kiln_instance* instance) {
  return reinterpret_cast<Instance<T>*>(instance)->host;
}

// A host error with a code when the host has error_new_code (ABI 1.1),
// else without one: a 1.0 host's table ends before that field.
inline kiln_error* new_error(const kiln_host* host, kiln_error_code code, const char* message) noexcept {
  if (KILN_HAS_FIELD(host, kiln_host, error_new_code) && host->error_new_code != nullptr)
    return host->error_new_code(host, code, message);
  return host->error_new(host, message);
}

// Runs `body`, turning any exception into a host-allocated error. An
// InvalidInput (ConfigError: the plugin's config is wrong; a data file the
// config names is unusable) is KILN_ERROR_INVALID_ARGUMENT: the host exits 2.
template <class F>
kiln_error* guarded(const kiln_host* host, F&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const HostError& e) {
    return e.error;
  } catch (const InvalidInput& e) {
    return new_error(host, KILN_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const c10::Error& e) {
    return new_error(host, KILN_ERROR_INTERNAL, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return new_error(host, KILN_ERROR_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return new_error(host, KILN_ERROR_UNKNOWN, e.what());
  } catch (...) {
    return new_error(host, KILN_ERROR_UNKNOWN, "unknown C++ exception");
  }
}

// True when T overrides the hook (its member pointer's class is not the base).
#define KILN_SDK_OVERRIDES(T, Base, hook) \
  (!std::is_same_v<decltype(&T::hook), decltype(&Base::hook)>)

template <class T>
kiln_error* create(const kiln_host* host, const char* config_toml, kiln_instance** out) noexcept {
  auto instance = std::make_unique<Instance<T>>();
  instance->host = host;
  kiln_error* error = guarded(host, [&] {
    Config config(config_toml ? config_toml : "");
    instance->object = std::make_unique<T>(Host(host), config);
    const auto unread = config.unread_keys();
    if (!unread.empty()) {
      std::string message = "unknown config key";
      message += unread.size() > 1 ? "s " : " ";
      for (size_t i = 0; i < unread.size(); ++i) message += (i ? ", " : "") + unread[i];
      throw ConfigError(message);
    }
  });
  if (error) return error;  // `instance` (and any object) is freed here
  *out = reinterpret_cast<kiln_instance*>(instance.release());
  return nullptr;
}

template <class T>
void destroy(kiln_instance* instance) noexcept {
  try {
    delete reinterpret_cast<Instance<T>*>(instance);
  } catch (...) {
    // A destructor that throws would terminate the host; swallow instead.
  }
}

template <class T>
kiln_error* setup(kiln_instance* i, kiln_stage stage) noexcept {
  return guarded(host_of<T>(i), [&] { self<T>(i).setup(static_cast<Stage>(stage)); });
}
template <class T>
kiln_error* teardown(kiln_instance* i, kiln_stage stage, int32_t failed) noexcept {
  return guarded(host_of<T>(i), [&] { self<T>(i).teardown(static_cast<Stage>(stage), failed != 0); });
}
template <class T>
kiln_error* on_exception(kiln_instance* i, const kiln_exception_info* info) noexcept {
  return guarded(host_of<T>(i), [&] {
    ExceptionInfo e{info->reason, info->message ? info->message : "",
                    info->plugin_id ? info->plugin_id : "", info->hook ? info->hook : "", info->rank};
    self<T>(i).on_exception(e);
  });
}
template <class T>
kiln_error* state_save(kiln_instance* i, kiln_state_writer* writer) noexcept {
  return guarded(host_of<T>(i), [&] {
    StateWriter w(host_of<T>(i), writer);
    self<T>(i).state_save(w);
  });
}
template <class T>
kiln_error* state_load(kiln_instance* i, kiln_state_reader* reader) noexcept {
  return guarded(host_of<T>(i), [&] { self<T>(i).state_load(StateReader(host_of<T>(i), reader)); });
}

template <class T>
const kiln_lifecycle* lifecycle() {
  static const kiln_lifecycle table = {
      sizeof(kiln_lifecycle),
      &create<T>,
      KILN_SDK_OVERRIDES(T, Plugin, setup) ? &setup<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Plugin, teardown) ? &teardown<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Plugin, on_exception) ? &on_exception<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Plugin, state_save) ? &state_save<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Plugin, state_load) ? &state_load<T> : nullptr,
      &destroy<T>,
  };
  return &table;
}

// --- model ---------------------------------------------------------------

struct VisitContext {
  kiln_tensor_visitor visit;
  void* context;
};

template <class T>
kiln_error* parameters(kiln_instance* i, void* context, kiln_tensor_visitor visit) noexcept {
  return guarded(host_of<T>(i), [&] {
    torch::nn::Module& module = self<T>(i).module();
    for (const auto& item : module.named_parameters(/*recurse=*/true))
      visit(context, item.key().c_str(),
            reinterpret_cast<kiln_tensor*>(item.value().unsafeGetTensorImpl()), KILN_TENSOR_PARAMETER);
    for (const auto& item : module.named_buffers(/*recurse=*/true))
      visit(context, item.key().c_str(),
            reinterpret_cast<kiln_tensor*>(item.value().unsafeGetTensorImpl()), KILN_TENSOR_BUFFER);
  });
}

// The host calls steps in a known mode; the SDK keeps the module in step so
// that dropout and batch norm behave, without an extra ABI hook.
template <class T>
void set_training(T& model, bool training) {
  torch::nn::Module& module = model.module();
  if (module.is_training() != training) module.train(training);
}

template <class T>
kiln_error* training_step(kiln_instance* i, const kiln_batch* batch, int64_t index,
                          kiln_tensor** loss) noexcept {
  return guarded(host_of<T>(i), [&] {
    T& model = self<T>(i);
    set_training(model, true);
    at::Tensor value = model.training_step(Batch(host_of<T>(i), batch), index);
    if (!value.defined()) throw std::runtime_error("training_step returned an undefined tensor");
    *loss = release_tensor(std::move(value));
  });
}
template <class T>
kiln_error* validation_step(kiln_instance* i, const kiln_batch* batch, int64_t index) noexcept {
  return guarded(host_of<T>(i), [&] {
    T& model = self<T>(i);
    set_training(model, false);
    model.validation_step(Batch(host_of<T>(i), batch), index);
  });
}
template <class T>
kiln_error* test_step(kiln_instance* i, const kiln_batch* batch, int64_t index) noexcept {
  return guarded(host_of<T>(i), [&] {
    T& model = self<T>(i);
    set_training(model, false);
    model.test_step(Batch(host_of<T>(i), batch), index);
  });
}
template <class T>
kiln_error* predict_step(kiln_instance* i, const kiln_batch* batch, int64_t index,
                         kiln_tensor** output) noexcept {
  return guarded(host_of<T>(i), [&] {
    T& model = self<T>(i);
    set_training(model, false);
    at::Tensor value = model.predict_step(Batch(host_of<T>(i), batch), index);
    if (!value.defined()) throw std::runtime_error("predict_step returned an undefined tensor");
    *output = release_tensor(std::move(value));
  });
}

template <class T>
kiln_error* on_epoch_end(kiln_instance* i, kiln_split split, const kiln_batch* collected) noexcept {
  return guarded(host_of<T>(i), [&] {
    self<T>(i).on_epoch_end(static_cast<Split>(split), Collected(host_of<T>(i), collected));
  });
}

template <class T>
kiln_error* check_batch(kiln_instance* i, kiln_split split, const kiln_batch* batch) noexcept {
  return guarded(host_of<T>(i), [&] {
    torch::NoGradGuard no_grad;
    self<T>(i).check_batch(static_cast<Split>(split), Batch(host_of<T>(i), batch));
  });
}

template <class T>
const kiln_model_hooks* model_hooks() {
  static const kiln_model_hooks table = {
      sizeof(kiln_model_hooks),
      &parameters<T>,
      &training_step<T>,
      KILN_SDK_OVERRIDES(T, Model, validation_step) ? &validation_step<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Model, test_step) ? &test_step<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Model, predict_step) ? &predict_step<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Model, on_epoch_end) ? &on_epoch_end<T> : nullptr,
      KILN_SDK_OVERRIDES(T, Model, check_batch) ? &check_batch<T> : nullptr,
  };
  return &table;
}

// --- data module ------------------------------------------------------------

template <class T>
kiln_error* prepare_data(kiln_instance* i) noexcept {
  return guarded(host_of<T>(i), [&] { self<T>(i).prepare_data(); });
}
template <class T>
kiln_error* length(kiln_instance* i, kiln_split split, int64_t* out) noexcept {
  return guarded(host_of<T>(i), [&] { *out = self<T>(i).length(static_cast<Split>(split)); });
}
template <class T>
kiln_error* batch_of(kiln_instance* i, const BatchRequest& request, kiln_batch** out) noexcept {
  const kiln_host* host = host_of<T>(i);
  kiln_batch* batch = nullptr;
  kiln_error* error = guarded(host, [&] {
    TensorMap tensors = KILN_SDK_OVERRIDES(T, DataModule, get_batch_seeded)
                            ? self<T>(i).get_batch_seeded(request)
                            : self<T>(i).get_batch(request.split, request.indices, request.count);
    batch = host->batch_new(host);
    for (auto& [name, tensor] : tensors) {
      if (kiln_error* e = host->batch_put(host, batch, name.c_str(), release_tensor(std::move(tensor))))
        throw HostError{e};
    }
  });
  if (error) {
    if (batch) host->batch_release(host, batch);
    return error;
  }
  *out = batch;
  return nullptr;
}
template <class T>
kiln_error* get_batch(kiln_instance* i, kiln_split split, const int64_t* indices, size_t count,
                      kiln_batch** out) noexcept {
  return batch_of<T>(i, BatchRequest{static_cast<Split>(split), indices, count, nullptr, -1}, out);
}
template <class T>
kiln_error* get_batch_seeded(kiln_instance* i, const kiln_batch_request* r, kiln_batch** out) noexcept {
  const bool for_check = KILN_HAS_FIELD(r, kiln_batch_request, for_check) && r->for_check != 0;
  return batch_of<T>(
      i, BatchRequest{static_cast<Split>(r->split), r->indices, r->count, r->sample_seeds, r->epoch, for_check}, out);
}

template <class T>
const kiln_data_hooks* data_hooks() {
  static const kiln_data_hooks table = {
      sizeof(kiln_data_hooks),
      KILN_SDK_OVERRIDES(T, DataModule, prepare_data) ? &prepare_data<T> : nullptr,
      &length<T>,
      &get_batch<T>,
      KILN_SDK_OVERRIDES(T, DataModule, get_batch_seeded) ? &get_batch_seeded<T> : nullptr,
  };
  return &table;
}

// --- callback ---------------------------------------------------------------

template <class T, void (Callback::*Hook)(const kiln_progress&)>
kiln_error* callback_hook(kiln_instance* i, const kiln_progress* progress) noexcept {
  return guarded(host_of<T>(i), [&] { (self<T>(i).*Hook)(*progress); });
}

template <class T>
kiln_error* on_epoch_collected(kiln_instance* i, const kiln_progress* progress, kiln_split split,
                               const kiln_batch* collected) noexcept {
  return guarded(host_of<T>(i), [&] {
    self<T>(i).on_epoch_collected(*progress, static_cast<Split>(split), Collected(host_of<T>(i), collected));
  });
}

#define KILN_SDK_CALLBACK_HOOK(T, hook) \
  (KILN_SDK_OVERRIDES(T, Callback, hook) ? &callback_hook<T, &Callback::hook> : nullptr)

template <class T>
const kiln_callback_hooks* callback_hooks() {
  static const kiln_callback_hooks table = {
      sizeof(kiln_callback_hooks),
      KILN_SDK_CALLBACK_HOOK(T, on_fit_start),
      KILN_SDK_CALLBACK_HOOK(T, on_fit_end),
      KILN_SDK_CALLBACK_HOOK(T, on_train_epoch_start),
      KILN_SDK_CALLBACK_HOOK(T, on_train_epoch_end),
      KILN_SDK_CALLBACK_HOOK(T, on_train_batch_end),
      KILN_SDK_CALLBACK_HOOK(T, on_validation_start),
      KILN_SDK_CALLBACK_HOOK(T, on_validation_end),
      KILN_SDK_CALLBACK_HOOK(T, on_test_end),
      KILN_SDK_OVERRIDES(T, Callback, on_epoch_collected) ? &on_epoch_collected<T> : nullptr,
  };
  return &table;
}

}  // namespace detail

inline void Host::collect(const std::string& name, const at::Tensor& rows) const {
  if (!KILN_HAS_FIELD(host_, kiln_host, collect) || host_->collect == nullptr)
    throw std::runtime_error("collect('" + name + "') needs a kiln host with ABI 1.2 or later; this one speaks " +
                             std::to_string(host_->abi_major) + "." + std::to_string(host_->abi_minor));
  if (kiln_error* e = host_->collect(host_, name.c_str(), reinterpret_cast<const kiln_tensor*>(rows.unsafeGetTensorImpl())))
    throw HostError{e};
}

inline bool Host::write_run_file(const std::string& name, const std::string& bytes) const {
  if (!KILN_HAS_FIELD(host_, kiln_host, run_file_write) || host_->run_file_write == nullptr) return false;
  if (kiln_error* e = host_->run_file_write(host_, name.c_str(), bytes.data(), bytes.size())) throw HostError{e};
  return true;
}

// The descriptor of plugin class T (a Model, DataModule or Callback). Storage
// is static per T, so describe each class once.
template <class T>
const kiln_descriptor* describe(const PluginInfo& info) {
  static_assert(std::is_base_of_v<Plugin, T>, "T must derive from kiln::Model, DataModule or Callback");
  static_assert(std::is_constructible_v<T, const Host&, Config&>,
                "a plugin class needs a constructor T(const kiln::Host&, kiln::Config&)");
  static const kiln_descriptor descriptor = [&] {
    kiln_descriptor d{};
    d.struct_size = sizeof(kiln_descriptor);
    d.id = info.id;
    d.name = info.name;
    d.version = info.version;
    d.description = info.description;
    d.torch_version = KILN_SDK_TORCH_VERSION;
    d.flags = info.flags;
    d.lifecycle = detail::lifecycle<T>();
    if constexpr (std::is_base_of_v<Model, T>) {
      d.kind = KILN_KIND_MODEL;
      d.hooks = detail::model_hooks<T>();
    } else if constexpr (std::is_base_of_v<DataModule, T>) {
      d.kind = KILN_KIND_DATA_MODULE;
      d.hooks = detail::data_hooks<T>();
    } else {
      static_assert(std::is_base_of_v<Callback, T>, "unknown plugin kind");
      d.kind = KILN_KIND_CALLBACK;
      d.hooks = detail::callback_hooks<T>();
    }
    return d;
  }();
  return &descriptor;
}

}  // namespace kiln

// Exports the entry point of this shared object, listing its plugins:
//   KILN_EXPORT_PLUGINS(kiln::describe<A>({...}), kiln::describe<B>({...}))
// Use it once per shared object.
#define KILN_EXPORT_PLUGINS(...)                                                        \
  extern "C" KILN_EXPORT const kiln_entry* kiln_plugin_entry(void) {                    \
    static const kiln_descriptor* const descriptors[] = {__VA_ARGS__};                  \
    static const kiln_entry entry = {sizeof(kiln_entry), KILN_ABI_VERSION_MAJOR,        \
                                     KILN_ABI_VERSION_MINOR,                            \
                                     sizeof(descriptors) / sizeof(descriptors[0]),      \
                                     descriptors};                                      \
    return &entry;                                                                      \
  }
