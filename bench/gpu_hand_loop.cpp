// The GPU reference benchmark (shared/bench-definition.md, "GPU") as a plain,
// hand-written LibTorch CUDA loop: kiln's shipped CNN on Fashion-MNIST,
// batch 256, Adam 1e-3, in float32 or bf16-mixed. What kiln's
// `bench/gpu_cnn.toml` is measured against.
//
//   bench_gpu_hand_loop <32|bf16-mixed> [data_dir]
//
// The same arithmetic as kiln: the CNN plugin's layers in its order of
// construction after torch::manual_seed(0), built on the CPU and moved to
// the GPU; one randperm(60000) per epoch from a CPU generator seeded 0; the
// batch gathered on the host, page-locked, copied with non_blocking; the
// forward pass and the loss under autocast for bf16-mixed; the device
// synchronised only at epoch ends. Prints the like-for-like markers and one
// line per timed epoch in the words of bench_hand_loop.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "idx_reader.hpp"

namespace {

struct Data {
  torch::Tensor train_x, train_y, test_x, test_y;
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

// plugins/cnn with channels = [32, 64], hidden = 128, classes = 10, dropout 0.25.
struct CnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 32, 3).padding(1)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(32, 64, 3).padding(1)};
  torch::nn::Linear fc1{64 * 7 * 7, 128}, fc2{128, 10};
  CnnImpl() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor x = input.reshape({input.size(0), 1, 28, 28});
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::relu(fc1->forward(x.flatten(1)));
    x = torch::dropout(x, 0.25, is_training());
    return fc2->forward(x);
  }
};
TORCH_MODULE(Cnn);

// bfloat16 autocast on CUDA for the scope (the API changed in LibTorch 2.4).
struct Autocast {
  bool on;
  explicit Autocast(bool on) : on(on) {
    if (!on) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "32" && std::string(argv[1]) != "bf16-mixed")) {
    std::fprintf(stderr, "usage: %s <32|bf16-mixed> [data_dir]\n", argv[0]);
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_gpu_hand_loop: no CUDA device\n");
    return 2;
  }
  const bool bf16 = std::string(argv[1]) == "bf16-mixed";
  const std::string dir = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  const int64_t batch = 256;
  const torch::Device device(torch::kCUDA, 0);
  const Data data = load(dir);
  const int64_t n = data.train_x.size(0);

  auto train_epoch = [&](Cnn& model, torch::optim::Optimizer& optimizer, const torch::Tensor& order,
                         int64_t max_batches, torch::Tensor* last_loss) {
    const int64_t batches = std::min<int64_t>(max_batches, (n + batch - 1) / batch);
    for (int64_t b = 0; b < batches; ++b) {
      const auto index = order.slice(0, b * batch, std::min<int64_t>(n, (b + 1) * batch));
      const auto x = data.train_x.index_select(0, index).pin_memory().to(device, /*non_blocking=*/true);
      const auto y = data.train_y.index_select(0, index).pin_memory().to(device, /*non_blocking=*/true);
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        Autocast autocast(bf16);
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      loss.backward();
      optimizer.step();
      if (last_loss) *last_loss = loss.detach();  // read after the epoch, not per step
    }
    return batches;
  };

  {  // Warm-up on a throw-away model: 50 batches.
    torch::manual_seed(0);
    Cnn model;
    model->to(device);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
    at::Generator g = at::detail::createCPUGenerator(0);
    train_epoch(model, optimizer, torch::randperm(n, g, torch::kLong), 50, nullptr);
    torch::cuda::synchronize();
  }

  torch::manual_seed(0);
  Cnn model;
  double sum = 0;
  for (const auto& p : model->parameters()) sum += p.sum().item<double>();
  std::printf("initial parameter sum %.6f\n", sum);
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  at::Generator generator = at::detail::createCPUGenerator(0);
  torch::Tensor last_loss;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const auto order = torch::randperm(n, generator, torch::kLong);
    if (epoch == 0) {
      std::printf("epoch 0 order starts");
      for (int i = 0; i < 5; ++i) std::printf(" %lld", static_cast<long long>(order[i].item<int64_t>()));
      std::printf("\n");
    }
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    const int64_t steps = train_epoch(model, optimizer, order, INT64_MAX, &last_loss);
    torch::cuda::synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d seconds %.4f samples/s %.0f us/step %.1f\n", epoch, seconds, n / seconds,
                1e6 * seconds / steps);
  }
  std::printf("last batch loss %.6f\n", last_loss.item<double>());
  torch::NoGradGuard no_grad;
  model->eval();
  const auto predicted = model->forward(data.test_x.to(device)).argmax(1).cpu();
  std::printf("test accuracy %.4f\n", predicted.eq(data.test_y).to(torch::kDouble).mean().item<double>());
  return 0;
}
