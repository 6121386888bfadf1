// c10d as kiln uses it, the same on LibTorch 1.13 and 2.x. c10d changed
// between them (2.x splits a ProcessGroup from its per-device Backends; the
// DDP Reducer's constructor changed): every difference lives here, behind
// TORCH_VERSION_MAJOR/MINOR. (The one other adapter is autocast's, in
// optim/precision.cpp; docs.version_ifs_only_in_adapters checks.)
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace c10d {
class Reducer;
}
namespace kiln {
class ShmAllReduce;
}

namespace kiln::c10d_compat {

// A process group whose collectives run on Gloo (CPU tensors).
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options);

// A process group whose only collective is the sum all-reduce of CPU
// tensors, through `shm` (the ranks of one host): the DDP Reducer's group.
c10::intrusive_ptr<c10d::ProcessGroup> shm_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 std::shared_ptr<ShmAllReduce> shm);

#ifdef KILN_WITH_NCCL
// A process group whose collectives run on NCCL (CUDA tensors).
c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout);
#endif

// DDP's gradient Reducer over `group`: buckets as DDP assigns them (a small
// first bucket, then `bucket_bytes`), in reverse parameter order.
std::shared_ptr<c10d::Reducer> make_reducer(const std::vector<at::Tensor>& parameters,
                                            const std::vector<std::string>& names,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group, size_t bucket_bytes,
                                            size_t first_bucket_bytes);

}  // namespace kiln::c10d_compat
