// Schema-driven validation of a parsed manifest (config/manifest_validation.hpp):
// host tables as config/manifest_schema.cpp declares them, plugin tables
// (their plugin looked up on the plugin path), then the defaults and checks
// that span keys.
#include "config/manifest_validation.hpp"

#include <algorithm>
#include <map>
#include <system_error>

#include "config/input_guard.hpp"
#include "config/manifest_schema.hpp"
#include "config/text.hpp"
#include "kiln/detail/suggest.hpp"

namespace kiln::manifest_detail {

namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kAllTables = {"run",       "model",     "data",       "callbacks",  "trainer",
                                             "optimizer", "scheduler", "checkpoint", "distributed",
                                             "logging", "metrics", "profiler", "averaging"};

class Validator {
 public:
  Validator(const Context& context, Manifest& manifest, const PluginSearchPath& search_path)
      : ctx(context), m(manifest), search(search_path) {}

  void run(const toml::table& root) {
    check_entries(root);
    require_plugins();
    apply_dependent_defaults();
    check_across_keys();
  }

 private:
  const Context& ctx;
  Manifest& m;
  const PluginSearchPath& search;
  std::map<std::string, const toml::table*> host_tables;  // as found, for cross-key checks
  bool have_model = false;
  bool have_data = false;

  const toml::table* host_table(const std::string& name) const {
    const auto it = host_tables.find(name);
    return it == host_tables.end() ? nullptr : it->second;
  }

  bool has_key(const std::string& table, const std::string& key) const {
    const toml::table* t = host_table(table);
    return t && t->contains(key);
  }

  // Which other host table knows `key` (for "it belongs in [optimizer]");
  // an array of tables comes back bracketed once more, so that the callers'
  // "[" + owner + "]" reads [[optimizer.groups]].
  std::string owner_of(const std::string& key, const std::string& except) const {
    for (const auto& t : manifest_schema()) {
      if (t.name != except && t.find(key)) return t.array_of_tables ? "[" + t.name + "]" : t.name;
    }
    return "";
  }

  // The position of `key` in a host table, or of the table, for cross-key checks.
  std::string where_key(const std::string& table_name, const std::string& key) const {
    if (const toml::table* table = host_table(table_name)) {
      if (const toml::node* node = table->get(key)) return ctx.where({table_name, key}, node->source());
      return ctx.where({table_name}, table->source());
    }
    return ctx.file;
  }

  // ---- the top level, in file order

  void check_entries(const toml::table& root) {
    for (const auto& [k, v] : in_file_order(root)) {
      const std::string name(k->str());
      const KeyPath path{name};
      if (name == "model") {
        m.model = check_plugin("model", path, *v, table_source(*v, *k));
        have_model = true;
      } else if (name == "data") {
        m.data = check_plugin("data", path, *v, table_source(*v, *k));
        have_data = true;
      } else if (name == "callbacks") {
        check_callbacks(*k, *v);
      } else if (const TableSchema* schema = find_table_schema(name); schema && !schema->array_of_tables) {
        if (name == "checkpoint") m.checkpoint.enabled = true;  // `enabled` may still turn it off
        check_host_table(*schema, *k, *v);
      } else {
        unknown_top_level(name, *k, *v);
      }
    }
  }

  [[noreturn]] void unknown_top_level(const std::string& name, const toml::key& key, const toml::node& node) const {
    const KeyPath path{name};
    const auto& source = table_source(node, key);
    if (node.is_table() || node.is_array()) {
      std::string hint = detail::did_you_mean_choice(name, kAllTables);
      if (hint.empty()) hint = " (known tables: " + join(kAllTables, ", ") + ")";
      ctx.fail_at(path, source, "unknown table '" + name + "'" + hint);
    }
    std::string hint = detail::did_you_mean_choice(name, kAllTables);
    if (hint.empty()) {
      const std::string owner = owner_of(name, "");
      hint = owner.empty() ? " (keys belong in a table: " + join(kAllTables, ", ") + ")"
                           : " (it belongs in [" + owner + "]: put it after the [" + owner + "] header)";
    }
    ctx.fail_at(path, source, "unknown top-level key '" + name + "'" + hint);
  }

  // ---- host tables

  void check_host_table(const TableSchema& schema, const toml::key& key, const toml::node& node) {
    check_host_table(schema, KeyPath{schema.name}, key, node);
  }

  // `path`: where the table is ({"logging", "mlflow"} for [logging.mlflow]).
  void check_host_table(const TableSchema& schema, const KeyPath& path, const toml::key& key, const toml::node& node) {
    const auto* table = node.as_table();
    if (!table) {
      std::string message = "[" + schema.name + "] must be a table, not " + std::string(type_phrase(node));
      if (node.is_array()) message += " (write [" + schema.name + "], not [[" + schema.name + "]])";
      ctx.fail_at(path, table_source(node, key), message);
    }
    host_tables[schema.name] = table;
    std::vector<std::string> known = schema.key_names();
    for (const auto& t : manifest_schema())
      if (starts_with(t.name, schema.name + ".") && t.name.find('.', schema.name.size() + 1) == std::string::npos)
        known.push_back(t.name.substr(schema.name.size() + 1));
    for (const auto& [k, v] : in_file_order(*table)) {
      const std::string name(k->str());
      const KeySchema* spec = schema.find(name);
      const KeyPath key_path = child(path, name);
      if (const TableSchema* entries = find_table_schema(schema.name + "." + name); entries && entries->array_of_tables) {
        check_table_array(*entries, key_path, *k, *v);
        continue;
      }
      if (const TableSchema* inner = find_table_schema(schema.name + "." + name); inner) {  // [logging.mlflow]
        check_host_table(*inner, key_path, *k, *v);
        continue;
      }
      if (!spec) {
        std::string hint = renamed_key_hint(schema.name, name);
        if (hint.empty()) hint = detail::did_you_mean_choice(name, known);
        if (hint.empty()) {
          const std::string owner = owner_of(name, schema.name);
          hint = owner.empty() ? " (known keys: " + join(known, ", ") + ")" : " (it belongs in [" + owner + "])";
        }
        ctx.fail_at(key_path, k->source(), "unknown key '" + name + "' in [" + schema.name + "]" + hint);
      }
      spec->store(m, checked_value(*spec, Field{ctx, key_path, *v}));
    }
  }

  // [[optimizer.groups]]: each entry opened, then its keys checked and
  // stored into it; an entry missing a required key is refused.
  void check_table_array(const TableSchema& schema, const KeyPath& path, const toml::key& key, const toml::node& node) {
    const std::string shown = "[[" + schema.name + "]]";
    const auto* array = node.as_array();
    if (!array) {
      std::string message = display(path) + " must be an array of tables, not " + std::string(type_phrase(node));
      if (node.is_table()) message += " (write each entry as a " + shown + " table)";
      ctx.fail_at(path, table_source(node, key), message);
    }
    for (std::size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      const KeyPath element_path = child(path, index_part(i));
      const auto& source = element.source().begin.line > 0 ? element.source() : table_source(node, key);
      const auto* entry = element.as_table();
      if (!entry) {
        ctx.fail_at(element_path, source,
                    display(element_path) + " must be a table, not " + std::string(type_phrase(element)) +
                        " (write each entry as a " + shown + " table)");
      }
      open_entry(schema, *entry, element_path, source);
      check_entry_keys(schema, *entry, element_path);
    }
  }

  // Refuses an entry without a required key, then opens it, placed where
  // its last required key is written.
  void open_entry(const TableSchema& schema, const toml::table& entry, const KeyPath& element_path,
                  const toml::source_region& source) {
    std::string where = ctx.where(element_path, source);
    for (const auto& k : schema.keys) {
      if (!k.required) continue;
      const toml::node* value = entry.get(k.key);
      if (!value) {
        ctx.fail_at(element_path, source,
                    display(element_path) + " has no '" + k.key + "': every [[" + schema.name + "]] entry sets it (" +
                        k.doc + ")");
      }
      where = ctx.where(child(element_path, k.key), value->source());
    }
    schema.add_entry(m, where);
  }

  void check_entry_keys(const TableSchema& schema, const toml::table& entry, const KeyPath& element_path) {
    const std::vector<std::string> known = schema.key_names();
    for (const auto& [k, v] : in_file_order(entry)) {
      const std::string name(k->str());
      const KeySchema* spec = schema.find(name);
      const KeyPath key_path = child(element_path, name);
      if (!spec) {
        std::string hint = detail::did_you_mean_choice(name, known);
        if (hint.empty()) hint = " (known keys: " + join(known, ", ") + ")";
        ctx.fail_at(key_path, k->source(), "unknown key '" + name + "' in " + display(element_path) + hint);
      }
      spec->store(m, checked_value(*spec, Field{ctx, key_path, *v}));
    }
  }

  // ---- plugin tables

  // The plugin libraries in `dirs`, by the name a manifest gives them, sorted.
  static std::vector<std::string> installed_plugins(const std::vector<fs::path>& dirs) {
    std::vector<std::string> available;
    std::error_code ec;
    for (const auto& dir : dirs) {
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::string file = it->path().filename().string();
        if (!ends_with(file, ".so")) continue;
        file.resize(file.size() - 3);
        if (starts_with(file, "lib")) file.erase(0, 3);
        if (!file.empty() && std::find(available.begin(), available.end(), file) == available.end()) {
          available.push_back(file);
        }
      }
      ec.clear();
    }
    std::sort(available.begin(), available.end());
    return available;
  }

  fs::path find_plugin(const std::string& name, const KeyPath& path, const toml::node& value,
                       const std::string& slot_text) const {
    std::error_code ec;
    for (const auto& dir : search.dirs) {
      for (const std::string& candidate : {"lib" + name + ".so", name + ".so"}) {
        const fs::path p = dir / candidate;
        if (fs::is_regular_file(p, ec)) return p;
      }
    }
    std::vector<std::string> dirs;
    for (const auto& dir : search.dirs) dirs.push_back(dir.string());
    std::string message = "plugin '" + name + "' for " + slot_text + " not found";
    if (dirs.empty()) {
      message += ": no plugin directories to search (set KILN_PLUGIN_PATH, or give the path to the .so file)";
    } else {
      message += " in " + join(dirs, ", ");
      const std::string hint = detail::did_you_mean(name, installed_plugins(search.dirs));
      message += hint.empty() ? " (add its directory to KILN_PLUGIN_PATH, or give the path to the .so file)" : hint;
    }
    ctx.fail_at(path, value.source(), message);
  }

  [[noreturn]] void missing_path(const std::string& slot_text, const KeyPath& path, const toml::table& table,
                                 const toml::source_region& source) const {
    std::string hint;
    for (const auto& [k, v] : table) {
      const std::string name(k.str());
      if (name != "id" && detail::closest(name, {"path"}) == "path") {
        hint = " (did you mean 'path' instead of '" + name + "'?)";
        break;
      }
    }
    ctx.fail_at(path, source,
                slot_text + " has no 'path': set path = \"<plugin name>\" (looked up on the plugin path) or the "
                            "path to its .so file" + hint);
  }

  PluginSpec check_plugin(const std::string& slot, const KeyPath& path, const toml::node& node,
                          const toml::source_region& source) const {
    const std::string slot_text = path.size() == 1 ? "[" + slot + "]" : slot;
    const auto* table = node.as_table();
    if (!table) {
      std::string message = slot_text + " must be a table, not " + std::string(type_phrase(node));
      if (path.size() == 1 && node.is_array()) message += " (write [" + slot + "], not [[" + slot + "]])";
      ctx.fail_at(path, source, message);
    }
    PluginSpec spec;
    spec.slot = slot;
    spec.where = ctx.where(path, source);
    const toml::node* path_node = table->get("path");
    if (!path_node) missing_path(slot_text, path, *table, source);
    const Field path_field{ctx, child(path, "path"), *path_node};
    spec.path_text = path_field.nonempty_string();
    if (spec.path_text.find('/') != std::string::npos || ends_with(spec.path_text, ".so")) {
      spec.path = ctx.resolve(spec.path_text);
    } else {
      spec.path = find_plugin(spec.path_text, path_field.path, *path_node, slot_text);
    }
    if (const toml::node* id_node = table->get("id")) {
      spec.id = Field{ctx, child(path, "id"), *id_node}.string();
    }
    toml::table config = *table;
    config.erase("path");
    config.erase("id");
    spec.config_toml = toml_text(config);
    return spec;
  }

  void check_callbacks(const toml::key& key, const toml::node& node) {
    const KeyPath path{"callbacks"};
    const auto* array = node.as_array();
    if (!array) {
      std::string message = "callbacks must be an array of tables, not " + std::string(type_phrase(node));
      if (node.is_table()) message += " (write [[callbacks]] for each callback, not [callbacks])";
      ctx.fail_at(path, table_source(node, key), message);
    }
    m.callbacks.clear();
    for (std::size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      const KeyPath element_path = child(path, index_part(i));
      const auto& source = element.source().begin.line > 0 ? element.source() : table_source(node, key);
      if (!element.is_table()) {
        ctx.fail_at(element_path, source,
                    display(element_path) + " must be a table, not " + std::string(type_phrase(element)) +
                        " (write each callback as a [[callbacks]] table)");
      }
      m.callbacks.push_back(check_plugin(display(element_path), element_path, element, source));
    }
  }

  // ---- after every entry

  void require_plugins() const {
    if (!have_model) {
      fail(ctx.file + ": missing [model] table: add [model] with path = \"<plugin name or .so file>\"");
    }
    if (!have_data) {
      fail(ctx.file + ": missing [data] table: add [data] with path = \"<plugin name or .so file>\"");
    }
  }

  // Defaults that depend on other keys.
  void apply_dependent_defaults() {
    if (!has_key("run", "dir")) m.run.dir = (ctx.dir / "runs" / m.run.name).lexically_normal();
    if (!has_key("checkpoint", "dir")) m.checkpoint.dir = m.run.dir / "checkpoints";
    // torch's own defaults: Adagrad's eps is 1e-10, the others' 1e-8.
    if (!has_key("optimizer", "eps") && m.optimizer.name == OptimizerName::adagrad) m.optimizer.eps = 1e-10;
  }

  void check_across_keys() const {
    if (m.trainer.max_epochs == -1 && m.trainer.max_steps == -1 && m.trainer.max_time.empty()) {
      fail(where_key("trainer", has_key("trainer", "max_epochs") ? "max_epochs" : "max_steps") +
           ": trainer.max_epochs = -1 and trainer.max_steps = -1 would train forever: set max_epochs, "
           "max_steps or max_time to a limit");
    }
    const BatchLimit& every = m.trainer.val_check_interval;
    if (every.is_fraction ? every.fraction <= 0.0 : every.count <= 0) {
      fail(where_key("trainer", "val_check_interval") +
           ": trainer.val_check_interval must be above 0: a fraction of the epoch in (0.0, 1.0] or a number of "
           "batches >= 1 (to validate less often, use check_val_every_n_epoch; never: 0 there)");
    }
    if (m.optimizer.name == OptimizerName::sgd && m.optimizer.nesterov && m.optimizer.momentum <= 0.0) {
      fail(where_key("optimizer", "nesterov") +
           ": optimizer.nesterov = true needs optimizer.momentum > 0 (set momentum, e.g. 0.9, or nesterov = false)");
    }
    if (m.optimizer.fused && m.optimizer.name != OptimizerName::adam && m.optimizer.name != OptimizerName::adamw) {
      fail(where_key("optimizer", "fused") + ": optimizer.fused = true is for adam and adamw; optimizer.name is " +
           option_name(m.optimizer.name) + " (remove fused, or use adam or adamw)");
    }
    check_optimizer_groups();
    check_overfit_batches();
    check_averaging();
    // The averages would be kept in the model's bfloat16, where an EMA's
    // small steps round away; float32 averages of the masters are not built.
    if (m.trainer.precision == Precision::bf16_true && m.averaging.kind != AveragingKind::none)
      fail(where_key("averaging", "kind") + ": averaging.kind = '" + option_name(m.averaging.kind) +
           "' is not built for trainer.precision = 'bf16-true' (its averages would be bfloat16, where an average's "
           "small steps round away): use precision = 'bf16-mixed', or averaging.kind = 'none'");
    if (!m.trainer.master_weights && m.trainer.precision != Precision::bf16_true)
      fail(where_key("trainer", "master_weights") + ": trainer.master_weights = false is for trainer.precision = "
           "'bf16-true' (the other precisions keep float32 weights, which are their own masters): set precision = "
           "'bf16-true', or remove master_weights");
    if (!m.trainer.master_weights && m.optimizer.name != OptimizerName::adam && m.optimizer.name != OptimizerName::adamw)
      fail(where_key("trainer", "master_weights") + ": trainer.master_weights = false is built for adam and adamw, "
           "whose step computes each bfloat16 weight in float32 and rounds it once; optimizer.name is " +
           option_name(m.optimizer.name) + " (use adam or adamw, or master_weights = true)");
    if (m.checkpoint.enabled && m.checkpoint.monitor.empty() && m.checkpoint.save_top_k > 1) {
      fail(where_key("checkpoint", "save_top_k") + ": checkpoint.save_top_k = " +
           std::to_string(m.checkpoint.save_top_k) +
           " needs checkpoint.monitor to rank checkpoints by (set monitor = \"<metric>\", or save_top_k = 1)");
    }
    if (m.distributed.backend == DistributedBackend::nccl && m.run.device == "cpu") {
      fail(where_key("distributed", "backend") +
           ": distributed.backend = 'nccl' needs a CUDA device (set run.device = \"cuda\", or backend = \"gloo\")");
    }
  }

  static bool is_zero(const BatchLimit& limit) { return limit.is_fraction ? limit.fraction == 0.0 : limit.count == 0; }

  // overfit_batches decides the training and validation batches itself.
  void check_overfit_batches() const {
    if (is_zero(m.trainer.overfit_batches)) return;
    for (const char* key : {"limit_train_batches", "limit_val_batches", "fast_dev_run"}) {
      if (!has_key("trainer", key)) continue;
      fail(where_key("trainer", key) + ": trainer." + key +
           " cannot be set with trainer.overfit_batches, which trains and validates on the same first batches of "
           "the training split (remove one of them)");
    }
    // Lightning turns the shuffling off with a warning; a manifest that asks
    // for both says two things, and kiln would honour only one.
    if (has_key("trainer", "shuffle") && m.trainer.shuffle)
      fail(where_key("trainer", "shuffle") +
           ": trainer.shuffle = true cannot be set with trainer.overfit_batches, which trains and validates on "
           "the same first batches in order (remove trainer.shuffle)");
  }

  // [averaging]: the keys of its kind only, with values it can honour.
  void check_averaging() const {
    const AveragingConfig& a = m.averaging;
    const std::vector<std::string> ema_keys{"decay", "start_step"};
    const std::vector<std::string> swa_keys{"start_epoch", "swa_lr", "annealing_epochs"};
    const std::string kind = option_name(a.kind);
    // kind = "none" turns the table off with its keys in place; keys with
    // no kind at all are a kind forgotten, and would average nothing.
    if (!has_key("averaging", "kind"))
      for (const auto* keys : {&ema_keys, &swa_keys})
        for (const std::string& key : *keys)
          if (has_key("averaging", key))
            fail(where_key("averaging", key) + ": averaging." + key + " is set but averaging.kind is not, so nothing " +
                 "would be averaged: set averaging.kind = '" + (keys == &ema_keys ? "ema" : "swa") +
                 "' (or 'none' to keep the table off)");
    for (const auto* keys : {&ema_keys, &swa_keys}) {
      const bool own = (keys == &ema_keys) == (a.kind == AveragingKind::ema);
      if (own || a.kind == AveragingKind::none) continue;
      for (const std::string& key : *keys)
        if (has_key("averaging", key))
          fail(where_key("averaging", key) + ": averaging." + key + " is not read with averaging.kind = '" + kind +
               "' (it is for " + (keys == &ema_keys ? "ema" : "swa") + ")");
    }
    if (!(a.decay > 0.0 && a.decay < 1.0))
      fail(where_key("averaging", "decay") + ": averaging.decay must be in (0.0, 1.0), not " + float_text(a.decay) +
           " (0.999 is usual; 1 would never move, 0 would be the weights themselves)");
    if (a.kind != AveragingKind::swa) return;
    const int64_t max_epochs = m.trainer.max_epochs;
    if (a.start_epoch.is_fraction && max_epochs < 0)
      fail(where_key("averaging", has_key("averaging", "start_epoch") ? "start_epoch" : "kind") +
           ": averaging.start_epoch = " + float_text(a.start_epoch.fraction) +
           " is a fraction of trainer.max_epochs, which is -1 (no limit): set max_epochs, or start_epoch to an epoch "
           "number");
    const int64_t start = swa_start_epoch(a, max_epochs);
    if (max_epochs >= 0 && start >= max_epochs)
      fail(where_key("averaging", has_key("averaging", "start_epoch") ? "start_epoch" : "kind") +
           ": SWA would start at epoch " + std::to_string(start) + " of a fit of " + std::to_string(max_epochs) +
           " epochs (0-based) and never average: set averaging.start_epoch below trainer.max_epochs");
    if (a.annealing_epochs > 0 && a.swa_lr == 0.0)
      fail(where_key("averaging", "annealing_epochs") +
           ": averaging.annealing_epochs anneals to averaging.swa_lr, which is not set (set swa_lr > 0, or remove "
           "annealing_epochs)");
    if (m.scheduler.interval == SchedulerInterval::step && a.swa_lr > 0.0)
      fail(where_key("averaging", "swa_lr") +
           ": averaging.swa_lr replaces the learning-rate schedule at epoch boundaries, but [scheduler] interval = "
           "'step' sets the rate every step (use interval = 'epoch', or leave swa_lr unset to keep the schedule)");
  }

  // Each group sets only options its optimizer reads (an option the
  // optimizer ignores would silently do nothing), and nesterov keeps its
  // momentum.
  void check_optimizer_groups() const {
    const toml::table* optimizer = host_table("optimizer");
    const toml::array* entries = optimizer ? optimizer->get_as<toml::array>("groups") : nullptr;
    if (!entries) return;
    const std::vector<std::string>& takes = optimizer_option_keys(m.optimizer.name);
    for (std::size_t i = 0; i < entries->size() && i < m.optimizer.groups.size(); ++i) {
      const toml::table* entry = entries->get(i)->as_table();
      const KeyPath entry_path{"optimizer", "groups", index_part(i)};
      for (const auto& [k, v] : in_file_order(*entry)) {
        const std::string name(k->str());
        if (name == "match" || std::find(takes.begin(), takes.end(), name) != takes.end()) continue;
        const KeyPath key_path = child(entry_path, name);
        ctx.fail_at(key_path, k->source(),
                    display(key_path) + ": " + option_name(m.optimizer.name) + " takes no " + name +
                        " (the options it takes: " + join(takes, ", ") + ")");
      }
      const OptimizerConfig options = m.optimizer.for_group(m.optimizer.groups[i]);
      if (options.name == OptimizerName::sgd && options.nesterov && options.momentum <= 0.0) {
        ctx.fail_at(entry_path, entry->source(),
                    display(entry_path) + ": nesterov = true needs momentum > 0 (set momentum in the group or in "
                                          "[optimizer], or nesterov = false)");
      }
    }
  }
};

}  // namespace

void validate_manifest(const toml::table& root, const Context& ctx, Manifest& manifest,
                       const PluginSearchPath& search) {
  Validator(ctx, manifest, search).run(root);
}

}  // namespace kiln::manifest_detail
