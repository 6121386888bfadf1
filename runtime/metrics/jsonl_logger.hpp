// metrics.jsonl: one JSON object a line, for every step row and epoch row:
//   {"kind":"step","epoch":0,"step":50,"train/loss_step":0.71,...}
// Numbers are written as the shortest text that reads back as the same
// double; NaN and ±infinity, which JSON cannot express, as null. Appended
// (util/append_file); its state is the file's length.
#pragma once

#include <filesystem>
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
  const char* name() const override { return "jsonl"; }
  void open(const std::string& state) override;
  void log(const LogRow& row) override;
  void flush() override;
  std::string state() override;

 private:
  std::filesystem::path path_;
  std::optional<AppendFile> file_;
  std::string line_;                                  // kept between rows: no allocation a row
  std::map<std::string, std::string> member_starts_;  // name -> ,"name":
};

}  // namespace kiln
