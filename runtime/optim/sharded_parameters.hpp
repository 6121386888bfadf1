// distributed.shard = "parameters" (ZeRO stage 3, FSDP's FULL_SHARD): each
// rank keeps only its 1/N of every parameter's elements, frozen ones
// included, and a parameter is whole only while an operator reads it.
//
// The model's parameters keep their shapes, but between uses their storage
// holds no memory (FSDP1's _free_storage). A RecordFunction callback, on
// for the loop's thread while a ShardedParameters::Active lives, looks at
// the inputs of every operator LibTorch dispatches: before one reads a
// parameter or a view of one (a weight autograd saved for backward
// included), the parameter's bucket is gathered from the ranks that hold
// it (ProcessGroup::gather_range). No plugin cooperates or knows: a C++
// module, an exported program and activation checkpointing's recompute all
// dispatch their operators. Buckets are consecutive parameters of about
// `bucket_bytes`; at most twice that stays whole beyond what the running
// operator reads and the bucket fetched ahead (below), the least recently
// read freed first, and every
// bucket is freed after each backward and each evaluation batch. Every
// rank runs the same operators in the same order, so every rank gathers
// the same buckets in the same order: the gathers are collectives that
// need no agreement.
//
// Gathers are prefetched one bucket ahead: every pass (a training step's
// forward and backward, an evaluation batch) records the order its buckets
// were first read in, and the next pass of its kind, when it reads one of
// them, asks for the one that came after it then. The gathers run in that
// order on a thread of their own (over ProcessGroup::gather_range's own
// channel), so the next bucket travels while the operators on this one
// compute. What is asked for, and when, follows from the operators alone,
// never from timing: every rank asks for the same buckets in the same order.
//
// Refilling a storage writes through a tensor of its own over it (not the
// parameter), so the parameter's version counter does not move and
// autograd's saved tensors stay valid.
//
// The trained parameters' shard is the optimizer's: owned_views() are its
// parameters (optim/sharded_step.hpp), so a step updates the shard in
// place and nothing is gathered after it.
//
// Thread: the callbacks run on whichever thread dispatches an operator
// while Active lives there (the loop's, and the autograd engine's, which
// inherits it); the rest on the loop's thread. The gathers themselves run
// on a thread of this object's (with more than one rank).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/shard_layout.hpp"

namespace kiln {

class ProcessGroup;
class Profiler;

class ShardedParameters {
 public:
  // `trainable`: the optimizer's parameters, in the layout `trainable_layout`
  // (ShardedStep's); `frozen`: every other parameter (its own layout, in
  // order). Each list shares one dtype and device. `group` is null in one
  // process. `prefetch`: gathers one bucket ahead (below). Throws
  // InputError (one line) for parameters it cannot shard.
  ShardedParameters(const std::vector<at::Tensor>& trainable, const ShardLayout& trainable_layout,
                    const std::vector<at::Tensor>& frozen, ProcessGroup* group, int64_t bucket_bytes,
                    bool prefetch = true);
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // The optimizer's parameters: for each trainable parameter, a 1-D leaf
  // over this rank's elements in its shard (empty where it owns none).
  std::vector<at::Tensor> owned_views() const;
  // Takes this rank's elements of rank 0's whole parameters (the resumed
  // ones, after a resume) and frees every parameter's storage, a bucket at
  // a time: with more than one rank, each bucket is broadcast from rank 0
  // first (the start-up agreement's broadcast, for the parameters). A
  // collective: every rank calls it, after the agreement on the facts.
  void shard();
  bool sharded() const { return sharded_; }
  // Where the operators' waits for gathers are counted ([profiler]: its
  // "parameter gather wait", taken from the phase they happen in), or null.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  // bf16-true: the float32 masters (one per trainable parameter, as
  // owned_views()), rounded into the shard after a step.
  void round_into_shard(const std::vector<at::Tensor>& masters);

  // While alive, the operators this thread dispatches gather what they read.
  class Active {
   public:
    explicit Active(ShardedParameters& parameters);
    ~Active();
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;

   private:
    ShardedParameters& parameters_;
    uint64_t handle_;
  };

  // Frees every whole bucket, once what is on its way arrived (after a
  // backward, before a step, after an evaluation batch and a checkpoint's
  // commit).
  void release_all();
  // Throws PeerFailure if a gather failed: its parameters held NaN
  // meanwhile, so nothing computed since counts. Throws std::runtime_error
  // if something wrote into a whole parameter (its version counter moved):
  // the write was to a copy the next free drops, never to this rank's part.
  void check() const;
  // Every parameter whole until release_all(), for a checkpoint's param/
  // sections, which rank 0 alone writes. `keep` false (the other ranks):
  // this rank takes part in each bucket's gather, a collective, and frees
  // it at once, so a commit holds no more than a bucket whole here.
  void gather_all(bool keep = true);
  // The most batches any rank has of an evaluation this rank has `mine` of
  // (a sum over ranks): a rank with fewer repeats its last batch, uncounted,
  // so that every rank gathers as often.
  int64_t most_batches(int64_t mine);

  // Gathers, and the bytes whole now and at most (for the log and tests).
  struct Stats {
    int64_t gathers = 0;
    int64_t prefetched = 0;  // of those, asked for before an operator read them
    double waiting_s = 0;    // operators waited for gathers to arrive
    int64_t whole_bytes = 0, peak_whole_bytes = 0;  // since shard(), but for checkpoints' gather_all()
    int64_t total_bytes = 0;                        // every parameter's
    int64_t commit_whole_bytes = 0;  // the most whole at once in gather_all() (a commit): all on rank 0
    int64_t allocations = 0;         // parameters made whole in memory of their own, not a freed one's
  };
  Stats stats() const;

 private:
  struct Space;
  struct Bucket {
    int space = 0;
    size_t first = 0, last = 0;  // parameters [first, last) of the space
    int64_t bytes = 0;
    bool whole = true;   // its memory allocated (arrived, or on its way)
    bool read = true;    // read since it was gathered (a prefetch not yet used: false)
    int pins = 0;        // operators running that read it
    uint64_t used = 0;   // when last read (for the least recently read)
    std::vector<int64_t> versions;  // each parameter's version counter when gathered
  };
  friend struct ReadCallbacks;

  // The buckets an operator's inputs read, gathered, pinned until it ends.
  std::vector<size_t> read(const std::vector<const c10::StorageImpl*>& storages);
  void unpin(const std::vector<size_t>& buckets);
  void allocate(size_t bucket);  // memory for its parameters, whole from now (their values not yet)
  void request(size_t bucket);   // allocated, and its gather queued (or done, in one process)
  bool await(size_t bucket);     // until its values arrived; whether they had not yet
  void transfer(size_t bucket);  // the gather itself (the gathering thread's)
  void free(size_t bucket);      // after await()
  void fill_nan(size_t bucket);  // its allocated memory (a failed gather's)
  // Frees the least recently read whole buckets, never a pinned one, until
  // `needed` more bytes fit in the budget (or nothing more can go).
  void make_room(int64_t needed);
  // A bucket read for the first time since its gather: recorded, and found
  // in the last pass of this kind.
  void first_read(size_t bucket, bool training);
  // Asks for the bucket the last pass of this kind read next, unless whole
  // already or among those being read: one bucket ahead.
  void fetch_ahead(const std::vector<size_t>& reading);
  void end_pass();
  void gathering_thread();

  // Memory of freed buckets, kept for the next gather of a parameter of its
  // size instead of going back to the allocator: every pass gathers the
  // same buckets, so after the first the gathers allocate nothing. Freed
  // and allocated again each time, tensors of 1-32 MB churned glibc's heap
  // (its mmap threshold rises to the largest freed), which then held up to
  // several hundred MB a rank more than the whole buckets, differently on
  // each rank. At most the most bytes ever whole at once is kept.
  struct Spare {
    at::DataPtr memory;
    size_t bytes;
  };
  std::vector<Spare> spare_;
  int64_t spare_bytes_ = 0;
  // Spare memory of `bytes` on `device`, or null (then some may go back).
  at::DataPtr take_spare(size_t bytes, c10::Device device);

  std::vector<std::unique_ptr<Space>> spaces_;
  std::vector<at::Tensor> owned_;  // round_into_shard's views of the shard
  std::vector<Bucket> buckets_;
  std::unordered_map<const c10::StorageImpl*, size_t> bucket_of_;
  ProcessGroup* group_;
  int64_t budget_bytes_;  // whole beyond the running operator's
  bool prefetch_;
  Profiler* profiler_ = nullptr;
  bool sharded_ = false;
  bool hold_all_ = false;  // gather_all() until release_all(): nothing freed
  mutable std::mutex mutex_;
  uint64_t clock_ = 0;
  Stats stats_;
  std::optional<std::string> written_;  // the first parameter something wrote into while whole
  // The pass being read (its buckets in the order first read) and the last
  // pass of each kind (0: without grad mode, an evaluation; 1: training).
  std::vector<size_t> pass_;
  int pass_kind_ = -1;
  std::vector<size_t> last_pass_[2];
  size_t position_ = 0;  // in last_pass_[pass_kind_]: what comes next

  // The gathering thread's queue; arrived_ and failure_ are shared with it.
  std::thread gatherer_;
  mutable std::mutex queue_mutex_;
  std::condition_variable queued_, arrived_cv_;
  std::deque<size_t> queue_;
  std::vector<char> arrived_;
  bool stopping_ = false;
  std::exception_ptr failure_;  // the first gather that failed
};

}  // namespace kiln
