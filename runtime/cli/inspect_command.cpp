#include "cli/inspect_command.hpp"

#include <filesystem>
#include <iostream>
#include <system_error>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"
#include "ckpt/rank_files.hpp"
#include "config/manifest.hpp"
#include "plugin/loader.hpp"
#include "data/data_summary.hpp"
#include "train/model_parameters.hpp"
#include "train/run/trainer.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

void print_report(const PluginReport& r, const std::string& slot) {
  std::cout << (slot.empty() ? "" : "[" + slot + "] ") << r.id << "\n"
            << "  name:          " << r.name << (r.version.empty() ? "" : " " + r.version) << "\n";
  if (!r.description.empty()) std::cout << "  description:   " << r.description << "\n";
  std::cout << "  kind:          " << r.kind << "\n"
            << "  ABI:           " << r.abi_major << "." << r.abi_minor << "\n"
            << "  LibTorch:      " << r.torch_version << "\n";
  if (r.flags & KILN_DATA_CONCURRENT_GET_BATCH) std::cout << "  flags:         concurrent get_batch\n";
  std::cout << "  hooks:        ";
  for (const auto& h : r.hooks) std::cout << " " << h;
  std::cout << "\n";
}

// A checkpoint: validated (checksum included), then its metadata. Exit 2
// when it is not a usable checkpoint.
int inspect_checkpoint(const std::filesystem::path& path) {
  if (auto problem = CheckpointFile::check(path)) throw InputError(*problem);
  const CheckpointFile file = CheckpointFile::read(path);
  const CheckpointMeta meta = read_meta(file);
  size_t params = 0, optimizer = 0, plugins = 0;
  for (const auto& name : file.names()) {
    params += name.rfind("param/", 0) == 0;
    optimizer += name.rfind("optim/", 0) == 0;
    plugins += name.rfind("plugin/", 0) == 0;
  }
  std::cout << "checkpoint " << std::filesystem::absolute(path).string() << " (valid, checksum verified)\n"
            << "  written by:    kiln " << meta.kiln_version << ", format " << kCheckpointFormat << "\n"
            << "  position:      epoch " << meta.position.epoch << ", batch " << meta.position.next_batch;
  if (meta.position.next_sample >= 0) std::cout << ", sample " << meta.position.next_sample << " of its order";
  std::cout << "\n  global step:   " << meta.position.global_step << "\n";
  if (meta.saved_by.world_size > 0)
    std::cout << "  saved by:      " << meta.saved_by.world_size << " process" << (meta.saved_by.world_size == 1 ? "" : "es")
              << ", batch size " << meta.saved_by.batch_size << "\n";
  if (!meta.monitor.empty())
    std::cout << "  monitor:       " << meta.monitor << " = "
              << (meta.monitored ? std::to_string(*meta.monitored) : std::string("(none)")) << "\n";
  std::cout << "  sections:      " << params << " parameters, " << optimizer << " optimizer, " << plugins
            << " plugin state, " << file.names().size() << " in all\n";
  if (!meta.rank_files.prefix.empty()) {
    // Read and verified as a resume reads them: a missing or damaged one is an error here too.
    const std::vector<CheckpointFile> ranks = read_rank_files(file);
    size_t sections = 0;
    for (const auto& r : ranks) sections += r.names().size();
    std::cout << "  rank files:    " << ranks.size() << " (distributed.shard: each rank's optimizer state, "
              << sections << " sections, checksums verified), "
              << rank_file_path(path.parent_path(), meta.rank_files.prefix, 0, static_cast<int>(ranks.size())).string()
              << " and the others\n";
  }
  // The mlflow logger's state: "<spool length> <run id>" (metrics/mlflow_logger.hpp).
  if (file.has("logger/mlflow")) {
    const std::string state(file.section("logger/mlflow"));
    const std::string id = state.substr(state.find(' ') + 1);
    std::cout << "  mlflow:        " << (id == "-" || id.empty() ? std::string("run not created yet (its id is in the run "
                                                                              "directory's mlflow/run.json once made)")
                                                                 : "mlflow run " + id)
              << "\n";
  }
  return kExitOk;
}

}  // namespace

int inspect_command(const std::string& target, const std::vector<std::string>& overrides) {
  Loader loader;
  const std::filesystem::path path(target);
  if (path.extension() == ".ckpt") return inspect_checkpoint(path);
  if (path.extension() == ".toml") {
    const Manifest m = load_manifest(path, overrides, PluginSearchPath::from_environment());
    std::cout << "manifest " << m.file.string() << "\n  run dir: " << m.run.dir.string() << "\n";
    const auto plugins = load_plugins(m, Command::fit, loader);
    auto show = [&](const LoadedPlugin& p) {
      const kiln_entry entry{sizeof(kiln_entry), KILN_ABI_VERSION_MAJOR, KILN_ABI_VERSION_MINOR, 0, nullptr};
      auto report = describe_plugin(*p.descriptor, entry);
      std::cout << "\n";
      print_report(report, p.slot);
      std::cout << "  file:          " << p.path.string() << "\n";
    };
    show(plugins.model);
    show(plugins.data);
    for (const auto& c : plugins.callbacks) show(c);
    // Lightning's summary, from the model the manifest configures.
    std::cout << "\nmodel summary (" << plugins.model.id() << ", as configured by the manifest):\n";
    for (const std::string& line : model_summary(inspect_model_parameters(plugins.model, m.model.config_toml)))
      std::cout << "  " << line << "\n";
    // The data it reads: each split's size, a sample's tensors, its class list.
    std::cout << "\ndata (" << plugins.data.id() << ", as configured by the manifest):\n";
    for (const std::string& line : inspect_data(plugins.data, m.data.config_toml)) std::cout << "  " << line << "\n";
    return kExitOk;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(target + " is a directory: inspect takes a manifest (.toml), a plugin shared object or a "
                              "checkpoint (.ckpt)");
  // Loaded before anything is printed: a target that is none of the three
  // gets the one error line only.
  const auto reports = loader.inspect(path);
  std::cout << "plugin library " << std::filesystem::absolute(path).string() << "\n";
  for (const auto& report : reports) {
    std::cout << "\n";
    print_report(report, "");
  }
  return kExitOk;
}

}  // namespace kiln
