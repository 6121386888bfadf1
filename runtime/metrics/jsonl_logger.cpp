#include "metrics/jsonl_logger.hpp"

#include "config/logger_registry.hpp"

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
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return python_float_repr(v);
}

std::string json_line(const LogRow& row) {
  std::string out = "{\"kind\":" + json_string(kind_name(row.kind)) + ",\"epoch\":" + std::to_string(row.epoch) +
                    ",\"step\":" + std::to_string(row.step);
  for (const auto& [name, value] : row.metrics) out += "," + json_string(name) + ":" + json_number(value);
  return out + "}";
}

void JsonlLogger::open(const std::string& state) {
  file_.emplace(path_, state.empty() ? -1 : parse_length_state(state, "jsonl"));
  if (!file_->continued_whole())
    spdlog::warn("{} is shorter than the checkpoint recorded; rows from before the checkpoint are missing from it",
                 path_.string());
}

void JsonlLogger::log(const LogRow& row) {
  if (file_) file_->append(json_line(row) + "\n");
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
