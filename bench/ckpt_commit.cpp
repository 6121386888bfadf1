// Committing a checkpoint versus writing the same bytes raw.
//
//   bench_ckpt_commit [megabytes] [rounds] [dir]
//
// (a) kiln: CheckpointWriter — sections streamed to a temporary in the final
//     directory with an XXH64 checksum, fsync, rename, directory fsync;
// (b) raw: open, write the same tensors' bytes, fsync, close.
// Alternates the two, prints the median of each and the ratio.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "ckpt/checkpoint_writer.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t megabytes = argc > 1 ? std::stoll(argv[1]) : 100;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 7;
  const std::filesystem::path dir = argc > 3 ? argv[3] : std::filesystem::temp_directory_path() / "kiln-bench-ckpt";
  std::filesystem::create_directories(dir);

  // A model-like state: tensors of 1-4 MiB summing to `megabytes`.
  std::vector<at::Tensor> tensors;
  int64_t bytes = 0;
  for (int i = 0; bytes < megabytes * (1 << 20); ++i) {
    tensors.push_back(at::randn({(1 + i % 4) << 18}));
    bytes += tensors.back().numel() * 4;
  }
  std::printf("state: %zu tensors, %.1f MB, in %s\n", tensors.size(), bytes / 1e6, dir.c_str());

  std::vector<double> kiln_times, raw_times;
  for (int r = 0; r < rounds; ++r) {
    {
      const auto start = std::chrono::steady_clock::now();
      kiln::CheckpointWriter writer(dir / "state.ckpt");
      for (size_t i = 0; i < tensors.size(); ++i)
        writer.add("param/" + std::to_string(i), "Float " + std::to_string(tensors[i].numel()) + "\n",
                   tensors[i].data_ptr(), tensors[i].numel() * 4);
      writer.commit();
      kiln_times.push_back(seconds_since(start));
    }
    {
      const auto start = std::chrono::steady_clock::now();
      const int fd = ::open((dir / "raw.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      for (const auto& t : tensors) {
        const char* p = static_cast<const char*>(t.data_ptr());
        size_t left = t.numel() * 4;
        while (left > 0) {
          const ssize_t n = ::write(fd, p, left);
          if (n <= 0) return 1;
          p += n;
          left -= static_cast<size_t>(n);
        }
      }
      ::fsync(fd);
      ::close(fd);
      raw_times.push_back(seconds_since(start));
    }
  }
  const double k = median(kiln_times), w = median(raw_times);
  std::printf("commit %.3f s, raw write+fsync %.3f s (medians of %d), ratio %.3f\n", k, w, rounds, k / w);
  std::filesystem::remove(dir / "state.ckpt");
  std::filesystem::remove(dir / "raw.bin");
  return 0;
}
