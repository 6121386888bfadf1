// train/profiler: phases take their own time (nested ones subtracted), so
// the table's rows and "other" add up to the fit; the trace nests.
#include <gtest/gtest.h>

#include <thread>

#include "train/profiler.hpp"

namespace kiln {
namespace {

void busy(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(Profiler, NestedPhasesCountOnceAndTheTableAddsUp) {
  Profiler p(ProfilerKind::trace, 0);
  p.begin_fit();
  {
    ProfileScope v(&p, Phase::validation);
    busy(std::chrono::milliseconds(20));
    ProfileScope c(&p, Phase::callbacks);
    busy(std::chrono::milliseconds(10));
  }
  {
    ProfileScope b(&p, Phase::backward);
    busy(std::chrono::milliseconds(10));
    p.carve(Phase::allreduce_wait, 0.004, 3);
  }
  p.end_fit();
  const Profiler::Totals& t = p.totals();
  auto self = [&](Phase ph) { return t.self_s[static_cast<size_t>(ph)]; };
  EXPECT_NEAR(self(Phase::callbacks), 0.010, 0.005);
  EXPECT_GE(self(Phase::validation), 0.019) << "its own 20 ms, without the nested callbacks";
  EXPECT_LT(self(Phase::validation), 0.028);
  EXPECT_DOUBLE_EQ(self(Phase::allreduce_wait), 0.004);
  EXPECT_EQ(t.count[static_cast<size_t>(Phase::allreduce_wait)], 3);
  EXPECT_NEAR(self(Phase::backward), 0.006, 0.004);
  double sum = 0;
  for (double s : t.self_s) sum += s;
  EXPECT_LE(sum, t.wall_s);
  EXPECT_GT(sum, 0.9 * t.wall_s);

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
