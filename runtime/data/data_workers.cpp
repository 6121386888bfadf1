#include "data/data_workers.hpp"

#include <algorithm>

#include "data/fetch_trial.hpp"

namespace kiln {

namespace {

// More threads than this rarely pay: past it the gather is memory-bound, and
// each thread is a stack and a wake-up per batch (DataLoader users settle on
// 4-8 workers per GPU for the same reason).
constexpr int kMaxAutoWorkers = 8;

std::string plural(int n, const char* one, const char* many) { return std::to_string(n) + " " + (n == 1 ? one : many); }

}  // namespace

DataWorkersPlan plan_data_workers(const DataWorkersInput& in) {
  DataWorkersPlan plan;
  const std::string module = "data module '" + in.data_id + "'";
  const int ranks = std::max(1, in.world_size);
  const int share = std::max(1, in.cores / ranks);
  const std::string rank_share = plural(share, "core", "cores") + (ranks > 1 ? " for each of " + std::to_string(ranks) + " ranks" : "");
  if (in.requested == 0) {
    plan.kind = DataWorkersPlan::Kind::inline_;
  } else if (in.requested > 0) {
    plan.threads = in.concurrent ? in.requested : 1;
    if (!in.concurrent && in.requested > 1)
      plan.log = "trainer.data_workers = " + std::to_string(in.requested) + ": 1 worker thread, as " + module +
                 " does not declare concurrent get_batch (its calls would run one at a time)";
  } else if (in.on_gpu) {
    plan.threads = in.concurrent ? std::clamp(share - 1, 1, kMaxAutoWorkers) : 1;
    plan.log = "trainer.data_workers = auto: " + plural(plan.threads, "worker thread", "worker threads") + " (GPU; " +
               rank_share + (in.concurrent ? ", one kept for the main thread" : "; " + module + " is not concurrent") + ")";
  } else {
    const int left = share - in.intra_op_threads;
    plan.threads = in.concurrent ? std::clamp(left, 1, kMaxAutoWorkers) : 1;
    const AutoStart start = auto_start(in.intra_op_threads, plan.threads, in.cores, ranks);
    const std::string why = rank_share + ", " + plural(in.intra_op_threads, "intra-op thread", "intra-op threads") +
                            (in.concurrent ? "" : "; " + module + " is not concurrent");
    switch (start.kind) {
      case AutoStart::Kind::inline_:
        plan.kind = DataWorkersPlan::Kind::inline_;
        plan.log = "trainer.data_workers = auto: get_batch inline (" + why + ": a worker thread would compete with the step)";
        break;
      case AutoStart::Kind::thread:
        plan.log = "trainer.data_workers = auto: " + plural(plan.threads, "worker thread", "worker threads") + " (" + why + ")";
        break;
      case AutoStart::Kind::trial:
        plan.kind = DataWorkersPlan::Kind::trial;
        plan.log = "trainer.data_workers = auto: a trial in epoch 0 times get_batch inline against " +
                   plural(plan.threads, "worker thread", "worker threads") + " (" + why + ")";
        break;
    }
  }
  plan.depth = in.requested_depth > 0 ? in.requested_depth : std::max(4, 2 * plan.threads);
  return plan;
}

}  // namespace kiln
