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
#pragma once

#include <filesystem>
#include <optional>
#include <string>

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

 private:
  std::filesystem::path path_;
  std::optional<AppendFile> file_;
  int64_t epoch_written_at_ = -1;  // the step the `epoch` scalar was last written at
};

}  // namespace kiln
