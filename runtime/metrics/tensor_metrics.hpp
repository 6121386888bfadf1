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

#include <ATen/core/Tensor.h>

namespace kiln {

class MetricStore;

class TensorMetrics {
 public:
  explicit TensorMetrics(bool defer_cpu = false) : defer_cpu_(defer_cpu) {}

  // Adds `value` (one element, any device, floating or integer) with
  // `weight`. Queues device work only; never synchronises. Throws
  // std::invalid_argument for a tensor that is not one element or is complex,
  // or a reduction that differs from the name's earlier one in this epoch.
  void record(const std::string& name, const at::Tensor& value, double weight, uint32_t flags);

  // A log point: reads every pending metric (one device-to-host copy for all
  // of them) and hands it to `store`.
  void flush_into(MetricStore& store);

  bool empty() const { return pending_.empty(); }
  // Device-to-host reads so far (for tests: reads per epoch, not per step).
  int64_t device_reads() const { return device_reads_; }

 private:
  struct Accumulator {
    uint32_t flags = 0;
    uint32_t reduce = 0;
    double weight = 0;
    int64_t count = 0;
    // Values read at once (host memory).
    double host_sum = 0, host_extreme = 0;
    int64_t host_count = 0;
    // Values left where they live: float64 on their device.
    at::Tensor device_sum, device_extreme;
  };
  bool defer_cpu_;
  std::map<std::string, Accumulator> pending_;
  int64_t device_reads_ = 0;
};

}  // namespace kiln
