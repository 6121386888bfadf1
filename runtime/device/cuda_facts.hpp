// What this process's LibTorch offers for CUDA, asked once at start-up.
#pragma once

#include "device/device_choice.hpp"

namespace kiln {

// Whether kiln was compiled against a CUDA LibTorch (KILN_WITH_CUDA) and how
// many devices the driver shows this process. Asking initialises the CUDA
// driver; the supervisor asks before it starts its workers, which exec a
// fresh kiln and so never inherit that state.
CudaFacts cuda_facts();

}  // namespace kiln
