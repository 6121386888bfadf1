// trainer.data_workers and trainer.prefetch_batches: how many host threads
// call the data module's get_batch, and how many batches may be in flight.
// Pure decisions (no threads, no clocks), so every rule has a unit test.
//
//   data_workers = 0        get_batch inline, on the main thread before each step
//   data_workers = N        N worker threads; batches reach the step in sampler order
//   data_workers = "auto"   (the default) one line in the log says what it chose and why:
//     - a data module that does not declare KILN_DATA_CONCURRENT_GET_BATCH
//       (every 1.0/1.1 plugin) gets at most one thread: its calls are
//       serialised anyway;
//     - on a GPU: one thread per core of this rank's share but the main
//       thread's, at most 8 (the step only queues work);
//     - on the CPU: the cores of this rank's share the intra-op threads leave
//       over, at most 8; none left: inline; one process: a trial early in
//       epoch 0 times inline against the threads and keeps the faster
//       (data/fetch_trial.hpp); several processes: the threads.
//   prefetch_batches = "auto": twice the workers, at least 4.
#pragma once

#include <string>

namespace kiln {

struct DataWorkersPlan {
  enum class Kind { inline_, threads, trial } kind = Kind::threads;
  int threads = 1;  // worker threads when not inline
  int depth = 4;    // batches in flight (the bounded queue)
  std::string log;  // one line for the log, or empty
};

struct DataWorkersInput {
  int requested = -1;        // trainer.data_workers; -1 = auto
  int requested_depth = -1;  // trainer.prefetch_batches; -1 = auto
  bool concurrent = false;   // the data module sets KILN_DATA_CONCURRENT_GET_BATCH
  bool on_gpu = false;
  int intra_op_threads = 1;
  int cores = 1;       // the cores this process may use
  int world_size = 1;  // ranks sharing them (this node's)
  std::string data_id; // for the log line
};

DataWorkersPlan plan_data_workers(const DataWorkersInput& in);

}  // namespace kiln
