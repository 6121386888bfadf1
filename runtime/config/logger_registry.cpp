#include "config/logger_registry.hpp"

namespace kiln {

const std::vector<LoggerEntry>& logger_registry() {
  static const std::vector<LoggerEntry> entries{
      {"csv", &make_csv_logger},
      {"jsonl", &make_jsonl_logger},
      {"tensorboard", &make_tensorboard_logger},
      {"mlflow", &make_mlflow_logger, &check_mlflow_server},
  };
  return entries;
}

std::vector<std::string> logger_names() {
  std::vector<std::string> out;
  for (const LoggerEntry& e : logger_registry()) out.emplace_back(e.name);
  return out;
}

}  // namespace kiln
