#include "train/run/trainer.hpp"

#include "train/run/run_session.hpp"
#include "util/errors.hpp"

namespace kiln {

const char* command_name(Command command) {
  switch (command) {
    case Command::fit: return "fit";
    case Command::validate: return "validate";
    case Command::test: return "test";
    case Command::predict: return "predict";
  }
  return "?";
}

RunPlugins load_plugins(const Manifest& manifest, Command command, Loader& loader) {
  const std::string file = manifest.file.filename().string();
  auto load = [&](const PluginSpec& spec, kiln_plugin_kind kind) {
    return loader.load(spec.path, spec.id, kind, spec.slot, file + " [" + spec.slot + "]");
  };
  // Every plugin is loaded and checked before any is created.
  RunPlugins plugins{{}, load(manifest.data, KILN_KIND_DATA_MODULE), load(manifest.model, KILN_KIND_MODEL)};
  for (const auto& spec : manifest.callbacks) plugins.callbacks.push_back(load(spec, KILN_KIND_CALLBACK));

  std::vector<const LoadedPlugin*> all{&plugins.model, &plugins.data};
  for (const auto& c : plugins.callbacks) all.push_back(&c);
  check_unique_ids(all, file);

  const kiln_model_hooks& hooks = plugins.model.model_hooks();
  const std::string who = file + " [model] '" + plugins.model.id() + "'";
  if (command == Command::fit && !hooks.training_step)
    throw InputError(who + " implements no training_step; `kiln fit` needs one");
  if (command == Command::validate && !hooks.validation_step)
    throw InputError(who + " implements no validation_step; `kiln validate` needs one");
  if (command == Command::test && !hooks.test_step)
    throw InputError(who + " implements no test_step; `kiln test` needs one");
  if (command == Command::predict && !hooks.predict_step)
    throw InputError(who + " implements no predict_step; `kiln predict` needs one");
  return plugins;
}

RunOutcome run(const Manifest& manifest, Command command, RunPlugins plugins, const std::atomic<int>* signal,
               const DistEnv* dist, const std::optional<std::filesystem::path>& resume, Heartbeat* heartbeat) {
  return run_session(manifest, command, std::move(plugins), signal, dist, resume, heartbeat);
}

}  // namespace kiln
