// A sum all-reduce among the ranks of one host through a shared-memory
// segment: what loopback TCP (Gloo) costs milliseconds for, memory moves in
// tens of microseconds. oneCCL and DeepSpeed reduce between local CPU ranks
// the same way.
//
// Each call is cut into chunks of at most `slot_bytes`. Per chunk, every rank
//   1. copies its chunk into its own slot and announces it (`arrived`),
//   2. sums its share (1/ranks) of the chunk over all slots, in rank order,
//      into the result area and announces that (`reduced`),
//   3. copies the whole result back into its tensor (`done`).
// Every rank adds the same numbers in the same order, so all hold bitwise
// identical sums: replicas never drift. Slots and results alternate between
// two sets by the chunk's parity, so a rank may start the next chunk while a
// slower one still reads the last result.
//
// Waits spin briefly, then yield, then sleep; none lasts past the deadline
// (distributed.timeout_s), and each notices at once when a peer has exited
// (its pid is gone) or left the group (its ShmAllReduce was destroyed, as
// when a run fails on that rank): a dead or stopped peer never leaves a rank
// spinning. Failures throw PeerFailure naming the rank.
//
// Not thread-safe: one caller at a time (the autograd thread, in DDP's
// Reducer). All ranks make the same calls in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "distributed/shm_segment.hpp"

namespace kiln {

class ShmAllReduce {
 public:
  static constexpr size_t kDefaultSlotBytes = size_t{2} << 20;
  static constexpr int kMaxRanks = 256;

  // The bytes a segment for `ranks` ranks needs.
  static size_t segment_bytes(int ranks, size_t slot_bytes = kDefaultSlotBytes);

  // Rank 0 lays out a segment it created (ShmSegment::create); `nonce` is
  // what the others check they opened the same one with.
  static void initialise(ShmSegment& segment, int ranks, size_t slot_bytes, uint64_t nonce);
  // Whether `segment` was laid out for `ranks` ranks with `nonce`.
  static bool matches(const ShmSegment& segment, int ranks, size_t slot_bytes, uint64_t nonce);

  ShmAllReduce(ShmSegment segment, int rank, int ranks, std::chrono::milliseconds timeout,
               size_t slot_bytes = kDefaultSlotBytes);
  ~ShmAllReduce();  // tells the peers this rank has left
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // A background thread's channel (sharded parameters' gathers, fetched
  // ahead): its waits give the core away at once and sleep sooner, since
  // the thread they would spin on computes meanwhile.
  void set_background(bool background) { background_ = background; }

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Sums `tensor` (CPU, any dtype ATen adds) over the ranks, in place.
  // `contribution` names what each rank hands over, for the line that says
  // which rank did not ("its gradients", "its stop vote").
  void all_reduce_sum(at::Tensor& tensor, const char* contribution = "its gradients");

  // A reduce-scatter over a flat float32 index space cut into equal shards,
  // rank r's being [r * shard, (r + 1) * shard) (optim/shard_layout.hpp).
  // Every rank writes its values for [begin, begin + count) through `fill`
  // (called with a chunk's first index and the chunk's place in this rank's
  // slot, to fill in full); the ranks' values are summed in rank order, each
  // rank summing only what lies in its own shard, into `owned` (`shard`
  // values, overwritten, or added to with `accumulate`). What each rank
  // reads is its shard's part only: half the traffic of an all-reduce.
  using Fill = std::function<void(int64_t begin, at::Tensor& slot)>;
  void reduce_scatter_sum(int64_t begin, int64_t count, int64_t shard, const Fill& fill, at::Tensor& owned,
                          bool accumulate, const char* contribution = "its gradients");
  // Every rank's `part` (float32, the same length on each) into `whole`, in
  // rank order.
  void all_gather(const at::Tensor& part, at::Tensor& whole, const char* contribution);
  // The gather of a flat index range [begin, begin + count) whose elements
  // (`dtype`) each lie with one rank, rank r holding those in
  // [r * shard, (r + 1) * shard) (optim/shard_layout.hpp; sharded parameters
  // gathered before use): every rank hands over the part of a chunk in its
  // own shard through `give(first, place)` (place: elements [first, first +
  // place.numel()), to fill in full) and receives each rank's part of it,
  // in rank order, through `take(first, values)` (a view of the segment,
  // valid during the call). Each element crosses memory twice, once out of
  // its owner and once into each reader: an all-gather of unequal parts.
  using Give = std::function<void(int64_t first, at::Tensor& place)>;
  using Take = std::function<void(int64_t first, const at::Tensor& values)>;
  void gather_range(int64_t begin, int64_t count, int64_t shard, at::ScalarType dtype, const Give& give,
                    const Take& take, const char* contribution);

  // Where the time of the calls so far went (bench/README.md: where a
  // 2-process step goes).
  struct Stats {
    uint64_t calls = 0;
    double waiting_s = 0;  // for slower peers
    double moving_s = 0;   // copying and summing
  };
  Stats stats() const { return stats_; }

  // The segment's name, until unlink() (for tests).
  const std::string& name() const { return segment_.name(); }
  void unlink() { segment_.unlink(); }

 private:
  struct Header;
  struct RankState;
  enum class Phase { arrived, reduced, done };

  void reduce_chunk(uint8_t* data, size_t bytes, at::ScalarType dtype);
  // Runs `body` between this rank's arrival with chunk `seq + 1` (after
  // `write` filled its slot) and the moment every rank has read its slot.
  void exchange_chunk(const std::function<void(uint8_t* mine)>& write,
                      const std::function<void(uint64_t seq)>& read);
  void count_call(std::chrono::steady_clock::time_point start, double waited_before);
  // Until every rank's counter for `phase` reaches `seq`.
  void await(Phase phase, uint64_t seq);
  [[noreturn]] void fail_waiting(Phase phase, uint64_t seq, const std::string& why);
  int first_behind(Phase phase, uint64_t seq) const;
  bool peer_alive(int rank) const;

  Header& header() const;
  RankState& state(int rank) const;
  uint8_t* slot(uint64_t seq, int rank) const;
  uint8_t* result(uint64_t seq) const;

  ShmSegment segment_;
  int rank_, ranks_;
  std::chrono::milliseconds timeout_;
  size_t slot_bytes_;
  uint64_t seq_ = 0;  // chunks reduced so far (the same on every rank)
  const char* contribution_ = "its gradients";  // of the call in progress
  Stats stats_;
  bool background_ = false;
};

}  // namespace kiln
