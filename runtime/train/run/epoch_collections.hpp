// The host's side of kiln_host.collect (ABI 1.2, docs/metrics.md): each
// split's rows for the epoch, checked as they arrive; at the epoch's end
// every rank's rows are gathered — after the ranks agreed on what they
// collected and on its size — merged in sample order, and handed to the
// model's on_epoch_end (whose metrics are whole-split values) and the
// callbacks' on_epoch_collected. The training split's rows so far travel
// with a mid-epoch checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "metrics/collection.hpp"
#include "loop_parts/loop_parts.hpp"

namespace kiln {

class CallbackSet;
class ModelProxy;
class ProcessGroup;
class RunMetrics;

class EpochCollections final : public StepCollector {
 public:
  // `group`: null in one process. `limit_bytes`: the most the whole split's
  // rows may take (every rank holds all of them at the epoch's end).
  EpochCollections(ProcessGroup* group, RunMetrics& metrics, int64_t limit_bytes);

  // The hooks that take the rows (after the plugins are created).
  void attach(ModelProxy* model, CallbackSet* callbacks);

  // Whether any hook takes collected rows (the model's on_epoch_end, a
  // callback's on_epoch_collected): without one the loops collect nothing.
  bool consumed() const;
  // kiln_host.collect: "" or why the rows are refused.
  std::string collect(const std::string& plugin_id, bool main_thread, const char* name, const at::Tensor& rows);

  // StepCollector (the loops).
  void begin_step(kiln_split split, std::vector<int64_t> indices, int64_t batch) override;
  void end_step(kiln_split split) override;
  void drop_step(kiln_split split) override;
  void end_epoch(kiln_split split, const kiln_progress& progress) override;
  void discard(kiln_split split) override { of(split).clear(); }

  // A checkpoint inside a training epoch: the rows collected so far on
  // every rank, merged (a collective: every rank calls it); "" when none.
  std::string gather_for_checkpoint();
  // A resumed epoch: rank 0 takes back the merged rows of the checkpoint.
  void restore(const std::string& merged, int32_t rank);

 private:
  Collection& of(kiln_split split);
  // Every rank's columns, rows and bytes; throws on every rank alike when
  // the ranks collected differently or the total passes the limit. Returns
  // the rows of all ranks.
  int64_t agree(kiln_split split, const Collection& mine);
  void raise_pending(const char* hook);

  ProcessGroup* group_;
  RunMetrics& metrics_;
  int64_t limit_bytes_;
  ModelProxy* model_ = nullptr;
  CallbackSet* callbacks_ = nullptr;
  std::map<kiln_split, Collection> splits_;
  kiln_split active_ = 0;  // the split of the step in progress, or 0
  std::mutex pending_mutex_;  // a refusal may come from a prefetch thread
  std::string pending_;       // the first refusal not yet raised
  std::string pending_plugin_;
  std::set<std::string> warned_;
};

// metrics.collect_limit_mib as bytes; 0 means an eighth of this machine's memory.
int64_t collect_limit_bytes(int64_t mib);

}  // namespace kiln
