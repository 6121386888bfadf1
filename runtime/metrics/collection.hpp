// Per-sample rows that a model's steps hand over (kiln_host.collect), for
// metrics over a whole split (docs/metrics.md). One Collection holds one
// rank's rows of one split for one epoch, each row tagged with its sample
// index and where in the epoch it was collected; merge_collections turns
// every rank's rows into the whole split, ordered by sample index, each
// sample once: the same bytes whatever the number of ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

namespace kiln {

// The name under which merged rows carry their sample indices.
inline constexpr const char* kIndexColumn = "kiln.index";

class Collection {
 public:
  // One step: its rows are the samples indices[0..count) of its batch,
  // number `batch` of the epoch (tags the rows; earlier batches win a tie).
  void begin_step(const int64_t* indices, size_t count, int64_t batch);
  bool in_step() const { return in_step_; }
  // Copies `rows` (detached; from a device without waiting for it). Returns
  // "" or, for the person, why it is refused (the rows are then dropped).
  std::string add(const std::string& name, const at::Tensor& rows);
  // Closes the step: "" or why what it collected is incomplete.
  std::string end_step();
  // Ends a step whose rows are not kept (a batch repeated only so that
  // every rank runs as many: distributed.shard = "parameters").
  void drop_step();

  // What this rank holds, for the cross-rank check and the limit: one line
  // per name ("<name> <dtype> [<trailing shape>]"), in name order.
  std::vector<std::string> columns() const;
  int64_t steps() const { return steps_; }
  int64_t rows() const { return static_cast<int64_t>(indices_.size()); }
  int64_t bytes() const;
  bool empty() const { return indices_.empty() && names_.empty(); }

  // Everything collected, as bytes another rank can merge (waits for the
  // copies from a device first).
  std::string serialize();
  // Rows merged earlier (a checkpoint of an interrupted epoch) taken back:
  // they count as collected before every step of this run.
  void restore(const std::string& merged);
  void clear();

 private:
  struct Column {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> trailing;
    std::vector<at::Tensor> chunks;  // CPU, contiguous
  };
  Column* find(const std::string& name);

  std::vector<Column> names_;
  std::vector<int64_t> indices_, batches_;
  std::vector<std::string> step_names_;  // what the current step collected
  std::vector<int64_t> step_indices_;
  int64_t step_batch_ = 0;
  int64_t steps_ = 0, steps_with_rows_ = 0;
  bool in_step_ = false;
  std::optional<c10::Event> copied_;  // the last copy from a device
};

// Every rank's serialized rows (rank order) as one table: the sample
// indices (kIndexColumn, int64) and each name's rows, ordered by sample
// index; a sample collected more than once (a training epoch's padding)
// keeps its first occurrence in the epoch (earliest batch, then rank).
// Throws std::invalid_argument for bytes it cannot read, or ranks whose
// columns differ.
std::vector<std::pair<std::string, at::Tensor>> merge_collections(const std::vector<std::string>& per_rank);

// The merged table as bytes again (what a checkpoint keeps).
std::string serialize_merged(const std::vector<std::pair<std::string, at::Tensor>>& merged);

}  // namespace kiln
