#include "ckpt/checkpoint_dir.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>

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

namespace {

// `spec` ("last" or "best") to one valid file of `dir`, checksum verified;
// nullopt when `dir` holds no valid checkpoint. `refused` names the last
// file that failed its checksum, if any.
std::optional<CheckpointInfo> choose_checkpoint(const std::string& spec, const std::filesystem::path& dir,
                                                const RetentionPolicy& policy, std::string& refused,
                                                const std::string& option = "--resume") {
  std::vector<CheckpointInfo> candidates = scan_checkpoints(
      dir, [&](const CheckpointError& e) { spdlog::warn("{} {}: skipping {}", option, spec, e.what()); });
  // The listing did not read the tensor data. The choice is verified whole;
  // one that fails is dropped and the choice made again, which picks the same
  // file a listing that verified every checksum would have picked.
  while (true) {
    const auto chosen = spec == "best" ? pick_best(candidates, policy) : pick_last(candidates);
    if (!chosen) return std::nullopt;
    if (auto problem = CheckpointFile::check(chosen->path)) {
      spdlog::warn("{} {}: skipping {}", option, spec, *problem);
      refused = *problem;
      candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                      [&](const CheckpointInfo& c) { return c.path == chosen->path; }),
                       candidates.end());
      continue;
    }
    if (spec != "best" && !chosen->is_last)
      spdlog::warn("{} {}: last.ckpt is missing or invalid; using {}", option, spec, chosen->path.string());
    return *chosen;
  }
}

}  // namespace

std::filesystem::path resolve_resume(const std::string& spec, const std::filesystem::path& dir,
                                     const RetentionPolicy& policy, const std::string& option) {
  if (spec != "last" && spec != "best") {
    if (auto problem = CheckpointFile::check(spec)) throw InputError(option + ": " + *problem);
    return spec;
  }
  std::string refused;
  const auto chosen = choose_checkpoint(spec, dir, policy, refused, option);
  if (!chosen)
    throw InputError(option + " " + spec + ": no valid checkpoint in " + dir.string() +
                     (refused.empty() ? "" : " (the last one tried: " + refused + ")"));
  return chosen->path;
}

std::optional<CheckpointInfo> newest_checkpoint(const std::filesystem::path& dir, const RetentionPolicy& policy) {
  std::string refused;
  auto chosen = choose_checkpoint("auto", dir, policy, refused);
  // Checkpoints that all fail their checksum are not "none": starting over
  // would train from scratch beside them and prune them. The user decides.
  if (!chosen && !refused.empty())
    throw InputError("--resume auto: " + dir.string() + " holds checkpoints but none is valid (the last one tried: " +
                     refused + "); remove them, or name one with --resume PATH");
  // last.ckpt is a second name of a ranked file: the log names that one.
  if (chosen && chosen->is_last) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() == ".ckpt" && name != "last.ckpt" && name.front() != '.' &&
          std::filesystem::equivalent(entry.path(), chosen->path, ec)) {
        chosen->path = entry.path();
        chosen->is_last = false;
        break;
      }
    }
  }
  return chosen;
}

void link_checkpoint(const std::filesystem::path& existing, const std::filesystem::path& final) {
  link_durably(existing, final);
}

void CheckpointDirectory::open() {
  std::filesystem::create_directories(dir_);
  for (const auto& removed : sweep_temporaries(dir_))
    spdlog::warn("removed {} left by an interrupted checkpoint write", removed.string());
  ranked_ = ranked_only(scan_checkpoints(dir_, [](const CheckpointError& e) { spdlog::warn("ignoring {}", e.what()); }));
}

void CheckpointDirectory::add_ranked(CheckpointInfo committed) {
  forget(committed.path);
  ranked_.push_back(std::move(committed));
}

void CheckpointDirectory::prune(const RetentionPolicy& policy) {
  for (const auto& old : to_delete(ranked_, policy)) {
    std::error_code ec;
    std::filesystem::remove(old, ec);
    forget(old);
  }
}

void CheckpointDirectory::forget(const std::filesystem::path& path) {
  ranked_.erase(std::remove_if(ranked_.begin(), ranked_.end(), [&](const CheckpointInfo& i) { return i.path == path; }),
                ranked_.end());
}

// ============================================================================
// Sweeping temporaries
// ============================================================================

namespace {

// The pid in ".<anything>.tmp-<pid>", or nothing if `name` is not such a
// name (or the pid is not a plausible positive pid).
std::optional<pid_t> temporary_pid(const std::string& name) {
  static constexpr std::string_view kTag = ".tmp-";
  if (name.size() < 2 || name[0] != '.') return std::nullopt;
  const size_t tag = name.rfind(kTag);
  // tag >= 2: the "<anything>" between the leading dot and the tag is
  // not empty, as it never is for a file this writer creates.
  if (tag == std::string::npos || tag < 2) return std::nullopt;
  const std::string_view digits = std::string_view(name).substr(tag + kTag.size());
  if (digits.empty() || digits.size() > 9) return std::nullopt;  // pid_max is at most 2^22
  pid_t pid = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    pid = pid * 10 + (c - '0');
  }
  // 0 would make kill() address our whole process group.
  if (pid <= 0) return std::nullopt;
  return pid;
}

}  // namespace

std::vector<std::filesystem::path> sweep_temporaries(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return removed;
    throw std::runtime_error("cannot sweep checkpoint temporaries in " + dir.string() + ": " + ec.message());
  }
  const pid_t self = ::getpid();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& path = it->path();
    const std::optional<pid_t> pid = temporary_pid(path.filename().string());
    if (!pid) continue;
    // Only plain files: the writer never creates anything else, and a
    // directory or symlink of that name is somebody else's business.
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || it->is_symlink(type_ec)) continue;
    // Our own pid: a writer of this process that died with an exception
    // mid-way cannot have left one (its destructor removes it), so this is a
    // leftover of an earlier process that had the same pid. The caller sweeps
    // at start-up, before any writer of this process exists.
    // Another pid: removed only when no such process exists (ESRCH); EPERM
    // means it lives under another user and may still be writing.
    const bool dead = *pid == self || (::kill(*pid, 0) != 0 && errno == ESRCH);
    if (!dead) continue;
    if (::unlink(path.c_str()) != 0) {
      const int err = errno;
      if (err == ENOENT) continue;  // swept concurrently by someone else
      throw std::runtime_error("cannot remove stale checkpoint temporary " + path.string() + ": " +
                               error_text(err));
    }
    removed.push_back(path);
  }
  if (ec)
    throw std::runtime_error("cannot sweep checkpoint temporaries in " + dir.string() + ": " + ec.message());
  return removed;
}

}  // namespace kiln
