#include "metrics/csv_logger.hpp"

namespace kiln {

void CsvLogger::log(const LogRow& row) {
  if (row.kind != LogRow::Kind::epoch) return;
  std::map<std::string, double> cells = row.metrics;
  cells["epoch"] = static_cast<double>(row.epoch);
  cells["step"] = static_cast<double>(row.step);
  log_.append(cells);
}

}  // namespace kiln
