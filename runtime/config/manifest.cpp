// The run manifest: reading, --set overrides, validation and plugin lookup.
//
// Every problem becomes one kiln::InputError line that starts with where it is:
// "<file>:<line>:<col>" for something written in the manifest, "--set <arg>"
// for something an override wrote (its nodes have no position in the file),
// or just "<file>" when there is nothing more precise. Keys are checked in the
// order they appear in the file, so the error a user sees is the first one.
#include "config/manifest.hpp"

#include "config/manifest_schema.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>

#include <toml++/toml.h>

#include "kiln/detail/suggest.hpp"
#include "util/errors.hpp"

namespace kiln {

namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Small text helpers

// Messages are exactly one line, whatever a user put in a key or a value.
std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& message) { throw InputError(one_line(message)); }

// Where `text` has a non-ASCII byte outside a string or a comment, as
// "line:col"; empty when it has none. Valid TOML never does (bare keys are
// ASCII), and toml++ 3.3 reaches __builtin_unreachable() while classifying
// some such characters as whitespace or not (is_non_ascii_horizontal_
// whitespace: U+00A1-U+0499, U+2C5E-U+3057, U+FB26-U+FEFE, e.g. U+0193;
// found by tests/fuzz): text that would take that path never reaches it.
//
// "Inside a string" is what toml++ will read as one: a quote opens a string
// only where a key or a value starts (at a line's start, after '=', '[', '{'
// or ',', or after a '.' of a dotted key), never inside a bare value, which
// toml++ reads up to whitespace, ',', ']', '}' or '#' whatever it holds
// (1e'...', 1$a="..."); and so does this scan. Inside a
// multi-line basic string, toml++ also classifies the character after a
// backslash and those it skips after a line-ending backslash: they must be
// ASCII too.
std::string non_ascii_outside_strings(std::string_view text) {
  enum class In { code, comment, basic, literal, multi_basic, multi_literal, escape, line_ending } in = In::code;
  constexpr std::string_view kTripleQuote = "\"\"\"", kTripleApostrophe = "'''";
  size_t line = 1, column = 0;
  char last = '\n';        // the last character of code other than blanks; '\n' at a line's start
  bool key_side = true;     // a '.' here joins a dotted key (not a number's point)
  bool header = false;      // inside the brackets of [table] or [[table]]
  bool bare = false;        // inside a bare value (not a string, array or table)
  std::vector<char> open;   // the '[' of arrays and '{' of inline tables open in a value
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ++column;
    auto starts = [&](std::string_view s) { return text.substr(i, s.size()) == s; };
    auto here = [&] { return std::to_string(line) + ":" + std::to_string(column); };
    switch (in) {
      case In::comment:
        if (c != '\n') break;
        in = In::code;
        [[fallthrough]];
      case In::code: {
        if (!ascii(c)) return here();
        if (bare) {
          // toml++ reads a bare value (a number, a date, true, or junk) up to
          // one of these, classifying every character: nothing in it opens
          // a string, an array or a table.
          if (!blank(c) && c != ',' && c != ']' && c != '}' && c != '#') {
            last = c;
            break;
          }
          bare = false;
        }
        const bool opens = last == '\n' || last == '=' || last == '[' || last == '{' || last == ',' ||
                           (last == '.' && key_side);
        if (c == '#') {
          in = In::comment;
        } else if ((c == '"' || c == '\'') && opens) {
          if (starts(kTripleQuote)) {
            in = In::multi_basic, i += 2, column += 2;
          } else if (starts(kTripleApostrophe)) {
            in = In::multi_literal, i += 2, column += 2;
          } else {
            in = c == '"' ? In::basic : In::literal;
          }
        } else if (c == '=' && key_side && !header) {
          key_side = false;
        } else if (!key_side && !header && !blank(c) && c != '[' && c != '{' && c != ']' && c != '}' && c != ',') {
          bare = true;  // a value that is not a string, an array or an inline table
        } else if (c == '{') {
          open.push_back('{'), key_side = true;
        } else if (c == '[') {
          if (last == '\n' && open.empty()) header = true, key_side = true;
          else if (!header) open.push_back('['), key_side = false;
        } else if (c == ']' || c == '}') {
          if (!open.empty()) open.pop_back(), key_side = false;
          else header = false;
        } else if (c == ',') {
          key_side = !open.empty() && open.back() == '{';
        } else if (c == '\n' && open.empty()) {
          key_side = true, header = false;
        }
        if (c == '\n' || !blank(c)) last = c;
        break;
      }
      case In::basic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') ++i, ++column;
        else if (c == '"') in = In::code, last = c;
        else if (c == '\n') in = In::code, last = c;
        break;
      case In::literal:
        if (c == '\'' || c == '\n') in = In::code, last = c;
        break;
      case In::escape:  // the character after a backslash in a multi-line basic string
        if (!ascii(c)) return here();
        in = blank(c) ? In::line_ending : In::multi_basic;
        break;
      case In::line_ending:  // what toml++ skips after a line-ending backslash
        if (!ascii(c)) return here();
        if (blank(c)) break;
        in = In::multi_basic;
        [[fallthrough]];
      case In::multi_basic:
        if (c == '\\') in = In::escape;
        else if (starts(kTripleQuote)) in = In::code, last = '"', i += 2, column += 2;
        break;
      case In::multi_literal:
        if (starts(kTripleApostrophe)) in = In::code, last = '\'', i += 2, column += 2;
        break;
    }
    if (text[i] == '\n') line += 1, column = 0;
  }
  return "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The shortest text that reads back as the same double (0.1, not 0.1000000000000000055).
std::string format_double(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, d);
    if (std::strtod(buffer, nullptr) == d) break;
  }
  std::string out = buffer;
  if (out.find_first_of(".en") == std::string::npos) out += ".0";  // keep it visibly a float
  return out;
}

// 'a', 'b' or 'c'
std::string quoted_list(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? " or " : ", ";
    out += "'" + items[i] + "'";
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
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

// A suggestion for a misspelt choice: a case-insensitive match first, then the
// nearest by edit distance.
std::string suggest(const std::string& given, const std::vector<std::string>& candidates) {
  const std::string folded = lower(given);
  for (const auto& candidate : candidates) {
    if (folded == candidate) return " (did you mean '" + candidate + "'?)";
  }
  std::string hint = detail::did_you_mean(given, candidates);
  if (hint.empty() && folded.size() >= 3) {
    // "warning" for "warn", "cos" for "cosine"
    for (const auto& candidate : candidates) {
      if (candidate.size() >= 3 && (starts_with(folded, candidate) || starts_with(candidate, folded))) {
        return " (did you mean '" + candidate + "'?)";
      }
    }
  }
  return hint;
}

// ---------------------------------------------------------------------------
// Key paths: {"trainer", "max_epochs"}, {"callbacks", "[0]", "patience"}

using KeyPath = std::vector<std::string>;

std::string display(const KeyPath& path) {
  std::string out;
  for (const auto& part : path) {
    if (!out.empty() && !starts_with(part, "[")) out += '.';
    out += part;
  }
  return out;
}

std::string index_part(std::size_t index) { return "[" + std::to_string(index) + "]"; }

// Map key for a path (a separator no TOML key written on a command line contains).
std::string path_id(const KeyPath& path) { return join(path, std::string(1, '\x1f')); }

KeyPath child(KeyPath path, std::string part) {
  path.push_back(std::move(part));
  return path;
}

// ---------------------------------------------------------------------------
// Where things are

struct Context {
  std::string file;  // the manifest as the user named it, for messages
  fs::path dir;      // the manifest's directory (absolute)
  std::map<std::string, std::string> set_by;  // path_id -> the --set argument that wrote it

  // "--set <arg>" when an override wrote this node or one of its parents,
  // else "<file>:<line>:<col>" from the source region, else "<file>".
  std::string where(const KeyPath& path, const toml::source_region& source) const {
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

  [[noreturn]] void fail_at(const KeyPath& path, const toml::source_region& source,
                            const std::string& what) const {
    fail(where(path, source) + ": " + what);
  }

  fs::path resolve(const std::string& text) const {
    const fs::path p(text);
    if (p.is_absolute()) return p.lexically_normal();
    return (dir / p).lexically_normal();
  }
};

// The position of a top-level entry: a table's header ([model], [[callbacks]])
// where it has one, else the key.
const toml::source_region& table_source(const toml::node& node, const toml::key& key) {
  const bool container = node.is_table() || node.is_array();
  return container && node.source().begin.line > 0 ? node.source() : key.source();
}

// ---------------------------------------------------------------------------
// Typed reads of one host-owned value

struct Field {
  const Context& ctx;
  KeyPath path;
  const toml::node& node;

  std::string name() const { return display(path); }

  [[noreturn]] void fail(const std::string& what) const { ctx.fail_at(path, node.source(), what); }

  [[noreturn]] void wrong_type(const std::string& expected, toml::node_type expected_type) const {
    std::string message = name() + " must be " + expected + ", not " + type_phrase(node);
    if (const auto* f = node.as_floating_point(); f && expected_type == toml::node_type::integer) {
      const double d = f->get();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
        message += " (write " + std::to_string(static_cast<long long>(d)) + ", without a decimal point)";
      }
    } else if (const auto* s = node.as_string(); s && expected_type != toml::node_type::string) {
      // "3" where 3 was meant: say so.
      try {
        if (!non_ascii_outside_strings("v = " + s->get()).empty()) throw toml::parse_error("", toml::source_position{});
        const toml::table probe = toml::parse(std::string_view("v = " + s->get()));
        const toml::node* v = probe.get("v");
        const bool fits = v && probe.size() == 1 &&
                          (v->type() == expected_type ||
                           (expected_type == toml::node_type::floating_point && v->is_integer()));
        if (fits) message += " (write " + s->get() + " without quotes)";
      } catch (const toml::parse_error&) {
      }
    }
    fail(message);
  }

  int64_t integer() const {
    if (const auto* v = node.as_integer()) return v->get();
    wrong_type("an integer", toml::node_type::integer);
  }

  int64_t integer_at_least(int64_t min) const {
    const int64_t v = integer();
    if (v < min) fail(name() + " must be >= " + std::to_string(min) + ", not " + std::to_string(v));
    return v;
  }

  // An integer or a float, finite.
  double number() const {
    if (const auto* i = node.as_integer()) return static_cast<double>(i->get());
    if (const auto* f = node.as_floating_point()) {
      if (!std::isfinite(f->get())) fail(name() + " must be a finite number, not " + format_double(f->get()));
      return f->get();
    }
    wrong_type("a number", toml::node_type::floating_point);
  }

  bool boolean() const {
    if (const auto* v = node.as_boolean()) return v->get();
    wrong_type("a boolean (true or false)", toml::node_type::boolean);
  }

  std::string string() const {
    if (const auto* v = node.as_string()) return v->get();
    wrong_type("a string", toml::node_type::string);
  }

  std::string nonempty_string() const {
    std::string v = string();
    if (v.empty()) fail(name() + " must not be empty");
    return v;
  }

  // An integer is taken as its digits: Lightning's `precision = 32`.
  std::string choice(const std::vector<std::string>& choices) const {
    std::string v = node.is_integer() ? std::to_string(node.as_integer()->get()) : string();
    if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
      fail(name() + " must be " + quoted_list(choices) + ", not '" + v + "'" + suggest(v, choices));
    }
    return v;
  }
};

// Entries of a table in the order they were written; entries an override
// created (no position) come last, by name.
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

const std::vector<std::string> kAllTables = {"run",       "model",     "data",       "callbacks",  "trainer",
                                             "optimizer", "scheduler", "checkpoint", "distributed",
                                             "logging"};

// ---------------------------------------------------------------------------
// Host-owned values, checked as the schema declares them

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

// A count or a fraction (trainer.limit_*_batches).
SchemaValue batch_limit_value(const Field& f) {
  BatchLimit limit;
  if (const auto* i = f.node.as_integer()) {
    if (i->get() < 0) {
      f.fail(f.name() + " must be a number of batches (an integer >= 0) or a fraction (a float in [0.0, 1.0]), not " +
             std::to_string(i->get()));
    }
    limit.is_fraction = false;
    limit.count = i->get();
    return limit;
  }
  if (const auto* d = f.node.as_floating_point()) {
    const double v = d->get();
    if (!(v >= 0.0 && v <= 1.0)) {
      std::string message = f.name() + " must be a fraction in [0.0, 1.0] (a float) or a number of batches (an integer), not " +
                            format_double(v);
      if (std::isfinite(v) && v > 1.0 && v == std::floor(v) && v < 1e15) {
        message += " (write " + std::to_string(static_cast<long long>(v)) + " for a number of batches)";
      }
      f.fail(message);
    }
    limit.is_fraction = true;
    limit.fraction = v;
    return limit;
  }
  f.wrong_type("an integer (a number of batches) or a float in [0.0, 1.0] (a fraction)", toml::node_type::integer);
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

SchemaValue checked_value(const KeySchema& k, const Field& f) {
  switch (k.kind) {
    case ValueKind::boolean: return f.boolean();
    case ValueKind::integer: return integer_value(k, f);
    case ValueKind::number: return number_value(k, f);
    case ValueKind::string:
    case ValueKind::path: return string_value(k, f);
    case ValueKind::choice: return choice_value(k, f);
    case ValueKind::batch_limit: return batch_limit_value(f);
    case ValueKind::flag_or_count: return flag_or_count_value(f);
    case ValueKind::betas: return betas_value(f);
    case ValueKind::choice_list: return choice_list_value(k, f);
    case ValueKind::patterns: return patterns_value(f);
  }
  f.fail(f.name() + " has no reader (a bug in kiln's manifest schema)");
}

struct Validator {
  Context& ctx;
  Manifest& m;
  const PluginSearchPath& search;
  std::map<std::string, const toml::table*> host_tables;  // as found, for cross-key checks
  bool have_model = false;
  bool have_data = false;

  Validator(Context& context, Manifest& manifest, const PluginSearchPath& search_path)
      : ctx(context), m(manifest), search(search_path) {}

  const toml::table* host_table(const std::string& name) const {
    const auto it = host_tables.find(name);
    return it == host_tables.end() ? nullptr : it->second;
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

  void check_host_table(const TableSchema& schema, const toml::key& key, const toml::node& node) {
    const KeyPath path{schema.name};
    const auto* table = node.as_table();
    if (!table) {
      std::string message = "[" + schema.name + "] must be a table, not " + std::string(type_phrase(node));
      if (node.is_array()) message += " (write [" + schema.name + "], not [[" + schema.name + "]])";
      ctx.fail_at(path, table_source(node, key), message);
    }
    host_tables[schema.name] = table;
    std::vector<std::string> known = schema.key_names();
    for (const auto& t : manifest_schema())
      if (t.array_of_tables && starts_with(t.name, schema.name + ".")) known.push_back(t.name.substr(schema.name.size() + 1));
    for (const auto& [k, v] : in_file_order(*table)) {
      const std::string name(k->str());
      const KeySchema* spec = schema.find(name);
      const KeyPath key_path = child(path, name);
      if (const TableSchema* entries = find_table_schema(schema.name + "." + name); entries && entries->array_of_tables) {
        check_table_array(*entries, key_path, *k, *v);
        continue;
      }
      if (!spec) {
        std::string hint = suggest(name, known);
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
    const std::vector<std::string> known = schema.key_names();
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
      std::string where = ctx.where(element_path, source);
      for (const auto& k : schema.keys) {
        if (!k.required) continue;
        const toml::node* value = entry->get(k.key);
        if (!value) {
          ctx.fail_at(element_path, source,
                      display(element_path) + " has no '" + k.key + "': every " + shown + " entry sets it (" + k.doc +
                          ")");
        }
        where = ctx.where(child(element_path, k.key), value->source());
      }
      schema.add_entry(m, where);
      for (const auto& [k, v] : in_file_order(*entry)) {
        const std::string name(k->str());
        const KeySchema* spec = schema.find(name);
        const KeyPath key_path = child(element_path, name);
        if (!spec) {
          std::string hint = suggest(name, known);
          if (hint.empty()) hint = " (known keys: " + join(known, ", ") + ")";
          ctx.fail_at(key_path, k->source(), "unknown key '" + name + "' in " + display(element_path) + hint);
        }
        spec->store(m, checked_value(*spec, Field{ctx, key_path, *v}));
      }
    }
  }

  // Each group sets only options its optimizer reads (an option the
  // optimizer ignores would silently do nothing), and nesterov keeps its
  // momentum.
  void check_optimizer_groups() {
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

  // The position of `key` in a host table, or of the table, for cross-key checks.
  std::string where_key(const std::string& table_name, const std::string& key) {
    if (const toml::table* table = host_table(table_name)) {
      if (const toml::node* node = table->get(key)) return ctx.where({table_name, key}, node->source());
      return ctx.where({table_name}, table->source());
    }
    return ctx.file;
  }

  // ---- plugin tables

  fs::path find_plugin(const std::string& name, const KeyPath& path, const toml::node& value,
                       const std::string& slot_text) {
    std::error_code ec;
    for (const auto& dir : search.dirs) {
      for (const std::string& candidate : {"lib" + name + ".so", name + ".so"}) {
        const fs::path p = dir / candidate;
        if (fs::is_regular_file(p, ec)) return p;
      }
    }
    std::vector<std::string> available;
    std::vector<std::string> dirs;
    for (const auto& dir : search.dirs) {
      dirs.push_back(dir.string());
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
    std::string message = "plugin '" + name + "' for " + slot_text + " not found";
    if (dirs.empty()) {
      message += ": no plugin directories to search (set KILN_PLUGIN_PATH, or give the path to the .so file)";
    } else {
      message += " in " + join(dirs, ", ");
      const std::string hint = detail::did_you_mean(name, available);
      message += hint.empty() ? " (add its directory to KILN_PLUGIN_PATH, or give the path to the .so file)" : hint;
    }
    ctx.fail_at(path, value.source(), message);
  }

  PluginSpec check_plugin(const std::string& slot, const KeyPath& path, const toml::node& node,
                          const toml::source_region& source) {
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
    if (!path_node) {
      std::string hint;
      for (const auto& [k, v] : *table) {
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
    std::ostringstream out;
    out << toml::toml_formatter{config};
    spec.config_toml = out.str();
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

  // ---- the whole manifest

  void run(const toml::table& root) {
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
        const auto& source = table_source(*v, *k);
        if (v->is_table() || v->is_array()) {
          std::string hint = suggest(name, kAllTables);
          if (hint.empty()) hint = " (known tables: " + join(kAllTables, ", ") + ")";
          ctx.fail_at(path, source, "unknown table '" + name + "'" + hint);
        }
        std::string hint = suggest(name, kAllTables);
        if (hint.empty()) {
          const std::string owner = owner_of(name, "");
          hint = owner.empty() ? " (keys belong in a table: " + join(kAllTables, ", ") + ")"
                               : " (it belongs in [" + owner + "]: put it after the [" + owner + "] header)";
        }
        ctx.fail_at(path, source, "unknown top-level key '" + name + "'" + hint);
      }
    }

    if (!have_model) {
      fail(ctx.file + ": missing [model] table: add [model] with path = \"<plugin name or .so file>\"");
    }
    if (!have_data) {
      fail(ctx.file + ": missing [data] table: add [data] with path = \"<plugin name or .so file>\"");
    }

    // Defaults that depend on other keys.
    auto has_key = [&](const std::string& table, const std::string& key) {
      const toml::table* t = host_table(table);
      return t && t->contains(key);
    };
    if (!has_key("run", "dir")) m.run.dir = (ctx.dir / "runs" / m.run.name).lexically_normal();
    if (!has_key("checkpoint", "dir")) m.checkpoint.dir = m.run.dir / "checkpoints";
    // torch's own defaults: Adagrad's eps is 1e-10, the others' 1e-8.
    if (!has_key("optimizer", "eps") && m.optimizer.name == OptimizerName::adagrad) m.optimizer.eps = 1e-10;

    // Checks across keys.
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
    check_optimizer_groups();
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
};

// ---------------------------------------------------------------------------
// --set overrides

struct Segment {
  std::string name;
  bool bracket = false;  // written as [N]
  bool numeric = false;  // all digits: an index when it meets an array
  std::size_t index = 0;
};

std::vector<Segment> parse_override_key(const std::string& arg, const std::string& key) {
  auto bad = [&](const std::string& why) {
    fail("--set " + arg + ": " + why + "; expected KEY=VALUE with a dotted key, e.g. --set trainer.max_epochs=3 "
         "or --set callbacks[0].patience=5");
  };
  auto to_index = [&](const std::string& digits) {
    if (!all_digits(digits) || digits.size() > 9) bad("'" + digits + "' is not an array index");
    return static_cast<std::size_t>(std::stoul(digits));
  };
  std::vector<Segment> segments;
  std::size_t i = 0;
  bool expect_name = true;  // at the start or right after '.'
  while (i < key.size()) {
    if (key[i] == '[') {
      const auto close = key.find(']', i);
      if (close == std::string::npos) bad("'[' without ']' in '" + key + "'");
      if (expect_name && !segments.empty()) bad("empty key part in '" + key + "'");
      if (segments.empty()) bad("'" + key + "' starts with an index");
      Segment s;
      s.name = key.substr(i + 1, close - i - 1);
      s.bracket = true;
      s.numeric = true;
      s.index = to_index(s.name);
      segments.push_back(s);
      i = close + 1;
      expect_name = false;
      if (i < key.size() && key[i] != '.' && key[i] != '[') bad("unexpected '" + key.substr(i, 1) + "' after ']'");
      if (i < key.size() && key[i] == '.') {
        ++i;
        expect_name = true;
        if (i == key.size()) bad("empty key part in '" + key + "'");
      }
      continue;
    }
    const auto stop = key.find_first_of(".[]", i);
    const std::string name = trim(key.substr(i, stop == std::string::npos ? std::string::npos : stop - i));
    if (name.empty()) bad("empty key part in '" + key + "'");
    if (stop != std::string::npos && key[stop] == ']') bad("']' without '[' in '" + key + "'");
    Segment s;
    s.name = name;
    s.numeric = all_digits(name) && name.size() <= 9;
    if (s.numeric) s.index = static_cast<std::size_t>(std::stoul(name));
    segments.push_back(s);
    expect_name = false;
    if (stop == std::string::npos) break;
    i = stop;
    if (key[i] == '.') {
      ++i;
      expect_name = true;
      if (i == key.size()) bad("empty key part in '" + key + "'");
    }
  }
  if (segments.empty()) bad("empty key");
  return segments;
}

// Whether the schema says the key takes a string: `--set run.name=2024` means
// the string "2024", not the integer.
bool takes_string(const KeyPath& path) {
  auto plugin_string_key = [](const std::string& key) {
    for (const auto& k : plugin_host_keys()) {
      if (k.key == key) return k.takes_string();
    }
    return false;
  };
  if (path.size() == 2) {
    if (path[0] == "model" || path[0] == "data") return plugin_string_key(path[1]);
    const KeySchema* k = find_key_schema(path[0], path[1]);
    return k && k->takes_string();
  }
  return path.size() == 3 && path[0] == "callbacks" && starts_with(path[1], "[") && plugin_string_key(path[2]);
}

// The value of an override: TOML if it parses as one value, else the text.
toml::table parse_override_value(const std::string& text) {
  try {
    if (!non_ascii_outside_strings("v = " + text).empty()) throw toml::parse_error("", toml::source_position{});
    toml::table parsed = toml::parse(std::string_view("v = " + text));
    if (parsed.size() == 1 && parsed.contains("v")) return parsed;
  } catch (const toml::parse_error&) {
  }
  toml::table raw;
  raw.insert("v", text);
  return raw;
}

void apply_override(toml::table& root, const std::string& arg, Context& ctx) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos) {
    fail("--set " + arg + ": expected KEY=VALUE, e.g. --set trainer.max_epochs=3");
  }
  const std::string key = trim(arg.substr(0, eq));
  const std::string text = trim(arg.substr(eq + 1));
  if (key.empty()) fail("--set " + arg + ": the key before '=' is empty; expected KEY=VALUE, e.g. --set trainer.max_epochs=3");
  const std::vector<Segment> segments = parse_override_key(arg, key);
  if (text.empty()) {
    fail("--set " + arg + ": the value after '=' is empty (for an empty string write --set " + key + "='\"\"')");
  }

  toml::table holder = parse_override_value(text);
  toml::node* value = holder.get("v");

  toml::node* current = &root;
  KeyPath path;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& seg = segments[i];
    const bool last = i + 1 == segments.size();
    const bool next_is_index = !last && (segments[i + 1].bracket || segments[i + 1].numeric);

    if (auto* table = current->as_table()) {
      if (seg.bracket) {
        fail("--set " + arg + ": " + display(path) + " is a table, not an array; use " + display(path) + "." +
             seg.name + " for a key");
      }
      path.push_back(seg.name);
      if (last) {
        if (takes_string(path) && !value->is_string() && !value->is_array() && !value->is_table()) {
          table->insert_or_assign(seg.name, text);
        } else {
          table->insert_or_assign(seg.name, *value);
        }
        ctx.set_by[path_id(path)] = arg;
        return;
      }
      toml::node* next = table->get(seg.name);
      if (!next) {
        if (next_is_index) {
          table->insert(seg.name, toml::array{});
        } else {
          table->insert(seg.name, toml::table{});
        }
        next = table->get(seg.name);
        ctx.set_by.emplace(path_id(path), arg);
      }
      current = next;
    } else if (auto* array = current->as_array()) {
      if (!seg.numeric) {
        fail("--set " + arg + ": " + display(path) + " is an array; index it with a number, e.g. " + display(path) +
             "[0]." + seg.name);
      }
      const std::size_t size = array->size();
      if (seg.index > size) {
        fail("--set " + arg + ": index " + std::to_string(seg.index) + " is out of range: " + display(path) +
             " has " + std::to_string(size) + (size == 1 ? " entry" : " entries") + " (use 0.." +
             std::to_string(size) + ", where " + std::to_string(size) + " adds one)");
      }
      path.push_back(index_part(seg.index));
      if (last) {
        if (seg.index == size) {
          array->push_back(*value);
        } else {
          array->replace(array->cbegin() + static_cast<std::ptrdiff_t>(seg.index), *value);
        }
        ctx.set_by[path_id(path)] = arg;
        return;
      }
      if (seg.index == size) {
        if (next_is_index) {
          array->push_back(toml::array{});
        } else {
          array->push_back(toml::table{});
        }
        ctx.set_by.emplace(path_id(path), arg);
      }
      current = array->get(seg.index);
    } else {
      fail("--set " + arg + ": cannot set '" + seg.name + "' inside " + display(path) + ", which is " +
           type_phrase(*current) + ", not a table");
    }
  }
}

// ---------------------------------------------------------------------------
// Reading the file

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// The byte offset of "line:col" (as non_ascii_outside_strings gives it:
// columns count bytes from 1) in `text`.
size_t byte_at(const std::string& text, const std::string& line_col) {
  const size_t colon = line_col.find(':');
  size_t line = std::stoul(line_col.substr(0, colon));
  const size_t column = std::stoul(line_col.substr(colon + 1));
  size_t offset = 0;
  while (--line > 0 && offset < text.size()) {
    const size_t newline = text.find('\n', offset);
    if (newline == std::string::npos) return text.size();
    offset = newline + 1;
  }
  return std::min(text.size(), offset + column - 1);
}

std::string read_manifest(const fs::path& file, const std::string& shown) {
  errno = 0;
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) fail(shown + ": cannot read manifest: " + std::strerror(errno ? errno : ENOENT));
  std::string text;
  char buffer[65536];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) fail(shown + ": cannot read manifest: " + std::strerror(error ? error : EIO));
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------

OptimizerConfig OptimizerConfig::for_group(const OptimizerGroupConfig& g) const {
  OptimizerConfig c = *this;
  c.groups.clear();
  c.lr = g.lr.value_or(lr);
  c.weight_decay = g.weight_decay.value_or(weight_decay);
  c.momentum = g.momentum.value_or(momentum);
  c.nesterov = g.nesterov.value_or(nesterov);
  if (g.betas) std::tie(c.beta1, c.beta2) = *g.betas;
  c.eps = g.eps.value_or(eps);
  c.alpha = g.alpha.value_or(alpha);
  c.centered = g.centered.value_or(centered);
  c.lr_decay = g.lr_decay.value_or(lr_decay);
  c.initial_accumulator_value = g.initial_accumulator_value.value_or(initial_accumulator_value);
  return c;
}

int64_t BatchLimit::apply(int64_t available) const {
  if (available <= 0) return 0;
  if (!is_fraction) return std::clamp<int64_t>(count, 0, available);
  if (!(fraction > 0.0)) return 0;
  if (fraction >= 1.0) return available;
  const auto n = static_cast<int64_t>(std::floor(static_cast<double>(available) * fraction));
  return std::clamp<int64_t>(n, 1, available);
}

PluginSearchPath PluginSearchPath::from_environment() {
  PluginSearchPath search;
  auto add = [&](fs::path dir) {
    dir = dir.lexically_normal();
    if (!dir.has_filename() && dir.has_relative_path()) dir = dir.parent_path();  // drop a trailing '/'
    if (std::find(search.dirs.begin(), search.dirs.end(), dir) == search.dirs.end()) search.dirs.push_back(dir);
  };
  std::error_code ec;
  if (const char* env = std::getenv("KILN_PLUGIN_PATH")) {
    std::stringstream entries{std::string(env)};
    std::string entry;
    while (std::getline(entries, entry, ':')) {
      if (entry.empty()) continue;
      fs::path dir(entry);
      if (dir.is_relative()) {
        const fs::path absolute = fs::absolute(dir, ec);
        if (!ec) dir = absolute;
        ec.clear();
      }
      add(dir);
    }
  }
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bundled = (exe.parent_path() / ".." / "lib" / "kiln" / "plugins").lexically_normal();
    if (fs::is_directory(bundled, ec)) add(bundled);
  }
  return search;
}

Manifest load_manifest(const fs::path& file, const std::vector<std::string>& overrides,
                       const PluginSearchPath& search) {
  if (file.empty()) fail("no manifest given: pass the path to a run manifest, e.g. run.toml");

  Context ctx;
  ctx.file = file.string();
  std::error_code ec;
  fs::path absolute = fs::absolute(file, ec);
  if (ec) absolute = file;
  absolute = absolute.lexically_normal();
  ctx.dir = absolute.parent_path();

  std::string text = read_manifest(file, ctx.file);
  // A UTF-8 byte-order mark before the first line (editors on Windows write
  // one) is not part of the TOML: dropped, so line 1 column 1 is the first
  // character an editor shows. Anywhere else it is refused, by name.
  if (text.rfind(kUtf8Bom, 0) == 0) text.erase(0, kUtf8Bom.size());
  toml::table root;
  if (const std::string at = non_ascii_outside_strings(text); !at.empty()) {
    if (text.compare(byte_at(text, at), kUtf8Bom.size(), kUtf8Bom) == 0)
      fail(ctx.file + ":" + at + ": a byte-order mark (U+FEFF) outside a string, not at the start of the file "
           "(only the file's first bytes may hold one); delete it");
    fail(ctx.file + ":" + at + ": a non-ASCII character outside a string or comment (TOML keys are ASCII; "
         "quote the key or the value)");
  }
  try {
    root = toml::parse(std::string_view(text), std::string_view(ctx.file));
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    std::string where = ctx.file;
    if (begin.line > 0) where += ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column);
    fail(where + ": " + std::string(e.description()));
  }

  for (const auto& arg : overrides) apply_override(root, arg, ctx);

  Manifest manifest;
  manifest.file = absolute;
  Validator(ctx, manifest, search).run(root);

  std::ostringstream out;
  out << toml::toml_formatter{root};
  manifest.text = out.str();
  return manifest;
}

}  // namespace kiln
