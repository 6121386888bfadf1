#include "train/run/epoch_collections.hpp"

#include <chrono>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include <ATen/core/grad_mode.h>
#include <spdlog/spdlog.h>

#include "distributed/process_group.hpp"
#include "plugin/host_objects.hpp"
#include "plugin/proxies.hpp"
#include "train/run/run_metrics.hpp"

namespace kiln {

namespace {

const char* step_hook(kiln_split split) {
  switch (split) {
    case KILN_SPLIT_TRAIN: return "training_step";
    case KILN_SPLIT_VAL: return "validation_step";
    default: return "test_step";
  }
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// One rank's line of the agreement: "<steps> <rows> <bytes>", then its columns.
struct RankCollection {
  int64_t steps = 0, rows = 0, bytes = 0;
  std::map<std::string, std::string> columns;  // name -> "dtype [N, ...]"
};

RankCollection parse_rank(const std::string& text) {
  RankCollection r;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  std::istringstream(line) >> r.steps >> r.rows >> r.bytes;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    r.columns[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return r;
}

// "" when rank `r` collected what rank `ref` did, else the line naming both.
std::string compare(const RankCollection& a, size_t r, const RankCollection& ref, size_t rf) {
  for (const auto& [name, type] : ref.columns) {
    auto it = a.columns.find(name);
    if (it == a.columns.end())
      return fmt::format("rank {} did not collect '{}', which rank {} did (every rank collects the same names)", r,
                         name, rf);
    if (it->second != type)
      return fmt::format("rank {} collected '{}' as {} but rank {} as {} (a name has one dtype and trailing shape "
                         "on every rank)",
                         r, name, it->second, rf, type);
  }
  for (const auto& [name, type] : a.columns)
    if (!ref.columns.count(name))
      return fmt::format("rank {} collected '{}', which rank {} did not (every rank collects the same names)", r, name,
                         rf);
  return "";
}

}  // namespace

int64_t collect_limit_bytes(int64_t limit_mib) {
  if (limit_mib > 0) return limit_mib << 20;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 8 : int64_t{1} << 30;
}

EpochCollections::EpochCollections(ProcessGroup* group, RunMetrics& metrics, int64_t limit_bytes)
    : group_(group), metrics_(metrics), limit_bytes_(limit_bytes) {}

void EpochCollections::attach(ModelProxy* model, CallbackSet* callbacks) {
  model_ = model;
  callbacks_ = callbacks;
}

bool EpochCollections::consumed() const {
  return (model_ && model_->has_epoch_end()) || (callbacks_ && callbacks_->wants_collections());
}

Collection& EpochCollections::of(kiln_split split) { return splits_[split]; }

std::string EpochCollections::collect(const std::string& plugin_id, bool main_thread, const char* name,
                                      const at::Tensor& rows) {
  std::string problem;
  if (!main_thread) {
    problem = fmt::format("collected '{}' on a prefetch thread: collect is [main-thread], for the model's "
                          "training_step, validation_step and test_step",
                          name);
  } else if (!consumed()) {
    if (warned_.insert(name).second)
      spdlog::warn("[{}] collects '{}', but neither the model's on_epoch_end nor a callback's on_epoch_collected "
                   "takes collected rows: they are dropped (docs/metrics.md)",
                   plugin_id, name);
    return "";
  } else if (active_ == 0) {
    problem = fmt::format("collected '{}' outside a step: collect in training_step, validation_step or test_step",
                          name);
  } else {
    Collection& c = of(active_);
    problem = c.add(name, rows);
    if (problem.empty() && c.bytes() > limit_bytes_)
      problem = fmt::format("the {} split's rows collected on this rank alone take {}, more than "
                            "metrics.collect_limit_mib ({}): raise the key, or collect less (fewer names, smaller "
                            "dtypes)",
                            split_name(active_), mib(c.bytes()), mib(limit_bytes_));
  }
  if (!problem.empty()) {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (pending_.empty()) {
      pending_ = problem;
      pending_plugin_ = plugin_id;
    }
  }
  return problem;
}

void EpochCollections::raise_pending(const char* hook) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  if (pending_.empty()) return;
  std::string problem = std::move(pending_);
  pending_.clear();
  const bool model = model_ && pending_plugin_ == model_->id();
  throw HookError(pending_plugin_, model ? "model" : "plugin", hook, problem);
}

void EpochCollections::begin_step(kiln_split split, std::vector<int64_t> indices, int64_t batch) {
  raise_pending("collect");  // a refusal outside any step, ignored by its plugin
  if (!consumed()) return;
  active_ = split;
  of(split).begin_step(indices.data(), indices.size(), batch);
}

void EpochCollections::end_step(kiln_split split) {
  if (active_ == 0) {
    raise_pending(step_hook(split));
    return;
  }
  active_ = 0;
  const std::string problem = of(split).end_step();
  raise_pending(step_hook(split));
  if (!problem.empty()) throw HookError(model_ ? model_->id() : "model", "model", step_hook(split), problem);
}

void EpochCollections::drop_step(kiln_split split) {
  if (active_ == 0) {
    raise_pending(step_hook(split));
    return;
  }
  active_ = 0;
  of(split).drop_step();
  raise_pending(step_hook(split));
}

int64_t EpochCollections::agree(kiln_split split, const Collection& mine) {
  std::string text = fmt::format("{} {} {}\n", mine.steps(), mine.rows(), mine.bytes());
  for (const std::string& column : mine.columns()) text += column + "\n";
  const std::vector<std::string> all = group_ ? group_->all_gather_text(text) : std::vector<std::string>{text};
  std::vector<RankCollection> ranks;
  for (const auto& t : all) ranks.push_back(parse_rank(t));
  int64_t total = 0, rows = 0;
  size_t ref = ranks.size();
  for (size_t r = 0; r < ranks.size(); ++r) {
    total += ranks[r].bytes;
    rows += ranks[r].rows;
    if (ref == ranks.size() && ranks[r].rows > 0) ref = r;
  }
  if (ref < ranks.size()) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string problem;
      if (ranks[r].rows == 0 && ranks[r].steps > 0)
        problem = fmt::format("rank {} collected nothing in its {} steps, while rank {} collected '{}'", r,
                              ranks[r].steps, ref, ranks[ref].columns.begin()->first);
      else if (ranks[r].rows > 0)
        problem = compare(ranks[r], r, ranks[ref], ref);
      if (!problem.empty())
        throw HookError(model_ ? model_->id() : "model", "model", step_hook(split), problem);
    }
  }
  if (total > limit_bytes_)
    throw std::runtime_error(fmt::format(
        "the {} split's collected rows take {} over all ranks, more than metrics.collect_limit_mib ({}): every rank "
        "holds all of them at the epoch's end; raise the key, or collect less (fewer names, smaller dtypes)",
        split_name(split), mib(total), mib(limit_bytes_)));
  return rows;
}

void EpochCollections::end_epoch(kiln_split split, const kiln_progress& progress) {
  raise_pending("collect");
  Collection& mine = of(split);
  if (!consumed()) {
    mine.clear();
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  // Nothing collected anywhere (a split the model does not collect in):
  // the agreement was the only exchange.
  const bool any = agree(split, mine) > 0;
  const std::vector<std::string> all = !any ? std::vector<std::string>{}
                                       : group_ ? group_->all_gather_bytes(mine.serialize())
                                                : std::vector<std::string>{mine.serialize()};
  mine.clear();
  kiln_batch rows;
  try {
    rows.tensors = merge_collections(all);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("the {} split's collected rows cannot be merged: {}", split_name(split),
                                         e.what()));
  }
  const auto gathered = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  if (model_) {
    struct WholeSplit {
      RunMetrics& m;
      explicit WholeSplit(RunMetrics& metrics) : m(metrics) { m.begin_whole_split(); }
      ~WholeSplit() { m.end_whole_split(); }
    } whole(metrics_);
    model_->on_epoch_end(split, rows);
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    int64_t bytes = 0;
    for (const auto& [name, t] : rows.tensors) bytes += static_cast<int64_t>(t.nbytes());
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    spdlog::debug("collected {} rows: {} rows, {}; agreed, gathered and merged in {:.2f} ms; on_epoch_end {:.2f} ms",
                  split_name(split), rows.tensors.front().second.size(0), mib(bytes), ms(started, gathered),
                  ms(gathered, std::chrono::steady_clock::now()));
  }
  if (callbacks_ && rows.tensors.front().second.numel() > 0) callbacks_->epoch_collected(progress, split, rows);
}

std::string EpochCollections::gather_for_checkpoint() {
  if (!consumed()) return "";
  Collection& mine = of(KILN_SPLIT_TRAIN);
  const std::vector<std::string> all =
      group_ ? group_->all_gather_bytes(mine.serialize()) : std::vector<std::string>{mine.serialize()};
  const auto merged = merge_collections(all);
  if (merged.front().second.numel() == 0) return "";
  return serialize_merged(merged);
}

void EpochCollections::restore(const std::string& merged, int32_t rank) {
  if (rank == 0 && !merged.empty()) of(KILN_SPLIT_TRAIN).restore(merged);
}

}  // namespace kiln
