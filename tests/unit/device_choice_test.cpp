// device/device_choice: every rule of run.device, trainer.precision and the
// NCCL backend against what a machine has, with the facts given (no GPU
// needed). Each refusal is one line naming the manifest and what to do.
#include <gtest/gtest.h>

#include "device/device_choice.hpp"
#include "util/errors.hpp"

namespace kiln {
namespace {

const CudaFacts no_cuda_build{false, 0, "1.13.1"};
const CudaFacts no_gpu{true, 0, "2.14.1"};
const CudaFacts two_gpus{true, 2, "2.14.1"};

std::string choose(const std::string& spec, const CudaFacts& cuda, int64_t local_rank = 0, int64_t local_world = 1,
                   Precision precision = Precision::fp32, DistributedBackend backend = DistributedBackend::automatic) {
  return choose_device(spec, precision, backend, local_rank, local_world, cuda, "run.toml");
}

// The message of the refusal, or "" when the choice is accepted.
std::string refusal(const std::string& spec, const CudaFacts& cuda, int64_t local_rank = 0, int64_t local_world = 1,
                    Precision precision = Precision::fp32, DistributedBackend backend = DistributedBackend::automatic) {
  try {
    choose(spec, cuda, local_rank, local_world, precision, backend);
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind("run.toml: ", 0), 0u) << message;
    return message;
  }
  return "";
}

TEST(DeviceChoice, AutoTakesCudaWhenThereIsADeviceAndTheCpuOtherwise) {
  EXPECT_EQ(choose("auto", no_cuda_build), "cpu");
  EXPECT_EQ(choose("auto", no_gpu), "cpu");
  EXPECT_EQ(choose("auto", two_gpus), "cuda:0");
  EXPECT_EQ(choose("cpu", two_gpus), "cpu");
}

TEST(DeviceChoice, EachLocalRankTakesItsOwnGpu) {
  EXPECT_EQ(choose("cuda", two_gpus, 0, 2), "cuda:0");
  EXPECT_EQ(choose("cuda", two_gpus, 1, 2), "cuda:1");
  EXPECT_EQ(choose("auto", two_gpus, 1, 2), "cuda:1");
  EXPECT_EQ(choose("cuda:1", two_gpus), "cuda:1");
  // The CPU is shared by any number of ranks.
  EXPECT_EQ(choose("cpu", two_gpus, 3, 4), "cpu");
}

TEST(DeviceChoice, CudaWithoutACudaLibTorchIsRefused) {
  const std::string m = refusal("cuda", no_cuda_build);
  EXPECT_NE(m.find("run.device = 'cuda'"), std::string::npos) << m;
  EXPECT_NE(m.find("LibTorch (1.13.1) was built without CUDA"), std::string::npos) << m;
  EXPECT_NE(refusal("cuda:0", no_cuda_build).find("built without CUDA"), std::string::npos);
}

TEST(DeviceChoice, CudaWithoutADeviceIsRefused) {
  const std::string m = refusal("cuda", no_gpu);
  EXPECT_NE(m.find("no CUDA device is visible"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << m;
}

TEST(DeviceChoice, AnIndexPastTheDevicesIsRefused) {
  const std::string m = refusal("cuda:3", two_gpus);
  EXPECT_NE(m.find("run.device = 'cuda:3': this machine has 2 CUDA devices (cuda:0 to cuda:1)"), std::string::npos)
      << m;
  EXPECT_NE(refusal("cuda:1", CudaFacts{true, 1, "2.14.1"}).find("has 1 CUDA device (cuda:0)"), std::string::npos);
}

TEST(DeviceChoice, MoreLocalRanksThanGpusIsRefused) {
  const std::string m = refusal("cuda", two_gpus, 0, 3);
  EXPECT_NE(m.find("3 processes run on this node but it has 2 CUDA devices"), std::string::npos) << m;
  EXPECT_NE(m.find("start at most 2 per node"), std::string::npos) << m;
  EXPECT_NE(refusal("auto", two_gpus, 2, 3).find("3 processes run"), std::string::npos);
}

TEST(DeviceChoice, OneGpuNamedForSeveralLocalRanksIsRefused) {
  const std::string m = refusal("cuda:0", two_gpus, 0, 2);
  EXPECT_NE(m.find("names one GPU, but 2 processes run on this node"), std::string::npos) << m;
}

TEST(DeviceChoice, Float16MixedPrecisionOnTheCpuIsRefused) {
  const std::string m = refusal("cpu", two_gpus, 0, 1, Precision::fp16_mixed);
  EXPECT_NE(m.find("trainer.precision = '16-mixed'"), std::string::npos) << m;
  EXPECT_NE(m.find("use precision = 'bf16-mixed' or '32'"), std::string::npos) << m;
  EXPECT_NE(refusal("auto", no_gpu, 0, 1, Precision::fp16_mixed).find("16-mixed"), std::string::npos);
  EXPECT_EQ(refusal("cpu", no_gpu, 0, 1, Precision::bf16_mixed), "");
  EXPECT_EQ(choose("auto", two_gpus, 0, 1, Precision::fp16_mixed), "cuda:0");
}

TEST(DeviceChoice, NcclOnTheCpuIsRefused) {
  const std::string m = refusal("auto", no_gpu, 0, 1, Precision::fp32, DistributedBackend::nccl);
  EXPECT_NE(m.find("distributed.backend = 'nccl' needs a CUDA device"), std::string::npos) << m;
  EXPECT_EQ(choose("auto", two_gpus, 0, 1, Precision::fp32, DistributedBackend::nccl), "cuda:0");
}

}  // namespace
}  // namespace kiln
