#include "metrics/metric_store.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "kiln/abi.h"

namespace kiln {

void MetricStore::record(const std::string& name, double value, double weight, uint32_t flags) {
  if ((flags & KILN_METRIC_REDUCE_MASK) > KILN_METRIC_REDUCE_MIN)
    throw std::invalid_argument("unknown reduction for metric '" + name + "'");
  record_accumulated(name, flags, value * weight, weight, value, 1);
}

void MetricStore::record_given(const std::string& name, double value, uint32_t flags) {
  record_accumulated(name, (flags & ~KILN_METRIC_REDUCE_MASK) | kReduceGiven, value, 1.0, value, 1);
}

void MetricStore::record_accumulated(const std::string& name, uint32_t flags, double weighted_sum, double weight,
                                     double extreme, int64_t count) {
  const uint32_t reduce = flags & KILN_METRIC_REDUCE_MASK;
  if (reduce > KILN_METRIC_REDUCE_MIN && reduce != kReduceGiven)
    throw std::invalid_argument("unknown reduction for metric '" + name + "'");
  if (count <= 0) return;
  auto [it, inserted] = pending_.try_emplace(name);
  Accumulator& a = it->second;
  if (inserted) {
    a.flags = flags;
    a.reduce = reduce;
    a.extreme = extreme;
  } else if (a.reduce != reduce) {
    throw std::invalid_argument("metric '" + name + "' was recorded with two different reductions in one epoch");
  }
  if (reduce == kReduceGiven) {  // the last value counts
    a.sum = a.extreme = extreme;
    a.weight = 1.0;
    a.count += count;
    return;
  }
  a.sum += weighted_sum;
  a.weight += weight;
  a.count += count;
  if (reduce == KILN_METRIC_REDUCE_MAX) a.extreme = std::max(a.extreme, extreme);
  if (reduce == KILN_METRIC_REDUCE_MIN) a.extreme = std::min(a.extreme, extreme);
}

double MetricStore::value_of(const Accumulator& a) {
  switch (a.reduce) {
    case KILN_METRIC_REDUCE_SUM: return a.sum;
    case KILN_METRIC_REDUCE_MAX:
    case KILN_METRIC_REDUCE_MIN:
    case kReduceGiven: return a.extreme;
    default: return a.weight > 0 ? a.sum / a.weight : 0.0;
  }
}

std::map<std::string, double> MetricStore::reduce() {
  std::map<std::string, double> out;
  for (const auto& [name, a] : pending_) out[name] = latest_[name] = value_of(a);
  pending_.clear();
  return out;
}

// One line of export_pending(): "<reduce> <sum> <weight> <extreme> <count> <name>".
bool MetricStore::parse_pending(const std::string& line, std::string* name, Accumulator* a) {
  unsigned reduce = 0;
  long long count = 0;
  int consumed = 0;
  if (std::sscanf(line.c_str(), "%u %la %la %la %lld %n", &reduce, &a->sum, &a->weight, &a->extreme, &count,
                  &consumed) < 5)
    return false;
  a->reduce = reduce;
  a->count = count;
  *name = line.substr(static_cast<size_t>(consumed));
  return true;
}

std::string MetricStore::export_pending() const {
  // One line a metric; %a keeps doubles exact across the text round trip.
  std::string out;
  char line[512];
  for (const auto& [name, a] : pending_) {
    if (a.flags & KILN_METRIC_RANK_ZERO_ONLY) continue;
    std::snprintf(line, sizeof line, "%u %a %a %a %lld ", a.reduce, a.sum, a.weight, a.extreme,
                  static_cast<long long>(a.count));
    out += line + name + "\n";
  }
  return out;
}

std::map<std::string, double> MetricStore::reduce_merged(const std::vector<std::string>& per_rank,
                                                         std::vector<std::string>* missing) {
  std::map<std::string, Accumulator> merged;
  std::map<std::string, std::vector<size_t>> holders;
  // name -> reduction -> ranks: one metric must be reduced one way everywhere.
  std::map<std::string, std::map<unsigned, std::string>> reductions;
  std::map<std::string, std::string> differing;  // whole-split values unlike the first rank's
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    std::istringstream in(per_rank[rank]);
    for (std::string line; std::getline(in, line);) {
      std::string name;
      Accumulator r;
      if (!parse_pending(line, &name, &r)) continue;
      std::string& ranks = reductions[name][r.reduce];
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
      auto [it, inserted] = merged.try_emplace(name, r);
      Accumulator& a = it->second;
      if (!inserted && r.reduce == kReduceGiven) {
        if (std::memcmp(&a.extreme, &r.extreme, sizeof(double)) != 0)
          differing[name] += (differing[name].empty() ? "" : ", ") + std::to_string(rank);
      } else if (!inserted) {
        a.sum += r.sum;
        a.weight += r.weight;
        a.count += r.count;
        if (r.reduce == KILN_METRIC_REDUCE_MAX) a.extreme = std::max(a.extreme, r.extreme);
        if (r.reduce == KILN_METRIC_REDUCE_MIN) a.extreme = std::min(a.extreme, r.extreme);
      }
      holders[name].push_back(rank);
    }
  }
  // Every rank sees the same gathered lines, so every rank refuses alike.
  for (const auto& [name, ways] : reductions) {
    if (ways.size() < 2) continue;
    static const char* const kNames[] = {"mean", "sum", "max", "min", "a whole-split value"};
    std::string text;
    for (const auto& [reduce, ranks] : ways)
      text += (text.empty() ? "" : " and as ") + std::string(reduce <= kReduceGiven ? kNames[reduce] : "?") + " on rank(s) " + ranks;
    pending_.clear();
    throw std::runtime_error("metric '" + name + "' is reduced as " + text +
                             ": ranks must log a metric with the same reduction (the values cannot be combined)");
  }
  std::map<std::string, double> out;
  for (const auto& [name, ranks] : differing)
    if (missing)
      missing->push_back("metric '" + name + "' was logged in on_epoch_end with another value on rank(s) " + ranks +
                         " than on the first rank: compute a whole-split value from the collected rows only (kept: "
                         "the first rank's)");
  for (const auto& [name, a] : merged) {
    out[name] = latest_[name] = value_of(a);
    const auto& have = holders[name];
    if (missing && have.size() != per_rank.size()) {
      std::string with, without;
      for (size_t r = 0, h = 0; r < per_rank.size(); ++r) {
        const bool has = h < have.size() && have[h] == r;
        if (has) ++h;
        (has ? with : without) += (has ? with : without).empty() ? std::to_string(r) : ", " + std::to_string(r);
      }
      missing->push_back("metric '" + name + "' was recorded on rank(s) " + with + " only; reduced over those " +
                         "(rank(s) " + without + " recorded none: log it on every rank, or flag it rank-zero-only)");
    }
  }
  // Rank-zero-only metrics never left this rank: reduce them locally.
  for (const auto& [name, a] : pending_)
    if (a.flags & KILN_METRIC_RANK_ZERO_ONLY) out[name] = latest_[name] = value_of(a);
  pending_.clear();
  return out;
}

std::string MetricStore::export_latest() const {
  std::string out;
  char value[64];
  for (const auto& [name, v] : latest_) {
    std::snprintf(value, sizeof value, "%a ", v);
    out += value + name + "\n";
  }
  return out;
}

void MetricStore::import(const std::string& latest, const std::string& pending) {
  latest_.clear();
  std::istringstream in(latest);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    latest_[line.substr(space + 1)] = std::strtod(line.substr(0, space).c_str(), nullptr);
  }
  pending_.clear();
  std::istringstream p(pending);
  for (std::string line; std::getline(p, line);) {
    std::string name;
    Accumulator a;
    if (parse_pending(line, &name, &a)) pending_[name] = a;
  }
}

// One line of export_state(): "<flags> <reduce> <sum> <weight> <extreme> <count> <name>".
std::string MetricStore::export_state() const {
  std::string out;
  char line[512];
  for (const auto& [name, a] : pending_) {
    std::snprintf(line, sizeof line, "%u %u %a %a %a %lld ", a.flags, a.reduce, a.sum, a.weight, a.extreme,
                  static_cast<long long>(a.count));
    out += line + name + "\n";
  }
  return out;
}

void MetricStore::add_state(const std::string& state) {
  std::istringstream in(state);
  for (std::string line; std::getline(in, line);) {
    unsigned flags = 0, reduce = 0;
    double sum = 0, weight = 0, extreme = 0;
    long long count = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%u %u %la %la %la %lld %n", &flags, &reduce, &sum, &weight, &extreme, &count,
                    &consumed) < 6 ||
        consumed <= 0 || static_cast<size_t>(consumed) >= line.size() || count < 0 ||
        (flags & KILN_METRIC_REDUCE_MASK) != reduce)
      throw std::invalid_argument("not a metric's state: '" + line.substr(0, 80) + "'");
    record_accumulated(line.substr(static_cast<size_t>(consumed)), flags, sum, weight, extreme, count);
  }
}

void MetricStore::set_aside() {
  aside_ = std::move(pending_);
  pending_.clear();
}

void MetricStore::take_back() {
  // A name recorded on both sides of the aside keeps the epoch's value: the
  // validation's records were reduced already.
  for (auto& [name, a] : aside_) pending_[name] = a;
  aside_.clear();
}

std::optional<double> MetricStore::latest(const std::string& name) const {
  auto it = latest_.find(name);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kiln
