// Helpers shared by the integration tests that train.
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_process.hpp"

namespace kiln::test {

// metrics.csv as rows of column -> value (empty cells left out).
inline std::vector<std::map<std::string, double>> read_metrics(const std::filesystem::path& file) {
  std::istringstream in(read_file(file));
  std::string line;
  std::vector<std::string> columns;
  std::vector<std::map<std::string, double>> rows;
  if (!std::getline(in, line)) return rows;
  std::istringstream header(line);
  for (std::string c; std::getline(header, c, ',');) columns.push_back(c);
  while (std::getline(in, line)) {
    std::map<std::string, double> row;
    std::istringstream cells(line);
    std::string cell;
    for (size_t i = 0; i < columns.size() && std::getline(cells, cell, ','); ++i)
      if (!cell.empty()) row[columns[i]] = std::stod(cell);
    rows.push_back(row);
  }
  return rows;
}

// The last row that has `column`.
inline double last_value(const std::vector<std::map<std::string, double>>& rows, const std::string& column) {
  for (auto it = rows.rbegin(); it != rows.rend(); ++it)
    if (auto c = it->find(column); c != it->end()) return c->second;
  return -1e300;
}

// A small run on the synthetic data module with the shipped MLP.
inline std::filesystem::path synthetic_manifest(const TempDir& dir, const std::string& extra = "") {
  const std::string text = "[run]\nname = \"synthetic\"\ndir = \"" + (dir / "run").string() +
                           "\"\nseed = 3\nthreads = 1\n\n[model]\npath = \"kiln_mlp\"\nin_features = 32\n"
                           "hidden = [32]\nclasses = 4\n\n[data]\npath = \"kiln_synthetic\"\nfeatures = 32\n"
                           "classes = 4\n\n[trainer]\nmax_epochs = 3\nbatch_size = 32\nprogress = \"none\"\n\n"
                           "[optimizer]\nname = \"adam\"\nlr = 0.01\n" +
                           extra;
  write_file(dir / "run.toml", text);
  return dir / "run.toml";
}

}  // namespace kiln::test
