#include "metrics/tensor_metrics.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/abi.h"
#include "metrics/metric_store.hpp"

namespace kiln {

namespace {

double combine(uint32_t reduce, double a, double b) {
  return reduce == KILN_METRIC_REDUCE_MAX ? std::max(a, b) : std::min(a, b);
}

}  // namespace

void TensorMetrics::record(const std::string& name, const at::Tensor& value, double weight, uint32_t flags) {
  if (!value.defined() || value.numel() != 1)
    throw std::invalid_argument("metric '" + name + "' must be a tensor of one element");
  const uint32_t reduce = flags & KILN_METRIC_REDUCE_MASK;
  if (reduce > KILN_METRIC_REDUCE_MIN) throw std::invalid_argument("unknown reduction for metric '" + name + "'");
  auto [it, inserted] = pending_.try_emplace(name);
  Accumulator& a = it->second;
  if (inserted) {
    a.flags = flags;
    a.reduce = reduce;
  } else if (a.reduce != reduce) {
    throw std::invalid_argument("metric '" + name + "' was recorded with two different reductions in one epoch");
  }
  a.weight += weight;
  a.count += 1;
  const bool extreme = reduce == KILN_METRIC_REDUCE_MAX || reduce == KILN_METRIC_REDUCE_MIN;
  if (value.device().is_cpu() && !defer_cpu_) {
    const double v = value.item<double>();  // host memory: nothing to wait for
    a.host_sum += v * weight;
    a.host_extreme = a.host_count == 0 ? v : combine(reduce, a.host_extreme, v);
    a.host_count += 1;
    return;
  }
  // float64 on the value's own device: the sums match the double path's, and
  // nothing here waits for the device.
  const at::Tensor v = value.detach().reshape({}).to(at::kDouble);
  if (!a.device_sum.defined()) {
    a.device_sum = v * weight;
    a.device_extreme = v;
  } else {
    a.device_sum = a.device_sum + v * weight;
    if (extreme) a.device_extreme = reduce == KILN_METRIC_REDUCE_MAX ? at::maximum(a.device_extreme, v)
                                                                      : at::minimum(a.device_extreme, v);
  }
}

void TensorMetrics::flush_into(MetricStore& store) {
  if (pending_.empty()) return;
  std::map<std::string, Accumulator> pending;
  pending.swap(pending_);
  // Everything left on devices comes over in one copy per device:
  // [sum_0, extreme_0, sum_1, ...].
  std::map<std::string, std::pair<double, double>> read;
  std::vector<std::pair<c10::Device, std::vector<std::string>>> by_device;  // a run has one or two devices
  for (const auto& [name, a] : pending) {
    if (!a.device_sum.defined()) continue;
    auto at = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& d) { return d.first == a.device_sum.device(); });
    if (at == by_device.end()) at = by_device.insert(by_device.end(), {a.device_sum.device(), {}});
    at->second.push_back(name);
  }
  for (const auto& [device, names] : by_device) {
    std::vector<at::Tensor> parts;
    for (const auto& name : names) {
      parts.push_back(pending.at(name).device_sum);
      parts.push_back(pending.at(name).device_extreme);
    }
    const at::Tensor values = at::stack(parts).to(at::kCPU).contiguous();
    ++device_reads_;
    const double* v = values.data_ptr<double>();
    for (size_t i = 0; i < names.size(); ++i) read[names[i]] = {v[2 * i], v[2 * i + 1]};
  }
  std::string error;
  for (const auto& [name, a] : pending) {
    double sum = a.host_sum, extreme = a.host_extreme;
    if (auto r = read.find(name); r != read.end()) {
      sum += r->second.first;
      extreme = a.host_count == 0 ? r->second.second : combine(a.reduce, extreme, r->second.second);
    }
    try {
      store.record_accumulated(name, a.flags, sum, a.weight, extreme, a.count);
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw std::invalid_argument(error);
}

}  // namespace kiln
