#include "metrics/jsonl_logger.hpp"

#include "config/logger_registry.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "metrics/logger_state.hpp"
#include "util/shortest_double.hpp"

namespace kiln {


// Python's repr of the double, as metrics.csv writes it (every form of it,
// 10.0, 1e-05, 1e+16, is a JSON number); NaN and infinities, which JSON
// cannot express, as null.
namespace {

void append_json_number(std::string& out, double v) {
  if (std::isfinite(v))
    append_python_float_repr(out, v);
  else
    out += "null";
}

void append_integer(std::string& out, int64_t v) {
  char number[24];
  out.append(number, std::to_chars(number, number + sizeof number, v).ptr);
}

}  // namespace

std::string json_number(double v) {
  std::string out;
  append_json_number(out, v);
  return out;
}

std::string json_line(const LogRow& row) {
  std::string out;
  append_json_line(out, row, nullptr);
  return out;
}

void append_json_line(std::string& out, const LogRow& row, std::map<std::string, std::string>* member_starts) {
  out += "{\"kind\":";
  out += json_string(kind_name(row.kind));
  out += ",\"epoch\":";
  append_integer(out, row.epoch);
  out += ",\"step\":";
  append_integer(out, row.step);
  for (const auto& [name, value] : row.metrics) {
    if (member_starts) {
      auto it = member_starts->find(name);
      if (it == member_starts->end()) it = member_starts->emplace(name, "," + json_string(name) + ":").first;
      out += it->second;
    } else {
      out += "," + json_string(name) + ":";
    }
    append_json_number(out, value);
  }
  out += '}';
}

void JsonlLogger::open(const std::string& state) {
  file_.emplace(path_, state.empty() ? -1 : parse_length_state(state, "jsonl"));
  if (!file_->continued_whole())
    spdlog::warn("{} is shorter than the checkpoint recorded; rows from before the checkpoint are missing from it",
                 path_.string());
}

void JsonlLogger::log(const LogRow& row) {
  if (!file_) return;
  line_.clear();
  append_json_line(line_, row, &member_starts_);
  line_ += '\n';
  file_->append(line_);
}

void JsonlLogger::flush() {
  if (file_) file_->sync();
}

std::string JsonlLogger::state() {
  if (!file_) return "";
  file_->sync();
  return std::to_string(file_->size());
}

std::unique_ptr<Logger> make_jsonl_logger(const LoggerContext& context) { return std::make_unique<JsonlLogger>(context.run_dir); }

}  // namespace kiln
