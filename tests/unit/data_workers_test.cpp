// trainer.data_workers / prefetch_batches: what `auto` picks, and the one
// line that says why (data/data_workers.hpp).
#include <gtest/gtest.h>

#include "data/data_workers.hpp"

namespace {

using kiln::DataWorkersInput;
using kiln::DataWorkersPlan;
using Kind = kiln::DataWorkersPlan::Kind;

DataWorkersInput cpu(int requested, bool concurrent, int intra, int cores, int ranks = 1) {
  DataWorkersInput in;
  in.requested = requested;
  in.concurrent = concurrent;
  in.intra_op_threads = intra;
  in.cores = cores;
  in.world_size = ranks;
  in.data_id = "kiln.image_folder";
  return in;
}

TEST(DataWorkers, AnExplicitCountIsKeptForAConcurrentModuleAndOneThreadOtherwiseWithALine) {
  const DataWorkersPlan four = kiln::plan_data_workers(cpu(4, true, 1, 2));
  EXPECT_EQ(four.kind, Kind::threads);
  EXPECT_EQ(four.threads, 4);
  EXPECT_EQ(four.depth, 8) << "twice the workers";
  EXPECT_EQ(four.log, "");
  const DataWorkersPlan serial = kiln::plan_data_workers(cpu(4, false, 1, 2));
  EXPECT_EQ(serial.threads, 1);
  EXPECT_EQ(serial.depth, 4);
  EXPECT_EQ(serial.log,
            "trainer.data_workers = 4: 1 worker thread, as data module 'kiln.image_folder' does not declare concurrent "
            "get_batch (its calls would run one at a time)");
  EXPECT_EQ(kiln::plan_data_workers(cpu(0, true, 1, 8)).kind, Kind::inline_);
}

TEST(DataWorkers, PrefetchBatchesBoundsTheQueueAsGiven) {
  DataWorkersInput in = cpu(3, true, 1, 4);
  in.requested_depth = 2;
  EXPECT_EQ(kiln::plan_data_workers(in).depth, 2);
  in.requested_depth = -1;
  EXPECT_EQ(kiln::plan_data_workers(in).depth, 6);
}

TEST(DataWorkers, AutoOnTheCpuUsesTheCoresTheIntraOpThreadsLeaveOver) {
  const DataWorkersPlan filled = kiln::plan_data_workers(cpu(-1, true, 2, 2));
  EXPECT_EQ(filled.kind, Kind::inline_);
  EXPECT_EQ(filled.log,
            "trainer.data_workers = auto: get_batch inline (2 cores, 2 intra-op threads: a worker thread would "
            "compete with the step)");
  const DataWorkersPlan trial = kiln::plan_data_workers(cpu(-1, true, 2, 8));
  EXPECT_EQ(trial.kind, Kind::trial);
  EXPECT_EQ(trial.threads, 6);
  EXPECT_EQ(trial.log,
            "trainer.data_workers = auto: a trial in epoch 0 times get_batch inline against 6 worker threads (8 cores, "
            "2 intra-op threads)");
  const DataWorkersPlan serial = kiln::plan_data_workers(cpu(-1, false, 2, 8));
  EXPECT_EQ(serial.threads, 1);
  EXPECT_NE(serial.log.find("data module 'kiln.image_folder' is not concurrent"), std::string::npos) << serial.log;
  EXPECT_EQ(kiln::plan_data_workers(cpu(-1, true, 1, 64)).threads, 8) << "at most 8";
  const DataWorkersPlan ranks = kiln::plan_data_workers(cpu(-1, true, 1, 8, 2));
  EXPECT_EQ(ranks.kind, Kind::threads) << "several processes cannot time themselves alone";
  EXPECT_EQ(ranks.threads, 3);
  EXPECT_EQ(ranks.log, "trainer.data_workers = auto: 3 worker threads (4 cores for each of 2 ranks, 1 intra-op thread)");
  EXPECT_EQ(kiln::plan_data_workers(cpu(-1, true, 1, 2, 2)).kind, Kind::inline_);
}

TEST(DataWorkers, AutoOnAGpuKeepsOneCoreForTheMainThread) {
  DataWorkersInput in = cpu(-1, true, 1, 16);
  in.on_gpu = true;
  const DataWorkersPlan gpu = kiln::plan_data_workers(in);
  EXPECT_EQ(gpu.kind, Kind::threads);
  EXPECT_EQ(gpu.threads, 8);
  EXPECT_EQ(gpu.log, "trainer.data_workers = auto: 8 worker threads (GPU; 16 cores, one kept for the main thread)");
  in.cores = 4;
  EXPECT_EQ(kiln::plan_data_workers(in).threads, 3);
  in.cores = 1;
  EXPECT_EQ(kiln::plan_data_workers(in).threads, 1);
}

}  // namespace
