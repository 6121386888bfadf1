// The GPU reference benchmark (shared/bench-definition.md, "GPU") as a plain,
// hand-written LibTorch CUDA loop: what kiln's bench/gpu_cnn.toml is measured
// against (bench/gpu.sh runs both, alternating).
//
//   bench_gpu_hand_loop <32|bf16-mixed> [data_dir] [threads]
//
// The arithmetic of kiln's CNN plugin (plugins/cnn, channels [32, 64],
// hidden 128, dropout 0.25) on Fashion-MNIST (uint8 / 255, no normalisation,
// all 60000 training images), batch 256, cross-entropy, Adam lr 1e-3:
//   - layers built on the CPU in the plugin's order (conv1, conv2, fc1, fc2)
//     right after torch::manual_seed(0), then moved to the GPU (which is also
//     where kiln sums them for its "initial parameter sum" marker);
//   - one randperm(60000) per epoch from a CPU generator seeded 0, cut into
//     consecutive batches (the last, short one kept);
//   - each batch gathered on the host with index_select straight into
//     page-locked memory, copied to the device with non_blocking=true;
//   - "bf16-mixed": bfloat16 autocast around the forward pass and the loss
//     only (as kiln's AutocastScope: nesting counted, cast cache cleared on
//     exit); backward and the optimizer outside it, weights stay float32;
//   - the test split in batches of 256, in eval mode, under the same
//     autocast as training (kiln evaluates with its batch size too).
// 50 warm-up steps on a throw-away model (then torch::manual_seed(0) again,
// which also resets the CUDA generator that dropout draws from), then 3
// timed epochs; torch::cuda::synchronize() only at epoch boundaries, and the
// loss is read back only after the last epoch. Prints the like-for-like
// markers and per-epoch lines in the words of bench_hand_loop.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "idx_reader.hpp"

namespace {

constexpr int64_t kBatch = 256;
constexpr int64_t kWarmupSteps = 50;
constexpr int kEpochs = 3;

struct Data {
  torch::Tensor train_x, train_y, test_x, test_y;  // float32 [N, 784] / 255, int64 [N]
};

Data load(const std::string& dir) {
  using namespace kiln_fashion_mnist;
  auto images = [&](const char* name) {
    return read_idx(dir + "/" + name, kIdxImagesMagic).to(torch::kFloat).div_(255).reshape({-1, 784});
  };
  auto labels = [&](const char* name) { return read_idx(dir + "/" + name, kIdxLabelsMagic).to(torch::kLong); };
  return {images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
          images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")};
}

// plugins/cnn/cnn.cpp with its defaults: 3x3 conv (padding 1) + ReLU + 2x2
// max-pool per channel entry, then Linear + ReLU + dropout, then Linear.
struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor x = input.reshape({input.size(0), 1, 28, 28});
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), /*kernel_size=*/2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), /*kernel_size=*/2);
    x = torch::relu(fc1->forward(x.flatten(/*start_dim=*/1)));
    x = torch::dropout(x, 0.25, is_training());
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Cnn);

// CUDA autocast to bfloat16 for one scope, as kiln's AutocastScope
// (runtime/optim/precision.cpp). LibTorch 2.4 made the switches per device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool cuda_autocast_enabled() { return at::autocast::is_autocast_enabled(at::kCUDA); }
void set_cuda_autocast_enabled(bool on) { at::autocast::set_autocast_enabled(at::kCUDA, on); }
at::ScalarType cuda_autocast_dtype() { return at::autocast::get_autocast_dtype(at::kCUDA); }
void set_cuda_autocast_dtype(at::ScalarType dtype) { at::autocast::set_autocast_dtype(at::kCUDA, dtype); }
#else
bool cuda_autocast_enabled() { return at::autocast::is_enabled(); }
void set_cuda_autocast_enabled(bool on) { at::autocast::set_enabled(on); }
at::ScalarType cuda_autocast_dtype() { return at::autocast::get_autocast_gpu_dtype(); }
void set_cuda_autocast_dtype(at::ScalarType dtype) { at::autocast::set_autocast_gpu_dtype(dtype); }
#endif

class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool on) : on_(on) {
    if (!on_) return;
    was_enabled_ = cuda_autocast_enabled();
    was_dtype_ = cuda_autocast_dtype();
    set_cuda_autocast_enabled(true);
    set_cuda_autocast_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Bf16Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_cuda_autocast_enabled(was_enabled_);
    set_cuda_autocast_dtype(was_dtype_);
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string precision = argc > 1 ? argv[1] : "";
  if (precision != "32" && precision != "bf16-mixed") {
    std::fprintf(stderr, "usage: %s <32|bf16-mixed> [data_dir] [threads]\n", argv[0]);
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_gpu_hand_loop: no CUDA device visible (or LibTorch without CUDA)\n");
    return 2;
  }
  const bool bf16 = precision == "bf16-mixed";
  const std::string dir = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  // Host threads for the gather (bench/gpu_cnn.toml sets run.threads to the same).
  at::set_num_threads(argc > 3 ? std::stoi(argv[3]) : 1);
  const torch::Device device(torch::kCUDA, 0);
  const Data data = load(dir);
  const int64_t n = data.train_x.size(0);
  const auto pinned_float = torch::TensorOptions(torch::kFloat).pinned_memory(true);
  const auto pinned_long = torch::TensorOptions(torch::kLong).pinned_memory(true);
  std::printf("precision %s, batch %lld, %lld training images, %d intra-op threads, LibTorch %d.%d.%d\n",
              precision.c_str(), static_cast<long long>(kBatch), static_cast<long long>(n), at::get_num_threads(),
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);

  // One pass over `order` (at most max_steps batches). The loss stays on the
  // device: `last_loss` is read by the caller after synchronising.
  auto train = [&](Cnn& model, torch::optim::Optimizer& optimizer, const torch::Tensor& order, int64_t max_steps,
                   torch::Tensor* last_loss) {
    const int64_t steps = std::min<int64_t>(max_steps, (n + kBatch - 1) / kBatch);
    for (int64_t b = 0; b < steps; ++b) {
      const int64_t begin = b * kBatch, rows = std::min<int64_t>(n, begin + kBatch) - begin;
      const torch::Tensor index = order.slice(0, begin, begin + rows);
      torch::Tensor x = torch::empty({rows, 784}, pinned_float);
      torch::Tensor y = torch::empty({rows}, pinned_long);
      torch::index_select_out(x, data.train_x, 0, index);
      torch::index_select_out(y, data.train_y, 0, index);
      x = x.to(device, /*non_blocking=*/true);
      y = y.to(device, /*non_blocking=*/true);
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        Bf16Autocast autocast(bf16);
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      loss.backward();
      optimizer.step();
      if (last_loss) *last_loss = loss.detach();
    }
    return steps;
  };

  {  // Warm-up on a throw-away model: CUDA context, cuBLAS/cuDNN handles, kernels loaded.
    torch::manual_seed(0);
    Cnn model;
    model->to(device);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
    at::Generator g = at::detail::createCPUGenerator(0);
    train(model, optimizer, torch::randperm(n, g, torch::kLong), kWarmupSteps, nullptr);
    torch::cuda::synchronize();
  }

  torch::manual_seed(0);  // the CPU generator (initialisation) and CUDA's (dropout)
  Cnn model;
  model->to(device);
  double sum = 0;
  for (const auto& p : model->parameters()) sum += p.sum().item<double>();
  std::printf("initial parameter sum %.6f\n", sum);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  at::Generator generator = at::detail::createCPUGenerator(0);
  torch::Tensor last_loss;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const torch::Tensor order = torch::randperm(n, generator, torch::kLong);
    if (epoch == 0) {
      std::printf("epoch 0 order starts");
      for (int i = 0; i < 5; ++i) std::printf(" %lld", static_cast<long long>(order[i].item<int64_t>()));
      std::printf("\n");
    }
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    const int64_t steps = train(model, optimizer, order, INT64_MAX, &last_loss);
    torch::cuda::synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d seconds %.4f samples/s %.0f us/step %.1f\n", epoch, seconds, n / seconds,
                1e6 * seconds / steps);
    std::fflush(stdout);
  }
  std::printf("last batch loss %.6f\n", last_loss.item<double>());

  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t tests = data.test_x.size(0);
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions(torch::kLong).device(device));
  for (int64_t begin = 0; begin < tests; begin += kBatch) {
    const int64_t rows = std::min<int64_t>(tests - begin, kBatch);
    const torch::Tensor x = data.test_x.narrow(0, begin, rows).to(device);
    const torch::Tensor y = data.test_y.narrow(0, begin, rows).to(device);
    torch::Tensor logits;
    {
      Bf16Autocast autocast(bf16);
      logits = model->forward(x);
    }
    correct += logits.argmax(/*dim=*/1).eq(y).sum();
  }
  std::printf("test accuracy %.4f\n", static_cast<double>(correct.item<int64_t>()) / static_cast<double>(tests));
  return 0;
}
