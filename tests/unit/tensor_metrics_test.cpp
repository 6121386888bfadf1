// metrics/tensor_metrics: the tensor path reduces exactly as the double path,
// and reads values back once per log point, not once per record.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "kiln/abi.h"
#include "metrics/metric_store.hpp"
#include "metrics/tensor_metrics.hpp"

namespace kiln {
namespace {

struct Case {
  uint32_t reduce;
  const char* name;
};

class TensorMetricsTest : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(TensorMetricsTest, ReducesAsTheDoublePathDoes) {
  const auto [reduce, defer_cpu] = GetParam();
  MetricStore doubles, tensors;
  TensorMetrics pending(defer_cpu);
  const double values[] = {0.5, -2.0, 3.25, 1.0};
  const double weights[] = {4, 1, 2, 0.5};
  for (int i = 0; i < 4; ++i) {
    doubles.record("m", values[i], weights[i], reduce.reduce);
    pending.record("m", at::scalar_tensor(values[i], at::kFloat), weights[i], reduce.reduce);
  }
  pending.flush_into(tensors);
  EXPECT_DOUBLE_EQ(tensors.reduce().at("m"), doubles.reduce().at("m")) << reduce.name;
  // Across ranks the pending accumulators travel as text: the same text.
  doubles.record("m", 1.5, 2, reduce.reduce);
  pending.record("m", at::scalar_tensor(1.5, at::kDouble), 2, reduce.reduce);
  pending.flush_into(tensors);
  EXPECT_EQ(tensors.export_pending(), doubles.export_pending());
}

INSTANTIATE_TEST_SUITE_P(
    Reductions, TensorMetricsTest,
    ::testing::Combine(::testing::Values(Case{KILN_METRIC_REDUCE_MEAN, "mean"}, Case{KILN_METRIC_REDUCE_SUM, "sum"},
                                         Case{KILN_METRIC_REDUCE_MAX, "max"}, Case{KILN_METRIC_REDUCE_MIN, "min"}),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "_deferred" : "_read_at_once");
    });

// The device path (exercised on the CPU with defer_cpu): a thousand records
// and three metrics cost one read-back at the log point.
TEST(TensorMetrics, ReadsBackOncePerLogPointNotPerRecord) {
  MetricStore store;
  TensorMetrics pending(/*defer_cpu=*/true);
  for (int step = 0; step < 1000; ++step) {
    pending.record("train/loss", at::scalar_tensor(1.0 / (step + 1)), 32, KILN_METRIC_REDUCE_MEAN);
    pending.record("train/acc", at::scalar_tensor(0.5), 32, KILN_METRIC_REDUCE_MEAN);
    pending.record("train/max", at::scalar_tensor(static_cast<double>(step)), 1, KILN_METRIC_REDUCE_MAX);
  }
  EXPECT_EQ(pending.device_reads(), 0);
  pending.flush_into(store);
  EXPECT_EQ(pending.device_reads(), 1);
  const auto reduced = store.reduce();
  EXPECT_DOUBLE_EQ(reduced.at("train/acc"), 0.5);
  EXPECT_DOUBLE_EQ(reduced.at("train/max"), 999.0);
  EXPECT_TRUE(pending.empty());
}

// What records every step records by key: the same metric as its name, and
// the key holds across log points.
TEST(TensorMetrics, AKeyIsItsNameAndOutlivesAFlush) {
  MetricStore store;
  TensorMetrics pending;
  const TensorMetrics::Key loss = pending.key("train/loss");
  pending.record(loss, at::scalar_tensor(1.0), 1, KILN_METRIC_REDUCE_MEAN);
  pending.record("train/loss", at::scalar_tensor(3.0), 1, KILN_METRIC_REDUCE_MEAN);
  EXPECT_FALSE(pending.empty());
  pending.flush_into(store);
  EXPECT_TRUE(pending.empty());
  EXPECT_DOUBLE_EQ(store.reduce().at("train/loss"), 2.0);
  pending.record(loss, at::scalar_tensor(5.0), 1, KILN_METRIC_REDUCE_MEAN);
  pending.flush_into(store);
  EXPECT_DOUBLE_EQ(store.reduce().at("train/loss"), 5.0);
  pending.record(loss, at::scalar_tensor(1.0), 1, KILN_METRIC_REDUCE_MEAN);
  EXPECT_THROW(pending.record(loss, at::scalar_tensor(1.0), 1, KILN_METRIC_REDUCE_MAX), std::invalid_argument)
      << "a reduction is kept per name within an epoch, by key too";
}

// A NaN among the values (a diverged batch): the double path's std::max
// keeps its extreme when a later value is NaN, and stays NaN when the first
// is. The tensor path on a device must do the same, not propagate every NaN
// as at::maximum would.
TEST_P(TensorMetricsTest, NaNValuesReduceAsTheDoublePathDoes) {
  const auto [reduce, defer_cpu] = GetParam();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::vector<double>& values : {std::vector<double>{1.0, nan, 2.0, nan, -1.0},
                                            std::vector<double>{nan, 1.0, 2.0}}) {
    MetricStore doubles, tensors;
    TensorMetrics pending(defer_cpu);
    for (double v : values) {
      doubles.record("m", v, 1, reduce.reduce);
      pending.record("m", at::scalar_tensor(v, at::kDouble), 1, reduce.reduce);
    }
    pending.flush_into(tensors);
    // The pending text carries sum and extreme exactly (%a, "nan" for NaN).
    EXPECT_EQ(tensors.export_pending(), doubles.export_pending()) << reduce.name << " first " << values[0];
  }
}

// A value that cannot be a metric (complex) is refused before anything is
// recorded, on both paths: the metric's weight and count are untouched.
TEST(TensorMetrics, ARefusedValueLeavesNoTrace) {
  for (bool defer_cpu : {false, true}) {
    MetricStore doubles, tensors;
    TensorMetrics pending(defer_cpu);
    doubles.record("m", 2.0, 3, KILN_METRIC_REDUCE_MEAN);
    pending.record("m", at::scalar_tensor(2.0), 3, KILN_METRIC_REDUCE_MEAN);
    EXPECT_THROW(pending.record("m", at::scalar_tensor(c10::complex<double>(1.0, 1.0), at::kComplexDouble), 5, KILN_METRIC_REDUCE_MEAN),
                 std::invalid_argument);
    pending.flush_into(tensors);
    EXPECT_EQ(tensors.export_pending(), doubles.export_pending()) << (defer_cpu ? "deferred" : "read at once");
  }
}

// The value is taken at the call, as log_metric's is: a plugin that reuses
// one float64 tensor in place (a running buffer) does not change what was
// recorded — on the device path too, where nothing is read until the flush.
TEST(TensorMetrics, AValueChangedAfterTheCallKeepsItsRecordedValue) {
  for (bool defer_cpu : {false, true}) {
    MetricStore store;
    TensorMetrics pending(defer_cpu);
    at::Tensor buffer = at::scalar_tensor(3.0, at::kDouble);
    pending.record("hi", buffer, 1, KILN_METRIC_REDUCE_MAX);
    pending.record("mean", buffer, 1, KILN_METRIC_REDUCE_MEAN);
    buffer.fill_(100.0);
    pending.flush_into(store);
    const auto reduced = store.reduce();
    EXPECT_EQ(reduced.at("hi"), 3.0) << (defer_cpu ? "deferred" : "read at once");
    EXPECT_EQ(reduced.at("mean"), 3.0) << (defer_cpu ? "deferred" : "read at once");
  }
}

TEST(TensorMetrics, RefusesWhatTheDoublePathRefuses) {
  TensorMetrics pending;
  EXPECT_THROW(pending.record("m", at::ones({2}), 1, KILN_METRIC_REDUCE_MEAN), std::invalid_argument);
  pending.record("m", at::scalar_tensor(1.0), 1, KILN_METRIC_REDUCE_MEAN);
  EXPECT_THROW(pending.record("m", at::scalar_tensor(1.0), 1, KILN_METRIC_REDUCE_MAX), std::invalid_argument);
  // A name recorded with another reduction through the double path is named at the log point.
  MetricStore store;
  store.record("m", 1.0, 1, KILN_METRIC_REDUCE_SUM);
  EXPECT_THROW(pending.flush_into(store), std::invalid_argument);
}

// A checkpoint inside an epoch reads the pending values without flushing
// them; restored into a fresh run, the epoch's sums continue in the same
// order, so the epoch reduces to the same bits as one never interrupted.
// Rank-zero-only metrics and their flags survive too.
TEST(MetricState, ACheckpointedEpochReducesToTheSameBitsAsAnUninterruptedOne) {
  for (const bool defer_cpu : {false, true}) {
    // Sums whose rounding depends on where they are cut: a flush at the
    // checkpoint (after 3) would change the last bits.
    const double values[] = {1e-9, 1.0 / 3, 1e8, 0.1, 1e8, 1.0 / 3, 1.0 / 3, 1e8};
    auto record = [&](TensorMetrics& t, MetricStore& s, int i) {
      t.record("train/loss", at::scalar_tensor(values[i], at::kFloat), 3.0, KILN_METRIC_REDUCE_MEAN);
      t.record("peak", at::scalar_tensor(values[i], at::kDouble), 1.0, KILN_METRIC_REDUCE_MAX);
      s.record("acc", values[i] / 3, 7.0, KILN_METRIC_REDUCE_MEAN);
      s.record("seen", 1.0, 1.0, KILN_METRIC_REDUCE_SUM | KILN_METRIC_RANK_ZERO_ONLY);
    };
    TensorMetrics straight_t(defer_cpu);
    MetricStore straight;
    for (int i = 0; i < 8; ++i) record(straight_t, straight, i);
    straight_t.flush_into(straight);
    const auto expected = straight.reduce();

    TensorMetrics first_t(defer_cpu);
    MetricStore first;
    for (int i = 0; i < 3; ++i) record(first_t, first, i);
    const std::string tensors = first_t.export_state(), store = first.export_state();
    EXPECT_FALSE(first_t.empty()) << "export_state must not flush";

    TensorMetrics resumed_t(defer_cpu);
    MetricStore resumed;
    resumed_t.key("train/loss");
    resumed_t.import_state(tensors, c10::Device(c10::kCPU));
    resumed.add_state(store);
    for (int i = 3; i < 8; ++i) record(resumed_t, resumed, i);
    resumed_t.flush_into(resumed);
    const auto got = resumed.reduce();
    ASSERT_EQ(got.size(), expected.size());
    for (const auto& [name, value] : expected) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(std::memcmp(&got.at(name), &value, sizeof value), 0)
          << name << ": " << got.at(name) << " vs " << value << (defer_cpu ? " (deferred)" : "");
    }
    EXPECT_EQ(got.at("seen"), 8.0);
  }
}

TEST(MetricState, StatesOfSeveralRanksMergeAsTheDistributedReductionDoes) {
  MetricStore a, b;
  a.record("loss", 1.0, 2.0, KILN_METRIC_REDUCE_MEAN);
  b.record("loss", 4.0, 1.0, KILN_METRIC_REDUCE_MEAN);
  b.record("top", 9.0, 1.0, KILN_METRIC_REDUCE_MAX);
  MetricStore merged;
  merged.add_state(a.export_state());
  merged.add_state(b.export_state());
  const auto out = merged.reduce();
  EXPECT_DOUBLE_EQ(out.at("loss"), 2.0);
  EXPECT_EQ(out.at("top"), 9.0);
  MetricStore bad;
  EXPECT_THROW(bad.add_state("x y z\n"), std::invalid_argument);
  TensorMetrics bad_t;
  EXPECT_THROW(bad_t.import_state("1 0 nonsense\n", c10::Device(c10::kCPU)), std::invalid_argument);
}

}  // namespace
}  // namespace kiln
