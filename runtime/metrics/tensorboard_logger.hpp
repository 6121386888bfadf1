// TensorBoard's event file, written by kiln itself (metrics/tfevents: the
// record framing and the Event encoding; no TensorFlow, no protobuf
// runtime): <run.dir>/events.out.tfevents.kiln. Every row is one Event of
// scalar summaries at the row's step (the global optimizer step); an epoch
// row also carries `epoch` as a scalar, as Lightning's logger does. Point
// TensorBoard at the run directory, or at the directory above several runs.
//
// Appended (util/append_file); its state is the file's length. A resumed run
// cuts the file back to it, so TensorBoard sees each step once without
// relying on its purge-on-restart heuristics.
//
// Hyperparameters (set_hparams): a file created afresh starts with the
// hparams plugin's session start info after its version event; finish()
// appends the session end info (status and time) at the last row's step.
// A resumed run continues the file and does not write the start again: a
// checkpoint's length is always past it, and before any end info (written
// after the run's last checkpoint), so the end a stopped run wrote is cut
// away and the resumed run writes its own. No experiment summary is written:
// TensorBoard computes the experiment from the session start infos of all
// the runs it sees (their hparams' domains) and the scalar tags (the
// metrics, each with its last value), where one run's experiment summary
// would stand for every run in the directory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "metrics/logger.hpp"
#include "util/append_file.hpp"

namespace kiln {

class TensorBoardLogger final : public Logger {
 public:
  static constexpr const char* kFileName = "events.out.tfevents.kiln";
  explicit TensorBoardLogger(const std::filesystem::path& run_dir) : path_(run_dir / kFileName) {}
  const char* name() const override { return "tensorboard"; }
  void open(const std::string& state) override;
  void log(const LogRow& row) override;
  void flush() override;
  std::string state() override;
  void set_hparams(const std::vector<HParam>& hparams) override;
  void finish(const RunEnd& end) override;

 private:
  std::filesystem::path path_;
  std::optional<AppendFile> file_;
  int64_t epoch_written_at_ = -1;  // the step the `epoch` scalar was last written at
  std::optional<std::vector<HParam>> hparams_;
  double start_time_ = 0;  // when set_hparams was called: the run's start
  int64_t last_step_ = 0;  // the last row's
};

}  // namespace kiln
