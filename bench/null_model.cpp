// kiln.bench.null_model — a model whose step costs nothing, for
// bench/image_folder.sh: the training epoch's time is then the time the data
// workers take to build the batches (images per second of a data module).
// Its one weight trains on nothing (the batch is only received).
#include <kiln/plugin.hpp>

namespace {

class NullModel final : public kiln::Model {
 public:
  NullModel(const kiln::Host& host, kiln::Config&) : kiln::Model(host), net_(torch::nn::Linear(1, 1)) {}
  torch::nn::Module& module() override { return *net_; }
  at::Tensor training_step(const kiln::Batch&, int64_t) override { return net_->weight.square().sum(); }

 private:
  torch::nn::Linear net_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<NullModel>({"kiln.bench.null_model", "A step that costs nothing (bench)", "1.0.0"}))
