#include "device/device_choice.hpp"

#include "util/errors.hpp"

namespace kiln {

namespace {

std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string choose_device(const std::string& spec, Precision precision, DistributedBackend backend, int64_t local_rank,
                          int64_t local_world_size, const CudaFacts& cuda, const std::string& slot) {
  const std::string device_slot = slot + ": run.device = '" + spec + "'";
  std::string chosen;
  if (spec == "cpu" || (spec == "auto" && (!cuda.built_with_cuda || cuda.devices == 0))) {
    chosen = "cpu";
  } else {
    if (!cuda.built_with_cuda)
      throw InputError(device_slot + ": this kiln's LibTorch (" + cuda.torch_version +
                       ") was built without CUDA; use device = 'cpu' or 'auto', or build kiln against a CUDA "
                       "LibTorch (README: Your own LibTorch)");
    if (cuda.devices == 0)
      throw InputError(device_slot + ": no CUDA device is visible to this process (check the driver with "
                       "nvidia-smi, and CUDA_VISIBLE_DEVICES); use device = 'cpu' or 'auto'");
    if (spec == "cuda" || spec == "auto") {
      if (local_world_size > cuda.devices)
        throw InputError(device_slot + ": " + plural(local_world_size, "process runs", "processes run") +
                         " on this node but it has " + plural(cuda.devices, "CUDA device", "CUDA devices") +
                         ", and each rank takes its own (cuda:LOCAL_RANK); start at most " +
                         std::to_string(cuda.devices) + " per node, or use device = 'cpu'");
      chosen = "cuda:" + std::to_string(local_rank);
    } else {
      const int64_t index = std::stoll(spec.substr(5));  // the schema admits cuda:<1-4 digits> only
      if (index >= cuda.devices)
        throw InputError(device_slot + ": this machine has " + plural(cuda.devices, "CUDA device", "CUDA devices") +
                         " (cuda:0" + (cuda.devices > 1 ? " to cuda:" + std::to_string(cuda.devices - 1) : "") +
                         ")");
      if (local_world_size > 1)
        throw InputError(device_slot + " names one GPU, but " + std::to_string(local_world_size) +
                         " processes run on this node and each needs its own; use device = 'cuda' (each rank "
                         "takes cuda:LOCAL_RANK)");
      chosen = spec;
    }
  }
  if (precision == Precision::fp16_mixed && chosen == "cpu")
    throw InputError(slot + ": trainer.precision = '16-mixed': float16 mixed precision needs a CUDA device, and "
                     "this run is on the CPU (device = '" + spec +
                     "'); use precision = 'bf16-mixed' or '32' on the CPU");
  if (backend == DistributedBackend::nccl && chosen == "cpu")
    throw InputError(slot + ": distributed.backend = 'nccl' needs a CUDA device, and this run is on the CPU (device = '" +
                     spec + "'); use backend = 'gloo' or 'auto' on the CPU");
  return chosen;
}

}  // namespace kiln
