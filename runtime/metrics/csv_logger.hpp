// metrics.csv: epoch rows only (step rows are for the jsonl and tensorboard
// loggers), one column per metric, as kiln always wrote it (metrics/csv_log).
// Its state is the file's text: a resumed run rewrites the file from the
// checkpoint's copy, so rows logged after that checkpoint disappear.
#pragma once

#include <filesystem>

#include "metrics/csv_log.hpp"
#include "metrics/logger.hpp"

namespace kiln {

class CsvLogger final : public Logger {
 public:
  explicit CsvLogger(const std::filesystem::path& run_dir) : log_(run_dir / "metrics.csv") {}
  const char* name() const override { return "csv"; }
  void open(const std::string& state) override { log_.restore(state); }
  void log(const LogRow& row) override;
  void flush() override {}  // every row is written durably (util/durable_file)
  std::string state() override { return log_.text(); }

 private:
  CsvLog log_;
};

}  // namespace kiln
