#include "ckpt/background_commit.hpp"

#include <exception>
#include <stdexcept>
#include <utility>

namespace kiln {

BackgroundCommit::~BackgroundCommit() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundCommit::start(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_) throw std::logic_error("BackgroundCommit::start while a commit is pending");
    running_ = pending_ = true;
    failure_.clear();
  }
  if (thread_.joinable()) thread_.join();  // ended: its outcome was taken
  thread_ = std::thread([this, work = std::move(work)]() mutable {
    std::string failure;
    try {
      work();
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "unknown error";
    } catch (...) {
      failure = "unknown error";
    }
    // What the work holds (a snapshot the size of the state) is freed before
    // anyone learns it ended: the next snapshot never coexists with it.
    work = nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = std::move(failure);
    running_ = false;
    done_cv_.notify_all();
  });
}

bool BackgroundCommit::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_;
}

std::optional<std::string> BackgroundCommit::take_locked() {
  pending_ = false;
  if (failure_.empty()) return std::nullopt;
  return std::exchange(failure_, {});
}

std::optional<std::string> BackgroundCommit::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pending_ || running_) return std::nullopt;
  return take_locked();
}

std::optional<std::string> BackgroundCommit::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return !running_; });
  if (!pending_) return std::nullopt;
  return take_locked();
}

}  // namespace kiln
