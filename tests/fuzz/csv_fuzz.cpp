// kiln_csv's reader (plugins/csv/csv_table.hpp): RFC 4180 records, the
// table of numbers built from them, and the target's encoding. The
// contract: either a CsvError of one line, or a table whose values are
// rows x features finite floats with one target cell per row, and targets
// that encode to finite values (a class index below the number of classes).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "csv_table.hpp"

namespace {

void one_line(const kiln_csv::CsvError& e) {
  const std::string what = e.what();
  if (what.empty() || what.find('\n') != std::string::npos) std::abort();
}

void check_table(const std::string& text, const kiln_csv::Columns& columns, const char* target_type) {
  try {
    const kiln_csv::Table t = kiln_csv::read_table("fuzz.csv", text, columns);
    if (t.values.size() != static_cast<size_t>(t.rows) * t.features.size()) std::abort();
    for (const float v : t.values)
      if (!std::isfinite(v)) std::abort();
    if (!columns.target.empty() && t.targets.size() != static_cast<size_t>(t.rows)) std::abort();
    if (columns.target.empty()) return;
    const kiln_csv::TargetEncoding e = kiln_csv::choose_encoding(t, target_type);
    const auto values = kiln_csv::encode_targets(t, e);
    if (values.size() != t.targets.size()) std::abort();
    for (const double v : values) {
      if (!std::isfinite(v)) std::abort();
      if (e.kind == kiln_csv::TargetEncoding::named && (v < 0 || v >= static_cast<double>(e.names.size()))) std::abort();
    }
  } catch (const kiln_csv::CsvError& e) {
    one_line(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kiln_csv::Reader reader("fuzz.csv", text);
    kiln_csv::Record record;
    int64_t last = 0;
    while (reader.next(record)) {
      if (record.line <= last || record.fields.empty()) std::abort();  // lines only move forward
      last = record.line;
    }
  } catch (const kiln_csv::CsvError& e) {
    one_line(e);
  }
  // The header's first column as the target, the others as features; and
  // every column a feature.
  std::string first;
  try {
    kiln_csv::Reader reader("fuzz.csv", text);
    kiln_csv::Record header;
    if (reader.next(header)) first = header.fields.at(0);
  } catch (const kiln_csv::CsvError&) {
  }
  check_table(text, kiln_csv::Columns{first.empty() ? "t" : first, {}}, size % 2 ? "auto" : "class");
  check_table(text, kiln_csv::Columns{"", {}}, "auto");
  return 0;
}
