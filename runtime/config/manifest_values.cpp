// Where a manifest value is, and its typed, checked reading
// (config/manifest_values.hpp).
#include "config/manifest_values.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "config/input_guard.hpp"
#include "config/text.hpp"
#include "kiln/detail/suggest.hpp"

namespace kiln::manifest_detail {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Key paths

std::string display(const KeyPath& path) {
  std::string out;
  for (const auto& part : path) {
    if (!out.empty() && !starts_with(part, "[")) out += '.';
    out += part;
  }
  return out;
}

std::string index_part(std::size_t index) { return "[" + std::to_string(index) + "]"; }

std::string path_id(const KeyPath& path) { return join(path, std::string(1, '\x1f')); }

KeyPath child(KeyPath path, std::string part) {
  path.push_back(std::move(part));
  return path;
}

// ---------------------------------------------------------------------------
// Where things are

std::string Context::where(const KeyPath& path, const toml::source_region& source) const {
  KeyPath p = path;
  while (!p.empty()) {
    const auto it = set_by.find(path_id(p));
    if (it != set_by.end()) return "--set " + it->second;
    p.pop_back();
  }
  if (source.begin.line > 0) {
    return file + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
  }
  return file;
}

void Context::fail_at(const KeyPath& path, const toml::source_region& source, const std::string& what) const {
  manifest_detail::fail(where(path, source) + ": " + what);
}

fs::path Context::resolve(const std::string& text) const {
  const fs::path p(text);
  if (p.is_absolute()) return p.lexically_normal();
  return (dir / p).lexically_normal();
}

const toml::source_region& table_source(const toml::node& node, const toml::key& key) {
  const bool container = node.is_table() || node.is_array();
  return container && node.source().begin.line > 0 ? node.source() : key.source();
}

const char* type_phrase(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// A value as the user would recognise it in a message.
std::string value_text(const toml::node& node) {
  if (const auto* s = node.as_string()) return "'" + s->get() + "'";
  if (const auto* i = node.as_integer()) return std::to_string(i->get());
  if (const auto* f = node.as_floating_point()) return format_double(f->get());
  if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
  return type_phrase(node);
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& table) {
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  for (const auto& [key, node] : table) entries.emplace_back(&key, &node);
  auto rank = [](const std::pair<const toml::key*, const toml::node*>& e) {
    const auto& s = e.first->source().begin.line > 0 ? e.first->source() : e.second->source();
    const bool placed = s.begin.line > 0;
    return std::make_tuple(!placed, placed ? s.begin.line : 0u, placed ? s.begin.column : 0u);
  };
  std::stable_sort(entries.begin(), entries.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return entries;
}

// ---------------------------------------------------------------------------
// Typed reads of one host-owned value

void Field::wrong_type(const std::string& expected, toml::node_type expected_type) const {
  std::string message = name() + " must be " + expected + ", not " + type_phrase(node);
  if (const auto* f = node.as_floating_point(); f && expected_type == toml::node_type::integer) {
    const double d = f->get();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
      message += " (write " + std::to_string(static_cast<long long>(d)) + ", without a decimal point)";
    }
  } else if (const auto* s = node.as_string(); s && expected_type != toml::node_type::string) {
    // "3" where 3 was meant: say so.
    const std::optional<toml::table> probe = parse_one_value(s->get());
    const toml::node* v = probe ? probe->get("v") : nullptr;
    const bool fits = v && (v->type() == expected_type ||
                            (expected_type == toml::node_type::floating_point && v->is_integer()));
    if (fits) message += " (write " + s->get() + " without quotes)";
  }
  fail(message);
}

int64_t Field::integer() const {
  if (const auto* v = node.as_integer()) return v->get();
  wrong_type("an integer", toml::node_type::integer);
}

int64_t Field::integer_at_least(int64_t min) const {
  const int64_t v = integer();
  if (v < min) fail(name() + " must be >= " + std::to_string(min) + ", not " + std::to_string(v));
  return v;
}

double Field::number() const {
  if (const auto* i = node.as_integer()) return static_cast<double>(i->get());
  if (const auto* f = node.as_floating_point()) {
    if (!std::isfinite(f->get())) fail(name() + " must be a finite number, not " + format_double(f->get()));
    return f->get();
  }
  wrong_type("a number", toml::node_type::floating_point);
}

bool Field::boolean() const {
  if (const auto* v = node.as_boolean()) return v->get();
  wrong_type("a boolean (true or false)", toml::node_type::boolean);
}

std::string Field::string() const {
  if (const auto* v = node.as_string()) return v->get();
  wrong_type("a string", toml::node_type::string);
}

std::string Field::nonempty_string() const {
  std::string v = string();
  if (v.empty()) fail(name() + " must not be empty");
  return v;
}

std::string Field::choice(const std::vector<std::string>& choices) const {
  std::string v = node.is_integer() ? std::to_string(node.as_integer()->get()) : string();
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    fail(name() + " must be " + quoted_list(choices) + ", not '" + v + "'" + detail::did_you_mean_choice(v, choices));
  }
  return v;
}

// ---------------------------------------------------------------------------
// Host-owned values, checked as the schema declares them

namespace {

SchemaValue integer_value(const KeySchema& k, const Field& f) {
  const int64_t v = f.integer();
  if (k.int_min && k.int_max && (v < *k.int_min || v > *k.int_max)) {
    f.fail(f.name() + " must be between " + std::to_string(*k.int_min) + " and " + std::to_string(*k.int_max) +
           ", not " + std::to_string(v));
  }
  if (k.int_min && v < *k.int_min) f.fail(f.name() + " must be >= " + std::to_string(*k.int_min) + ", not " + std::to_string(v));
  return v;
}

SchemaValue number_value(const KeySchema& k, const Field& f) {
  const double v = f.number();
  if (k.min && k.max && (v < *k.min || v > *k.max)) {
    f.fail(f.name() + " must be between " + format_double(*k.min) + " and " + format_double(*k.max) + ", not " +
           value_text(f.node));
  }
  if (k.min && k.min_exclusive && !(v > *k.min)) {
    f.fail(f.name() + " must be > " + format_double(*k.min) + ", not " + value_text(f.node));
  }
  if (k.min && v < *k.min) f.fail(f.name() + " must be >= " + format_double(*k.min) + ", not " + value_text(f.node));
  return v;
}

SchemaValue string_value(const KeySchema& k, const Field& f) {
  std::string v = k.nonempty ? f.nonempty_string() : f.string();
  if (k.refuse) {
    if (const std::string why = k.refuse(f.name(), v); !why.empty()) f.fail(why);
  }
  if (k.kind == ValueKind::path) return f.ctx.resolve(v);
  return v;
}

SchemaValue choice_value(const KeySchema& k, const Field& f) {
  const std::string v = f.choice(k.choices);
  return ChoiceIndex{static_cast<std::size_t>(std::find(k.choices.begin(), k.choices.end(), v) - k.choices.begin())};
}

// A count or a fraction (trainer.limit_*_batches; averaging.start_epoch
// counts epochs).
SchemaValue batch_limit_value(const KeySchema& k, const Field& f) {
  BatchLimit limit;
  if (const auto* i = f.node.as_integer()) {
    if (i->get() < 0) {
      f.fail(f.name() + " must be " + k.counts + " (an integer >= 0) or a fraction (a float in [0.0, 1.0]), not " +
             std::to_string(i->get()));
    }
    limit.is_fraction = false;
    limit.count = i->get();
    return limit;
  }
  if (const auto* d = f.node.as_floating_point()) {
    const double v = d->get();
    if (!(v >= 0.0 && v <= 1.0)) {
      std::string message =
          f.name() + " must be a fraction in [0.0, 1.0] (a float) or " + k.counts + " (an integer), not " + format_double(v);
      if (std::isfinite(v) && v > 1.0 && v == std::floor(v) && v < 1e15) {
        message += " (write " + std::to_string(static_cast<long long>(v)) + " for " + k.counts + ")";
      }
      f.fail(message);
    }
    limit.is_fraction = true;
    limit.fraction = v;
    return limit;
  }
  f.wrong_type("an integer (" + k.counts + ") or a float in [0.0, 1.0] (a fraction)", toml::node_type::integer);
}

// "auto" = -1 (trainer.data_workers).
SchemaValue count_or_auto_value(const KeySchema& k, const Field& f) {
  if (const auto* s = f.node.as_string()) {
    if (s->get() == "auto") return int64_t{-1};
    const std::string& v = s->get();
    const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
    f.fail(f.name() + " must be \"auto\" or an integer, not '" + v + "'" + (digits ? " (write " + v + " without quotes)" : ""));
  }
  if (!f.node.is_integer()) f.wrong_type("\"auto\" or an integer", toml::node_type::integer);
  return integer_value(k, f);
}

// true = 1 (trainer.fast_dev_run).
SchemaValue flag_or_count_value(const Field& f) {
  if (const auto* b = f.node.as_boolean()) return int64_t{b->get() ? 1 : 0};
  if (f.node.is_integer()) return f.integer_at_least(0);
  f.wrong_type("a boolean or an integer number of batches", toml::node_type::integer);
}

SchemaValue betas_value(const Field& f) {
  const auto* array = f.node.as_array();
  if (!array) f.wrong_type("an array of two numbers, e.g. [0.9, 0.999]", toml::node_type::array);
  if (array->size() != 2) {
    f.fail(f.name() + " must have two elements [beta1, beta2], e.g. [0.9, 0.999], not " + std::to_string(array->size()));
  }
  double betas[2];
  for (std::size_t i = 0; i < 2; ++i) {
    const Field element{f.ctx, child(f.path, index_part(i)), *array->get(i)};
    betas[i] = element.number();
    if (betas[i] < 0.0 || betas[i] >= 1.0) {
      element.fail(element.name() + " must be in [0, 1), not " + value_text(element.node));
    }
  }
  return std::make_pair(betas[0], betas[1]);
}

// An array of distinct names out of a closed set (logging.loggers).
SchemaValue choice_list_value(const KeySchema& k, const Field& f) {
  const auto* array = f.node.as_array();
  if (!array) {
    std::string message = f.name() + " must be an array of " + quoted_list(k.choices) + ", not " + type_phrase(f.node);
    if (const auto* s = f.node.as_string()) message += " (write [\"" + s->get() + "\"])";
    f.fail(message);
  }
  std::vector<std::string> names;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const Field element{f.ctx, child(f.path, index_part(i)), *array->get(i)};
    std::string v = element.choice(k.choices);
    if (std::find(names.begin(), names.end(), v) != names.end()) {
      element.fail(f.name() + " lists '" + v + "' twice");
    }
    names.push_back(std::move(v));
  }
  return names;
}

// Glob patterns: a non-empty array of non-empty strings.
SchemaValue patterns_value(const Field& f) {
  const auto* array = f.node.as_array();
  if (!array) f.wrong_type("an array of glob patterns, e.g. [\"*.bias\"]", toml::node_type::array);
  if (array->empty()) f.fail(f.name() + " must list at least one pattern, e.g. [\"*.bias\"]");
  std::vector<std::string> patterns;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const Field element{f.ctx, child(f.path, index_part(i)), *array->get(i)};
    patterns.push_back(element.nonempty_string());
  }
  return patterns;
}

// A table of strings (logging.mlflow.tags): { team = "vision" }.
SchemaValue string_table_value(const Field& f) {
  const auto* table = f.node.as_table();
  if (!table) f.wrong_type("a table of strings, e.g. { team = \"vision\" }", toml::node_type::table);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : *table) {
    const Field element{f.ctx, child(f.path, std::string(k.str())), v};
    out[std::string(k.str())] = element.nonempty_string();
  }
  return out;
}

}  // namespace

SchemaValue checked_value(const KeySchema& k, const Field& f) {
  switch (k.kind) {
    case ValueKind::boolean: return f.boolean();
    case ValueKind::integer: return integer_value(k, f);
    case ValueKind::number: return number_value(k, f);
    case ValueKind::string:
    case ValueKind::path: return string_value(k, f);
    case ValueKind::choice: return choice_value(k, f);
    case ValueKind::batch_limit: return batch_limit_value(k, f);
    case ValueKind::flag_or_count: return flag_or_count_value(f);
    case ValueKind::count_or_auto: return count_or_auto_value(k, f);
    case ValueKind::betas: return betas_value(f);
    case ValueKind::choice_list: return choice_list_value(k, f);
    case ValueKind::patterns: return patterns_value(f);
    case ValueKind::string_table: return string_table_value(f);
  }
  f.fail(f.name() + " has no reader (a bug in kiln's manifest schema)");
}

}  // namespace kiln::manifest_detail
