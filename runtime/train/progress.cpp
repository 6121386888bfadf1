#include "train/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace kiln {

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 3600) return fmt::format("{:02d}:{:02d}", s / 60, s % 60);
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

Progress::Mode Progress::mode_from(ProgressMode setting) {
  switch (setting) {
    case ProgressMode::bar: return Mode::bar;
    case ProgressMode::lines: return Mode::lines;
    case ProgressMode::none: return Mode::none;
    case ProgressMode::automatic: break;
  }
  return isatty(STDERR_FILENO) ? Mode::bar : Mode::lines;
}

Progress::Progress(Mode mode, int64_t log_every_n_steps, Clock clock)
    : mode_(mode), every_(log_every_n_steps), clock_(std::move(clock)) {}

void Progress::begin(const std::string& label, int64_t total_batches, FitPlace fit) {
  label_ = label;
  total_ = total_batches;
  first_ = -1;
  done_in_epoch_ = 0;
  fit_ = fit;
  start_ = last_draw_ = clock_();
  if (fit.epoch >= 0 && !fit_started_) {
    fit_started_ = true;
    fit_start_ = start_;
  }
  drawn_ = false;
}

// "[elapsed<left]" for the epoch, then the fit's when this is a fit's epoch
// with a known last epoch. Left = the time per batch so far times the
// batches to go (the fit's: this epoch's rest, then every later epoch's,
// each as long as this one).
std::string Progress::times(std::chrono::steady_clock::time_point now, int64_t done) {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t stepped = done_in_epoch_;
  const double per_batch = stepped > 0 ? elapsed / static_cast<double>(stepped) : NAN;
  std::string out = "[" + clock_text(elapsed) + "<" + clock_text(per_batch * static_cast<double>(total_ - done)) + "]";
  if (fit_.epoch >= 0 && fit_started_) {
    const double fit_elapsed = std::chrono::duration<double>(now - fit_start_).count();
    const int64_t fit_done = fit_batches_ + stepped;
    const double fit_per_batch = fit_done > 0 ? fit_elapsed / static_cast<double>(fit_done) : NAN;
    const double left = fit_.last_epoch >= fit_.epoch
                            ? fit_per_batch * static_cast<double>((total_ - done) + (fit_.last_epoch - fit_.epoch) * total_)
                            : NAN;
    out += " fit [" + clock_text(fit_elapsed) + "<" + clock_text(left) + "]";
  }
  return out;
}

void Progress::step(int64_t batch_index, const std::function<double()>& loss) {
  const int64_t done = batch_index + 1;
  if (first_ < 0) first_ = batch_index;
  done_in_epoch_ = done - first_;
  if (mode_ == Mode::lines) {
    if (every_ > 0 && (done % every_ == 0 || done == total_)) {
      last_times_ = times(clock_(), done);
      if (!loss)
        spdlog::info("{} batch {}/{} {}", label_, done, total_, last_times_);
      else
        spdlog::info("{} batch {}/{} loss {:.4f} {}", label_, done, total_, loss(), last_times_);
    }
    return;
  }
  if (mode_ != Mode::bar) return;
  const auto now = clock_();
  // Redraw at most 10 times a second: a terminal write per step would cost
  // more than a small model's step.
  if (done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int width = 30;
  const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  const std::string loss_text = loss ? fmt::format(" loss {:.4f}", loss()) : "";
  last_times_ = times(now, done);
  std::fprintf(stderr, "\r%s [%s] %lld/%lld%s %.1f it/s %s ", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), loss_text.c_str(),
               elapsed > 0 ? static_cast<double>(done_in_epoch_) / elapsed : 0.0, last_times_.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::end() {
  if (drawn_) std::fputs("\n", stderr);
  drawn_ = false;
  if (fit_.epoch >= 0) fit_batches_ += done_in_epoch_;
  fit_ = {};
}

}  // namespace kiln
