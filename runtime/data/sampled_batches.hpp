// The host's BatchSource: the data module's splits through kiln's sampler
// (seeded order, sharding, limits) and prefetcher, moved to the run's device.
// get_batch runs on worker threads or inline on the main thread, as
// trainer.data_workers says (data/data_workers.hpp: how `auto` decides).
#pragma once

#include <optional>

#include <c10/core/Device.h>

#include "config/options.hpp"
#include "plugin/proxies.hpp"
#include "data/fetch_trial.hpp"
#include "loop_parts/loop_parts.hpp"
#include "data/sampler.hpp"

namespace kiln {

struct SamplingSettings {
  uint64_t seed = 0;
  bool drop_last = false;
  int32_t rank = 0;
  int32_t world_size = 1;
  int data_workers = -1;      // trainer.data_workers; -1 = auto (data/data_workers.hpp)
  int prefetch_batches = -1;  // trainer.prefetch_batches; -1 = auto
  FetchTrial::Shape trial;    // data_workers = auto, one process on the CPU
  int cores = 0;              // the cores this process may use; 0: usable_cores()
};

class SampledBatches final : public BatchSource {
 public:
  // Call on the main thread once the intra-op threads are set: `auto` without
  // a measurement goes by the cores they leave over.
  SampledBatches(DataModuleProxy data, SamplingSettings settings, c10::Device device);

  int64_t length(kiln_split split) override { return data_.length(source(split)); }
  int64_t batches_per_epoch(kiln_split split, const EpochSpec& spec) override;
  std::unique_ptr<BatchStream> open(kiln_split split, const EpochSpec& spec, int64_t epoch,
                                    int64_t first_sample) override;
  [[noreturn]] void refuse_empty(kiln_split, const std::string& message) override { data_.refuse("length", message); }

  // The first `count` samples of `split` (fewer when it is shorter), as
  // get_batch builds them for epoch 0, on the CPU: what the model checks
  // before anything runs (ABI 1.5, check_batch). Null for an empty split.
  BatchPtr sample(kiln_split split, size_t count);

  // Epoch `epoch` continues from a checkpoint a run of another world size
  // or batch size saved inside it (data/sampler.hpp, saved_elsewhere).
  void continue_epoch_saved_elsewhere(int64_t epoch) { saved_elsewhere_epoch_ = epoch; }

  // trainer.overfit_batches: the validation split is the training split's
  // batches, sampled as training samples them.
  void validate_on_training_split() { val_from_train_ = true; }

  // [profiler]: host-to-device copies, and the workers' get_batch calls.
  void profile_with(std::shared_ptr<Profiler> profiler) { profiler_ = std::move(profiler); }

  // How batches are fetched now (the decision of `auto` once its trial ran).
  FetchMode mode() const;
  // data_workers = auto: its trial (null when the count is fixed, when the
  // intra-op threads leave no core for a worker, or when the run is not one
  // process on the CPU).
  const FetchTrial* trial() const { return trial_ ? &*trial_ : nullptr; }

 private:
  kiln_split source(kiln_split split) const {
    return split == KILN_SPLIT_VAL && val_from_train_ ? KILN_SPLIT_TRAIN : split;
  }

  DataModuleProxy data_;
  bool val_from_train_ = false;
  std::shared_ptr<Profiler> profiler_;
  SamplingSettings settings_;
  c10::Device device_;
  EpochOrders orders_;  // the training order's generator, kept from epoch to epoch
  int64_t saved_elsewhere_epoch_ = -1;
  FetchMode fixed_ = FetchMode::thread;  // without a trial
  int threads_ = 1, depth_ = 4;          // worker threads and batches in flight, when on threads
  std::optional<FetchTrial> trial_;
};

}  // namespace kiln
