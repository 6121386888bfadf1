#include "metrics/tensorboard_logger.hpp"

#include "config/logger_registry.hpp"

#include <chrono>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "metrics/logger_state.hpp"
#include "metrics/tfevents.hpp"

namespace kiln {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

void TensorBoardLogger::open(const std::string& state) {
  file_.emplace(path_, state.empty() ? -1 : parse_length_state(state, "tensorboard"));
  if (!file_->continued_whole())
    spdlog::warn("{} is shorter than the checkpoint recorded; events from before the checkpoint are missing from it",
                 path_.string());
  // Every event file starts with its version: TensorBoard reads the format
  // (and its restart rules) from it.
  if (file_->size() == 0) {
    file_->append(tfrecord(file_version_event(wall_time())));
    if (hparams_) file_->append(tfrecord(hparams_start_event(wall_time(), *hparams_, start_time_)));
  }
}

void TensorBoardLogger::set_hparams(const std::vector<HParam>& hparams) {
  hparams_ = hparams;
  start_time_ = wall_time();
}

void TensorBoardLogger::finish(const RunEnd& end) {
  const bool success = end.success();
  if (!file_ || !hparams_) return;
  const double now = wall_time();
  file_->append(tfrecord(hparams_end_event(now, last_step_, success, now)));
  file_->sync();
}

void TensorBoardLogger::log(const LogRow& row) {
  if (!file_) return;
  std::vector<std::pair<std::string, float>> scalars;
  scalars.reserve(row.metrics.size() + 1);
  for (const auto& [name, value] : row.metrics) scalars.emplace_back(name, static_cast<float>(value));
  // Once per step: the row test_after_fit logs shares the last epoch row's step.
  if (row.kind == LogRow::Kind::epoch && row.step != epoch_written_at_) {
    scalars.emplace_back("epoch", static_cast<float>(row.epoch));
    epoch_written_at_ = row.step;
  }
  file_->append(tfrecord(scalars_event(wall_time(), row.step, scalars)));
  last_step_ = row.step;
}

void TensorBoardLogger::flush() {
  if (file_) file_->sync();
}

std::string TensorBoardLogger::state() {
  if (!file_) return "";
  file_->sync();
  return std::to_string(file_->size());
}

std::unique_ptr<Logger> make_tensorboard_logger(const LoggerContext& context) {
  auto logger = std::make_unique<TensorBoardLogger>(context.run_dir);
  if (context.hparams) logger->set_hparams(*context.hparams);
  return logger;
}

}  // namespace kiln
