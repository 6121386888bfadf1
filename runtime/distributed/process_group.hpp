// The run's process group: c10d's TCPStore rendezvous and ProcessGroupGloo
// (NCCL for CUDA devices when LibTorch has it), created by the host before
// any plugin exists. Every collective carries the manifest's timeout. The ABI
// gives plugins no way to reach this object.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include "config/manifest.hpp"
#include "distributed/launch_env.hpp"

namespace c10d {
class ProcessGroup;
class Store;
class Work;
}  // namespace c10d

namespace kiln {

class ShmAllReduce;

class ProcessGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // Rendezvous with the other ranks; throws std::runtime_error naming the
  // address and timeout when they do not all arrive in time.
  // `interrupted` (may be empty) is polled while any wait is in progress;
  // when it returns a non-empty reason ("SIGTERM") the wait throws
  // Interrupted, so a signalled rank cleans up instead of sitting out the
  // collective's timeout.
  ProcessGroup(const DistEnv& env, const DistributedConfig& config, const std::string& device,
               std::function<std::string()> interrupted = {});
  ~ProcessGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool is_local_zero() const { return local_rank_ == 0; }
  // Every rank runs on this host (so every rank sees the same run directory).
  bool one_host() const { return one_host_; }
  // The model's group: NCCL for CUDA tensors, else the Gloo control group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }
  // The gradient all-reduce's group: the shared-memory one when every rank
  // is on this host and maps the segment (distributed.intra_host), else group().
  const c10::intrusive_ptr<c10d::ProcessGroup>& gradient_group() const { return grads_ ? grads_ : group_; }
  bool gradients_in_shared_memory() const { return static_cast<bool>(grads_); }
  // What the gradients travel through, for the log: "shared memory", "Gloo" or "NCCL".
  std::string gradient_transport() const;
  // With shared memory: how the all-reduce's time split so far, one line; else "".
  std::string gradient_stats() const;
  // The gradient all-reduce's time waiting for other ranks so far, and its
  // calls: measured by the shared-memory all-reduce only (Gloo's waits stay
  // inside backward: zeros).
  struct GradientWaits {
    double seconds = 0;
    int64_t calls = 0;
  };
  GradientWaits gradient_waits() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

  // barrier and all_reduce_sum run on the Gloo control group (all_reduce_sum
  // through shared memory when the gradients do): CPU only, so the host's
  // decisions never need the GPU.
  void barrier();
  // In place, from `root` to every rank.
  void broadcast(std::vector<at::Tensor>& tensors, int root);
  // In place, summed over ranks. The one wait a signal does not end (it
  // carries the agreed decisions: stop votes, checkpoint commits).
  // `contribution` names what each rank hands over, for the line that says
  // which rank did not.
  void all_reduce_sum(at::Tensor& tensor, const char* contribution);
  // Every rank's `text`, indexed by rank. Goes through the store, so it works
  // for values of any length and never depends on tensor shapes agreeing.
  std::vector<std::string> all_gather_text(const std::string& text);
  // Every rank's `bytes`, indexed by rank, through the Gloo control group
  // (for payloads too large for the store: collected rows).
  std::vector<std::string> all_gather_bytes(const std::string& bytes);
  // Every rank's `part` (the same size on each) into `whole`, in rank
  // order, on the gradients' group (Gloo on the CPU, NCCL on CUDA): what a
  // sharded optimizer step hands the other ranks. `what` names the part.
  // Through shared memory between the ranks of one host (float32 CPU parts).
  void all_gather(const at::Tensor& part, at::Tensor& whole, const char* what);
  // The sharded step's gradient reduction over a flat index space cut into
  // `shard`-sized parts (optim/shard_layout.hpp): each rank's values for
  // [begin, begin + count), written by `fill(first index, place)`, are summed
  // over the ranks in rank order, and this rank keeps the part in its own
  // shard, written into (or, with `accumulate`, added to) `owned`. Between
  // the ranks of one host a true reduce-scatter in shared memory; elsewhere
  // an all-reduce of the range on the gradients' group (twice the traffic:
  // the ranges do not follow the shards' borders, which c10d's reduce-scatter
  // needs), as reduce_scatter_is_all_reduce() says.
  using ShardFill = std::function<void(int64_t begin, at::Tensor& place)>;
  void reduce_scatter(int64_t begin, int64_t count, int64_t shard, const ShardFill& fill, at::Tensor& owned,
                      bool accumulate, const char* what);
  bool reduce_scatter_is_all_reduce() const { return !shm_; }
  // Sharded parameters gathered before use: the values of the flat range
  // [begin, begin + count) of a space cut into `shard`-sized parts, each
  // element held by the rank whose part it lies in, handed over through
  // `give` and received by every rank through `take`, in rank order
  // (ShmAllReduce::gather_range says how). Through shared memory between
  // the ranks of one host (CPU values); elsewhere an all-gather on the
  // gradients' group of chunks every rank pads to the same length. Under
  // distributed.shard = "parameters" on a channel of its own (a second
  // segment, a second Gloo or NCCL group), so one thread may gather while
  // another reduces; one caller at a time, every rank in the same order.
  using RangeGive = std::function<void(int64_t first, at::Tensor& place)>;
  using RangeTake = std::function<void(int64_t first, const at::Tensor& values)>;
  void gather_range(int64_t begin, int64_t count, int64_t shard, const at::TensorOptions& options,
                    const RangeGive& give, const RangeTake& take, const char* what);

 private:
  // Counts this rank in and waits, until `deadline`, for all the others.
  void arrive(Clock::time_point deadline, const std::string& where);
  // Waits for a collective, polling `interrupted_` (and `deadline`, if any).
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what,
            std::optional<Clock::time_point> deadline = std::nullopt);
  // Waits for a store key until `deadline`, polling `interrupted_`; false on timeout.
  bool wait_key(const std::string& key, Clock::time_point deadline, const char* what);
  void check_interrupted(const char* what) const;
  // Every rank maps one segment that rank 0 creates, or none uses it: the
  // decision is taken from every rank's answer in the store, so it is the
  // same on all ranks. Returns why not when the ranks cannot share it.
  // `keys`: the store keys' prefix; `joined`: the segment's all-reduce.
  std::string join_shared_memory(Clock::time_point deadline, const std::string& keys,
                                 std::shared_ptr<ShmAllReduce>& joined);

  std::function<std::string()> interrupted_;
  int rank_, world_size_, local_rank_;
  bool one_host_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;    // the model's tensors
  c10::intrusive_ptr<c10d::ProcessGroup> control_;  // the host's decisions (Gloo, CPU)
  c10::intrusive_ptr<c10d::ProcessGroup> grads_;    // shared memory between the ranks of one host, or null
  std::shared_ptr<ShmAllReduce> shm_;               // what grads_ reduces through
  c10::intrusive_ptr<c10d::ProcessGroup> gathers_;  // gather_range's own channel (shard = "parameters"), or null
  std::shared_ptr<ShmAllReduce> gather_shm_;        // ... through shared memory, or null
  uint64_t gather_round_ = 0;
};

}  // namespace kiln
