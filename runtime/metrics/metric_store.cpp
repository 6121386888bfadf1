#include "metrics/metric_store.hpp"

#include <algorithm>
#include <stdexcept>

#include "kiln/abi.h"

namespace kiln {

void MetricStore::record(const std::string& name, double value, double weight, uint32_t flags) {
  const uint32_t reduce = flags & KILN_METRIC_REDUCE_MASK;
  if (reduce > KILN_METRIC_REDUCE_MIN) throw std::invalid_argument("unknown reduction for metric '" + name + "'");
  auto [it, inserted] = pending_.try_emplace(name);
  Accumulator& a = it->second;
  if (inserted) {
    a.reduce = reduce;
    a.extreme = value;
  } else if (a.reduce != reduce) {
    throw std::invalid_argument("metric '" + name + "' was recorded with two different reductions in one epoch");
  }
  a.sum += value * weight;
  a.weight += weight;
  a.count += 1;
  if (reduce == KILN_METRIC_REDUCE_MAX) a.extreme = std::max(a.extreme, value);
  if (reduce == KILN_METRIC_REDUCE_MIN) a.extreme = std::min(a.extreme, value);
}

std::map<std::string, double> MetricStore::reduce() {
  std::map<std::string, double> out;
  for (const auto& [name, a] : pending_) {
    double value = 0;
    switch (a.reduce) {
      case KILN_METRIC_REDUCE_SUM: value = a.sum; break;
      case KILN_METRIC_REDUCE_MAX:
      case KILN_METRIC_REDUCE_MIN: value = a.extreme; break;
      default: value = a.weight > 0 ? a.sum / a.weight : 0.0; break;
    }
    out[name] = value;
    latest_[name] = value;
  }
  pending_.clear();
  return out;
}

std::optional<double> MetricStore::latest(const std::string& name) const {
  auto it = latest_.find(name);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln
