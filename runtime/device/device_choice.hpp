// Which device a rank trains on, decided from the manifest, the launch and
// what this machine has. No LibTorch here: the facts come in (device/cuda_facts
// asks LibTorch), so every rule is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "config/options.hpp"

namespace kiln {

// What this process's LibTorch can use.
struct CudaFacts {
  bool built_with_cuda = false;  // the LibTorch kiln links has CUDA compiled in
  int devices = 0;               // CUDA devices visible to this process
  std::string torch_version;     // for messages: "1.13.1", "2.15.0"
};

// The run's device for the rank with `local_rank` of `local_world_size`
// processes on this node: "cpu" or "cuda:K". `spec` is run.device ("auto",
// "cpu", "cuda", "cuda:N"): auto takes CUDA when there is a device; with
// several processes on a node, cuda (or auto) gives each rank
// cuda:LOCAL_RANK.
// Throws InputError, one line starting with `slot` (the manifest's file)
// and saying what to do, when the spec cannot be honoured, or when
// `precision` or `backend` needs a device the choice lacks (16-mixed and
// NCCL need CUDA).
std::string choose_device(const std::string& spec, Precision precision, DistributedBackend backend, int64_t local_rank,
                          int64_t local_world_size, const CudaFacts& cuda, const std::string& slot);

}  // namespace kiln
