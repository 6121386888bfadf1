// The metrics' part of a checkpoint, as the run exports them (strings; no
// LibTorch here): "metrics/latest" (MetricStore::export_latest),
// "metrics/pending" (rank 0's export_pending, for older kilns),
// "metrics/state/<r>" and "metrics/tensor_state/<r>" (every rank's
// unreduced metrics, in rank order: an interrupted epoch's, exactly; absent
// in an older kiln's checkpoint) and "metrics/collected/train". The
// loggers' states are their own part (metrics/loggers.hpp).
#pragma once

#include <string>
#include <vector>

#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/stateful.hpp"

namespace kiln {

struct MetricsSections {
  std::string latest, pending;
  std::vector<std::string> state, tensor_state;  // per rank
  std::string collected;  // "metrics/collected/train": an interrupted epoch's collected rows (absent: none)
};

class MetricsPart : public Stateful {
 public:
  // `saved_by`: the run that saved the checkpoint, as its "meta" section
  // says (loaded before this part): it must have saved every rank's metrics.
  MetricsPart(MetricsSections& sections, const SavedBy& saved_by) : s_(sections), saved_by_(saved_by) {}
  void save(CheckpointSnapshot& snapshot) const override;
  void load(const CheckpointFile& file) override;

 private:
  MetricsSections& s_;
  const SavedBy& saved_by_;
};

}  // namespace kiln
