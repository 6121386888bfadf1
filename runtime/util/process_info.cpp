#include "util/process_info.hpp"

#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace kiln {

std::string mapped_blas() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> found;
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::filesystem::path path = line.substr(slash);
    const std::string name = path.filename().string();
    if (name.find("blas") == std::string::npos && name.find("mkl") == std::string::npos) continue;
    if (name.rfind("libcublas", 0) == 0) continue;  // the GPU's BLAS, mapped by a CUDA LibTorch on any device
    // The full path: Debian's alternatives map libblas.so.3 from a directory
    // that names the implementation (openblas-openmp/, blas/ for Netlib).
    found.insert(path.string());
  }
  // PyPI's wheels link MKL into libtorch_cpu: nothing of its own to map.
  if (found.empty()) return "none mapped (linked into LibTorch)";
  std::string out;
  for (const auto& name : found) out += (out.empty() ? "" : ", ") + name;
  return out;
}

double seconds_since_start() {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat;
  std::getline(stat_file, stat);
  // Field 2 is the command in parentheses and may itself hold spaces and
  // parentheses: count fields from the last ')'. starttime is field 22.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return NAN;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i < 22 && fields >> field; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return NAN;
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  timespec now{};
  // starttime counts from boot, suspended time included: CLOCK_BOOTTIME.
  if (ticks_per_second <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return NAN;
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
         static_cast<double>(start_ticks) / static_cast<double>(ticks_per_second);
}

int64_t peak_resident_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) {
      long long kib = -1;
      if (std::sscanf(line.c_str() + 6, "%lld", &kib) != 1) return -1;
      return static_cast<int64_t>(kib / 1024);
    }
  return -1;
}

}  // namespace kiln
