#include "train/run/profile_report.hpp"

#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "distributed/process_group.hpp"
#include "profiling/profiler.hpp"

namespace kiln {

void report_profile(const Profiler& profiler, ProcessGroup* group, const std::filesystem::path& run_dir,
                    int32_t rank) {
  std::vector<std::string> texts{profiler.export_totals()};
  if (group) texts = group->all_gather_text(texts[0]);
  if (profiler.tracing()) {
    profiler.write_trace(run_dir);
    if (rank == 0)
      spdlog::info("profiler: each rank's trace is {}/trace.rank<N>.json (open it in Perfetto or chrome://tracing)",
                   run_dir.string());
  }
  if (rank != 0) return;
  std::vector<Profiler::Totals> totals;
  for (const std::string& text : texts) totals.push_back(Profiler::parse_totals(text));
  spdlog::info("{}", Profiler::table(totals));
}

void write_failed_trace(Profiler& profiler, const std::filesystem::path& run_dir, int32_t rank) noexcept {
  try {
    profiler.end_fit();
    const auto file = profiler.write_trace(run_dir);
    spdlog::info("profiler: the fit failed; rank {}'s trace up to the failure is {}", rank, file.string());
  } catch (const std::exception& e) {
    spdlog::warn("profiler: rank {}'s trace up to the failure could not be written: {}", rank, e.what());
  }
}

}  // namespace kiln
