#include "device/cuda_facts.hpp"

#include <torch/cuda.h>
#include <torch/version.h>

namespace kiln {

CudaFacts cuda_facts() {
  CudaFacts facts;
  facts.torch_version = TORCH_VERSION;
#ifdef KILN_WITH_CUDA
  facts.built_with_cuda = true;
  // 0 without a driver or device: LibTorch reports, it does not throw.
  facts.devices = static_cast<int>(torch::cuda::device_count());
#endif
  return facts;
}

}  // namespace kiln
