// Metrics recorded by plugins (and the host) during an epoch, reduced by the
// host at fixed points. Plugins only record; only the host reduces, so no
// plugin can start a collective that other ranks do not join.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

class MetricStore {
 public:
  // Records one value (main thread). A metric's reduction is fixed by its
  // first record in an epoch; a different one later is an error.
  void record(const std::string& name, double value, double weight, uint32_t flags);
  // A whole-split value (logged in on_epoch_end from every rank's collected
  // rows, docs/metrics.md): taken as it is, the last one in an epoch, never
  // averaged; across ranks the lowest rank's is kept, and a rank whose value
  // differs is named (it did not compute from the collected rows alone).
  static constexpr uint32_t kReduceGiven = 4;
  void record_given(const std::string& name, double value, uint32_t flags);
  // Adds what was accumulated elsewhere (metrics/tensor_metrics: values
  // recorded as tensors): `weighted_sum` is the sum of value * weight over
  // `count` values of total weight `weight`, `extreme` their max or min.
  // The same result as recording each value here; the same reduction rule.
  void record_accumulated(const std::string& name, uint32_t flags, double weighted_sum, double weight,
                          double extreme, int64_t count);

  // Reduces everything recorded since the last call; the results become the
  // latest values. Returns the reduced metrics.
  std::map<std::string, double> reduce();

  // Distributed reduction: every rank exports what it recorded since the last
  // reduce (metrics flagged rank-zero-only stay local), the host gathers the
  // texts, and every rank merges all of them in rank order, so all ranks get
  // the same values. A metric some ranks did not record is reduced over the
  // ranks that have it; `missing` receives one line naming those without it.
  std::string export_pending() const;
  std::map<std::string, double> reduce_merged(const std::vector<std::string>& per_rank,
                                              std::vector<std::string>* missing);

  // For checkpoints: the latest values, and (with export_pending) what an
  // interrupted epoch had recorded so far; import puts both back.
  std::string export_latest() const;
  void import(const std::string& latest, const std::string& pending);

  // For checkpoints, exactly: everything recorded since the last reduce,
  // rank-zero-only metrics and flags included (export_pending leaves those
  // out), as text that round-trips every double. add_state adds such a text
  // to what is pending: into an empty store it restores the state bit for
  // bit; states of several ranks added in rank order merge as reduce_merged
  // would. Throws std::invalid_argument for a line it cannot read.
  std::string export_state() const;
  void add_state(const std::string& state);

  // Around a validation inside an epoch: the epoch's records so far leave
  // pending (reduce and export_pending do not see them) and come back.
  void set_aside();
  void take_back();
  // Forgets what is pending (the latest values stay).
  void discard_pending() { pending_.clear(); }

  std::optional<double> latest(const std::string& name) const;
  const std::map<std::string, double>& latest() const { return latest_; }

 private:
  struct Accumulator {
    uint32_t flags = 0;
    uint32_t reduce = 0;
    double sum = 0, weight = 0, extreme = 0;
    int64_t count = 0;
  };
  static double value_of(const Accumulator& a);
  static bool parse_pending(const std::string& line, std::string* name, Accumulator* a);
  std::map<std::string, Accumulator> pending_, aside_;
  std::map<std::string, double> latest_;
};

}  // namespace kiln
