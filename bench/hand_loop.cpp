// The reference training benchmark (shared/bench-definition.md) as a plain,
// hand-written LibTorch loop: what kiln's overhead is measured against.
//
//   bench_hand_loop <mlp256|mlp32> <threads> [data_dir] [--batch N] [--epochs N] [--batches N] [--phases]
//
// --batch overrides the definition's batch size (128 for mlp256, 32 for
// mlp32): bench/cost_curve.sh sweeps it. --epochs (default 3): two runs that
// differ only in it give one epoch's counts under `perf stat`. --batches caps
// each timed epoch's batches (callgrind: two runs that differ only in it give
// a step's instructions).
// Prints the like-for-like markers (initial parameter sum, first indices of
// epoch 0's permutation, last-batch loss, test accuracy) and one line per
// timed epoch, in the same words as bench/run.sh parses from kiln.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

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

// The layers called directly (no nn::Sequential dispatch through AnyModule),
// ReLU in place on each hidden layer's output: the fastest honest floor
// (shared/bench-definition.md), so that kiln is not flattered by a slow one.
struct Mlp {
  std::vector<torch::nn::Linear> layers;
  explicit Mlp(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) layers.emplace_back(widths[i], widths[i + 1]);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x.relu_();
    }
    return x;
  }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& l : layers)
      for (const auto& p : l->parameters()) out.push_back(p);
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  int64_t batch_option = 0;
  int epochs = 3;
  bool timed_phases = false;
  int64_t max_batches = INT64_MAX;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--batch" && i + 1 < argc) {
      batch_option = std::atoll(argv[++i]);
      if (batch_option < 1) {
        std::fprintf(stderr, "%s: --batch must be a positive integer, not '%s'\n", argv[0], argv[i]);
        return 2;
      }
    } else if (arg == "--phases") {
      timed_phases = true;
    } else if (arg == "--batches" && i + 1 < argc) {
      max_batches = std::atoll(argv[++i]);
      if (max_batches < 1) {
        std::fprintf(stderr, "%s: --batches must be a positive integer, not '%s'\n", argv[0], argv[i]);
        return 2;
      }
    } else if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::atoi(argv[++i]);
      if (epochs < 1) {
        std::fprintf(stderr, "%s: --epochs must be a positive integer, not '%s'\n", argv[0], argv[i]);
        return 2;
      }
    } else {
      args.push_back(arg);
    }
  }
  if (args.size() < 2 || (args[0] != "mlp256" && args[0] != "mlp32")) {
    std::fprintf(stderr, "usage: %s <mlp256|mlp32> <threads> [data_dir] [--batch N] [--epochs N] [--batches N] [--phases]\n", argv[0]);
    return 2;
  }
  const std::string which = args[0];
  const int threads = std::stoi(args[1]);
  const std::string dir = args.size() > 2 ? args[2] : "/usr/share/datasets/fashion-mnist";
  const std::vector<int64_t> widths = which == "mlp32" ? std::vector<int64_t>{784, 32, 10}
                                                       : std::vector<int64_t>{784, 256, 128, 10};
  const int64_t batch = batch_option > 0 ? batch_option : which == "mlp32" ? 32 : 128;
  at::set_num_threads(threads);
  const Data data = load(dir);
  const int64_t n = data.train_x.size(0);

  // --phases: the step's parts timed apart (two clock reads a part), to set
  // beside kiln's `[profiler] kind = "simple"` table.
  struct Phases {
    bool on = false;
    std::chrono::steady_clock::time_point last;
    double seconds[4] = {0, 0, 0, 0};
    int64_t steps = 0;
    void start() {
      if (on) last = std::chrono::steady_clock::now();
    }
    void lap(int part) {
      if (!on) return;
      const auto now = std::chrono::steady_clock::now();
      seconds[part] += std::chrono::duration<double>(now - last).count();
      last = now;
      if (part == 3) ++steps;
    }
  } phases;

  // Gradients dropped rather than zeroed before each step (PyTorch >= 2.0's
  // zero_grad(set_to_none=True); LibTorch 1.13's zero_grad() zeroes them),
  // and the loss read back once, after the epoch: no per-step sync.
  auto train_epoch = [&](Mlp& model, torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                         const torch::Tensor& order, int64_t max_batches, double* last_loss) {
    const int64_t batches = std::min<int64_t>(max_batches, (n + batch - 1) / batch);
    torch::Tensor loss;
    for (int64_t b = 0; b < batches; ++b) {
      phases.start();
      const auto index = order.slice(0, b * batch, std::min<int64_t>(n, (b + 1) * batch));
      const auto x = data.train_x.index_select(0, index);
      const auto y = data.train_y.index_select(0, index);
      phases.lap(0);
      for (const auto& p : params)
        if (p.grad().defined()) p.mutable_grad().reset();
      loss = torch::nn::functional::cross_entropy(model.forward(x), y);
      phases.lap(1);
      loss.backward();
      phases.lap(2);
      optimizer.step();
      phases.lap(3);
    }
    if (last_loss) *last_loss = loss.item<double>();
    return batches;
  };

  {  // Warm-up on a throw-away model: 50 batches.
    torch::manual_seed(0);
    Mlp model(widths);
    const auto params = model.parameters();
    torch::optim::Adam optimizer(params, torch::optim::AdamOptions(1e-3));
    at::Generator g = at::detail::createCPUGenerator(0);
    train_epoch(model, optimizer, params, torch::randperm(n, g, torch::kLong), 50, nullptr);
  }

  phases.on = timed_phases;
  torch::manual_seed(0);
  Mlp model(widths);
  const auto params = model.parameters();
  double sum = 0;
  for (const auto& p : params) sum += p.sum().item<double>();
  std::printf("initial parameter sum %.6f\n", sum);
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(1e-3));
  at::Generator generator = at::detail::createCPUGenerator(0);
  double last_loss = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const auto order = torch::randperm(n, generator, torch::kLong);
    if (epoch == 0) {
      std::printf("epoch 0 order starts");
      for (int i = 0; i < 5; ++i) std::printf(" %lld", static_cast<long long>(order[i].item<int64_t>()));
      std::printf("\n");
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t steps = train_epoch(model, optimizer, params, order, max_batches, &last_loss);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d seconds %.4f samples/s %.0f us/step %.1f\n", epoch, seconds,
                static_cast<double>(std::min<int64_t>(n, steps * batch)) / seconds,
                1e6 * seconds / steps);
  }
  if (phases.on && phases.steps > 0)
    std::printf("phases us/step (timed epochs): gather %.1f forward+loss %.1f backward %.1f step %.1f\n",
                1e6 * phases.seconds[0] / phases.steps, 1e6 * phases.seconds[1] / phases.steps,
                1e6 * phases.seconds[2] / phases.steps, 1e6 * phases.seconds[3] / phases.steps);
  std::printf("last batch loss %.6f\n", last_loss);
  torch::NoGradGuard no_grad;
  const auto predicted = model.forward(data.test_x).argmax(1);
  std::printf("test accuracy %.4f\n", predicted.eq(data.test_y).to(torch::kDouble).mean().item<double>());
  return 0;
}
