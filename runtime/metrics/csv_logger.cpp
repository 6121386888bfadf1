#include "metrics/csv_logger.hpp"

#include "config/logger_registry.hpp"

namespace kiln {

void CsvLogger::log(const LogRow& row) {
  if (row.kind != LogRow::Kind::epoch) return;
  std::map<std::string, double> cells = row.metrics;
  cells["epoch"] = static_cast<double>(row.epoch);
  cells["step"] = static_cast<double>(row.step);
  // The column appears with the first such row (metrics.csv is rewritten whole).
  if (row.partial) cells["partial"] = 1;
  log_.append(cells);
}

std::unique_ptr<Logger> make_csv_logger(const LoggerContext& context) { return std::make_unique<CsvLogger>(context.run_dir); }

}  // namespace kiln
