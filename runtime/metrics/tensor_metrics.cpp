#include "metrics/tensor_metrics.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/abi.h"
#include "metrics/metric_store.hpp"
#include "util/host_scalar.hpp"

namespace kiln {

namespace {

// As MetricStore::record: a mean or a sum keeps its first value as the
// extreme (unused, but it travels between ranks in the pending text).
double combine(uint32_t reduce, double a, double b) {
  if (reduce == KILN_METRIC_REDUCE_MAX) return std::max(a, b);
  if (reduce == KILN_METRIC_REDUCE_MIN) return std::min(a, b);
  return a;
}

}  // namespace

TensorMetrics::Key TensorMetrics::key(const std::string& name) {
  auto [it, inserted] = by_name_.try_emplace(name, entries_.size());
  if (inserted) entries_.push_back(Entry{name, {}});
  Key key;
  key.index_ = it->second;
  return key;
}

void TensorMetrics::record(Key key, const at::Tensor& value, double weight, uint32_t flags) {
  const std::string& name = entries_.at(key.index_).name;
  if (!value.defined() || value.numel() != 1)
    throw std::invalid_argument("metric '" + name + "' must be a tensor of one element");
  // A complex value has no place in a mean or a max; read at once it would
  // throw, but converted on a device LibTorch drops the imaginary part with
  // only a warning. Refused alike on both paths.
  if (value.is_complex()) throw std::invalid_argument("metric '" + name + "' must be real, got a complex tensor");
  const uint32_t reduce = flags & KILN_METRIC_REDUCE_MASK;
  if (reduce > KILN_METRIC_REDUCE_MIN) throw std::invalid_argument("unknown reduction for metric '" + name + "'");
  // The value is read (host memory: nothing to wait for) or converted
  // (float64 on its own device: the sums match the double path's, and
  // nothing waits for the device) before anything is recorded, so a value
  // LibTorch cannot convert leaves no trace.
  const bool at_once = value.device().is_cpu() && !defer_cpu_;
  // In place where it can be (host_scalar: the loss, every step).
  double read = 0.0;
  if (at_once) {
    const std::optional<double> in_place = host_scalar(value);
    read = in_place ? *in_place : value.item<double>();
  }
  // Always a copy (copy=true): a float64 value would otherwise be aliased,
  // and a plugin that reuses its tensor in place would change a recorded
  // max or min after the fact (abi.h: the value is taken at the call).
  const at::Tensor v =
      at_once ? at::Tensor() : value.detach().reshape({}).to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  Accumulator& a = entries_[key.index_].pending;
  if (a.count == 0) {
    ++pending_count_;
    a.flags = flags;
    a.reduce = reduce;
  } else if (a.reduce != reduce) {
    throw std::invalid_argument("metric '" + name + "' was recorded with two different reductions in one epoch");
  }
  a.weight += weight;
  a.count += 1;
  if (at_once) {
    a.host_sum += read * weight;
    a.host_extreme = a.host_count == 0 ? read : combine(reduce, a.host_extreme, read);
    a.host_count += 1;
    return;
  }
  if (!a.device_sum.defined()) {
    a.device_sum = v * weight;
    a.device_extreme = v;
    return;
  }
  a.device_sum = a.device_sum + v * weight;
  // std::max(e, v) and std::min(e, v), as the double path combines values,
  // not at::maximum/minimum: those propagate a NaN that std::max ignores (a
  // NaN after the first value leaves the double path's extreme as it was).
  if (reduce == KILN_METRIC_REDUCE_MAX) a.device_extreme = at::where(a.device_extreme < v, v, a.device_extreme);
  if (reduce == KILN_METRIC_REDUCE_MIN) a.device_extreme = at::where(v < a.device_extreme, v, a.device_extreme);
}

void TensorMetrics::flush_into(MetricStore& store) {
  if (pending_count_ == 0) return;
  // In name order, as the metrics were kept before keys (the first error
  // reported is the same).
  std::map<std::string, Accumulator> pending;
  for (const auto& [name, index] : by_name_) {
    Accumulator& a = entries_[index].pending;
    if (a.count == 0) continue;
    pending.emplace(name, std::move(a));
    a = Accumulator{};
  }
  pending_count_ = 0;
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

// One line a metric: "<flags> <reduce> <weight> <count> <host_sum>
// <host_extreme> <host_count> <on_device> <device_sum> <device_extreme> <name>".
std::string TensorMetrics::export_state() const {
  std::string out;
  char line[640];
  for (const auto& [name, index] : by_name_) {
    const Accumulator& a = entries_[index].pending;
    if (a.count == 0) continue;
    const bool on_device = a.device_sum.defined();
    const double sum = on_device ? a.device_sum.item<double>() : 0.0;
    const double extreme = on_device ? a.device_extreme.item<double>() : 0.0;
    std::snprintf(line, sizeof line, "%u %u %a %lld %a %a %lld %d %a %a ", a.flags, a.reduce, a.weight,
                  static_cast<long long>(a.count), a.host_sum, a.host_extreme, static_cast<long long>(a.host_count),
                  on_device ? 1 : 0, sum, extreme);
    out += line + name + "\n";
  }
  return out;
}

void TensorMetrics::import_state(const std::string& state, c10::Device device) {
  for (Entry& e : entries_) e.pending = Accumulator{};
  pending_count_ = 0;
  size_t at = 0;
  while (at < state.size()) {
    const size_t end = std::min(state.find('\n', at), state.size());
    const std::string line = state.substr(at, end - at);
    at = end + 1;
    Accumulator a;
    long long count = 0, host_count = 0;
    int on_device = 0, consumed = 0;
    double sum = 0, extreme = 0;
    if (std::sscanf(line.c_str(), "%u %u %la %lld %la %la %lld %d %la %la %n", &a.flags, &a.reduce, &a.weight, &count,
                    &a.host_sum, &a.host_extreme, &host_count, &on_device, &sum, &extreme, &consumed) < 10 ||
        consumed <= 0 || static_cast<size_t>(consumed) >= line.size() || count <= 0 || host_count < 0 ||
        a.reduce > KILN_METRIC_REDUCE_MIN || (on_device != 0 && on_device != 1))
      throw std::invalid_argument("not a tensor metric's state: '" + line.substr(0, 80) + "'");
    a.count = count;
    a.host_count = host_count;
    if (on_device) {
      const auto options = at::TensorOptions().dtype(at::kDouble).device(device);
      a.device_sum = at::scalar_tensor(sum, options);
      a.device_extreme = at::scalar_tensor(extreme, options);
    }
    const Key k = key(line.substr(static_cast<size_t>(consumed)));
    Accumulator& slot = entries_[k.index_].pending;
    if (slot.count == 0) ++pending_count_;
    slot = std::move(a);
  }
}

}  // namespace kiln
