#include "csv_table.hpp"

#include "kiln_plugins/one_line.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <set>

namespace kiln_csv {

namespace {

using kiln_plugins::one_line;

}  // namespace

std::string shown(const std::string& text) {
  return "'" + one_line(text.size() <= 64 ? text : text.substr(0, 64) + "...") + "'";
}

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + one_line(n.size() <= 64 ? n : n.substr(0, 64) + "...");
  return out.empty() ? "none" : out;
}

Reader::Reader(std::string name, std::string_view text, char delimiter)
    : name_(std::move(name)), text_(text), delimiter_(delimiter) {
  if (text_.substr(0, 3) == "\xEF\xBB\xBF") at_ = 3;
}

void Reader::fail(int64_t line, const std::string& what) const {
  throw CsvError(one_line(name_ + ":" + std::to_string(line) + ": " + what));
}

bool Reader::next(Record& out) {
  out.fields.clear();
  // Empty lines between records are skipped (as pandas does).
  while (at_ < text_.size() && (text_[at_] == '\n' || text_[at_] == '\r')) {
    if (text_[at_] == '\n') ++line_;
    ++at_;
  }
  if (at_ >= text_.size()) return false;
  out.line = line_;
  std::string field;
  for (;;) {
    field.clear();
    if (at_ < text_.size() && text_[at_] == '"') {
      const int64_t opened = line_;
      ++at_;
      for (;;) {
        if (at_ >= text_.size()) fail(opened, "a quoted field is never closed");
        const char c = text_[at_++];
        if (c == '"') {
          if (at_ < text_.size() && text_[at_] == '"') {
            field += '"';
            ++at_;
            continue;
          }
          break;
        }
        if (c == '\n') ++line_;
        field += c;
      }
      if (at_ < text_.size() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r')
        fail(line_, "text after a quoted field's closing quote (a quote inside a field is written twice: \"\")");
    } else {
      while (at_ < text_.size() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r') {
        if (text_[at_] == '"') fail(line_, "a quote inside an unquoted field (quote the whole field)");
        field += text_[at_++];
      }
    }
    out.fields.push_back(field);
    if (at_ < text_.size() && text_[at_] == delimiter_) {
      ++at_;
      continue;
    }
    // The record's end: CRLF, LF, a lone CR, or the end of the text.
    if (at_ < text_.size() && text_[at_] == '\r') ++at_;
    if (at_ < text_.size() && text_[at_] == '\n') ++at_;
    ++line_;
    return true;
  }
}

bool parse_number(std::string_view cell, double& out) {
  while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
  if (!cell.empty() && cell.front() == '+') cell.remove_prefix(1);
  if (cell.empty() || cell.front() == '+' || cell.front() == ' ') return false;
  double value = 0;
  const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (error != std::errc() || end != cell.data() + cell.size() || !std::isfinite(value)) return false;
  out = value;
  return true;
}

Table read_table(const std::string& name, std::string_view text, const Columns& columns, char delimiter) {
  Reader reader(name, text, delimiter);
  Record record;
  if (!reader.next(record)) throw CsvError(one_line(name + ": is empty; a table starts with a header row"));
  Table table;
  table.name = name;
  table.header = record.fields;
  std::map<std::string, int> column_of;
  for (size_t i = 0; i < table.header.size(); ++i)
    if (!column_of.emplace(table.header[i], static_cast<int>(i)).second)
      throw CsvError(one_line(name + ":" + std::to_string(record.line) + ": the header names column " +
                              shown(table.header[i]) + " twice"));
  const auto find = [&](const std::string& column, const char* role) {
    const auto it = column_of.find(column);
    if (it == column_of.end())
      throw CsvError(one_line(name + ": has no " + role + " column " + shown(column) + "; its columns: " +
                              name_list(table.header)));
    return it->second;
  };
  if (!columns.target.empty()) table.target_column = find(columns.target, "target") + 1;
  std::vector<int> feature_index;
  if (columns.features.empty()) {
    for (size_t i = 0; i < table.header.size(); ++i)
      if (static_cast<int>(i) + 1 != table.target_column) {
        feature_index.push_back(static_cast<int>(i));
        table.features.push_back(table.header[i]);
      }
  } else {
    for (const auto& f : columns.features) {
      const int i = find(f, "feature");
      if (i + 1 == table.target_column)
        throw CsvError(one_line(name + ": column " + shown(f) + " is the target; it cannot also be a feature"));
      feature_index.push_back(i);
      table.features.push_back(f);
    }
  }
  if (feature_index.empty()) throw CsvError(one_line(name + ": has no feature columns (only the target)"));
  const size_t width = table.header.size();
  while (reader.next(record)) {
    if (record.fields.size() != width)
      throw CsvError(one_line(name + ":" + std::to_string(record.line) + ": " + std::to_string(record.fields.size()) +
                              " field" + (record.fields.size() == 1 ? "" : "s") + ", the header has " +
                              std::to_string(width)));
    for (const int i : feature_index) {
      const std::string& cell = record.fields[static_cast<size_t>(i)];
      double value = 0;
      if (!parse_number(cell, value)) {
        std::string trimmed = cell;
        const bool blank = trimmed.find_first_not_of(" \t") == std::string::npos;
        throw CsvError(one_line(name + ":" + std::to_string(record.line) + ":" + std::to_string(i + 1) +
                                ": column " + shown(table.header[static_cast<size_t>(i)]) + ": " +
                                (blank ? std::string("the cell is empty (a missing value)")
                                       : shown(cell) + " is not a finite number")));
      }
      if (std::fabs(value) > std::numeric_limits<float>::max())
        throw CsvError(one_line(name + ":" + std::to_string(record.line) + ":" + std::to_string(i + 1) +
                                ": column " + shown(table.header[static_cast<size_t>(i)]) + ": " + shown(cell) +
                                " is outside float32's range"));
      table.values.push_back(static_cast<float>(value));
    }
    if (table.target_column > 0) {
      table.targets.push_back(record.fields[static_cast<size_t>(table.target_column - 1)]);
      table.target_lines.push_back(record.line);
    }
    ++table.rows;
  }
  return table;
}

namespace {

bool is_index(const std::string& cell) {
  double v = 0;
  return parse_number(cell, v) && v >= 0 && v <= 9007199254740992.0 && std::floor(v) == v &&
         cell.find_first_of(".eE") == std::string::npos;
}

[[noreturn]] void bad_cell(const Table& t, size_t row, const std::string& what) {
  throw CsvError(one_line(t.name + ":" + std::to_string(t.target_lines[row]) + ":" + std::to_string(t.target_column) +
                          ": target column " + shown(t.header[static_cast<size_t>(t.target_column - 1)]) + ": " +
                          what));
}

}  // namespace

TargetEncoding choose_encoding(const Table& train, const std::string& target_type) {
  if (target_type != "auto" && target_type != "class" && target_type != "number")
    throw CsvError("target_type " + shown(target_type) + " is not \"auto\", \"class\" or \"number\"");
  TargetEncoding e;
  bool all_numbers = true, all_indices = true;
  for (const auto& cell : train.targets) {
    double v = 0;
    all_numbers = all_numbers && parse_number(cell, v);
    all_indices = all_indices && is_index(cell);
  }
  if (target_type == "number" || (target_type == "auto" && all_numbers && !all_indices)) {
    e.kind = TargetEncoding::number;
    return e;
  }
  if (target_type == "auto" && all_indices) {
    e.kind = TargetEncoding::index;
    return e;
  }
  e.kind = TargetEncoding::named;
  for (size_t row = 0; row < train.targets.size(); ++row)
    if (train.targets[row].find_first_not_of(" \t") == std::string::npos)
      bad_cell(train, row, "the cell is empty (a missing label)");
  const std::set<std::string> distinct(train.targets.begin(), train.targets.end());
  e.names.assign(distinct.begin(), distinct.end());
  if (all_numbers)
    std::stable_sort(e.names.begin(), e.names.end(), [](const std::string& a, const std::string& b) {
      double x = 0, y = 0;
      parse_number(a, x), parse_number(b, y);
      return x < y;
    });
  return e;
}

std::vector<double> encode_targets(const Table& table, const TargetEncoding& encoding) {
  std::vector<double> out;
  out.reserve(table.targets.size());
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < encoding.names.size(); ++i) index_of.emplace(encoding.names[i], i);
  for (size_t row = 0; row < table.targets.size(); ++row) {
    const std::string& cell = table.targets[row];
    double v = 0;
    switch (encoding.kind) {
      case TargetEncoding::index:
        if (!is_index(cell))
          bad_cell(table, row, shown(cell) + " is not a class index (an integer >= 0, as the train split's are)");
        parse_number(cell, v);
        break;
      case TargetEncoding::number:
        if (!parse_number(cell, v)) bad_cell(table, row, shown(cell) + " is not a finite number");
        break;
      case TargetEncoding::named: {
        const auto it = index_of.find(cell);
        if (it == index_of.end())
          bad_cell(table, row, "class " + shown(cell) + " is not one of the train split's " +
                                   std::to_string(encoding.names.size()) + " classes");
        v = static_cast<double>(it->second);
        break;
      }
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace kiln_csv
