#include "util/process_info.hpp"

#include <filesystem>
#include <fstream>
#include <set>

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

}  // namespace kiln
