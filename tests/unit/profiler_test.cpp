// profiling/profiler: phases take their own time (nested ones subtracted), so
// the table's rows and "other" add up to the fit; the trace nests.
#include <gtest/gtest.h>

#include <thread>

#include "profiling/profiler.hpp"

namespace kiln {
namespace {

void busy(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Timings on a loaded machine only grow: each phase is checked against the
// busy time it holds (a lower bound) and the span the test measured around
// it (an upper bound), never against a fixed figure.
TEST(Profiler, NestedPhasesCountOnceAndTheTableAddsUp) {
  using Clock = Profiler::Clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  Profiler p(ProfilerKind::trace, 0);
  p.begin_fit();
  const auto v0 = Clock::now();
  Clock::time_point c0, c1;
  {
    ProfileScope v(&p, Phase::validation);
    busy(std::chrono::milliseconds(20));
    c0 = Clock::now();
    {
      ProfileScope c(&p, Phase::callbacks);
      busy(std::chrono::milliseconds(10));
    }
    c1 = Clock::now();
  }
  const auto v1 = Clock::now();
  const auto b0 = Clock::now();
  {
    ProfileScope b(&p, Phase::backward);
    busy(std::chrono::milliseconds(10));
    p.carve(Phase::allreduce_wait, 0.004, 3);
  }
  const auto b1 = Clock::now();
  p.end_fit();
  const Profiler::Totals& t = p.totals();
  auto self = [&](Phase ph) { return t.self_s[static_cast<size_t>(ph)]; };
  EXPECT_GE(self(Phase::callbacks), 0.010);
  EXPECT_LE(self(Phase::callbacks), seconds(c0, c1));
  // Validation's own time: its 20 ms, without the nested callbacks' (counted
  // in both, the two would exceed the span they lie in by the callbacks' 10 ms).
  EXPECT_GE(self(Phase::validation), 0.020);
  EXPECT_LE(self(Phase::validation) + self(Phase::callbacks), seconds(v0, v1));
  EXPECT_DOUBLE_EQ(self(Phase::allreduce_wait), 0.004);
  EXPECT_EQ(t.count[static_cast<size_t>(Phase::allreduce_wait)], 3);
  // The carved 4 ms leave backward's own time.
  EXPECT_GE(self(Phase::backward), 0.010 - 0.004);
  EXPECT_LE(self(Phase::backward) + 0.004, seconds(b0, b1));
  double sum = 0;
  for (double s : t.self_s) sum += s;
  EXPECT_LE(sum, t.wall_s) << "the phases lie inside the fit, each counted once";
  EXPECT_GE(sum, 0.040) << "the 40 ms of busy time inside phases";

  // Round trip of the totals, and the table of two ranks names the slowest.
  Profiler::Totals other = Profiler::parse_totals(p.export_totals());
  EXPECT_EQ(other.wall_s, t.wall_s);
  other.wall_s += 1.0;
  const std::string table = Profiler::table({t, other});
  EXPECT_NE(table.find("on rank 1, the slowest of 2"), std::string::npos) << table;
  EXPECT_NE(table.find("gradient all-reduce wait"), std::string::npos) << table;
  EXPECT_EQ(table.find("host-to-device"), std::string::npos) << "phases that never ran are left out\n" << table;

  const std::string json = p.trace_json();
  EXPECT_NE(json.find("\"name\": \"fit\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"callbacks\""), std::string::npos);
}

TEST(Profiler, WorkersGetTracksOfTheirOwn) {
  Profiler p(ProfilerKind::trace, 3);
  std::thread worker([&p] {
    const auto start = Profiler::Clock::now();
    busy(std::chrono::milliseconds(1));
    p.worker_event("get_batch", start, Profiler::Clock::now());
  });
  worker.join();
  const std::string json = p.trace_json();
  EXPECT_NE(json.find("\"name\": \"data worker 1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\": \"get_batch\", \"cat\": \"kiln\", \"ph\": \"X\", \"pid\": 3, \"tid\": 1"),
            std::string::npos)
      << json;
  Profiler simple(ProfilerKind::simple, 0);
  simple.worker_event("get_batch", Profiler::Clock::now(), Profiler::Clock::now());
  EXPECT_EQ(simple.trace_json().find("get_batch"), std::string::npos) << "simple keeps no events";
}

}  // namespace
}  // namespace kiln
