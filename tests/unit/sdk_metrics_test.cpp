// kiln/metrics.hpp against scikit-learn: random inputs of several sizes and
// class counts, and the edge cases (a class absent from the targets,
// all-equal scores, a single class, heavy ties), each compared to
// scikit-learn's value on the same numbers (tests/support/sklearn_metrics.py)
// to 1e-9, NaN to NaN. And every bad input refused in one line naming the
// function.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "kiln/metrics.hpp"
#include "support/run_process.hpp"

namespace kiln::test {
namespace {

namespace km = kiln::metrics;

struct Case {
  std::string name, kind;
  at::Tensor scores, target;  // multiclass: [N, C] and [N]; binary: [N] and [N]; regression: [N] and [N]
};

std::string text(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).reshape({-1}).contiguous();
  std::string out;
  char v[40];
  for (int64_t i = 0; i < d.numel(); ++i) {
    std::snprintf(v, sizeof v, " %.17g", d.data_ptr<double>()[i]);
    out += v;
  }
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  at::Generator g = at::detail::createCPUGenerator(20);
  auto labels = [&](int64_t n, int64_t c) { return at::randint(c, {n}, g, at::kLong); };
  for (int64_t n : {7, 100, 1001})
    for (int64_t c : {2, 3, 10}) {
      const at::Tensor s = at::softmax(at::randn({n, c}, g, at::kFloat) * 2, 1);
      out.push_back({"random_" + std::to_string(n) + "x" + std::to_string(c), "multiclass", s, labels(n, c)});
      // Rounded to a tenth: heavy ties within every class's scores.
      out.push_back({"ties_" + std::to_string(n) + "x" + std::to_string(c), "multiclass",
                     at::round(s.to(at::kDouble) * 10) / 10, labels(n, c)});
    }
  // Class 3 never a target; all-equal scores; one class only.
  at::Tensor absent = labels(50, 3);
  out.push_back({"absent_class", "multiclass", at::softmax(at::randn({50, 4}, g), 1), absent});
  out.push_back({"all_equal", "multiclass", at::full({40, 3}, 1.0 / 3), labels(40, 3)});
  out.push_back({"one_class", "multiclass", at::softmax(at::randn({30, 3}, g), 1), at::full({30}, 1, at::kLong)});
  // A diverged model: a NaN score (scikit-learn's argmax takes it as the
  // largest, as torch's; the functions that take scores raise: NaN).
  at::Tensor diverged = at::softmax(at::randn({25, 4}, g, at::kDouble), 1);
  diverged[3][2] = std::numeric_limits<double>::quiet_NaN();
  out.push_back({"nan_score", "multiclass", diverged, labels(25, 4)});
  for (int64_t n : {5, 200, 999}) {
    out.push_back({"binary_" + std::to_string(n), "binary", at::rand({n}, g, at::kDouble), labels(n, 2)});
    out.push_back({"binary_ties_" + std::to_string(n), "binary", at::round(at::rand({n}, g, at::kDouble) * 4) / 4,
                   labels(n, 2)});
  }
  out.push_back({"binary_all_equal", "binary", at::full({20}, 0.5, at::kDouble), labels(20, 2)});
  out.push_back({"binary_no_positive", "binary", at::rand({20}, g, at::kDouble), at::zeros({20}, at::kLong)});
  out.push_back({"binary_no_negative", "binary", at::rand({20}, g, at::kDouble), at::ones({20}, at::kLong)});
  at::Tensor infinite = at::rand({20}, g, at::kDouble);
  infinite[5] = std::numeric_limits<double>::infinity();
  out.push_back({"binary_infinite_score", "binary", infinite, labels(20, 2)});
  for (int64_t n : {2, 50, 777}) {
    const at::Tensor y = at::randn({n}, g, at::kDouble);
    out.push_back({"regression_" + std::to_string(n), "regression", y + 0.3 * at::randn({n}, g, at::kDouble), y});
  }
  out.push_back({"regression_constant_exact", "regression", at::full({9}, 2.0), at::full({9}, 2.0)});
  out.push_back({"regression_constant_missed", "regression", at::arange(9, at::kDouble), at::full({9}, 2.0)});
  out.push_back({"regression_one_sample", "regression", at::full({1}, 1.0), at::full({1}, 2.0)});
  at::Tensor diverged_regression = at::randn({30}, g, at::kDouble);
  diverged_regression[7] = std::numeric_limits<double>::quiet_NaN();
  out.push_back({"regression_nan", "regression", diverged_regression, at::randn({30}, g, at::kDouble)});
  return out;
}

// kiln's values, named as the script names scikit-learn's.
std::map<std::string, double> kiln_values(const Case& c) {
  std::map<std::string, double> v;
  if (c.kind == "multiclass") {
    const int64_t classes = c.scores.size(1);
    v["accuracy"] = km::accuracy(c.scores, c.target);
    // Predicted labels [N] instead of scores: the same values.
    const at::Tensor predicted = c.scores.argmax(1);
    v["accuracy_of_labels"] = km::accuracy(predicted, c.target);
    v["f1_macro_of_labels"] = km::f1(predicted, c.target, classes, km::Average::macro);
    if (classes > 2) v["top2"] = km::accuracy(c.scores, c.target, 2);
    const std::pair<const char*, km::Average> averages[] = {
        {"micro", km::Average::micro}, {"macro", km::Average::macro}, {"weighted", km::Average::weighted}};
    for (const auto& [name, average] : averages) {
      v[std::string("precision_") + name] = km::precision(c.scores, c.target, classes, average);
      v[std::string("recall_") + name] = km::recall(c.scores, c.target, classes, average);
      v[std::string("f1_") + name] = km::f1(c.scores, c.target, classes, average);
    }
    const at::Tensor cm = km::confusion_matrix(c.scores, c.target, classes).reshape({-1});
    for (int64_t i = 0; i < cm.numel(); ++i) v["confusion_" + std::to_string(i)] = cm[i].item<double>();
    v["auroc"] = km::auroc(c.scores, c.target);
    v["average_precision"] = km::average_precision(c.scores, c.target);
  } else if (c.kind == "binary") {
    v["auroc"] = km::auroc(c.scores, c.target);
    v["average_precision"] = km::average_precision(c.scores, c.target);
    const at::Tensor predicted = c.scores.gt(0.5).to(at::kLong);
    v["f1_binary"] = km::f1(predicted, c.target, 2, km::Average::binary);
    v["precision_binary"] = km::precision(predicted, c.target, 2, km::Average::binary);
    v["recall_binary"] = km::recall(predicted, c.target, 2, km::Average::binary);
  } else {
    v["mse"] = km::mean_squared_error(c.scores, c.target);
    v["mae"] = km::mean_absolute_error(c.scores, c.target);
    v["r2"] = km::r2_score(c.scores, c.target);
  }
  return v;
}

TEST(MetricsLibraryAgainstScikitLearn, EveryFunctionOnRandomInputsAndEdgeCases) {
  if (check_python().empty())
    GTEST_SKIP() << "no checking Python (configure with -DKILN_CHECK_PYTHON=..., as ./go does): "
                    "kiln/metrics.hpp not compared with scikit-learn";
  TempDir dir;
  const std::vector<Case> all = cases();
  {
    std::ofstream out(dir / "cases.txt");
    for (const Case& c : all)
      out << c.name << " " << c.kind << " " << c.scores.size(0) << " " << (c.scores.dim() == 2 ? c.scores.size(1) : 1)
          << text(c.scores) << text(c.target) << "\n";
  }
  const ProcessResult r = run_process({check_python().string(), (source_dir() / "tests/support/sklearn_metrics.py").string(),
                                       (dir / "cases.txt").string(), (dir / "expected.txt").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, double> expected;
  std::istringstream in(read_file(dir / "expected.txt"));
  std::string key, value;
  while (in >> key >> value) expected[key] = std::strtod(value.c_str(), nullptr);
  size_t compared = 0;
  for (const Case& c : all)
    for (const auto& [name, mine] : kiln_values(c)) {
      const std::string k = c.name + "/" + name;
      ASSERT_TRUE(expected.count(k)) << k;
      const double theirs = expected.at(k);
      if (std::isnan(theirs)) {
        EXPECT_TRUE(std::isnan(mine)) << k << ": scikit-learn NaN (it raises), kiln " << mine;
      } else {
        EXPECT_NEAR(mine, theirs, 1e-9) << k;
      }
      ++compared;
    }
  EXPECT_EQ(compared, expected.size()) << "every value scikit-learn computed is compared";
  EXPECT_GT(compared, 400u);
  std::cout << all.size() << " cases, " << compared << " values compared with scikit-learn\n";
}

// The CPU path (each column's positives and negatives sorted apart, U
// counted in integers, columns over threads) and the device path (one
// sort, mean ranks of ties) compute the same exact fraction: the same bits.
TEST(MetricsLibrary, TheCpuAndDeviceAurocPathsGiveTheSameBits) {
  at::Generator g = at::detail::createCPUGenerator(9);
  for (const double step : {0.0, 0.05, 0.25}) {
    at::Tensor scores = at::rand({2001, 6}, g, at::kDouble);
    if (step > 0) scores = at::round(scores / step) * step;  // ties
    const at::Tensor target = at::randint(6, {2001}, g, at::kLong);
    const at::Tensor positive = target.unsqueeze(1).eq(at::arange(6, at::kLong).unsqueeze(0));
    const at::Tensor cpu = km::detail::column_aurocs(scores, positive);
    const at::Tensor device = km::detail::column_aurocs_on_device(scores, positive);
    EXPECT_TRUE(at::equal(cpu, device)) << step << "\n" << cpu << "\n" << device;
  }
}

// Rows given in another order give the same value (ties grouped, stable sorts).
TEST(MetricsLibrary, ValuesDoNotDependOnTheOrderOfTheRows) {
  at::Generator g = at::detail::createCPUGenerator(3);
  const at::Tensor scores = at::round(at::softmax(at::randn({300, 5}, g), 1) * 20) / 20;
  const at::Tensor target = at::randint(5, {300}, g, at::kLong);
  const at::Tensor p = at::randperm(300, g, at::kLong);
  EXPECT_EQ(km::auroc(scores, target), km::auroc(scores.index_select(0, p), target.index_select(0, p)));
  EXPECT_EQ(km::average_precision(scores, target),
            km::average_precision(scores.index_select(0, p), target.index_select(0, p)));
  EXPECT_EQ(km::f1(scores, target, 5), km::f1(scores.index_select(0, p), target.index_select(0, p), 5));
}

void expect_refused(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "not refused: " << text;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
  }
}

TEST(MetricsLibrary, BadInputIsRefusedInOneLineNamingTheFunction) {
  const at::Tensor scores = at::rand({10, 3}), target = at::randint(3, {10}, at::kLong);
  expect_refused([&] { km::auroc(scores, target.narrow(0, 0, 9)); },
                 "kiln::metrics::auroc: scores has 10 rows but target has 9");
  expect_refused([&] { km::f1(at::empty({0, 3}), at::empty({0}, at::kLong), 3); }, "kiln::metrics::f1: target is empty");
  expect_refused([&] { km::confusion_matrix(scores, target + 3, 3); },
                 "kiln::metrics::confusion_matrix: target holds label");
  expect_refused([&] { km::accuracy(scores, target.to(at::kFloat)); }, "kiln::metrics::accuracy: target must hold integer labels");
  expect_refused([&] { km::precision(scores, target, 4); }, "kiln::metrics::precision: input has 3 columns but num_classes is 4");
  expect_refused([&] { km::recall(scores, target, 3, km::Average::binary); }, "Average::binary needs num_classes = 2");
  expect_refused([&] { km::mean_squared_error(at::rand({4}), at::rand({5})); },
                 "kiln::metrics::mean_squared_error: input has shape [4] but target has [5]");
  expect_refused([&] { km::bits_per_token(at::rand({4}), at::zeros({4}, at::kLong)); }, "tokens sum to zero");
  expect_refused([&] { km::average_precision(target, target); }, "scores must be floating");
}

// Bool targets are labels 0/1; float32 scores give the float64 values of
// the same numbers (the accumulation is float64 whatever the input).
TEST(MetricsLibrary, BoolTargetsAndFloat32ScoresGiveTheSameValues) {
  at::Generator g = at::detail::createCPUGenerator(5);
  const at::Tensor scores = at::rand({200}, g, at::kFloat), target = at::randint(2, {200}, g, at::kLong);
  EXPECT_EQ(km::auroc(scores, target.to(at::kBool)), km::auroc(scores, target));
  EXPECT_EQ(km::auroc(scores, target), km::auroc(scores.to(at::kDouble), target));
  EXPECT_EQ(km::average_precision(scores, target.to(at::kBool)), km::average_precision(scores.to(at::kDouble), target));
  const at::Tensor predicted = scores.gt(0.5);
  EXPECT_EQ(km::f1(predicted, target.to(at::kBool), 2, km::Average::binary), km::f1(predicted.to(at::kLong), target, 2, km::Average::binary));
}

TEST(MetricsLibrary, PerplexityAndBitsPerTokenWeighEveryTokenTheSame) {
  const at::Tensor nll = at::tensor({2.0, 6.0}, at::kDouble), tokens = at::tensor({1, 3}, at::kLong);
  EXPECT_DOUBLE_EQ(km::bits_per_token(nll, tokens), 2.0 / std::log(2.0));
  EXPECT_DOUBLE_EQ(km::perplexity(nll, tokens), std::exp(2.0));
  EXPECT_DOUBLE_EQ(km::bits_per_token(at::tensor({1.0, 3.0}, at::kDouble)), 2.0 / std::log(2.0));
}

}  // namespace
}  // namespace kiln::test
