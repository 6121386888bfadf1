#include "cli/command_line.hpp"

#include <iostream>

#include "config/manifest.hpp"
#include "kiln/abi.h"
#include "plugin/loader.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

// An option another command or the whole program takes, given in the wrong
// place: what the user meant, rather than CLI11's "not expected".
std::string misplaced_option(int argc, char** argv) {
  if (argc < 2) return "";
  const std::string command = argv[1];
  const bool evaluation = command == "validate" || command == "test" || command == "predict";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string option = arg.substr(0, arg.find('='));
    if (evaluation && option == "--resume")
      return "kiln " + command + " takes the checkpoint to evaluate as --ckpt (a file, `last` or `best`); --resume is "
                                 "fit's";
    if (command == "fit" && (option == "--ckpt" || option == "--ckpt_path" || option == "--ckpt-path"))
      return "kiln fit continues from a checkpoint with --resume (a file, `last`, `best` or `auto`); " + option +
             " is not fit's";
  }
  return "";
}

}  // namespace

CommandLine::CommandLine() {
  app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION + " (ABI " +
                                        std::to_string(KILN_ABI_VERSION_MAJOR) + "." +
                                        std::to_string(KILN_ABI_VERSION_MINOR) + ", LibTorch " +
                                        host_torch_version() + ")");
  app.require_subcommand(1);
  // --log-level after the command too (kiln fit run.toml --log-level debug).
  app.fallthrough();
  app.add_option("--log-level", log_level, "debug, info, warn or error")
      ->check(CLI::IsMember(option_names<LogLevel>()));
  add_run_commands();
  add_inspect();
  add_export();
  add_mlflow_sync();
  reference_cmd = app.add_subcommand(
      "manifest-reference", "print the reference of every manifest key (docs/manifest.md) as Markdown");
}

void CommandLine::add_run_commands() {
  struct Spec {
    const char* name;
    const char* help;
    Command command;
  };
  const Spec specs[] = {
      {"fit", "train (and validate) the model of a manifest", Command::fit},
      {"validate", "run the validation split once", Command::validate},
      {"test", "run the test split once", Command::test},
      {"predict", "write predictions of the predict split to <run dir>/predictions.pt", Command::predict},
  };
  for (const Spec& s : specs) {
    CLI::App* sub = app.add_subcommand(s.name, s.help);
    sub->add_option("manifest", manifest, "the run's TOML manifest")->required();
    sub->add_option("--set", overrides, "override a manifest key, e.g. --set trainer.max_epochs=3")
        ->take_all()
        ->allow_extra_args(false);
    sub->add_option("--processes,-n", processes,
                    "start this many worker processes on this machine (overrides distributed.processes)")
        ->check(CLI::Range(1, 4096));
    if (s.command == Command::fit) {
      sub->add_option("--resume", resume,
                      "continue from a checkpoint: a file, `last`, `best`, or `auto` (the newest if there is one, "
                      "else a fresh start: for torchrun restarts and requeued jobs)");
      sub->add_option("--max-restarts", max_restarts,
                      "after a worker fails, restart the workers from the newest committed checkpoint up to this "
                      "many times (overrides distributed.max_restarts)")
          ->check(CLI::NonNegativeNumber);
    } else
      sub->add_option("--ckpt", resume, "evaluate the weights of a checkpoint: a file, `last` or `best`");
    commands.emplace_back(sub, s.command);
  }
}

void CommandLine::add_inspect() {
  inspect_cmd =
      app.add_subcommand("inspect", "describe a manifest's plugins, a plugin .so, or check a checkpoint (.ckpt)");
  inspect_cmd->add_option("target", target, "a manifest (.toml), a plugin shared object or a checkpoint (.ckpt)")
      ->required();
  inspect_cmd->add_option("--set", overrides, "override a manifest key")->allow_extra_args(false);
}

void CommandLine::add_export() {
  export_cmd = app.add_subcommand(
      "export", "write a checkpoint's model weights for other tools: safetensors, or a torch.load-able .pt dict");
  export_cmd->add_option("checkpoint", export_checkpoint, "the checkpoint (.ckpt)")->required();
  export_cmd
      ->add_option("--format", export_request.format, "safetensors (default) or pt")
      // One validating transform (CLI11 runs transforms before checks, so
      // a check beside CheckedTransformer never sees a bad value): the
      // name to the enum's number, or the line a person reads.
      ->transform(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "safetensors" || v == "pt") {
              const auto format = v == "pt" ? ExportFormat::pt : ExportFormat::safetensors;
              v = std::to_string(static_cast<int>(format));
              return "";
            }
            return "must be 'safetensors' or 'pt', not '" + v + "'";
          },
          "safetensors|pt"));
  export_cmd->add_option("-o,--output", export_output,
                         "the file to write (default: the checkpoint's name with .safetensors or .pt, beside it)");
  export_cmd->add_flag("--force", export_request.overwrite, "replace the output file if it exists");
  export_cmd->add_flag("--trained-weights", export_request.trained_weights,
                       "a checkpoint with averaged weights ([averaging]): write the trained weights instead");
}

void CommandLine::add_mlflow_sync() {
  mlflow_sync_cmd = app.add_subcommand(
      "mlflow-sync", "send what a run's MLflow spool still holds to its MLflow server (the same run)");
  mlflow_sync_cmd->add_option("run_dir", sync_dir, "the run directory (holds mlflow/spool.jsonl)")->required();
  mlflow_sync_cmd->add_option("--timeout", sync_timeout_s, "seconds to keep retrying a server that does not answer")
      ->check(CLI::NonNegativeNumber);
}

int command_line_error(const CLI::ParseError& e, CommandLine& cli, int argc, char** argv) {
  if (e.get_exit_code() == 0) return cli.app.exit(e);  // --help, --version
  // Bad command lines get kiln's one line too, naming what was wrong.
  std::string what = one_line(e.what());
  if (argc > 1 && argv[1][0] != '-' && cli.app.get_subcommands().empty())
    what = std::string("unknown command '") + argv[1] + "' (commands: fit, validate, test, predict, inspect, export, mlflow-sync, manifest-reference)";
  else if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::ExtrasError))
    if (const std::string hint = misplaced_option(argc, argv); !hint.empty()) what = hint;
  std::cerr << "kiln: error: " << what << " (see kiln --help)" << std::endl;
  return kExitBadInput;
}

}  // namespace kiln
