// kiln's command line (CLI11): the subcommands, the options each takes and
// the values they fill, and the one line a refused command line gets.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "ckpt/weights_export.hpp"
#include "train/command.hpp"

namespace kiln {

// The subcommands, and the values their options fill.
struct CommandLine {
  CLI::App app{"kiln — a training runtime for LibTorch plugins", "kiln"};
  std::string log_level = "info";
  // fit, validate, test and predict
  std::vector<std::pair<CLI::App*, Command>> commands;
  std::string manifest;
  std::vector<std::string> overrides;
  int processes = 0;
  int max_restarts = -1;  // -1: not given
  std::string resume;
  // inspect
  CLI::App* inspect_cmd = nullptr;
  std::string target;
  // export
  CLI::App* export_cmd = nullptr;
  ExportRequest export_request;
  std::string export_checkpoint, export_output;
  // manifest-reference
  CLI::App* reference_cmd = nullptr;
  // mlflow-sync
  CLI::App* mlflow_sync_cmd = nullptr;
  std::string sync_dir;
  double sync_timeout_s = 60.0;

  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

 private:
  void add_run_commands();
  void add_inspect();
  void add_export();
  void add_mlflow_sync();
};

// A command line CLI11 refused (or --help, --version): kiln's one line, or
// CLI11's help or version text. The exit code.
int command_line_error(const CLI::ParseError& e, CommandLine& cli, int argc, char** argv);

}  // namespace kiln
