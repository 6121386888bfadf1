#include "train/prediction_files.hpp"

#include <fstream>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <torch/serialize.h>

#include "train/prediction_table.hpp"
#include "train/prediction_text.hpp"
#include "util/durable_file.hpp"

namespace kiln {

namespace {

std::optional<std::string> read_if_present(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// predictions.csv, with the class names and sample names the data module
// recorded in the run directory (train/prediction_table.hpp).
void write_prediction_table(const at::Tensor& all, const std::filesystem::path& run_dir, const std::string& data_id) {
  const auto data_dir = run_dir / data_id;
  std::vector<std::string> classes, names;
  if (const std::optional<std::string> json = read_if_present(data_dir / "classes.json")) {
    if (std::optional<std::vector<std::string>> parsed = parse_string_array(*json))
      classes = std::move(*parsed);
    else
      spdlog::warn("predict: {} is not a JSON array of strings; predictions.csv has no class names",
                   (data_dir / "classes.json").string());
  }
  if (const std::optional<std::string> text = read_if_present(data_dir / "predict_names.txt")) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) names.push_back(line);
  }
  std::string warning;
  const std::optional<std::string> table = prediction_table(all, classes, names, &warning);
  if (!table) return;
  if (!warning.empty()) spdlog::warn("predict: {}", warning);
  const auto file = run_dir / "predictions.csv";
  write_file_durably(file, *table);
  spdlog::info("predict: each row's class in {}", file.string());
}

}  // namespace

void write_prediction_files(const std::vector<at::Tensor>& outputs, const std::filesystem::path& run_dir,
                            const std::string& data_id, bool as_text) {
  const at::Tensor all = at::cat(outputs).cpu();  // readable by torch.load on any machine
  // Made before anything is written: outputs that are not bytes refuse the
  // run with nothing on disk.
  const std::optional<std::string> text = as_text ? std::optional<std::string>(prediction_text(all)) : std::nullopt;
  const std::vector<char> bytes = torch::pickle_save(all);
  const auto file = run_dir / "predictions.pt";
  write_file_durably(file, std::string_view(bytes.data(), bytes.size()));
  spdlog::info("predict: {} rows written to {} (load with torch.load)", all.size(0), file.string());
  if (text) {
    const auto text_file = run_dir / "predictions.txt";
    write_file_durably(text_file, *text);
    spdlog::info("predict: the rows as text in {}", text_file.string());
  }
  write_prediction_table(all, run_dir, data_id);
}

}  // namespace kiln
