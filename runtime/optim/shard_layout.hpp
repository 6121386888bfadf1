// How distributed.shard = "optimizer" splits the trainable parameters
// between ranks (ZeRO stage 1's flat partition, as DeepSpeed and llm.c's
// -z 1 make it): the parameters, in the optimizer's order, form one flat
// index space of N elements, padded to N' = ceil(N / W) * W; rank r owns
// the r-th of its W equal parts, [r * S, (r + 1) * S) with S = N' / W. A
// parameter may straddle two ranks; the padding belongs to the last.
// Arithmetic only (no LibTorch): unit-tested on its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kiln {

class ShardLayout {
 public:
  // `numels`: each trainable parameter's number of elements, in order.
  ShardLayout(std::vector<int64_t> numels, int64_t world_size, int64_t rank)
      : numels_(std::move(numels)), world_size_(std::max<int64_t>(world_size, 1)), rank_(rank) {
    offsets_.reserve(numels_.size());
    for (int64_t n : numels_) {
      offsets_.push_back(total_);
      total_ += n;
    }
    shard_ = (total_ + world_size_ - 1) / world_size_;
  }

  int64_t total() const { return total_; }            // N
  int64_t shard_size() const { return shard_; }       // S: every rank's part, padding included
  int64_t padded() const { return shard_ * world_size_; }  // N'
  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }
  size_t parameters() const { return numels_.size(); }
  int64_t numel(size_t i) const { return numels_[i]; }
  int64_t offset(size_t i) const { return offsets_[i]; }  // parameter i's first element in the flat space

  // The elements of parameter i rank `r` owns: [begin, begin + length) of
  // the parameter's own (flattened) elements; length 0 where it owns none.
  struct Run {
    int64_t begin = 0, length = 0;
  };
  Run owned(size_t i, int64_t r) const {
    const int64_t lo = std::max(offsets_[i], r * shard_);
    const int64_t hi = std::min(offsets_[i] + numels_[i], (r + 1) * shard_);
    return hi > lo ? Run{lo - offsets_[i], hi - lo} : Run{0, 0};
  }
  Run owned(size_t i) const { return owned(i, rank_); }
  // Where this rank's run of parameter i lies in its part of the flat space.
  int64_t position_in_shard(size_t i) const { return offsets_[i] + owned(i).begin - rank_ * shard_; }

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int64_t world_size_, rank_;
  int64_t total_ = 0, shard_ = 0;
};

}  // namespace kiln
