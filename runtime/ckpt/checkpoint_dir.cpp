#include "ckpt/checkpoint_dir.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "ckpt/checkpoint_meta.hpp"
#include "util/durable_file.hpp"
#include "util/errors.hpp"

namespace kiln {

std::vector<CheckpointInfo> scan_checkpoints(const std::filesystem::path& dir,
                                             const std::function<void(const CheckpointError&)>& skipped) {
  std::vector<CheckpointInfo> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".ckpt" || name.front() == '.') continue;
    // The header, metadata and trailer only: see the header for why.
    CheckpointMeta meta;
    try {
      meta = read_meta(read_checkpoint_head(entry.path()));
    } catch (const CheckpointError& e) {
      if (skipped) skipped(e);
      continue;
    }
    found.push_back(CheckpointInfo{entry.path(), meta.position.epoch, meta.position.global_step, meta.monitored,
                                   name == "last.ckpt"});
  }
  return found;
}

std::vector<CheckpointInfo> ranked_only(std::vector<CheckpointInfo> all) {
  std::vector<CheckpointInfo> out;
  for (auto& info : all)
    if (!info.is_last && info.path.filename().string().rfind("epoch=", 0) == 0) out.push_back(std::move(info));
  return out;
}

std::filesystem::path resolve_resume(const std::string& spec, const std::filesystem::path& dir,
                                     const RetentionPolicy& policy) {
  if (spec != "last" && spec != "best") {
    if (auto problem = CheckpointFile::check(spec)) throw InputError("--resume: " + *problem);
    return spec;
  }
  std::vector<CheckpointInfo> candidates = scan_checkpoints(
      dir, [&](const CheckpointError& e) { spdlog::warn("--resume {}: skipping {}", spec, e.what()); });
  // The listing did not read the tensor data. The choice is verified whole;
  // one that fails is dropped and the choice made again, which picks the same
  // file a listing that verified every checksum would have picked.
  std::string refused;
  while (true) {
    const auto chosen = spec == "last" ? pick_last(candidates) : pick_best(candidates, policy);
    if (!chosen)
      throw InputError("--resume " + spec + ": no valid checkpoint in " + dir.string() +
                       (refused.empty() ? "" : " (the last one tried: " + refused + ")"));
    if (auto problem = CheckpointFile::check(chosen->path)) {
      spdlog::warn("--resume {}: skipping {}", spec, *problem);
      refused = *problem;
      candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                      [&](const CheckpointInfo& c) { return c.path == chosen->path; }),
                       candidates.end());
      continue;
    }
    if (spec == "last" && !chosen->is_last)
      spdlog::warn("--resume last: last.ckpt is missing or invalid; using {}", chosen->path.string());
    return chosen->path;
  }
}

void link_checkpoint(const std::filesystem::path& existing, const std::filesystem::path& final) {
  link_durably(existing, final);
}

}  // namespace kiln
