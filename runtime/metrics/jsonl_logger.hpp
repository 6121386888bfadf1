// metrics.jsonl: one JSON object a line, for every step row and epoch row:
//   {"kind":"step","epoch":0,"step":50,"train/loss_step":0.71,...}
// Numbers are written as the shortest text that reads back as the same
// double; NaN and ±infinity, which JSON cannot express, as null. Appended
// (util/append_file); its state is the file's length.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <map>
#include <optional>
#include <string>

#include "metrics/logger.hpp"
#include "util/json_string.hpp"
#include "util/append_file.hpp"

namespace kiln {

// One row as a JSON object, without the newline.
std::string json_line(const LogRow& row);
// The same, appended to `out`; `member_starts` (may be null) keeps each
// name's `,"name":` between rows, for a logger that writes one every step.
void append_json_line(std::string& out, const LogRow& row, std::map<std::string, std::string>* member_starts);
// `v` as a JSON number (shortest round-trip text), or null.
std::string json_number(double v);

class JsonlLogger final : public Logger {
 public:
  explicit JsonlLogger(const std::filesystem::path& run_dir) : path_(run_dir / "metrics.jsonl") {}
  ~JsonlLogger() override;
  const char* name() const override { return "jsonl"; }
  void open(const std::string& state) override;
  // Appends the row's line to memory; a thread of the logger's own
  // (`jsonl-writer`) writes what waits every 250 ms, as the MLflow spool's
  // writer does: a `write` a row cost a step-bound run about 1 %
  // (bench/README.md, "MLflow logger"). flush(), state() (before every
  // checkpoint records the length) and finish() write it at once.
  void log(const LogRow& row) override;
  void flush() override;
  std::string state() override;
  void finish(const RunEnd& end) override;

 private:
  static constexpr std::chrono::milliseconds kWriteInterval{250};
  void write_pending();
  void write_in_background();
  void stop_writer();

  std::filesystem::path path_;
  std::mutex file_mutex_;  // file_ and writing_: one writer at a time, rows in order
  std::optional<AppendFile> file_;
  std::string writing_;  // the taken rows (its capacity kept)
  std::mutex pending_mutex_;
  std::condition_variable wake_;
  std::string pending_;                               // under pending_mutex_: rows not yet written
  std::map<std::string, std::string> member_starts_;  // under pending_mutex_: name -> ,"name":
  bool writer_stopping_ = false;                      // under pending_mutex_
  std::exception_ptr write_error_;                    // under pending_mutex_: the writer's, rethrown
  std::thread writer_;
};

}  // namespace kiln
