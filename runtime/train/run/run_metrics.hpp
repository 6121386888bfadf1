// The run's metrics: what plugins and the loops record (any thread that may
// record), reduced at the loops' fixed points — by every rank together when
// distributed — and carried whole through checkpoints. The one place where
// metrics are reduced (docs/architecture.md).
#pragma once

#include <map>
#include <atomic>
#include <mutex>
#include <thread>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "metrics/metric_store.hpp"
#include "metrics/tensor_metrics.hpp"
#include "loop_parts/loop_parts.hpp"

namespace kiln {

class ProcessGroup;
class TrainingMonitors;

class RunMetrics final : public MetricSink {
 public:
  // `group`: null in a single process.
  explicit RunMetrics(ProcessGroup* group) : group_(group) {}

  // fit, rank 0: each training batch's loss also feeds the monitors.
  void attach_monitors(TrainingMonitors* monitors) { monitors_ = monitors; }

  // What a plugin records; a bad record is a warning naming the plugin.
  void record_from(const std::string& plugin_id, const char* name, double value, double weight, uint32_t flags);
  void record_tensor_from(const std::string& plugin_id, const char* name, const at::Tensor& value, double weight,
                          uint32_t flags);
  // Around the model's on_epoch_end (ABI 1.2): what this thread records
  // meanwhile is a whole-split value (MetricStore::record_given).
  void begin_whole_split() { whole_split_thread_ = std::this_thread::get_id(); }
  void end_whole_split() { whole_split_thread_ = std::thread::id(); }
  std::optional<double> latest(const std::string& name) const;
  std::map<std::string, double> latest() const;

  // MetricSink (the loops).
  void record(const char* name, double value, double weight, uint32_t flags) override;
  void record_loss(const at::Tensor& loss, double weight) override;
  std::map<std::string, double> reduce() override;
  void set_aside() override;
  void take_back() override;
  void discard() override;

  // Every rank's unreduced metrics, in rank order, read without a flush
  // (a collective: every rank calls it).
  struct Unreduced {
    std::vector<std::string> stores, tensors;  // MetricStore / TensorMetrics export_state
    std::string collected;  // the training split's collected rows so far, merged (EpochCollections)
  };
  Unreduced gather_unreduced();
  std::string export_latest() const;
  // A checkpoint's metrics back into the run: the latest values, and the
  // interrupted epoch's unreduced ones. The same number of ranks: each takes
  // back its own, so every sum continues in the same order. Another number:
  // rank 0 takes all of them, merged in rank order. Empty `unreduced` (an
  // older kiln's checkpoint): rank 0 takes `pending`. Throws
  // std::invalid_argument for a state it cannot read.
  void restore(const std::string& latest, const std::string& pending, const Unreduced& unreduced, int32_t rank,
               int32_t world_size, c10::Device device);
  // metrics/pending as kilns before per-rank states read it: rank 0's sums
  // with its tensor metrics flushed (into copies).
  static std::string pending_for_older_kilns(const Unreduced& unreduced);

 private:
  void flush_tensor_metrics();  // a log point (mutex_ held)

  ProcessGroup* group_;
  TrainingMonitors* monitors_ = nullptr;
  mutable std::mutex mutex_;  // data modules may record from prefetch threads
  MetricStore store_;
  TensorMetrics tensors_;
  const TensorMetrics::Key loss_key_ = tensors_.key("train/loss");
  std::set<std::string> warned_;
  std::atomic<std::thread::id> whole_split_thread_{};
};

}  // namespace kiln
