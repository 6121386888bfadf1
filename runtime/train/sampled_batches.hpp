// The host's BatchSource: the data module's splits through kiln's sampler
// (seeded order, sharding, limits) and prefetcher, moved to the run's device.
// get_batch runs on prefetch threads or inline on the main thread, as
// trainer.prefetch says (train/fetch_trial.hpp: how `auto` decides).
#pragma once

#include <optional>

#include <c10/core/Device.h>

#include "config/options.hpp"
#include "plugin/proxies.hpp"
#include "train/fetch_trial.hpp"
#include "train/loops/loop_parts.hpp"
#include "train/sampler.hpp"

namespace kiln {

struct SamplingSettings {
  uint64_t seed = 0;
  bool drop_last = false;
  int32_t rank = 0;
  int32_t world_size = 1;
  PrefetchPolicy prefetch = PrefetchPolicy::automatic;
  int prefetch_threads = 1;
  int prefetch_depth = 4;
  FetchTrial::Shape trial;  // prefetch = auto
  int cores = 0;            // the cores this process may use; 0: usable_cores()
};

class SampledBatches final : public BatchSource {
 public:
  // Call on the main thread once the intra-op threads are set: `auto` without
  // a measurement goes by the cores they leave over.
  SampledBatches(DataModuleProxy data, SamplingSettings settings, c10::Device device);

  int64_t length(kiln_split split) override { return data_.length(split); }
  int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) override;
  std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                    int64_t first_sample) override;
  [[noreturn]] void refuse_empty(kiln_split, const std::string& message) override { data_.refuse("length", message); }

  // Epoch `epoch` continues from a checkpoint a run of another world size
  // or batch size saved inside it (train/sampler.hpp, saved_elsewhere).
  void continue_epoch_saved_elsewhere(int64_t epoch) { saved_elsewhere_epoch_ = epoch; }

  // How batches are fetched now (the decision of `auto` once its trial ran).
  FetchMode mode() const;
  // prefetch = auto: its trial (null when the policy is fixed, when the
  // intra-op threads leave no core for a prefetch thread, or when the run is
  // not one process on the CPU).
  const FetchTrial* trial() const { return trial_ ? &*trial_ : nullptr; }

 private:
  DataModuleProxy data_;
  SamplingSettings settings_;
  c10::Device device_;
  EpochOrders orders_;  // the training order's generator, kept from epoch to epoch
  int64_t saved_elsewhere_epoch_ = -1;
  FetchMode fixed_ = FetchMode::thread;  // without a trial
  std::optional<FetchTrial> trial_;
};

}  // namespace kiln
