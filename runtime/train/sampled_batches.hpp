// The host's BatchSource: the data module's splits through kiln's sampler
// (seeded order, sharding, limits) and prefetcher, moved to the run's device.
#pragma once

#include <c10/core/Device.h>

#include "plugin/proxies.hpp"
#include "train/loops/loop_parts.hpp"
#include "train/sampler.hpp"

namespace kiln {

struct SamplingSettings {
  uint64_t seed = 0;
  bool drop_last = false;
  int32_t rank = 0;
  int32_t world_size = 1;
  int prefetch_threads = 1;
  int prefetch_depth = 4;
};

class SampledBatches final : public BatchSource {
 public:
  SampledBatches(DataModuleProxy data, SamplingSettings settings, c10::Device device)
      : data_(data), settings_(settings), device_(device) {}

  int64_t length(kiln_split split) override { return data_.length(split); }
  int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) override;
  std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                    int64_t first_batch) override;
  [[noreturn]] void refuse_empty(kiln_split, const std::string& message) override { data_.refuse("length", message); }

 private:
  DataModuleProxy data_;
  SamplingSettings settings_;
  c10::Device device_;
  EpochOrders orders_;  // the training order's generator, kept from epoch to epoch
};

}  // namespace kiln
