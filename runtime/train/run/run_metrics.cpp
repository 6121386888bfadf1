#include "train/run/run_metrics.hpp"

#include <spdlog/spdlog.h>

#include "distributed/process_group.hpp"
#include "kiln/abi.h"
#include "train/monitors.hpp"

namespace kiln {

void RunMetrics::record_from(const std::string& plugin_id, const char* name, double value, double weight,
                             uint32_t flags) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    if (std::this_thread::get_id() == whole_split_thread_.load())
      store_.record_given(name, value, flags);
    else
      store_.record(name, value, weight, flags);
  } catch (const std::exception& e) {
    spdlog::warn("[{}] {}", plugin_id, e.what());
  }
}

void RunMetrics::record_tensor_from(const std::string& plugin_id, const char* name, const at::Tensor& value,
                                    double weight, uint32_t flags) {
  if (std::this_thread::get_id() == whole_split_thread_.load()) {
    // The epoch's end: reading the value back costs nothing here.
    try {
      if (value.numel() != 1 || value.is_complex())
        throw std::invalid_argument("metric '" + std::string(name) + "' must be a one-element real tensor");
      const double v = value.detach().to(at::kCPU, at::kDouble).item<double>();
      std::lock_guard<std::mutex> lock(mutex_);
      store_.record_given(name, v, flags);
    } catch (const std::exception& e) {
      spdlog::warn("[{}] {}", plugin_id, e.what());
    }
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    tensors_.record(name, value, weight, flags);
  } catch (const std::exception& e) {
    spdlog::warn("[{}] {}", plugin_id, e.what());
  }
}

std::optional<double> RunMetrics::latest(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_.latest(name);
}

std::map<std::string, double> RunMetrics::latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_.latest();
}

void RunMetrics::record(const char* name, double value, double weight, uint32_t flags) {
  record_from("kiln", name, value, weight, flags);
}

// Every step: by a key looked up once, not by name. The lock stays: it
// costs ~60 instructions a step uncontended (callgrind, mlp32), and it keeps
// a plugin that breaks log_metric_tensor's [main-thread] rule in a release
// build (where nothing checks it) from racing this record.
void RunMetrics::record_loss(const at::Tensor& loss, double weight) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    tensors_.record(loss_key_, loss, weight, KILN_METRIC_REDUCE_MEAN);
  } catch (const std::exception& e) {
    spdlog::warn("[kiln] {}", e.what());
  }
  if (monitors_) monitors_->on_batch(loss, static_cast<int64_t>(weight));
}

// A fixed point where every rank reduces: plugins only ever record.
std::map<std::string, double> RunMetrics::reduce() {
  if (!group_) {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_tensor_metrics();
    return store_.reduce();
  }
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_tensor_metrics();
    mine = store_.export_pending();
  }
  const std::vector<std::string> all = group_->all_gather_text(mine);
  std::vector<std::string> missing;
  std::map<std::string, double> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out = store_.reduce_merged(all, &missing);
  }
  for (const auto& line : missing)
    if (warned_.insert(line).second) spdlog::warn("{}", line);
  return out;
}

void RunMetrics::set_aside() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_tensor_metrics();
  store_.set_aside();
}

void RunMetrics::take_back() {
  std::lock_guard<std::mutex> lock(mutex_);
  store_.take_back();
}

void RunMetrics::discard() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_tensor_metrics();
  store_.discard_pending();
}

RunMetrics::Unreduced RunMetrics::gather_unreduced() {
  Unreduced out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out.stores.push_back(store_.export_state());
    out.tensors.push_back(tensors_.export_state());
  }
  if (group_) {
    out.stores = group_->all_gather_text(out.stores[0]);
    out.tensors = group_->all_gather_text(out.tensors[0]);
  }
  return out;
}

std::string RunMetrics::export_latest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_.export_latest();
}

void RunMetrics::restore(const std::string& latest, const std::string& pending, const Unreduced& unreduced,
                         int32_t rank, int32_t world_size, c10::Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t ranks = unreduced.stores.size();
  if (ranks == 0) {  // an older kiln's checkpoint: rank 0's pending sums only
    store_.import(latest, rank == 0 ? pending : "");
    return;
  }
  store_.import(latest, "");
  if (ranks == static_cast<size_t>(world_size)) {
    store_.add_state(unreduced.stores[rank]);
    tensors_.import_state(unreduced.tensors[rank], device);
    return;
  }
  if (rank != 0) return;
  for (size_t r = 0; r < ranks; ++r) {
    store_.add_state(unreduced.stores[r]);
    TensorMetrics saved;
    saved.import_state(unreduced.tensors[r], c10::Device(c10::kCPU));
    saved.flush_into(store_);
  }
}

std::string RunMetrics::pending_for_older_kilns(const Unreduced& unreduced) {
  MetricStore store;
  store.add_state(unreduced.stores.at(0));
  TensorMetrics tensors;
  tensors.import_state(unreduced.tensors.at(0), c10::Device(c10::kCPU));
  tensors.flush_into(store);
  return store.export_pending();
}

void RunMetrics::flush_tensor_metrics() {
  try {
    tensors_.flush_into(store_);
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
}

}  // namespace kiln
