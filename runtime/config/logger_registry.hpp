// The loggers `[logging] loggers` may name: one entry each, its name and the
// function that makes it (Lightning's loggers/ folder, as a table). The
// manifest schema takes the names from here; each factory is defined
// beside its logger, in metrics/. Adding a logger is a file pair of its own
// in metrics/ (the logger and its make_*_logger), its entry here and its
// keys in the schema (config/manifest_schema.cpp). Here, under config/,
// because the schema needs the names: metrics/ includes config/, never the
// reverse (tests/docs: the folders form a one-way graph).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "config/hparams.hpp"

namespace kiln {

class Logger;
struct LoggingConfig;

// What a logger is made from: the [logging] table (a logger's own
// [logging.<name>] keys included), the run directory, and the run's
// hyperparameters (the manifest flattened once, at its parse).
struct LoggerContext {
  const LoggingConfig& config;
  std::filesystem::path run_dir;
  const std::vector<HParam>* hparams = nullptr;  // null: none given (the TensorBoard logger writes no session)
  // `kiln validate` / `kiln test`: the files start afresh, but an experiment
  // tracker's run is the directory's fit's, continued (MLflow's run_id, as
  // Lightning's logger given one).
  bool evaluates_the_fit = false;
};

using LoggerFactory = std::unique_ptr<Logger> (*)(const LoggerContext&);
// Checks, before any worker starts, what the logger needs outside the run
// directory (a server): throws InputError for what the user must fix.
using LoggerCheck = void (*)(const LoggerContext&);

struct LoggerEntry {
  const char* name;  // as the manifest writes it; its checkpoint part is "logger/<name>"
  LoggerFactory make;
  LoggerCheck check = nullptr;  // null: nothing to check
};

// In the order the manifest reference lists them.
const std::vector<LoggerEntry>& logger_registry();
std::vector<std::string> logger_names();

// The factories, each defined beside its logger (metrics/*_logger.cpp).
std::unique_ptr<Logger> make_csv_logger(const LoggerContext& context);
std::unique_ptr<Logger> make_jsonl_logger(const LoggerContext& context);
std::unique_ptr<Logger> make_tensorboard_logger(const LoggerContext& context);
std::unique_ptr<Logger> make_mlflow_logger(const LoggerContext& context);
void check_mlflow_server(const LoggerContext& context);

}  // namespace kiln
