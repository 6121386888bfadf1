#include "optim/nonfinite_watch.hpp"

#include <cmath>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "util/host_scalar.hpp"

namespace kiln {

NonfiniteWatch::NonfiniteWatch(NonfiniteMode mode, int64_t check_every,
                               std::function<void(at::Tensor&)> sum_over_ranks)
    : mode_(mode), check_every_(check_every > 0 ? check_every : 1), sum_over_ranks_(std::move(sum_over_ranks)) {}

void NonfiniteWatch::start(int64_t global_step) { window_start_ = global_step; }

// A float32 or float64 value in host memory is read where it lies
// (host_scalar). Whether it was taken so.
bool NonfiniteWatch::host_value_bad(const at::Tensor& value, bool* bad) {
  const std::optional<double> v = host_scalar(value);
  if (!v) return false;
  if (!std::isfinite(*v)) *bad = true;
  return true;
}

// Elsewhere one kernel a step: add_ with alpha 0 computes acc + 0 * loss, which stays 0
// for any finite loss and becomes NaN for NaN or +-inf.
void NonfiniteWatch::add_loss(const at::Tensor& loss) {
  if (!on()) return;
  if (host_value_bad(loss, &host_loss_bad_)) return;
  if (!loss_acc_.defined()) loss_acc_ = at::zeros(loss.sizes(), loss.options().dtype(at::kFloat));  // a [1] loss too
  loss_acc_.add_(loss, 0);
}

void NonfiniteWatch::add_grad_norm(const at::Tensor& norm) {
  if (!on()) return;
  if (host_value_bad(norm, &host_grad_bad_)) return;
  if (!grad_acc_.defined()) grad_acc_ = at::zeros(norm.sizes(), norm.options().dtype(at::kFloat));
  grad_acc_.add_(norm, 0);
}

std::vector<double> NonfiniteWatch::read_window(const std::vector<at::Tensor>* weights) {
  // One copy to the host for everything (a CPU tensor's copy costs nothing).
  std::vector<at::Tensor> parts;
  for (const at::Tensor* acc : {&loss_acc_, &grad_acc_})
    parts.push_back(acc->defined() ? acc->to(at::kCPU) : at::zeros({}, at::kFloat));
  at::Tensor weights_bad = at::zeros({}, at::kFloat);
  if (weights)
    for (const at::Tensor& w : *weights)
      if (w.is_floating_point()) weights_bad = weights_bad.logical_or(at::isfinite(w).logical_not().any().to(at::kCPU));
  ++reads_;
  at::Tensor found = at::zeros({3}, at::kDouble);
  auto* f = found.data_ptr<double>();
  auto finite = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    const float* v = c.data_ptr<float>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(v[i])) return false;
    return true;
  };
  f[0] = finite(parts[0]) && !host_loss_bad_ ? 0.0 : 1.0;
  f[1] = finite(parts[1]) && !host_grad_bad_ ? 0.0 : 1.0;
  host_loss_bad_ = host_grad_bad_ = false;
  f[2] = weights_bad.to(at::kFloat).data_ptr<float>()[0] != 0.0f ? 1.0 : 0.0;
  if (sum_over_ranks_) sum_over_ranks_(found);
  // The window starts afresh: a value found is reported once.
  if (loss_acc_.defined()) loss_acc_.zero_();
  if (grad_acc_.defined()) grad_acc_.zero_();
  return {f[0], f[1], f[2]};
}

std::string NonfiniteWatch::describe(const std::vector<double>& found, int64_t global_step, int64_t epoch) const {
  std::vector<std::string> what;
  if (found[0] > 0) what.push_back("the training loss");
  if (found[1] > 0) what.push_back("the gradient norm");
  if (found[2] > 0) what.push_back("the weights");
  std::string subject;
  for (size_t i = 0; i < what.size(); ++i) subject += (i == 0 ? "" : i + 1 == what.size() ? " and " : ", ") + what[i];
  const std::string when = global_step - window_start_ <= 1
                               ? "at step " + std::to_string(global_step)
                               : "between step " + std::to_string(window_start_) + " and " +
                                     std::to_string(global_step);
  std::string ranks;
  const double most = std::max({found[0], found[1], found[2]});
  if (sum_over_ranks_ && most > 0) ranks = " on " + std::to_string(static_cast<int64_t>(most)) + " rank(s)";
 return subject + " became NaN or inf " + when + " (epoch " +
         std::to_string(epoch) + ")" + ranks;
}

void NonfiniteWatch::check(int64_t global_step, int64_t epoch) {
  if (!on()) return;
  const std::vector<double> found = read_window(nullptr);
  const bool bad = found[0] > 0 || found[1] > 0;
  const std::string what = bad ? describe(found, global_step, epoch) : "";
  window_start_ = global_step;
  if (!bad) return;
  if (mode_ == NonfiniteMode::raise)
    throw NonfiniteTraining("trainer.detect_nonfinite: " + what +
                            "; the run stops here (lower the learning rate, clip gradients with "
                            "trainer.gradient_clip_val, or look at the data of those steps; detect_nonfinite = "
                            "\"warn\" trains on)");
  // Once: non-finite weights stay so, and every later window would repeat it.
  if (warned_) return;
  spdlog::warn("trainer.detect_nonfinite: {}; training goes on (detect_nonfinite = \"warn\"; later windows are not "
               "reported)",
               what);
  warned_ = true;
}

bool NonfiniteWatch::may_commit(const std::vector<at::Tensor>& weights, int64_t global_step, int64_t epoch) {
  if (!on()) return true;
  const std::vector<double> found = read_window(&weights);
  const bool bad = found[0] > 0 || found[1] > 0 || found[2] > 0;
  const std::string what = bad ? describe(found, global_step, epoch) : "";
  window_start_ = global_step;
  if (!bad) return true;
  if (mode_ == NonfiniteMode::raise)
    throw NonfiniteTraining("trainer.detect_nonfinite: " + what +
                            "; no checkpoint of these weights is committed and the run stops here (lower the "
                            "learning rate, or clip gradients with trainer.gradient_clip_val)");
  spdlog::warn("trainer.detect_nonfinite: {}; the checkpoint at step {} is not committed", what, global_step);
  return false;
}

}  // namespace kiln
