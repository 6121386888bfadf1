// What [profiler] leaves of a fit: each rank's trace in the run directory
// and, on rank 0, the table of every rank's totals; of a fit that failed,
// this rank's trace up to the failure.
#pragma once

#include <cstdint>
#include <filesystem>

namespace kiln {

class ProcessGroup;
class Profiler;

// After a fit. Every rank calls it (the totals are gathered over `group`;
// null in one process).
void report_profile(const Profiler& profiler, ProcessGroup* group, const std::filesystem::path& run_dir,
                    int32_t rank);

// No table, which would need every rank: where the time went before the
// failure is what one looks for. Never an error of its own over the
// failure's.
void write_failed_trace(Profiler& profiler, const std::filesystem::path& run_dir, int32_t rank) noexcept;

}  // namespace kiln
