// kiln/config.hpp — typed access to a plugin's own manifest table.
//
// The host hands each plugin the TOML text of its table. Config parses it and
// answers typed questions; a wrong type or a missing required key throws
// kiln::ConfigError with a message naming the key and the expected type.
// Every key a plugin reads is remembered, so that the SDK can refuse keys the
// plugin never read (almost always a typo) with a "did you mean" suggestion.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "kiln/detail/suggest.hpp"

namespace kiln {

// The user's input is wrong — a config value, a data file it names — and the
// run never started: the SDK reports it as KILN_ERROR_INVALID_ARGUMENT, so
// the host exits 2 ("bad input") when it comes from create or setup.
class InvalidInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A plugin's own config table is wrong (an unknown key, a wrong type).
class ConfigError : public InvalidInput {
 public:
  using InvalidInput::InvalidInput;
};

class Config {
 public:
  explicit Config(const std::string& toml_text) {
    try {
      table_ = toml::parse(toml_text);
    } catch (const toml::parse_error& e) {
      throw ConfigError(std::string("plugin config is not valid TOML: ") +
                        std::string(e.description()));
    }
  }

  bool has(const std::string& key) const { return table_.contains(key); }

  // The value of `key`, or `fallback` when absent. Integers convert to double.
  template <class T>
  T get(const std::string& key, T fallback) {
    auto value = find<T>(key);
    return value ? *value : fallback;
  }

  // The value of `key`; throws when absent.
  template <class T>
  T require(const std::string& key) {
    auto value = find<T>(key);
    if (!value) throw ConfigError("missing required key '" + key + "' (" + type_name<T>() + ")");
    return *value;
  }

  // An array of T; throws when an element has another type.
  template <class T>
  std::vector<T> get_list(const std::string& key, std::vector<T> fallback) {
    read_.insert(key);
    const toml::node* node = table_.get(key);
    if (!node) return fallback;
    const toml::array* array = node->as_array();
    if (!array) throw wrong_type(key, "array of " + type_name<T>(), *node);
    std::vector<T> out;
    for (const auto& element : *array) {
      auto v = convert<T>(element);
      if (!v) throw wrong_type(key + "[" + std::to_string(out.size()) + "]", type_name<T>(), element);
      out.push_back(*v);
    }
    return out;
  }

  // An array of tables (`transforms = [{ name = "resize", size = 256 }, ...]`),
  // each as a Config of its own: read its keys, then refuse its
  // unread_keys() as for the plugin's table.
  std::vector<Config> get_table_list(const std::string& key) {
    read_.insert(key);
    const toml::node* node = table_.get(key);
    std::vector<Config> out;
    if (!node) return out;
    const toml::array* array = node->as_array();
    if (!array) throw wrong_type(key, "an array of tables", *node);
    for (const auto& element : *array) {
      const toml::table* t = element.as_table();
      if (!t) throw wrong_type(key + "[" + std::to_string(out.size()) + "]", "a table", element);
      out.push_back(Config(*t));
    }
    return out;
  }

  // A table of strings (`inputs = { attention_mask = "mask" }`), by key.
  std::map<std::string, std::string> get_string_table(const std::string& key) {
    read_.insert(key);
    std::map<std::string, std::string> out;
    const toml::node* node = table_.get(key);
    if (!node) return out;
    const toml::table* t = node->as_table();
    if (!t) throw wrong_type(key, "a table of strings", *node);
    for (const auto& [name, value] : *t) {
      const auto* text = value.as_string();
      if (!text) throw wrong_type(key + "." + std::string(name.str()), "string", value);
      out[std::string(name.str())] = text->get();
    }
    return out;
  }

  // Keys present in the table that the plugin never asked about, each with a
  // suggestion from the keys it did ask about.
  std::vector<std::string> unread_keys() const {
    std::vector<std::string> read(read_.begin(), read_.end());
    std::vector<std::string> out;
    for (const auto& [key, node] : table_) {
      const std::string k(key.str());
      if (!read_.count(k)) out.push_back("'" + k + "'" + detail::did_you_mean(k, read));
    }
    return out;
  }

  const toml::table& table() const { return table_; }

 private:
  explicit Config(toml::table table) : table_(std::move(table)) {}

  template <class T>
  static std::string type_name() {
    if constexpr (std::is_same_v<T, bool>) return "boolean";
    else if constexpr (std::is_integral_v<T>) return "integer";
    else if constexpr (std::is_floating_point_v<T>) return "float";
    else return "string";
  }

  static std::string node_type(const toml::node& node) {
    switch (node.type()) {
      case toml::node_type::string: return "string";
      case toml::node_type::integer: return "integer";
      case toml::node_type::floating_point: return "float";
      case toml::node_type::boolean: return "boolean";
      case toml::node_type::array: return "array";
      case toml::node_type::table: return "table";
      default: return "date/time";
    }
  }

  static ConfigError wrong_type(const std::string& key, const std::string& expected,
                                const toml::node& node) {
    return ConfigError("key '" + key + "' must be " + expected + ", not " + node_type(node));
  }

  template <class T>
  static std::optional<T> convert(const toml::node& node) {
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node.value_exact<bool>()) return *v;
    } else if constexpr (std::is_integral_v<T>) {
      if (auto v = node.value_exact<int64_t>()) return static_cast<T>(*v);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node.value_exact<double>()) return static_cast<T>(*v);
      if (auto v = node.value_exact<int64_t>()) return static_cast<T>(*v);
    } else {
      if (auto v = node.value_exact<std::string>()) return T(*v);
    }
    return std::nullopt;
  }

  template <class T>
  std::optional<T> find(const std::string& key) {
    read_.insert(key);
    const toml::node* node = table_.get(key);
    if (!node) return std::nullopt;
    auto value = convert<T>(*node);
    if (!value) throw wrong_type(key, type_name<T>(), *node);
    return value;
  }

  toml::table table_;
  std::set<std::string> read_;
};

}  // namespace kiln
