#include "config/hparams.hpp"
#include "config/hparams_table.hpp"

#include "util/json_string.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include <toml++/toml.h>

// The manifest code's parser entry (its input guard): the one path by which
// kiln hands text to toml++.
#include "config/input_guard.hpp"
#include "util/shortest_double.hpp"

namespace kiln {

namespace {

// A TOML float as metrics.csv writes a number (Python's repr: 0.003, 10.0,
// 1e-05, every form of it a TOML float); NaN and infinities as TOML spells them.
std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return python_float_repr(v);
}

// A TOML basic string: JSON's escapes are all TOML's too.
std::string quoted(const std::string& s) { return json_string(s); }

std::string key_text(const std::string& key) {
  bool bare = !key.empty();
  for (const char c : key)
    bare = bare && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-');
  return bare ? key : quoted(key);
}

// A value as compact TOML text: [512, 256], ["*.bias", "*norm*"], {a = 1}.
std::string value_text(const toml::node& node) {
  if (const auto* s = node.as_string()) return quoted(s->get());
  if (const auto* i = node.as_integer()) return std::to_string(i->get());
  if (const auto* f = node.as_floating_point()) return float_text(f->get());
  if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
  if (const auto* a = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + value_text(*a->get(i));
    return out + "]";
  }
  if (const auto* t = node.as_table()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : *t) {
      out += (first ? "" : ", ") + key_text(std::string(k.str())) + " = " + value_text(v);
      first = false;
    }
    return out + "}";
  }
  // Dates and times, as toml++ writes them.
  std::ostringstream out;
  node.visit([&](const auto& n) { out << toml::toml_formatter{n}; });
  return out.str();
}

void flatten(const toml::table& table, const std::string& prefix, std::vector<HParam>& out);

void flatten_node(const toml::node& node, const std::string& name, std::vector<HParam>& out) {
  if (const auto* t = node.as_table()) {
    flatten(*t, name + ".", out);
  } else if (const auto* a = node.as_array(); a && !a->empty() && a->is_array_of_tables()) {
    // [[callbacks]], [[optimizer.groups]]: one key prefix per entry.
    for (size_t i = 0; i < a->size(); ++i) flatten(*a->get(i)->as_table(), name + "." + std::to_string(i) + ".", out);
  } else if (const auto* i = node.as_integer()) {
    // Beyond 2^53 a double is not the integer (a seed copied back from
    // TensorBoard would be another run's): those are text.
    constexpr int64_t exact = int64_t{1} << 53;
    if (i->get() >= -exact && i->get() <= exact)
      out.push_back(HParam::of_number(name, static_cast<double>(i->get())));
    else
      out.push_back(HParam::of_string(name, std::to_string(i->get())));
  } else if (const auto* f = node.as_floating_point()) {
    if (std::isfinite(f->get()))
      out.push_back(HParam::of_number(name, f->get()));
    else
      out.push_back(HParam::of_string(name, float_text(f->get())));
  } else if (const auto* b = node.as_boolean()) {
    out.push_back(HParam::of_bool(name, b->get()));
  } else if (const auto* s = node.as_string()) {
    out.push_back(HParam::of_string(name, s->get()));
  } else {
    out.push_back(HParam::of_string(name, value_text(node)));  // arrays, dates, times
  }
}

void flatten(const toml::table& table, const std::string& prefix, std::vector<HParam>& out) {
  for (const auto& [key, value] : table) flatten_node(value, prefix + std::string(key.str()), out);
}

}  // namespace

std::vector<HParam> flatten_manifest_hparams(const toml::table& root) {
  std::vector<HParam> out;
  flatten(root, "", out);
  return out;
}

std::vector<HParam> flatten_manifest_hparams(const std::string& toml_text) {
  return flatten_manifest_hparams(manifest_detail::parse_manifest_text(toml_text, "manifest"));
}

}  // namespace kiln
