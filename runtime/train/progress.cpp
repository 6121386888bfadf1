#include "train/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace kiln {

Progress::Mode Progress::mode_from(ProgressMode setting) {
  switch (setting) {
    case ProgressMode::bar: return Mode::bar;
    case ProgressMode::lines: return Mode::lines;
    case ProgressMode::none: return Mode::none;
    case ProgressMode::automatic: break;
  }
  return isatty(STDERR_FILENO) ? Mode::bar : Mode::lines;
}

Progress::Progress(Mode mode, int64_t log_every_n_steps) : mode_(mode), every_(log_every_n_steps) {}

void Progress::begin(const std::string& label, int64_t total_batches) {
  label_ = label;
  total_ = total_batches;
  start_ = last_draw_ = std::chrono::steady_clock::now();
  drawn_ = false;
}

void Progress::step(int64_t batch_index, const std::function<double()>& loss) {
  const int64_t done = batch_index + 1;
  if (mode_ == Mode::lines) {
    if (every_ > 0 && (done % every_ == 0 || done == total_)) {
      if (!loss)
        spdlog::info("{} batch {}/{}", label_, done, total_);
      else
        spdlog::info("{} batch {}/{} loss {:.4f}", label_, done, total_, loss());
    }
    return;
  }
  if (mode_ != Mode::bar) return;
  const auto now = std::chrono::steady_clock::now();
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
  std::fprintf(stderr, "\r%s [%s] %lld/%lld%s %.1f it/s ", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total_), loss_text.c_str(),
               elapsed > 0 ? done / elapsed : 0.0);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::end() {
  if (drawn_) std::fputs("\n", stderr);
  drawn_ = false;
}

}  // namespace kiln
