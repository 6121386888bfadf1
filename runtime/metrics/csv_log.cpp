#include "metrics/csv_log.hpp"

#include "util/durable_file.hpp"
#include "util/shortest_double.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kiln {

CsvLog::CsvLog(std::filesystem::path file) : file_(std::move(file)) {}

// Python's repr of the double (what Lightning's CSVLogger writes): the
// shortest text that reads back as the same double, so a cell is the value
// and not a rounding of it, in repr's notation (10.0, 0.0001, 1e-05, 1e+16);
// NaN and infinities as Python writes them (nan, inf, -inf: what pandas and
// float() read), whatever NaN's sign bit.
std::string csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return python_float_repr(v);
}

void CsvLog::add_columns(const std::map<std::string, double>& row) {
  for (const auto& [name, _] : row)
    if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) columns_.push_back(name);
  // epoch and step lead; metrics follow in order of first appearance.
  std::stable_sort(columns_.begin(), columns_.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& c) { return c == "epoch" ? 0 : c == "step" ? 1 : 2; };
    return rank(a) < rank(b);
  });
}

void CsvLog::append(const std::map<std::string, double>& row) {
  add_columns(row);
  rows_.push_back(row);
  write();
}

std::string CsvLog::text() const {
  std::ostringstream out;
  for (size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << columns_[i];
  out << "\n";
  char buffer[64];
  for (const auto& row : rows_) {
    for (size_t i = 0; i < columns_.size(); ++i) {
      if (i) out << ",";
      auto it = row.find(columns_[i]);
      if (it == row.end()) continue;
      if (columns_[i] == "epoch" || columns_[i] == "step") {
        std::snprintf(buffer, sizeof buffer, "%.0f", it->second);
        out << buffer;
      } else {
        out << csv_number(it->second);
      }
    }
    out << "\n";
  }
  return out.str();
}

void CsvLog::restore(const std::string& text) {
  columns_.clear();
  rows_.clear();
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line.empty()) return;
  std::istringstream header(line);
  for (std::string c; std::getline(header, c, ',');) columns_.push_back(c);
  while (std::getline(in, line)) {
    std::map<std::string, double> row;
    std::istringstream cells(line);
    std::string cell;
    for (size_t i = 0; i < columns_.size() && std::getline(cells, cell, ','); ++i)
      if (!cell.empty()) row[columns_[i]] = std::strtod(cell.c_str(), nullptr);
    rows_.push_back(row);
  }
}

void CsvLog::write() const { write_file_durably(file_, text()); }

}  // namespace kiln
