// kiln_csv's reader: RFC 4180 text (quoted fields, doubled quotes, CRLF or
// LF, newlines inside quotes) with a header row, turned into numbers once:
// the feature columns as float32, the target column as text. No LibTorch
// (the fuzz target links it alone). Every refusal is a CsvError of one line
// that names the file, and the line and column of a bad cell.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kiln_csv {

class CsvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One record: its fields (quotes removed) and the line it starts on (1-based).
struct Record {
  std::vector<std::string> fields;
  int64_t line = 0;
};

// Splits `text` into records. `name` is the file, for messages. A UTF-8
// byte-order mark at the start is skipped; empty lines are skipped.
class Reader {
 public:
  Reader(std::string name, std::string_view text, char delimiter = ',');
  // The next record into `out`; false at the end.
  bool next(Record& out);

 private:
  [[noreturn]] void fail(int64_t line, const std::string& what) const;
  std::string name_;
  std::string_view text_;
  char delimiter_;
  size_t at_ = 0;
  int64_t line_ = 1;
};

// What a table's columns are read as.
struct Columns {
  std::string target;                 // "" for none
  std::vector<std::string> features;  // empty: every column but the target
};

// A table read into numbers: rows x features float32, row-major, and the
// target column's cells as written.
struct Table {
  std::string name;
  std::vector<std::string> header;
  std::vector<std::string> features;  // the feature columns' names, in order
  std::vector<float> values;          // rows * features.size()
  std::vector<std::string> targets;   // one per row (none without a target)
  std::vector<int64_t> target_lines;  // the line each target cell is on
  int target_column = -1;             // 1-based column of the target, for messages
  int64_t rows = 0;
};

Table read_table(const std::string& name, std::string_view text, const Columns& columns, char delimiter = ',');

// How the target column becomes the batch's "target", decided by the train
// split and applied to every split:
// - index: every train cell an integer >= 0: the class index itself;
// - number: every train cell a number: float32 (regression);
// - named: class names, numbered in sorted order (by value when every name is
//   a number, else by their bytes, as Python's sorted() orders str).
// target_type "auto" picks the first that fits; "class" is always named;
// "number" always number.
struct TargetEncoding {
  enum Kind { index, number, named } kind = index;
  std::vector<std::string> names;  // named: index i is names[i]
};
TargetEncoding choose_encoding(const Table& train, const std::string& target_type);
// One value per row: class indices (as doubles, exact below 2^53) or numbers.
// A cell the encoding cannot take (empty, not a number, a class train does
// not have) is a CsvError naming its line and column.
std::vector<double> encode_targets(const Table& table, const TargetEncoding& encoding);

// A cell as a finite number: surrounding spaces allowed, a leading '+'
// too; false for anything else (empty, "nan", "inf", "1,5", "12abc").
bool parse_number(std::string_view cell, double& out);

// "a, b, c" (at most 64 characters each, control characters as \xNN).
std::string name_list(const std::vector<std::string>& names);
// A cell or name as a message shows it: quoted, cut at 64 characters, one line.
std::string shown(const std::string& text);

}  // namespace kiln_csv
