// test.index_probe — a data module that says which samples a run trained:
// each training batch's sample indices are appended to the file `record`
// names, one line a batch, in one write (O_APPEND: the ranks of a run share
// the file without tearing lines). The data is kiln_synthetic's kind: class
// i % classes, centred on its class, learnable by kiln_mlp.
//
// With `val_size` > 0 the validation split has that many samples, and its
// batches are recorded too, each line starting "val " (training's with "").
//
// [data]
// path = "<build>/lib/kiln/test_plugins/libkiln_test_index_probe.so"
// record = "/tmp/x/indices.txt"
// train_size = 240
// features = 8
// classes = 2
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "kiln/plugin.hpp"

namespace {

class IndexProbe final : public kiln::DataModule {
 public:
  IndexProbe(const kiln::Host& host, kiln::Config& config) : DataModule(host) {
    record_ = config.get<std::string>("record", "");
    train_size_ = config.get<int64_t>("train_size", 240);
    features_ = config.get<int64_t>("features", 8);
    classes_ = config.get<int64_t>("classes", 2);
    val_size_ = config.get<int64_t>("val_size", 0);
    if (record_.empty()) throw std::invalid_argument("record: a file to append the indices to is required");
  }

  void setup(kiln::Stage) override {
    fd_ = ::open(record_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error("cannot open " + record_);
  }
  void teardown(kiln::Stage, bool) override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int64_t length(kiln::Split split) override {
    return split == kiln::Split::train ? train_size_ : split == kiln::Split::val ? val_size_ : 0;
  }

  // Seeded (ABI 1.4) only to see for_check (1.5): the sample the model's
  // check_batch looks at before anything runs is no step's batch.
  kiln::TensorMap get_batch_seeded(const kiln::BatchRequest& request) override {
    return make_batch(request.split, request.indices, request.count, !request.for_check);
  }

  kiln::TensorMap get_batch(kiln::Split split, const int64_t* indices, size_t count) override {
    return make_batch(split, indices, count, true);
  }

 private:
  kiln::TensorMap make_batch(kiln::Split split, const int64_t* indices, size_t count, bool record) {
    std::string line = split == kiln::Split::val ? "val " : "";
    for (size_t i = 0; i < count; ++i) line += (i ? " " : "") + std::to_string(indices[i]);
    line += "\n";
    if (record && (split == kiln::Split::train || split == kiln::Split::val) && ::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      throw std::runtime_error("cannot write " + record_);
    const at::Tensor index = torch::from_blob(const_cast<int64_t*>(indices), {static_cast<int64_t>(count)}, at::kLong).clone();
    const at::Tensor target = index.remainder(classes_);
    at::Tensor input = at::zeros({static_cast<int64_t>(count), features_});
    input.scatter_(1, target.unsqueeze(1), 1.0);
    input.add_(at::sin(index.to(at::kFloat).unsqueeze(1) * at::arange(1, features_ + 1, at::kFloat)) * 0.5);
    return {{"input", input}, {"target", target}};
  }

  std::string record_;
  int64_t train_size_ = 0, features_ = 0, classes_ = 0, val_size_ = 0;
  int fd_ = -1;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<IndexProbe>({"test.index_probe", "Index probe", "0.1.0",
                                                "Records the sample indices of every training batch", 0}))
