#include "metrics/loggers.hpp"

#include <sstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "metrics/csv_logger.hpp"
#include "metrics/jsonl_logger.hpp"
#include "metrics/logger_names.hpp"
#include "metrics/tensorboard_logger.hpp"

namespace kiln {

const char* kind_name(LogRow::Kind kind) { return kind == LogRow::Kind::step ? "step" : "epoch"; }

const std::vector<std::string>& Loggers::known_names() { return logger_names(); }

Loggers::Loggers(const std::vector<std::string>& names, const std::filesystem::path& run_dir) {
  for (const auto& name : names) {
    if (name == "csv") loggers_.push_back(std::make_unique<CsvLogger>(run_dir));
    else if (name == "jsonl") loggers_.push_back(std::make_unique<JsonlLogger>(run_dir));
    else if (name == "tensorboard") loggers_.push_back(std::make_unique<TensorBoardLogger>(run_dir));
    else throw std::invalid_argument("unknown logger '" + name + "'");  // the manifest refuses it first
  }
}

Loggers::~Loggers() = default;
Loggers::Loggers(Loggers&&) noexcept = default;
Loggers& Loggers::operator=(Loggers&&) noexcept = default;

void Loggers::restore(const std::string& csv, const std::string& others) {
  restored_csv_ = csv;
  restored_others_ = others;
}

void Loggers::set_hparams(std::vector<HParam> hparams) {
  for (auto& logger : loggers_) logger->set_hparams(hparams);
}

void Loggers::open() { may_open_ = true; }

void Loggers::open_files() {
  std::istringstream in(restored_others_);
  std::vector<std::pair<std::string, std::string>> saved;
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    if (space != std::string::npos) saved.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  for (auto& logger : loggers_) {
    std::string state;
    if (std::string(logger->name()) == "csv") {
      state = restored_csv_;
    } else {
      // A logger the checkpoint did not have (added on resume) starts afresh.
      for (const auto& [name, s] : saved)
        if (name == logger->name()) state = s;
    }
    logger->open(state);
  }
  open_ = true;
}

void Loggers::log(const LogRow& row) {
  if (!may_open_) return;
  if (!open_) open_files();
  for (auto& logger : loggers_) logger->log(row);
}

void Loggers::flush() {
  for (auto& logger : loggers_) logger->flush();
}

void Loggers::finish(bool success) {
  if (!open_) return;
  for (auto& logger : loggers_) {
    try {
      logger->finish(success);
    } catch (const std::exception& e) {
      spdlog::warn("the {} logger could not record the run's end: {}", logger->name(), e.what());
    }
  }
}

std::string Loggers::csv_state() {
  if (!open_) return restored_csv_;
  for (auto& logger : loggers_)
    if (std::string(logger->name()) == "csv") return logger->state();
  return "";
}

std::string Loggers::states() {
  if (!open_) return restored_others_;
  std::string out;
  for (auto& logger : loggers_)
    if (std::string(logger->name()) != "csv") out += std::string(logger->name()) + " " + logger->state() + "\n";
  return out;
}

}  // namespace kiln
