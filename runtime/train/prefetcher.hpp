// Calls the data module's get_batch on host threads, ahead of the training
// step, and hands batches back in plan order. Without
// KILN_DATA_CONCURRENT_GET_BATCH one thread calls it at a time. An error from
// get_batch is rethrown on the main thread when its batch is taken.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kiln/abi.h"
#include "plugin/host_services.hpp"
#include "plugin/plugin_instance.hpp"
#include "train/sampler.hpp"

namespace kiln {

class Prefetcher {
 public:
  Prefetcher(const PluginInstance& data, kiln_split split, BatchPlan plan, int threads, int depth);
  ~Prefetcher();  // stops the workers and frees batches not taken
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  size_t size() const { return plan_.size(); }
  // The next batch in plan order; blocks until it is ready.
  BatchPtr next();

 private:
  void work();
  struct Slot {
    BatchPtr batch;
    std::exception_ptr error;
  };

  const PluginInstance& data_;
  kiln_split split_;
  BatchPlan plan_;
  size_t depth_;
  bool serialize_;

  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::mutex call_mutex_;  // serializes get_batch when the plugin is not concurrent
  size_t next_to_claim_ = 0, next_to_take_ = 0;
  std::map<size_t, Slot> done_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kiln
