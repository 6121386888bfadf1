#include "ckpt/retention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kiln {
namespace {

// A monitored value that can be ranked. NaN (a diverged metric) compares
// false with everything, which would break the sort's strict weak ordering;
// it ranks like a missing value instead, i.e. worst.
std::optional<double> rankable(const CheckpointInfo& c) {
  if (c.monitored && !std::isnan(*c.monitored)) return c.monitored;
  return std::nullopt;
}

// a newer than b: higher step, then higher epoch.
bool newer(const CheckpointInfo& a, const CheckpointInfo& b) {
  if (a.global_step != b.global_step) return a.global_step > b.global_step;
  return a.epoch > b.epoch;
}

// a ranks strictly before b under the monitor: having a value beats not
// having one, then the better value, then the newer checkpoint.
bool better_by_monitor(const CheckpointInfo& a, const CheckpointInfo& b, bool maximize) {
  const std::optional<double> va = rankable(a), vb = rankable(b);
  if (va.has_value() != vb.has_value()) return va.has_value();
  if (va && *va != *vb) return maximize ? *va > *vb : *va < *vb;
  return newer(a, b);
}

}  // namespace

std::string checkpoint_name(int64_t epoch, int64_t global_step) {
  char name[96];
  std::snprintf(name, sizeof name, "epoch=%04lld-step=%09lld.ckpt", static_cast<long long>(epoch),
                static_cast<long long>(global_step));
  return name;
}

std::vector<std::filesystem::path> to_delete(const std::vector<CheckpointInfo>& ranked,
                                             const RetentionPolicy& policy) {
  // Any negative top-k keeps everything (-1 is the documented spelling).
  if (policy.save_top_k < 0) return {};
  const bool by_monitor = !policy.monitor.empty();
  const bool maximize = by_monitor && policy.mode == MonitorMode::max;

  // Rank positions rather than copies, so the result keeps the input order.
  std::vector<size_t> order;
  for (size_t i = 0; i < ranked.size(); ++i)
    if (!ranked[i].is_last) order.push_back(i);  // last.ckpt is never a top-k candidate
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return by_monitor ? better_by_monitor(ranked[a], ranked[b], maximize) : newer(ranked[a], ranked[b]);
  });

  const size_t keep = std::min(order.size(), static_cast<size_t>(policy.save_top_k));
  std::vector<size_t> doomed(order.begin() + static_cast<std::ptrdiff_t>(keep), order.end());
  std::sort(doomed.begin(), doomed.end());
  std::vector<std::filesystem::path> out;
  out.reserve(doomed.size());
  for (const size_t i : doomed) out.push_back(ranked[i].path);
  return out;
}

std::optional<CheckpointInfo> pick_last(const std::vector<CheckpointInfo>& valid) {
  const CheckpointInfo* best = nullptr;
  for (const CheckpointInfo& c : valid) {
    if (c.is_last) return c;
    if (best == nullptr || newer(c, *best)) best = &c;
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

std::optional<CheckpointInfo> pick_best(const std::vector<CheckpointInfo>& valid, const RetentionPolicy& policy) {
  const bool by_monitor = !policy.monitor.empty();
  const bool maximize = by_monitor && policy.mode == MonitorMode::max;

  const CheckpointInfo* best_valued = nullptr;  // best by the monitor, among those with a value
  const CheckpointInfo* newest = nullptr;       // newest ranked checkpoint
  const CheckpointInfo* last = nullptr;         // last.ckpt, the fallback when nothing is ranked
  for (const CheckpointInfo& c : valid) {
    if (c.is_last) {
      if (last == nullptr) last = &c;
      continue;
    }
    if (newest == nullptr || newer(c, *newest)) newest = &c;
    if (by_monitor && rankable(c) && (best_valued == nullptr || better_by_monitor(c, *best_valued, maximize)))
      best_valued = &c;
  }
  if (best_valued != nullptr) return *best_valued;
  if (newest != nullptr) return *newest;
  if (last != nullptr) return *last;
  return std::nullopt;
}

}  // namespace kiln
