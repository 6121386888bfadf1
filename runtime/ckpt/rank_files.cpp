#include "ckpt/rank_files.hpp"

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "ckpt/checkpoint_dir.hpp"
#include "ckpt/checkpoint_meta.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFailed = ".failed";

// "<prefix>" of a rank file's name "<prefix>.rank<r>-of-<W>[.failed]", or "".
std::string prefix_of(const std::string& name) {
  const size_t at = name.rfind(".rank");
  return at == std::string::npos ? std::string() : name.substr(0, at);
}

std::string seconds_text(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}

}  // namespace

fs::path rank_files_dir(const fs::path& checkpoint_dir) { return checkpoint_dir / "shards"; }

std::string rank_files_prefix(const fs::path& checkpoint_file, uint64_t nonce) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(nonce));
  return checkpoint_file.filename().string() + "." + hex;
}

fs::path rank_file_path(const fs::path& checkpoint_dir, const std::string& prefix, int rank, int world) {
  return rank_files_dir(checkpoint_dir) / (prefix + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world));
}

void report_rank_file_failure(const fs::path& rank_file, const std::string& cause) {
  std::ofstream out(rank_file.string() + kFailed, std::ios::trunc);
  out << cause;
}

void await_rank_files(const fs::path& checkpoint_dir, const std::string& prefix, int world,
                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < world; ++r) {
    const fs::path file = rank_file_path(checkpoint_dir, prefix, r, world);
    for (auto pause = std::chrono::microseconds(200);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
      std::error_code ec;
      if (fs::exists(file, ec)) break;
      if (fs::exists(file.string() + kFailed, ec)) {
        std::ifstream in(file.string() + kFailed);
        std::stringstream cause;
        cause << in.rdbuf();
        throw std::runtime_error("rank " + std::to_string(r) + " could not write its part " + file.string() + ": " +
                                 cause.str());
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw std::runtime_error("rank " + std::to_string(r) + " did not write its part " + file.string() +
                                 " within " + seconds_text(timeout) +
                                 " (distributed.timeout_s; it failed or stopped responding)");
      std::this_thread::sleep_for(pause);
    }
  }
}

std::vector<CheckpointFile> read_rank_files(const CheckpointFile& checkpoint) {
  const CheckpointMeta meta = read_meta(checkpoint);
  std::vector<CheckpointFile> out;
  if (meta.rank_files.prefix.empty()) return out;
  if (meta.rank_files.world <= 0 || meta.rank_files.prefix.find('/') != std::string::npos)
    throw CheckpointError(checkpoint.path().string() + ": its metadata names rank files it cannot have (" +
                          shown(meta.rank_files.prefix) + ")");
  const fs::path dir = checkpoint.path().parent_path();
  for (int64_t r = 0; r < meta.rank_files.world; ++r) {
    const fs::path file = rank_file_path(dir, meta.rank_files.prefix, static_cast<int>(r),
                                         static_cast<int>(meta.rank_files.world));
    std::error_code ec;
    if (!fs::exists(file, ec))
      throw CheckpointError(checkpoint.path().string() + ": rank " + std::to_string(r) + "'s part " + file.string() +
                            " is missing (a checkpoint's shards/ files go with it when it is copied)");
    out.push_back(CheckpointFile::read(file));
  }
  return out;
}

int remove_unnamed_rank_files(const fs::path& checkpoint_dir) {
  const fs::path dir = rank_files_dir(checkpoint_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  sweep_temporaries(dir);
  std::set<std::string> named;
  for (const auto& info : scan_checkpoints(checkpoint_dir, {})) {
    try {
      named.insert(read_meta(read_checkpoint_head(info.path)).rank_files.prefix);
    } catch (const CheckpointError&) {
      // Not a checkpoint that can be loaded: it names nothing.
    }
  }
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.front() == '.') continue;  // a temporary still being written
    const std::string prefix = prefix_of(name);
    if (!prefix.empty() && named.count(prefix)) continue;
    if (fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace kiln
