// kiln.fashion_mnist — Fashion-MNIST from the gzipped IDX files, held in
// memory. Batches are "input" float32 ([N, 784], or [N, 1, 28, 28] when not
// flattened) and "target" int64 class labels in [0, 10).
//
// [data]
// path = "kiln_fashion_mnist"
// root = "/usr/share/datasets/fashion-mnist"   # where the four .gz files are
// val_size = 5000       # the last val_size training images; 0 = no val split
// normalize = false     # true: (x/255 - 0.2860) / 0.3530; false: x/255
// flatten = true
//
// Splits: train = the first 60000 - val_size images of the training file,
// val = the rest, test = the t10k file, predict = test.
#include <cstdint>
#include <future>
#include <string>

#include <ATen/TensorIterator.h>
#include <torch/torch.h>

#include "idx_reader.hpp"
#include "kiln/plugin.hpp"
#include "kiln_plugins/checks.hpp"
#include "kiln_plugins/by_split.hpp"
#include "kiln_plugins/sample_index.hpp"

namespace {

constexpr const char* kId = "kiln.fashion_mnist";
constexpr int64_t kSide = 28;
constexpr int64_t kPixels = kSide * kSide;
constexpr int64_t kClasses = 10;
// Mean and standard deviation of the training images' pixels, scaled to [0, 1].
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

// One image's bytes as float32 in [0, 1]. Cloned for AVX2 (chosen when the
// plugin is loaded, where the CPU has it): 8 divisions an instruction, as
// ATen's own kernels; a batch of 32 took 15.6 us with SSE2, 12-13 with AVX2,
// and 25-30 us through index_select and at::div (bench/README.md, issue 23).
__attribute__((target_clones("avx2", "default"))) void scale_row(const uint8_t* from, float* to) {
  for (int64_t j = 0; j < kPixels; ++j) to[j] = static_cast<float>(from[j]) / 255.0f;
}

// Rows a task when a batch is shared between threads: as index_select's gather.
constexpr int64_t kRowsPerTask = at::internal::GRAIN_SIZE / kPixels;

// One split: images stay uint8 (a quarter of the memory of float32) and are
// converted per batch, which costs little next to a training step.
// Contiguous, as read_idx returns them and narrow(0, ...) keeps them: get_batch
// reads rows by pointer.
struct SplitData {
  at::Tensor images;  // uint8 [N, 28, 28], contiguous
  at::Tensor labels;  // int64 [N], contiguous
};

class FashionMnist final : public kiln::DataModule {
 public:
  FashionMnist(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    root_ = config.get<std::string>("root", "/usr/share/datasets/fashion-mnist");
    val_size_ = kiln_plugins::non_negative("val_size", config.get<int64_t>("val_size", 5000));
    normalize_ = config.get<bool>("normalize", false);
    flatten_ = config.get<bool>("flatten", true);
  }

  // Everything is loaded whatever the stage: length() is then right for
  // every split, e.g. for a test run after fit. Decoding the gzip files is
  // most of a run's start-up after LibTorch's own (~0.4 s, nearly all of it
  // zlib; bench/README.md, "Start-up"): the test file is decoded on a
  // second thread meanwhile. get() rethrows its error, if any.
  void setup(kiln::Stage) override {
    std::future<SplitData> test = std::async(std::launch::async, [this] {
      return load("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz");
    });
    SplitData full = load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
    const int64_t total = full.labels.size(0);
    if (val_size_ >= total)
      throw kiln::ConfigError("val_size " + std::to_string(val_size_) +
                              " leaves no training images (the training file has " +
                              std::to_string(total) + "); use a smaller val_size");
    const int64_t train_size = total - val_size_;
    train_ = {full.images.narrow(0, 0, train_size), full.labels.narrow(0, 0, train_size)};
    val_ = {full.images.narrow(0, train_size, val_size_),
            full.labels.narrow(0, train_size, val_size_)};
    test_ = test.get();
    host().debug("train " + std::to_string(train_size) + ", val " + std::to_string(val_size_) +
                 ", test " + std::to_string(test_.labels.size(0)) + " images from " + root_);
  }

  void teardown(kiln::Stage, bool) override { train_ = val_ = test_ = SplitData{}; }

  int64_t length(kiln::Split split) override {
    const SplitData& data = select(split);
    return data.labels.defined() ? data.labels.size(0) : 0;
  }

  // Read-only on tensors fixed in setup, hence KILN_DATA_CONCURRENT_GET_BATCH.
  // One pass over the batch's bytes, gathering and converting together
  // with no operator dispatched but the two empty(): index_select and
  // at::div(uint8, 255.0) were eleven operators and two intermediate
  // tensors a batch, ~2 % of mlp32's step (bench/README.md, issue 23).
  // x / 255.0f is what at::div computes in float32, bit for bit.
  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    const SplitData& data = select(split);
    const int64_t size = data.labels.defined() ? data.labels.size(0) : 0;
    kiln_plugins::check_sample_indices(indices, count, size);
    const int64_t n = static_cast<int64_t>(count);
    at::Tensor input = flatten_ ? at::empty({n, kPixels}, at::kFloat) : at::empty({n, 1, kSide, kSide}, at::kFloat);
    at::Tensor target = at::empty({n}, at::kLong);
    const uint8_t* images = data.images.data_ptr<uint8_t>();
    const int64_t* labels = data.labels.data_ptr<int64_t>();
    float* pixels = input.data_ptr<float>();
    int64_t* classes = target.data_ptr<int64_t>();
    auto rows = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        scale_row(images + indices[i] * kPixels, pixels + i * kPixels);
        classes[i] = labels[indices[i]];
      }
    };
    if (n <= kRowsPerTask || at::get_num_threads() == 1) {
      rows(0, n);
    } else {
      // Shared between the intra-op threads as index_select shares a gather
      // (GRAIN_SIZE elements a task): mlp256's 128 rows in two halves at 2
      // threads, where the step's second thread otherwise waited ~35 us a
      // step for one thread's loop (bench/README.md, issue 23). Through
      // TensorIterator::for_each, an element per row of `target`: its
      // parallel_for is LibTorch's own, compiled with the OpenMP runtime
      // LibTorch uses; a plugin's own would need -fopenmp and could bring a
      // second runtime into the process (the PyPI wheel bundles its own).
      at::TensorIterator iter = at::TensorIterator::nullary_op(target);
      const char* first = reinterpret_cast<const char*>(classes);
      iter.for_each(
          [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
            for (int64_t j = 0; j < size1; ++j) {
              const int64_t begin = (data[0] + j * strides[1] - first) / static_cast<int64_t>(sizeof(int64_t));
              rows(begin, begin + size0);
            }
          },
          kRowsPerTask);
    }
    if (normalize_) input.sub_(kMean).div_(kStd);
    return {{"input", input}, {"target", target}};
  }

 private:
  const SplitData& select(kiln::Split split) const { return kiln_plugins::by_split(split, train_, val_, test_); }

  SplitData load(const std::string& images_file, const std::string& labels_file) const {
    const std::string images_path = root_ + "/" + images_file;
    const std::string labels_path = root_ + "/" + labels_file;
    SplitData data;
    try {
      data.images = kiln_fashion_mnist::read_idx(images_path, kiln_fashion_mnist::kIdxImagesMagic).contiguous();
      if (data.images.dim() != 3 || data.images.size(1) != kSide || data.images.size(2) != kSide)
        throw kiln_fashion_mnist::IdxError("'" + images_path + "' does not hold 28x28 images");
      data.labels = kiln_fashion_mnist::read_idx(labels_path, kiln_fashion_mnist::kIdxLabelsMagic)
                        .to(torch::kLong);
      if (data.labels.size(0) != data.images.size(0))
        throw kiln_fashion_mnist::IdxError(
            "'" + labels_path + "' has " + std::to_string(data.labels.size(0)) + " labels but '" +
            images_path + "' has " + std::to_string(data.images.size(0)) + " images");
      if (data.labels.numel() > 0 && data.labels.max().item<int64_t>() >= kClasses)
        throw kiln_fashion_mnist::IdxError("'" + labels_path + "' has labels outside 0..9");
    } catch (const kiln_fashion_mnist::IdxError& e) {
      // The files the user pointed `root` at are unusable: bad input, exit 2.
      throw kiln::InvalidInput(std::string(e.what()) +
                               "; install the Debian package dataset-fashion-mnist or set 'root' "
                               "in the [data] table to a directory with the four .gz files");
    }
    return data;
  }

  std::string root_;
  int64_t val_size_ = 0;
  bool normalize_ = false;
  bool flatten_ = true;
  SplitData train_, val_, test_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<FashionMnist>(
    {kId, "Fashion-MNIST", "0.1.0", "Fashion-MNIST images and labels from the IDX files, in memory",
     KILN_DATA_CONCURRENT_GET_BATCH}))
