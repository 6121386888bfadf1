// The one place where kiln's code depends on which LibTorch it is built
// against. c10d changed between 1.13 (Debian's libtorch-dev) and 2.x: Gloo
// and NCCL became Backends held by a ProcessGroup, and the DDP Reducer's
// constructor changed. Everything else in kiln compiles unchanged on both;
// version #ifs (TORCH_VERSION_MAJOR/MINOR) go here and nowhere else.
// Built and tested: LibTorch 1.13.1 (Debian) and 2.14.1 (PyPI's torch wheel).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

namespace c10d {
class ProcessGroup;
class Reducer;
class Store;
}  // namespace c10d

namespace gloo::transport {
class Device;
}

namespace kiln::c10d_compat {

// A process group whose collectives on CPU tensors go over Gloo, bound to
// `device`; `timeout` is every collective's that gives none.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  std::shared_ptr<gloo::transport::Device> device);

// A process group whose collectives on CUDA tensors go over NCCL. Only where
// LibTorch has NCCL (KILN_WITH_NCCL); throws std::runtime_error elsewhere.
c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout);

// c10d's DDP Reducer over `group`, with the given bucket assignment (as
// compute_bucket_assignment_by_size returns it, in the order to reduce).
std::shared_ptr<c10d::Reducer> make_reducer(std::vector<at::Tensor> params,
                                            std::vector<std::vector<size_t>> buckets,
                                            std::vector<size_t> bucket_limits,
                                            const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                            std::vector<bool> sparse, size_t bucket_bytes,
                                            std::unordered_map<size_t, std::string> param_names,
                                            size_t first_bucket_bytes);

}  // namespace kiln::c10d_compat
