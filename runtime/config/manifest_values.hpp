// Where a manifest value is, and its typed, checked reading. Internal to
// config/: shared by validation (manifest_validation.cpp) and --set
// overrides (manifest_overrides.cpp).
//
// Every problem becomes one kiln::InputError line that starts with where it is:
// "<file>:<line>:<col>" for something written in the manifest, "--set <arg>"
// for something an override wrote (its nodes have no position in the file),
// or just "<file>" when there is nothing more precise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "config/manifest_schema.hpp"

namespace kiln::manifest_detail {

// Key paths: {"trainer", "max_epochs"}, {"callbacks", "[0]", "patience"}
using KeyPath = std::vector<std::string>;

std::string display(const KeyPath& path);  // "callbacks[0].patience"
std::string index_part(std::size_t index);  // "[3]"
// Map key for a path (a separator no TOML key written on a command line contains).
std::string path_id(const KeyPath& path);
KeyPath child(KeyPath path, std::string part);

struct Context {
  std::string file;  // the manifest as the user named it, for messages
  std::filesystem::path dir;  // the manifest's directory (absolute)
  std::map<std::string, std::string> set_by;  // path_id -> the --set argument that wrote it

  // "--set <arg>" when an override wrote this node or one of its parents,
  // else "<file>:<line>:<col>" from the source region, else "<file>".
  std::string where(const KeyPath& path, const toml::source_region& source) const;
  [[noreturn]] void fail_at(const KeyPath& path, const toml::source_region& source, const std::string& what) const;
  // Relative to the manifest's directory.
  std::filesystem::path resolve(const std::string& text) const;
};

// The position of a top-level entry: a table's header ([model], [[callbacks]])
// where it has one, else the key.
const toml::source_region& table_source(const toml::node& node, const toml::key& key);

const char* type_phrase(const toml::node& node);  // "an integer"
// A value as the user would recognise it in a message.
std::string value_text(const toml::node& node);

// Entries of a table in the order they were written; entries an override
// created (no position) come last, by name.
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& table);

// Typed reads of one host-owned value.
struct Field {
  const Context& ctx;
  KeyPath path;
  const toml::node& node;

  std::string name() const { return display(path); }
  [[noreturn]] void fail(const std::string& what) const { ctx.fail_at(path, node.source(), what); }
  // "<name> must be <expected>, not <type>", with a hint where the value
  // was only written the wrong way (3.0 for 3, "3" for 3).
  [[noreturn]] void wrong_type(const std::string& expected, toml::node_type expected_type) const;

  int64_t integer() const;
  int64_t integer_at_least(int64_t min) const;
  double number() const;  // an integer or a float, finite
  bool boolean() const;
  std::string string() const;
  std::string nonempty_string() const;
  // An integer is taken as its digits: Lightning's `precision = 32`.
  std::string choice(const std::vector<std::string>& choices) const;
};

// A host-owned value, checked as the schema declares it.
SchemaValue checked_value(const KeySchema& k, const Field& f);

}  // namespace kiln::manifest_detail
