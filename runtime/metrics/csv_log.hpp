// metrics.csv in the run directory: one row per epoch (and one for a test or
// validate run), one column per metric. The file is rewritten whole, through a
// durable temporary and a rename (util/durable_file), whenever a row is added, so a crash never leaves a
// torn file and a metric that first appears late still gets its column.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kiln {

// A metric's cell (epoch and step are written as integers).
std::string csv_number(double value);

class CsvLog {
 public:
  explicit CsvLog(std::filesystem::path file);
  void append(const std::map<std::string, double>& row);
  // The file's text, and putting it back (a resumed run continues the file).
  std::string text() const;
  void restore(const std::string& text);
  const std::filesystem::path& file() const { return file_; }

 private:
  void write() const;
  void add_columns(const std::map<std::string, double>& row);
  std::filesystem::path file_;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, double>> rows_;
};

}  // namespace kiln
