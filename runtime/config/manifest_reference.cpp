#include "config/manifest_reference.hpp"

#include <sstream>

#include "config/manifest_schema.hpp"

namespace kiln {

namespace {

std::string code(const std::string& s) { return "`" + s + "`"; }

std::string type_text(const KeySchema& k) {
  switch (k.kind) {
    case ValueKind::boolean: return "boolean";
    case ValueKind::integer: return "integer";
    case ValueKind::number: return "number";
    case ValueKind::string: return "string";
    case ValueKind::path: return "string (path)";
    case ValueKind::choice: return "string";
    case ValueKind::batch_limit: return "integer or float";
    case ValueKind::flag_or_count: return "boolean or integer";
    case ValueKind::count_or_auto: return "integer or string";
    case ValueKind::betas: return "array of 2 numbers";
    case ValueKind::choice_list: return "array of strings";
    case ValueKind::patterns: return "array of strings";
    case ValueKind::string_table: return "table of strings";
  }
  return "";
}

std::string allowed_text(const KeySchema& k) {
  if (!k.allowed_text.empty()) return k.allowed_text;
  switch (k.kind) {
    case ValueKind::boolean: return "`true`, `false`";
    case ValueKind::integer:
      if (k.int_min && k.int_max) return std::to_string(*k.int_min) + " to " + std::to_string(*k.int_max);
      if (k.int_min) return ">= " + std::to_string(*k.int_min);
      return "any";
    case ValueKind::number:
      if (k.min && k.max) return float_text(*k.min) + " to " + float_text(*k.max);
      if (k.min) return (k.min_exclusive ? "> " : ">= ") + float_text(*k.min);
      return "any (finite)";
    case ValueKind::string:
    case ValueKind::path: return k.nonempty ? "not empty" : "any";
    case ValueKind::choice:
    case ValueKind::choice_list: {
      std::string out;
      for (const auto& c : k.choices) out += (out.empty() ? "" : ", ") + code("\"" + c + "\"");
      return out;
    }
    case ValueKind::batch_limit: return "an integer >= 0 (batches) or a float in [0.0, 1.0] (a fraction)";
    case ValueKind::flag_or_count: return "`true` (= 1), `false` (= 0) or an integer >= 0";
    case ValueKind::count_or_auto:
      return "`\"auto\"` or an integer " + std::to_string(k.int_min.value_or(0)) + " to " + std::to_string(k.int_max.value_or(0));
    case ValueKind::betas: return "each in [0, 1)";
    case ValueKind::patterns: return "at least one; none empty";
    case ValueKind::string_table: return "values not empty";
  }
  return "";
}

std::string default_text(const KeySchema& k, const Manifest& defaults) {
  if (!k.default_text.empty()) return k.default_text;
  return code(k.show(defaults));
}

void key_rows(std::ostringstream& out, const std::vector<KeySchema>& keys, const Manifest& defaults) {
  out << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const auto& k : keys) {
    out << "| " << code(k.table.empty() ? k.key : k.dotted()) << " | " << type_text(k) << " | " << default_text(k, defaults) << " | "
        << allowed_text(k) << " | " << k.doc << " |\n";
  }
}

}  // namespace

std::string manifest_reference_markdown() {
  const Manifest defaults;
  std::ostringstream out;
  out << "# Manifest reference\n\n"
         "<!-- Generated from runtime/config/manifest_schema.cpp; do not edit by hand. Refresh with:\n"
         "     build/bin/kiln manifest-reference > docs/manifest.md -->\n\n"
         "Every key the host reads from a run manifest. A key that is not listed is refused\n"
         "(with a suggestion), and so is a value of the wrong type or out of range: kiln exits 2\n"
         "with one line naming the file, line and column. `--set table.key=VALUE` takes the same\n"
         "keys; a string key takes VALUE as text (`--set run.name=2024` is the string \"2024\").\n"
         "Plugin tables belong to their plugins, except `path` and `id`.\n";
  for (const auto& table : manifest_schema()) {
    const std::string header = table.array_of_tables ? "[[" + table.name + "]]" : "[" + table.name + "]";
    out << "\n## " << header << "\n\n" << table.doc << ".\n\n";
    key_rows(out, table.keys, defaults);
  }
  out << "\n## [model], [data], [[callbacks]]\n\n"
         "Plugin tables: the host reads these two keys and hands every other key to the plugin.\n\n";
  key_rows(out, plugin_host_keys(), defaults);
  return out.str();
}

}  // namespace kiln
