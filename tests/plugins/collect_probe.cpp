// Test plugins for collected rows (kiln_host.collect, ABI 1.2): a model
// that collects per-sample scores and targets, or misuses collect on
// demand; a data module that collects where it must not; and a callback
// that writes what every rank gets at the epoch's end, so a test can
// compare the rows across world sizes and recompute metrics with
// scikit-learn.
//
// Model (kiln.test.collect_model), [model] keys:
//   features, classes   the linear layer (default 8, 4)
//   misuse    "" (none), "wrong_rows" (one row short), "dtype_change" (float64
//             from batch 1 on), "outside_step" (collect in on_epoch_end),
//             "ignore_error" (wrong rows through the C table, error ignored),
//             "rank_differs" (rank 1 collects one more column), "skip_batch"
//             (batch 1 collects nothing), "big" (4 MiB of rows a step)
//   log_rows  log "<split>/collected_rows" and "<split>/index_sum" in on_epoch_end
// Data module (kiln.test.collect_data): synthetic rows; collect_in_get_batch
//   = true collects from get_batch (a prefetch thread).
// Model (kiln.test.input_hash): each sample's input hashed (below).
// Callback (kiln.test.collect_dump): dir = where rank 0 writes
//   "<split>-<epoch>.txt": the rows, every value with 17 digits, after a line
//   "confusion <C*C counts>" (kiln::metrics::confusion_matrix) when the rows
//   hold scores and targets.
#include <cstdio>
#include <fstream>
#include <string>

#include <kiln/metrics.hpp>
#include <kiln/plugin.hpp>

namespace {

const char* split_text(kiln::Split split) {
  switch (split) {
    case kiln::Split::train: return "train";
    case kiln::Split::val: return "val";
    case kiln::Split::test: return "test";
    default: return "predict";
  }
}

class CollectModel final : public kiln::Model {
 public:
  CollectModel(const kiln::Host& host, kiln::Config& config)
      : Model(host),
        classes_(config.get<int64_t>("classes", 4)),
        net_(torch::nn::Linear(config.get<int64_t>("features", 8), classes_)),
        misuse_(config.get<std::string>("misuse", "")),
        log_rows_(config.get<bool>("log_rows", true)) {}

  torch::nn::Module& module() override { return *net_; }

  at::Tensor training_step(const kiln::Batch& batch, int64_t index) override {
    collect(row_scores(batch["input"]), batch["target"], index);
    return torch::cross_entropy_loss(net_->forward(batch["input"]), batch["target"]);
  }
  void validation_step(const kiln::Batch& batch, int64_t index) override {
    collect(row_scores(batch["input"]), batch["target"], index);
  }
  void test_step(const kiln::Batch& batch, int64_t index) override {
    collect(row_scores(batch["input"]), batch["target"], index);
  }

  void on_epoch_end(kiln::Split split, const kiln::Collected& rows) override {
    if (misuse_ == "outside_step") host().collect("scores", at::zeros({1, classes_}));
    if (!log_rows_) return;
    const std::string prefix = split_text(split);
    host().log_metric(prefix + "/collected_rows", static_cast<double>(rows.size()));
    if (!rows.empty()) host().log_metric(prefix + "/index_sum", rows.index().sum().item<double>());
  }

 private:
  // Each sample's scores from a one-row forward: a BLAS picks its kernel by
  // the batch's shape (MKL's sgemm for 8 rows and for 1 row differ in the
  // last bits), and the last batch's size depends on the number of ranks.
  // The tests compare rows byte for byte across process counts, which checks
  // kiln's gathering and ordering only when each row's bits depend on its
  // sample alone.
  at::Tensor row_scores(const at::Tensor& input) {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> rows;
    rows.reserve(static_cast<size_t>(input.size(0)));
    for (int64_t i = 0; i < input.size(0); ++i) rows.push_back(torch::softmax(net_->forward(input.narrow(0, i, 1)), 1));
    return at::cat(rows, 0);
  }

  void collect(const at::Tensor& scores_in, const at::Tensor& target, int64_t index) {
    at::Tensor scores = scores_in;
    if (misuse_ == "wrong_rows") scores = scores.narrow(0, 0, scores.size(0) - 1);
    if (misuse_ == "dtype_change" && index >= 1) scores = scores.to(at::kDouble);
    if (misuse_ == "rank_differs" && host().rank() == 1) scores = at::cat({scores, scores.narrow(1, 0, 1)}, 1);
    if (misuse_ == "skip_batch" && index == 1) return;
    if (misuse_ == "big") scores = at::zeros({scores_in.size(0), (4 << 20) / 4 / scores_in.size(0)});
    if (misuse_ == "ignore_error") {
      const kiln_host* raw = host().raw();
      const at::Tensor short_rows = scores.narrow(0, 0, scores.size(0) - 1);
      kiln_error* e = raw->collect(raw, "scores", reinterpret_cast<const kiln_tensor*>(short_rows.unsafeGetTensorImpl()));
      (void)e;  // leaked on purpose: a careless plugin; the host must still fail the step
      return;
    }
    host().collect("scores", scores);
    host().collect("target", target);
  }

  int64_t classes_;
  torch::nn::Linear net_;
  std::string misuse_;
  bool log_rows_;
};

// Model (kiln.test.input_hash): collects each sample's "input_hash" (FNV-1a
// of its input's bytes, as two 32-bit halves) and its target, so a test can
// compare what the data module built for every sample across data workers,
// process counts and resumes. Its one weight trains on the input's mean.
class InputHash final : public kiln::Model {
 public:
  InputHash(const kiln::Host& host, kiln::Config&) : Model(host), net_(torch::nn::Linear(1, 1)) {}
  torch::nn::Module& module() override { return *net_; }

  at::Tensor training_step(const kiln::Batch& batch, int64_t) override {
    const at::Tensor input = batch["input"];
    collect(input, batch["target"]);
    return net_->forward(input.reshape({input.size(0), -1}).mean(1, true)).pow(2).mean();
  }
  void validation_step(const kiln::Batch& batch, int64_t) override { collect(batch["input"], batch["target"]); }

 private:
  void collect(const at::Tensor& input, const at::Tensor& target) {
    const at::Tensor flat = input.to(at::kFloat).reshape({input.size(0), -1}).contiguous();
    at::Tensor hashes = at::empty({flat.size(0), 2}, at::kLong);
    for (int64_t i = 0; i < flat.size(0); ++i) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(flat[i].data_ptr<float>());
      uint64_t h = 1469598103934665603ull;
      for (int64_t b = 0; b < flat.size(1) * 4; ++b) h = (h ^ bytes[b]) * 1099511628211ull;
      hashes[i][0] = static_cast<int64_t>(h >> 32);
      hashes[i][1] = static_cast<int64_t>(h & 0xffffffffu);
    }
    host().collect("input_hash", hashes);
    host().collect("target", target);
  }

  torch::nn::Linear net_;
};

class CollectData final : public kiln::DataModule {
 public:
  CollectData(const kiln::Host& host, kiln::Config& config)
      : DataModule(host),
        size_(config.get<int64_t>("size", 64)),
        collect_(config.get<bool>("collect_in_get_batch", false)) {}
  int64_t length(kiln::Split) override { return size_; }
  kiln::TensorMap get_batch(kiln::Split, const int64_t* indices, size_t count) override {
    at::Tensor input = at::zeros({static_cast<int64_t>(count), 8});
    at::Tensor target = at::zeros({static_cast<int64_t>(count)}, at::kLong);
    for (size_t i = 0; i < count; ++i) {
      input[static_cast<int64_t>(i)].fill_(static_cast<double>(indices[i] % 7));
      target[static_cast<int64_t>(i)] = indices[i] % 4;
    }
    if (collect_) host().collect("target", target);
    return {{"input", input}, {"target", target}};
  }

 private:
  int64_t size_;
  bool collect_;
};

class CollectDump final : public kiln::Callback {
 public:
  CollectDump(const kiln::Host& host, kiln::Config& config)
      : Callback(host), dir_(config.get<std::string>("dir", "")) {}

  void on_epoch_collected(const kiln_progress& progress, kiln::Split split, const kiln::Collected& rows) override {
    if (host().rank() != 0 || dir_.empty()) return;
    std::ofstream out(dir_ + "/" + split_text(split) + "-" + std::to_string(progress.epoch) + ".txt");
    out << "rows " << rows.size() << "\n";
    // The confusion matrix a callback would write, from kiln's library.
    if (rows.has("scores") && rows.has("target")) {
      const at::Tensor matrix =
          kiln::metrics::confusion_matrix(rows["scores"], rows["target"], rows["scores"].size(1)).contiguous();
      out << "confusion";
      for (int64_t i = 0; i < matrix.numel(); ++i) out << " " << matrix.data_ptr<int64_t>()[i];
      out << "\n";
    }
    for (const char* name : {"kiln.index", "target", "scores", "input_hash"}) {
      if (!rows.has(name)) continue;
      const at::Tensor t = rows[name].to(at::kDouble).reshape({rows.size(), -1}).contiguous();
      out << name << " " << t.size(1) << "\n";
      const double* v = t.data_ptr<double>();
      char text[40];
      for (int64_t i = 0; i < t.numel(); ++i) {
        std::snprintf(text, sizeof text, "%.17g", v[i]);
        out << text << ((i + 1) % t.size(1) == 0 ? "\n" : " ");
      }
    }
  }

 private:
  std::string dir_;
};

}  // namespace

KILN_EXPORT_PLUGINS(kiln::describe<CollectModel>({"kiln.test.collect_model", "collect model", "1.0"}),
                    kiln::describe<CollectData>({"kiln.test.collect_data", "collect data", "1.0"}),
                    kiln::describe<InputHash>({"kiln.test.input_hash", "input hash", "1.0"}),
                    kiln::describe<CollectDump>({"kiln.test.collect_dump", "collect dump", "1.0"}))
