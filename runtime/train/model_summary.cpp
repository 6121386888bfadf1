#include "train/model_summary.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace kiln {

std::string short_count(int64_t count) {
  char text[32];
  if (count < 1000) {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(count));
  } else {
    static const char* const units[] = {"K", "M", "B", "T"};
    double value = static_cast<double>(count);
    int unit = -1;
    while (value >= 1000 && unit < 3) {
      value /= 1000;
      ++unit;
    }
    std::snprintf(text, sizeof text, value < 10 ? "%.1f %s" : "%.0f %s", value, units[unit]);
  }
  return text;
}

std::vector<std::string> model_summary(const std::vector<ParameterInfo>& parameters) {
  struct Row {
    std::string name;
    int64_t count = 0, trainable = 0;
  };
  std::vector<Row> rows;  // in the model's order of first appearance
  std::map<std::string, size_t> index;
  int64_t total = 0, trainable = 0, bytes = 0;
  for (const auto& p : parameters) {
    const std::string module = p.name.substr(0, p.name.find('.'));
    auto [at, added] = index.emplace(module, rows.size());
    if (added) rows.push_back(Row{module});
    Row& row = rows[at->second];
    row.count += p.count;
    if (p.trainable) row.trainable += p.count;
    total += p.count;
    if (p.trainable) trainable += p.count;
    bytes += p.bytes;
  }
  size_t name_width = 4, count_width = 6;
  for (const auto& r : rows) {
    name_width = std::max(name_width, r.name.size());
    count_width = std::max(count_width, short_count(r.count).size());
  }
  std::vector<std::string> lines;
  auto line = [&](const std::string& number, const std::string& name, const std::string& count,
                  const std::string& trains) {
    char text[512];
    std::snprintf(text, sizeof text, "%3s | %-*s | %-*s | %s", number.c_str(), static_cast<int>(name_width),
                  name.c_str(), static_cast<int>(count_width), count.c_str(), trains.c_str());
    lines.emplace_back(text);
  };
  line("", "Name", "Params", "Trains");
  lines.push_back(std::string(lines.back().size(), '-'));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    line(std::to_string(i), r.name, short_count(r.count),
         r.trainable == r.count ? "yes" : r.trainable == 0 ? "no" : "partly (" + short_count(r.trainable) + ")");
  }
  lines.push_back(std::string(lines.front().size(), '-'));
  char text[128];
  auto total_line = [&](const std::string& value, const char* what) {
    std::snprintf(text, sizeof text, "%-9s %s", value.c_str(), what);
    lines.emplace_back(text);
  };
  total_line(short_count(trainable), "Trainable params");
  total_line(short_count(total - trainable), "Non-trainable params");
  total_line(short_count(total), "Total params");
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(bytes) / (1 << 20));
  total_line(text, "Total estimated model params size (MiB)");
  return lines;
}

}  // namespace kiln
