// Metrics recorded as tensors (kiln_host.log_metric_tensor, and the host's
// own train/loss): accumulated where they live, without reading them back,
// and read once per log point — all of them in one transfer — into the
// MetricStore, which reduces them like any other value. On a GPU this keeps
// the training step free of host synchronisation.
//
// A value already in host memory (a CPU tensor) has no device to wait for:
// it is read at once and summed as a double, which costs less per step than
// tensor arithmetic (issue 11's per-step budget). `defer_cpu` keeps CPU
// values as tensors too, so tests can exercise the device path on a CPU.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace kiln {

class MetricStore;

class TensorMetrics {
 public:
  explicit TensorMetrics(bool defer_cpu = false) : defer_cpu_(defer_cpu) {}

  // A metric's name, looked up once: what records every step (the host's
  // train/loss) records by key, without a string lookup per step. A key
  // stays valid for the object's life, across flushes.
  class Key {
    friend class TensorMetrics;
    size_t index_ = 0;
  };
  Key key(const std::string& name);

  // Adds `value` (one element, any device, floating or integer) with
  // `weight`. Queues device work only; never synchronises. Throws
  // std::invalid_argument for a tensor that is not one element or is complex,
  // or a reduction that differs from the name's earlier one in this epoch.
  void record(Key key, const at::Tensor& value, double weight, uint32_t flags);
  void record(const std::string& name, const at::Tensor& value, double weight, uint32_t flags) {
    record(key(name), value, weight, flags);
  }

  // A log point: reads every pending metric (one device-to-host copy for all
  // of them) and hands it to `store`.
  void flush_into(MetricStore& store);

  // For checkpoints: what is pending, read without flushing it (one
  // device read per value left on a device), and put back. A run that
  // saves a checkpoint inside an epoch then sums exactly as one that does
  // not: the flush points, which decide the rounding, stay the epoch's.
  // import_state replaces what is pending; values that lived on a device go
  // back onto `device`. Throws std::invalid_argument for a line it cannot
  // read.
  std::string export_state() const;
  void import_state(const std::string& state, c10::Device device);

  bool empty() const { return pending_count_ == 0; }
  // Device-to-host reads so far (for tests: reads per epoch, not per step).
  int64_t device_reads() const { return device_reads_; }

 private:
  struct Accumulator {
    uint32_t flags = 0;
    uint32_t reduce = 0;
    double weight = 0;
    int64_t count = 0;  // 0: nothing pending
    // Values read at once (host memory).
    double host_sum = 0, host_extreme = 0;
    int64_t host_count = 0;
    // Values left where they live: float64 on their device.
    at::Tensor device_sum, device_extreme;
  };
  struct Entry {
    std::string name;
    Accumulator pending;
  };
  bool defer_cpu_;
  std::vector<Entry> entries_;              // by key
  std::map<std::string, size_t> by_name_;  // name -> key; also the flush order
  size_t pending_count_ = 0;               // entries with something recorded
  int64_t device_reads_ = 0;
};

}  // namespace kiln
