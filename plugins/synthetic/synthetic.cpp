// kiln.synthetic — a small, learnable classification problem generated in
// memory: class-conditional Gaussians. Each class has a centroid drawn from
// N(0, 1) per feature; a sample of class c is centroid[c] + noise * N(0, I).
// Labels cycle through the classes (sample i has class i % classes), so every
// split is balanced. Batches are "input" float32 [N, features] and "target"
// int64.
//
// [data]
// path = "kiln_synthetic"
// train_size = 1024
// val_size = 256        # 0 = no val split
// test_size = 256       # also the predict split
// features = 32
// classes = 4
// seed = 0              # the data is a pure function of these keys
// noise = 1.0           # larger is harder; 0 puts every sample on its centroid
#include <cstdint>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"
#include "kiln_plugins/by_split.hpp"
#include "kiln_plugins/sample_index.hpp"

namespace {

constexpr const char* kId = "kiln.synthetic";

// Seeds of independent generator streams derived from the user's seed
// (splitmix64's finaliser), so that each split depends only on its own size:
// resizing train does not change val or test.
uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + stream * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum Stream : uint64_t { kCentroids = 0, kTrain = 1, kVal = 2, kTest = 3 };

struct SplitData {
  at::Tensor inputs;  // float32 [N, features]
  at::Tensor labels;  // int64 [N]
};

class Synthetic final : public kiln::DataModule {
 public:
  Synthetic(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    using kiln_plugins::non_negative;
    using kiln_plugins::positive;
    train_size_ = non_negative("train_size", config.get<int64_t>("train_size", 1024));
    val_size_ = non_negative("val_size", config.get<int64_t>("val_size", 256));
    test_size_ = non_negative("test_size", config.get<int64_t>("test_size", 256));
    features_ = positive("features", config.get<int64_t>("features", 32));
    classes_ = positive("classes", config.get<int64_t>("classes", 4));
    // TOML integers are signed; any value is a usable seed, negative ones included.
    seed_ = static_cast<uint64_t>(config.get<int64_t>("seed", 0));
    noise_ = non_negative("noise", config.get<double>("noise", 1.0));
  }

  void setup(kiln::Stage) override {
    at::Generator centroid_gen =
        at::make_generator<at::CPUGeneratorImpl>(stream_seed(seed_, kCentroids));
    const at::Tensor centroids = at::randn({classes_, features_}, centroid_gen, at::kFloat);
    train_ = generate(centroids, train_size_, kTrain);
    val_ = generate(centroids, val_size_, kVal);
    test_ = generate(centroids, test_size_, kTest);
  }

  void teardown(kiln::Stage, bool) override { train_ = val_ = test_ = SplitData{}; }

  int64_t length(kiln::Split split) override {
    const SplitData& data = select(split);
    return data.labels.defined() ? data.labels.size(0) : 0;
  }

  // Read-only on tensors fixed in setup, hence KILN_DATA_CONCURRENT_GET_BATCH.
  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    const SplitData& data = select(split);
    const int64_t size = data.labels.defined() ? data.labels.size(0) : 0;
    const at::Tensor index = kiln_plugins::sample_index(indices, count, size);
    return {{"input", data.inputs.index_select(0, index)},
            {"target", data.labels.index_select(0, index)}};
  }

 private:
  SplitData generate(const at::Tensor& centroids, int64_t size, Stream stream) const {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(stream_seed(seed_, stream));
    SplitData data;
    data.labels = at::arange(size, at::kLong).remainder_(classes_);
    data.inputs = centroids.index_select(0, data.labels)
                      .add_(at::randn({size, features_}, gen, at::kFloat), noise_);
    return data;
  }

  const SplitData& select(kiln::Split split) const { return kiln_plugins::by_split(split, train_, val_, test_); }

  int64_t train_size_ = 0, val_size_ = 0, test_size_ = 0;
  int64_t features_ = 0, classes_ = 0;
  uint64_t seed_ = 0;
  double noise_ = 0.0;
  SplitData train_, val_, test_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<Synthetic>(
    {kId, "Synthetic Gaussians", "0.1.0",
     "Deterministic class-conditional Gaussian data for tests and examples",
     KILN_DATA_CONCURRENT_GET_BATCH}))
