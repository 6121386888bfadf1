#include "metrics/metrics_checkpoint.hpp"

namespace kiln {

void MetricsPart::save(CheckpointSnapshot& snapshot) const {
  snapshot.add("metrics/latest", s_.latest);
  snapshot.add("metrics/pending", s_.pending);
  for (size_t r = 0; r < s_.state.size(); ++r) snapshot.add("metrics/state/" + std::to_string(r), s_.state[r]);
  for (size_t r = 0; r < s_.tensor_state.size(); ++r)
    snapshot.add("metrics/tensor_state/" + std::to_string(r), s_.tensor_state[r]);
  if (!s_.collected.empty()) snapshot.add("metrics/collected/train", s_.collected);
}

void MetricsPart::load(const CheckpointFile& file) {
  const std::string where = file.path().string();
  s_.latest = std::string(file.section("metrics/latest"));
  s_.pending = std::string(file.section("metrics/pending"));
  s_.state.clear();
  s_.tensor_state.clear();
  for (size_t r = 0; file.has("metrics/state/" + std::to_string(r)); ++r) {
    const std::string tensors = "metrics/tensor_state/" + std::to_string(r);
    if (!file.has(tensors)) throw CheckpointError(where + ": section '" + tensors + "' is missing");
    s_.state.emplace_back(file.section("metrics/state/" + std::to_string(r)));
    s_.tensor_state.emplace_back(file.section(tensors));
  }
  if (!s_.state.empty() && saved_by_.world_size > 0 && s_.state.size() != static_cast<size_t>(saved_by_.world_size))
    throw CheckpointError(where + ": it holds the metrics of " + std::to_string(s_.state.size()) +
                          " ranks but was saved by " + std::to_string(saved_by_.world_size));
  s_.collected = file.has("metrics/collected/train") ? std::string(file.section("metrics/collected/train")) : "";
}

}  // namespace kiln
