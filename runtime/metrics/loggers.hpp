// The loggers a run writes to ([logging] loggers), as one: every row goes to
// each. Rank 0 alone opens and writes them; every rank may keep and hand back
// their checkpoint state (only rank 0's is saved). Which loggers exist is
// config/logger_registry's business; this is the fan-out.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/stateful.hpp"
#include "config/hparams.hpp"
#include "metrics/logger.hpp"

namespace kiln {

struct LoggingConfig;

class Loggers {
 public:
  // The loggers config.loggers names (checked by the manifest: known, no
  // repeats), made by the registry. `hparams` (may be null): the run's
  // hyperparameters, for the loggers that record them.
  // `evaluates_the_fit`: `kiln validate` / `kiln test` (LoggerContext).
  Loggers(const LoggingConfig& config, const std::filesystem::path& run_dir,
          const std::vector<HParam>* hparams = nullptr, bool evaluates_the_fit = false);
  ~Loggers();
  Loggers(Loggers&&) noexcept;
  Loggers& operator=(Loggers&&) noexcept;

  // Each logger's state by its name, as a checkpoint keeps it (flushes
  // first); before open(), what restore() was given.
  std::map<std::string, std::string> states();
  // A checkpoint's states, before open(): each logger continues from its
  // own; a logger the checkpoint did not have (added on resume) starts afresh.
  void restore(std::map<std::string, std::string> states);
  // The loggers' part of a checkpoint: "logger/<name>" for each logger
  // (ckpt/checkpoint_parts.hpp). A checkpoint of an older kiln has csv's in
  // "metrics/csv" and the others' as "<name> <state>" lines in
  // "metrics/loggers": read as well.
  Stateful& checkpoint_part();

  // From now on the run directory may be written. Each logger's file is
  // opened (afresh, or continuing the restored state) at the first row, so a
  // command that logs nothing (`kiln predict`) leaves the files as they were.
  void open();
  void log(const LogRow& row);
  void flush();
  // The run has ended, after its last row (`success`: without a failure):
  // the TensorBoard logger records the session's end and status. Nothing if
  // no row was logged (no file open). Never throws: a logger that cannot
  // write it warns.
  void finish(const RunEnd& end);
  void finish(bool success) { finish(RunEnd{success ? RunEnd::Status::finished : RunEnd::Status::failed, {}}); }

 private:
  class Part;
  friend void check_loggers(const LoggingConfig&, const std::filesystem::path&);
  std::vector<std::unique_ptr<Logger>> loggers_;
  std::unique_ptr<Part> part_;
  void open_files();
  std::map<std::string, std::string> restored_;
  bool may_open_ = false;
  bool open_ = false;  // the files are open
};

// Before any worker starts (the run's top process, once): each logger that
// depends on something outside the run directory (an MLflow server) checks
// it. Throws InputError (exit 2) for what the user must fix; a logger told
// not to require its server warns instead.
void check_loggers(const LoggingConfig& config, const std::filesystem::path& run_dir);

}  // namespace kiln
