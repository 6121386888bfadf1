// The schema of the manifest's host tables: each key the host reads from
// [run], [trainer], [optimizer], [scheduler], [checkpoint], [distributed] and
// [logging]
// is declared once, in manifest_schema.cpp, with its type, range or closed
// set, one line of documentation and the Manifest member it fills (whose
// initializer is its default). That one declaration drives validation
// (manifest.cpp), the typing of --set values, and docs/manifest.md
// (manifest_reference.cpp).
//
// Plugin tables are the plugins' own; only their host keys (`path`, `id`) are
// declared here, for --set and the reference.
//
// No TOML and no LibTorch in this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "config/manifest.hpp"

namespace kiln {

// What a key's value is, as written in the manifest.
enum class ValueKind {
  boolean,
  integer,
  number,         // an integer or a float, finite
  string,
  path,           // a string, resolved relative to the manifest's directory
  choice,         // a string out of a closed set (config/options.hpp)
  batch_limit,    // an integer >= 0 (batches) or a float in [0, 1] (a fraction)
  flag_or_count,  // true/false or an integer >= 0 (trainer.fast_dev_run)
  betas,          // [beta1, beta2], each a number in [0, 1) (optimizer.betas)
  choice_list,    // an array of distinct strings out of a closed set (logging.loggers)
  patterns,       // a non-empty array of non-empty strings (optimizer.groups[i].match)
  count_or_auto,  // "auto" (-1) or an integer >= 0 (trainer.data_workers)
  string_table,   // a table of string values (logging.mlflow.tags)
};

// The index of a name in a closed set.
struct ChoiceIndex {
  std::size_t index = 0;
};

// A checked value on its way into the Manifest.
using SchemaValue = std::variant<bool, int64_t, double, std::string, std::filesystem::path, ChoiceIndex, BatchLimit,
                                 std::pair<double, double>, std::vector<std::string>,
                                 std::map<std::string, std::string>>;

struct KeySchema {
  std::string table;  // "trainer"
  std::string key;    // "max_epochs"
  ValueKind kind = ValueKind::string;
  std::optional<int64_t> int_min, int_max;  // integer: inclusive bounds
  std::optional<double> min, max;           // number: bounds, inclusive unless min_exclusive
  bool min_exclusive = false;
  bool nonempty = false;              // string, path: "" is refused
  bool required = false;              // an entry of an array of tables must set it
  bool in_array = false;              // a key of each entry of an array of tables
  std::vector<std::string> choices;   // choice, choice_list: the closed set, in enum order
  // string: the whole message for a value it refuses, "" when fine (`name` is
  // the dotted key as messages show it).
  std::function<std::string(const std::string& name, const std::string& value)> refuse;
  std::string allowed_text;           // the reference's "allowed" cell where `refuse` decides
  std::string counts = "a number of batches";  // batch_limit: what its integer form counts, as messages name it
  std::string default_text;           // the reference's "default" cell where it is not the member's initializer
  std::string doc;                    // one line
  std::function<void(Manifest&, const SchemaValue&)> store;
  std::function<std::string(const Manifest&)> show;  // the value as TOML (for the default)

  // "optimizer.lr"; a key of an array of tables as its first entry's
  // ("optimizer.groups[0].lr"), as messages and --set name it.
  std::string dotted() const { return table + (in_array ? "[0]." : ".") + key; }
  // --set takes its value as text even when it reads as a number or boolean.
  bool takes_string() const {
    return kind == ValueKind::string || kind == ValueKind::path || kind == ValueKind::choice;
  }
};

struct TableSchema {
  std::string name;  // "trainer", or "optimizer.groups" for an array of tables
  std::string doc;   // one line
  std::vector<KeySchema> keys;
  // An array of tables ([[optimizer.groups]]) inside the table named before
  // its last dot: each entry is opened with `add_entry` (given where it is
  // written, for later messages), then its keys are stored into that entry.
  bool array_of_tables = false;
  std::function<void(Manifest&, const std::string& where)> add_entry;

  const KeySchema* find(const std::string& key) const;
  std::vector<std::string> key_names() const;
};

// The host tables, in the order the reference lists them (an array of
// tables right after the table that holds it).
const std::vector<TableSchema>& manifest_schema();
const TableSchema* find_table_schema(const std::string& table);
// A key an earlier kiln read, now named otherwise: what to write instead
// (" (renamed: ...)"), or empty.
std::string renamed_key_hint(const std::string& table, const std::string& key);
const KeySchema* find_key_schema(const std::string& table, const std::string& key);

// A float as the schema shows it: the shortest text that reads back as the
// same double, with a point (60.0, 0.001, 1e-08).
std::string float_text(double d);

// The [optimizer] keys optimizer `name` reads, in the order messages list
// them; a parameter group may set exactly these.
const std::vector<std::string>& optimizer_option_keys(OptimizerName name);

// The host keys of every plugin table ([model], [data], each [[callbacks]]);
// `table` is empty. Checked by the manifest's plugin code, not the schema.
const std::vector<KeySchema>& plugin_host_keys();

}  // namespace kiln
