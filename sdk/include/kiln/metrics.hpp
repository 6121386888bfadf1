// kiln/metrics.hpp — metrics over tensors: pure functions, no state, on the
// inputs' device, accumulated in float64. Each equals scikit-learn's named
// function (checked in tests/unit/sdk_metrics_test.cpp against Debian's
// scikit-learn on random inputs and edge cases; docs/metrics_library.md).
// Meant for Model::on_epoch_end, over the whole split's collected rows
// (docs/metrics.md): the same rows give the same bits.
//
// Inputs: `target` holds integer class labels (or bool); `scores` floating
// values, one column per class ([N, C]) or one per sample ([N], binary:
// the positive class's). Bad input throws std::invalid_argument with one
// line naming the function: mismatched shapes, an empty input, a label
// outside [0, num_classes), a wrong dtype.
//
// Where scikit-learn warns and returns a value (a zero division), kiln
// returns the same value; where scikit-learn raises (AUROC with a single
// class in the targets; NaN or infinite scores given to a function that
// takes scores, as a diverged model gives), kiln returns NaN: a metric must
// not end a run.
#pragma once

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace kiln::metrics {

enum class Average { binary, micro, macro, weighted };

namespace detail {

[[noreturn]] inline void refuse(const char* function, const std::string& problem) {
  throw std::invalid_argument(std::string("kiln::metrics::") + function + ": " + problem);
}

inline std::string shape(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

inline void check_defined(const char* f, const at::Tensor& t, const char* name) {
  if (!t.defined()) refuse(f, std::string(name) + " is undefined");
  if (t.dim() == 0 || t.size(0) == 0) refuse(f, std::string(name) + " is empty (shape " + shape(t) + ")");
}

// Integer labels [N] in [0, classes) (classes < 0: any non-negative).
inline at::Tensor labels(const char* f, const at::Tensor& target, int64_t classes, const char* name = "target") {
  check_defined(f, target, name);
  if (target.dim() != 1) refuse(f, std::string(name) + " must be one label per sample, shape [N], not " + shape(target));
  if (at::isFloatingType(target.scalar_type()) || at::isComplexType(target.scalar_type()))
    refuse(f, std::string(name) + " must hold integer labels, not " + std::string(c10::toString(target.scalar_type())));
  const at::Tensor t = target.to(at::kLong);
  const int64_t low = t.min().item<int64_t>(), high = t.max().item<int64_t>();
  if (low < 0 || (classes >= 0 && high >= classes))
    refuse(f, std::string(name) + " holds label " + std::to_string(low < 0 ? low : high) + ", outside [0, " +
                  (classes >= 0 ? std::to_string(classes) : std::string("inf")) + ")");
  return t;
}

// False when any value is NaN or infinite (scikit-learn refuses those).
inline bool finite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();

inline void same_rows(const char* f, const at::Tensor& a, const char* an, const at::Tensor& b, const char* bn) {
  if (a.size(0) != b.size(0))
    refuse(f, std::string(an) + " has " + std::to_string(a.size(0)) + " rows but " + bn + " has " +
                  std::to_string(b.size(0)));
}

inline void floating(const char* f, const at::Tensor& t, const char* name) {
  if (!at::isFloatingType(t.scalar_type()))
    refuse(f, std::string(name) + " must be floating, not " + std::string(c10::toString(t.scalar_type())));
}

// Predicted labels from `input`: argmax of scores [N, C], or labels [N].
inline at::Tensor predicted(const char* f, const at::Tensor& input, int64_t classes) {
  check_defined(f, input, "input");
  if (input.dim() == 2) {
    floating(f, input, "input");
    if (input.size(1) != classes)
      refuse(f, "input has " + std::to_string(input.size(1)) + " columns but num_classes is " + std::to_string(classes));
    return input.argmax(1);
  }
  return labels(f, input, classes, "input");
}

// The confusion counts [C, C] (rows: true, columns: predicted), int64.
inline at::Tensor counts(const char* f, const at::Tensor& input, const at::Tensor& target, int64_t classes) {
  if (classes < 1) refuse(f, "num_classes must be at least 1, not " + std::to_string(classes));
  const at::Tensor t = labels(f, target, classes);
  const at::Tensor p = predicted(f, input, classes);
  same_rows(f, input, "input", target, "target");
  return at::bincount(t * classes + p, {}, classes * classes).reshape({classes, classes});
}

// a / b, 0 where b is 0 (scikit-learn's zero_division default, after its warning).
inline at::Tensor ratio(const at::Tensor& a, const at::Tensor& b) {
  return at::where(b > 0, a / at::where(b > 0, b, at::ones_like(b)), at::zeros_like(a));
}

// Per class: tp, predicted count, true count (float64).
struct Tallies {
  at::Tensor tp, predicted, actual;
};
inline Tallies tallies(const char* f, const at::Tensor& input, const at::Tensor& target, int64_t classes) {
  const at::Tensor m = counts(f, input, target, classes).to(at::kDouble);
  return {m.diagonal(), m.sum(0), m.sum(1)};
}

enum class Score { precision, recall, f1 };

inline double prf(const char* f, Score score, const at::Tensor& input, const at::Tensor& target, int64_t classes,
                  Average average) {
  if (average == Average::binary && classes != 2)
    refuse(f, "Average::binary needs num_classes = 2, not " + std::to_string(classes));
  const Tallies t = tallies(f, input, target, classes);
  auto of = [&](const at::Tensor& tp, const at::Tensor& pred, const at::Tensor& actual) {
    const at::Tensor p = ratio(tp, pred), r = ratio(tp, actual);
    if (score == Score::precision) return p;
    if (score == Score::recall) return r;
    return ratio(2 * p * r, p + r);
  };
  switch (average) {
    case Average::binary: return of(t.tp[1], t.predicted[1], t.actual[1]).item<double>();
    case Average::micro: return of(t.tp.sum(), t.predicted.sum(), t.actual.sum()).item<double>();
    case Average::macro: return of(t.tp, t.predicted, t.actual).mean().item<double>();
    case Average::weighted: {
      const at::Tensor support = t.actual;
      const double total = support.sum().item<double>();
      if (total == 0) return 0.0;
      return ((of(t.tp, t.predicted, t.actual) * support).sum() / total).item<double>();
    }
  }
  return 0.0;
}

// scikit-learn's ranking curve of one binary problem: scores sorted
// descending (stable), one point per distinct score: true and false
// positives at or above it. Returns {tps, fps} as float64, or undefined
// tensors when `positive` is empty.
struct Curve {
  at::Tensor tps, fps;
};
inline Curve curve(const at::Tensor& scores, const at::Tensor& positive) {
  const auto sorted = at::sort(scores.to(at::kDouble), /*stable=*/true, /*dim=*/0, /*descending=*/true);
  const at::Tensor s = std::get<0>(sorted);
  const at::Tensor y = positive.to(at::kDouble).index_select(0, std::get<1>(sorted));
  const int64_t n = s.size(0);
  at::Tensor last = at::arange(n - 1, at::TensorOptions().dtype(at::kLong).device(s.device()))
                        .masked_select(s.narrow(0, 1, n - 1) != s.narrow(0, 0, n - 1));
  last = at::cat({last, at::full({1}, n - 1, last.options())});
  const at::Tensor tps = y.cumsum(0).index_select(0, last);
  const at::Tensor fps = (last + 1).to(at::kDouble) - tps;
  return {tps, fps};
}

// Every column's roc_auc_score at once (`positive` [N, C] marks each
// column's positive samples): Mann-Whitney's U over P x Q pairs, a tie
// counting half — exactly the area of roc_curve's trapezoids, tied scores
// being one point of the curve. One sort for every column, and the ranks
// of tied scores are their mean, so the sort's order among ties does not
// matter. NaN for a column with a single class (scikit-learn raises).
inline at::Tensor column_aurocs_on_device(const at::Tensor& scores, const at::Tensor& positive) {
  const auto sorted = at::sort(scores.to(at::kDouble), /*dim=*/0);
  const at::Tensor s = std::get<0>(sorted);
  const at::Tensor y = positive.to(at::kDouble).gather(0, std::get<1>(sorted));
  const int64_t n = s.size(0);
  const at::Tensor index =
      at::arange(n, at::TensorOptions().dtype(at::kLong).device(s.device())).unsqueeze(1).expand_as(s);
  const at::Tensor change = s.narrow(0, 1, n - 1).ne(s.narrow(0, 0, n - 1));
  const at::Tensor edge = at::ones({1, s.size(1)}, change.options());
  // Each position's tie group: its first and last position in the sort.
  const at::Tensor first = std::get<0>(at::cummax(at::where(at::cat({edge, change}), index, at::zeros_like(index)), 0));
  const at::Tensor last = at::flip(
      std::get<0>(at::cummin(at::flip(at::where(at::cat({change, edge}), index, at::full_like(index, n)), {0}), 0)), {0});
  const at::Tensor rank = (first + last).to(at::kDouble) / 2 + 1;
  const at::Tensor p = y.sum(0), q = static_cast<double>(n) - p;
  const at::Tensor u = (rank * y).sum(0) - p * (p + 1) / 2;
  return at::where(p.gt(0).logical_and(q.gt(0)), u / (p * q), at::full_like(u, nan_value));
}

// The same on the CPU, where sorting is the cost (a [10000, 10] split's
// columns take ~1 ms each to sort here): each column's positive and
// negative scores sorted apart (doubles alone, no payload) and U counted in
// one sweep, in integers — exact — with the columns spread over the
// intra-op threads. Each column's value is independent of the threads.
inline at::Tensor column_aurocs(const at::Tensor& scores, const at::Tensor& positive) {
  if (!scores.device().is_cpu()) return column_aurocs_on_device(scores, positive);
  const at::Tensor s = scores.to(at::kDouble).t().contiguous();
  const at::Tensor y = positive.to(at::kBool).t().contiguous();
  const int64_t columns = s.size(0), n = s.size(1);
  at::Tensor out = at::empty({columns}, at::kDouble);
  double* value = out.data_ptr<double>();
  const double* score = s.data_ptr<double>();
  const bool* is_positive = y.data_ptr<bool>();
  at::parallel_for(0, columns, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> pos, neg;
    for (int64_t c = begin; c < end; ++c) {
      pos.clear();
      neg.clear();
      for (int64_t i = 0; i < n; ++i) (is_positive[c * n + i] ? pos : neg).push_back(score[c * n + i]);
      if (pos.empty() || neg.empty()) {
        value[c] = nan_value;
        continue;
      }
      std::sort(pos.begin(), pos.end());
      std::sort(neg.begin(), neg.end());
      // Twice U: each positive scores 2 per negative below it, 1 per tie.
      int64_t twice = 0;
      size_t below = 0, not_above = 0;
      for (const double v : pos) {
        while (below < neg.size() && neg[below] < v) ++below;
        while (not_above < neg.size() && neg[not_above] <= v) ++not_above;
        twice += static_cast<int64_t>(2 * below + (not_above - below));
      }
      value[c] = (static_cast<double>(twice) / 2) / (static_cast<double>(pos.size()) * static_cast<double>(neg.size()));
    }
  });
  return out;
}


// average_precision_score of one binary problem (step-wise, no
// interpolation). No positive sample: scikit-learn 1.2 sets recall to 1 at
// every threshold, which gives 0 (after its warning).
inline double binary_ap(const at::Tensor& scores, const at::Tensor& positive) {
  const Curve c = curve(scores, positive);
  const double p = c.tps[-1].item<double>();
  if (p == 0) return 0.0;
  const at::Tensor precision = c.tps / (c.tps + c.fps);
  const at::Tensor recall = c.tps / p;
  const at::Tensor previous = at::cat({at::zeros({1}, recall.options()), recall.narrow(0, 0, recall.size(0) - 1)});
  return ((recall - previous) * precision).sum().item<double>();
}

// average_precision of every column (a loop: each has its own curve).
inline at::Tensor column_aps(const at::Tensor& scores, const at::Tensor& positive) {
  std::vector<double> values;
  for (int64_t c = 0; c < scores.size(1); ++c) values.push_back(binary_ap(scores.select(1, c), positive.select(1, c)));
  return at::tensor(values, at::kDouble);
}

// A ranking metric, binary for scores [N] (target 0/1), else the macro
// mean over one-vs-rest columns; `columns` gives each column's value.
template <class Columns>
double one_vs_rest(const char* f, const at::Tensor& scores, const at::Tensor& target, Columns columns) {
  check_defined(f, scores, "scores");
  floating(f, scores, "scores");
  if (scores.dim() == 1) {
    const at::Tensor t = labels(f, target, 2);
    same_rows(f, scores, "scores", target, "target");
    if (!finite(scores)) return nan_value;
    const at::Tensor value = columns(scores.unsqueeze(1), t.eq(1).unsqueeze(1));
    return value.item<double>();
  }
  if (scores.dim() != 2) refuse(f, "scores must be [N] or [N, C], not " + shape(scores));
  const at::Tensor t = labels(f, target, scores.size(1));
  same_rows(f, scores, "scores", target, "target");
  if (!finite(scores)) return nan_value;
  const at::Tensor classes = at::arange(scores.size(1), t.options());
  const at::Tensor values = columns(scores, t.unsqueeze(1).eq(classes.unsqueeze(0)));
  return values.mean().item<double>();
}

// Checks; false when a value is NaN or infinite (scikit-learn raises: NaN).
inline bool regression_inputs(const char* f, const at::Tensor& input, const at::Tensor& target) {
  check_defined(f, input, "input");
  check_defined(f, target, "target");
  if (input.sizes() != target.sizes())
    refuse(f, "input has shape " + shape(input) + " but target has " + shape(target));
  if (input.dim() > 2) refuse(f, "input must be [N] or [N, outputs], not " + shape(input));
  if (at::isComplexType(input.scalar_type()) || at::isComplexType(target.scalar_type()))
    refuse(f, "input and target must be real");
  return finite(input) && finite(target);
}

// Per output column, scikit-learn's multioutput="uniform_average".
inline at::Tensor columns(const at::Tensor& t) { return t.to(at::kDouble).reshape({t.size(0), -1}); }

inline void nll_inputs(const char* f, const at::Tensor& nll, const at::Tensor& tokens) {
  check_defined(f, nll, "nll");
  check_defined(f, tokens, "tokens");
  floating(f, nll, "nll");
  if (nll.sizes() != tokens.sizes()) refuse(f, "nll has shape " + shape(nll) + " but tokens has " + shape(tokens));
  if (tokens.sum().item<double>() <= 0) refuse(f, "tokens sum to zero");
}

}  // namespace detail

// The fraction of samples whose target is among the top_k scores
// (top_k 1: accuracy_score of the argmax, which takes the first of tied
// maxima, as numpy's and every function here; top_k > 1:
// sklearn.metrics.top_k_accuracy_score, ties ranked as it ranks them, the
// higher class index first). `input`: scores [N, C] or predicted labels [N].
// top_k 1 takes NaN as the largest score, as numpy's argmax; top_k > 1 with
// a NaN or infinite score: NaN (top_k_accuracy_score raises).
inline double accuracy(const at::Tensor& input, const at::Tensor& target, int64_t top_k = 1) {
  const char* f = "accuracy";
  detail::check_defined(f, input, "input");
  if (input.dim() == 2) {
    detail::floating(f, input, "input");
    if (top_k < 1 || top_k > input.size(1))
      detail::refuse(f, "top_k must be in [1, " + std::to_string(input.size(1)) + "], not " + std::to_string(top_k));
    const at::Tensor t = detail::labels(f, target, input.size(1));
    detail::same_rows(f, input, "input", target, "target");
    if (top_k == 1) return input.argmax(1).eq(t).to(at::kDouble).mean().item<double>();
    if (!detail::finite(input)) return detail::nan_value;
    // The target's rank: classes scored higher, or scored the same with a
    // higher index (scikit-learn's order for ties: a reversed stable sort).
    const at::Tensor mine = input.gather(1, t.unsqueeze(1));
    const at::Tensor index = at::arange(input.size(1), t.options()).unsqueeze(0);
    const at::Tensor ahead = input.gt(mine).logical_or(input.eq(mine).logical_and(index.gt(t.unsqueeze(1))));
    return ahead.sum(1).lt(top_k).to(at::kDouble).mean().item<double>();
  }
  if (top_k != 1) detail::refuse(f, "top_k needs scores [N, C], not labels");
  const at::Tensor p = detail::labels(f, input, -1, "input"), t = detail::labels(f, target, -1);
  detail::same_rows(f, input, "input", target, "target");
  return p.eq(t).to(at::kDouble).mean().item<double>();
}

// sklearn.metrics.precision_score / recall_score / f1_score(y, y_pred,
// labels=range(num_classes), average=...), binary with pos_label=1. A class
// never predicted (precision) or absent from the targets (recall) counts 0,
// as scikit-learn's zero_division default does after its warning.
inline double precision(const at::Tensor& input, const at::Tensor& target, int64_t num_classes,
                        Average average = Average::macro) {
  return detail::prf("precision", detail::Score::precision, input, target, num_classes, average);
}
inline double recall(const at::Tensor& input, const at::Tensor& target, int64_t num_classes,
                     Average average = Average::macro) {
  return detail::prf("recall", detail::Score::recall, input, target, num_classes, average);
}
inline double f1(const at::Tensor& input, const at::Tensor& target, int64_t num_classes,
                 Average average = Average::macro) {
  return detail::prf("f1", detail::Score::f1, input, target, num_classes, average);
}

// sklearn.metrics.confusion_matrix(y, y_pred, labels=range(num_classes)):
// int64 [C, C] on the CPU, rows the true class, columns the predicted one.
inline at::Tensor confusion_matrix(const at::Tensor& input, const at::Tensor& target, int64_t num_classes) {
  return detail::counts("confusion_matrix", input, target, num_classes).cpu();
}

// sklearn.metrics.roc_auc_score: binary for scores [N] (target 0/1);
// one-vs-rest, macro-averaged, for scores [N, C] (multi_class="ovr",
// labels=range(C)). Tied scores form one point of the curve, as in
// roc_curve. A single class in the targets (or, one-vs-rest, a class absent
// from them), or a NaN or infinite score, where scikit-learn raises: NaN.
// Unlike scikit-learn, rows of [N, C] scores need not sum to 1, and [N, 2]
// is one-vs-rest over both columns (for probabilities: the AUROC of column
// 1, which scikit-learn wants given alone).
inline double auroc(const at::Tensor& scores, const at::Tensor& target) {
  return detail::one_vs_rest("auroc", scores, target, &detail::column_aurocs);
}

// sklearn.metrics.average_precision_score: binary for scores [N]; for
// [N, C], macro over one-hot targets. A class with no positive sample
// counts 0 (scikit-learn 1.2 warns and gives 0). A NaN or infinite score,
// where scikit-learn raises: NaN.
inline double average_precision(const at::Tensor& scores, const at::Tensor& target) {
  return detail::one_vs_rest("average_precision", scores, target, &detail::column_aps);
}

// sklearn.metrics.mean_squared_error / mean_absolute_error (uniform average
// over output columns). A NaN or infinite value, where scikit-learn raises:
// NaN.
inline double mean_squared_error(const at::Tensor& input, const at::Tensor& target) {
  if (!detail::regression_inputs("mean_squared_error", input, target)) return detail::nan_value;
  return (detail::columns(input) - detail::columns(target)).pow(2).mean(0).mean().item<double>();
}
inline double mean_absolute_error(const at::Tensor& input, const at::Tensor& target) {
  if (!detail::regression_inputs("mean_absolute_error", input, target)) return detail::nan_value;
  return (detail::columns(input) - detail::columns(target)).abs().mean(0).mean().item<double>();
}

// sklearn.metrics.r2_score (uniform average over output columns). A
// constant target column scores 1.0 when predicted exactly, else 0.0
// (scikit-learn's force_finite default). Fewer than two samples: NaN, as
// scikit-learn (with a warning). A NaN or infinite value, where scikit-learn
// raises: NaN.
inline double r2_score(const at::Tensor& input, const at::Tensor& target) {
  if (!detail::regression_inputs("r2_score", input, target)) return detail::nan_value;
  if (input.size(0) < 2) return detail::nan_value;
  const at::Tensor y = detail::columns(target), p = detail::columns(input);
  const at::Tensor residual = (y - p).pow(2).sum(0);
  const at::Tensor total = (y - y.mean(0)).pow(2).sum(0);
  const at::Tensor score = at::where(total > 0, 1 - residual / at::where(total > 0, total, at::ones_like(total)),
                                     at::where(residual == 0, at::ones_like(total), at::zeros_like(total)));
  return score.mean().item<double>();
}

// Over a split of token sequences: `nll` each sample's summed negative
// log-likelihood (nats), `tokens` its token count. exp(sum nll / sum tokens)
// and (sum nll / sum tokens) / ln 2: every token weighs the same.
inline double perplexity(const at::Tensor& nll, const at::Tensor& tokens) {
  detail::nll_inputs("perplexity", nll, tokens);
  return std::exp(nll.to(at::kDouble).sum().item<double>() / tokens.to(at::kDouble).sum().item<double>());
}
inline double bits_per_token(const at::Tensor& nll, const at::Tensor& tokens) {
  detail::nll_inputs("bits_per_token", nll, tokens);
  return nll.to(at::kDouble).sum().item<double>() / tokens.to(at::kDouble).sum().item<double>() / std::log(2.0);
}
// The same from each token's negative log-likelihood (nats).
inline double perplexity(const at::Tensor& nll_per_token) {
  detail::check_defined("perplexity", nll_per_token, "nll");
  detail::floating("perplexity", nll_per_token, "nll");
  return std::exp(nll_per_token.to(at::kDouble).mean().item<double>());
}
inline double bits_per_token(const at::Tensor& nll_per_token) {
  detail::check_defined("bits_per_token", nll_per_token, "nll");
  detail::floating("bits_per_token", nll_per_token, "nll");
  return nll_per_token.to(at::kDouble).mean().item<double>() / std::log(2.0);
}

}  // namespace kiln::metrics
