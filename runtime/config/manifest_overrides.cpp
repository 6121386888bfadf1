// `--set` overrides (config/manifest_overrides.hpp): the key parsed into
// segments, the value typed, then a walk from the root that creates what is
// missing and refuses what does not fit.
#include "config/manifest_overrides.hpp"

#include <cstddef>
#include <vector>

#include "config/input_guard.hpp"
#include "config/manifest_schema.hpp"
#include "config/text.hpp"

namespace kiln::manifest_detail {

namespace {

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
  // A key of a host table inside a table ([logging.mlflow]).
  if (path.size() == 3 && !starts_with(path[1], "[")) {
    const KeySchema* k = find_key_schema(path[0] + "." + path[1], path[2]);
    if (k) return k->takes_string();
  }
  return path.size() == 3 && path[0] == "callbacks" && starts_with(path[1], "[") && plugin_string_key(path[2]);
}

// The value of an override: TOML if it parses as one value, else the text.
toml::table parse_override_value(const std::string& text) {
  if (std::optional<toml::table> parsed = parse_one_value(text)) return std::move(*parsed);
  toml::table raw;
  raw.insert("v", text);
  return raw;
}

// One override on its way down from the root.
class OverrideWalk {
 public:
  OverrideWalk(const std::string& arg, const std::string& text, toml::node* value, Context& ctx)
      : arg_(arg), text_(text), value_(value), ctx_(ctx) {}

  void run(toml::table& root, const std::vector<Segment>& segments) {
    toml::node* current = &root;
    for (std::size_t i = 0; i < segments.size() && current; ++i) {
      const bool last = i + 1 == segments.size();
      const bool next_is_index = !last && (segments[i + 1].bracket || segments[i + 1].numeric);
      if (auto* table = current->as_table()) {
        current = into_table(*table, segments[i], last, next_is_index);
      } else if (auto* array = current->as_array()) {
        current = into_array(*array, segments[i], last, next_is_index);
      } else {
        fail("--set " + arg_ + ": cannot set '" + segments[i].name + "' inside " + display(path_) + ", which is " +
             type_phrase(*current) + ", not a table");
      }
    }
  }

 private:
  // The node `seg` names in `table`, made when missing; nullptr once the
  // value is set.
  toml::node* into_table(toml::table& table, const Segment& seg, bool last, bool next_is_index) {
    if (seg.bracket) {
      fail("--set " + arg_ + ": " + display(path_) + " is a table, not an array; use " + display(path_) + "." +
           seg.name + " for a key");
    }
    path_.push_back(seg.name);
    if (last) {
      if (takes_string(path_) && !value_->is_string() && !value_->is_array() && !value_->is_table()) {
        table.insert_or_assign(seg.name, text_);
      } else {
        table.insert_or_assign(seg.name, *value_);
      }
      ctx_.set_by[path_id(path_)] = arg_;
      return nullptr;
    }
    toml::node* next = table.get(seg.name);
    if (!next) {
      if (next_is_index) {
        table.insert(seg.name, toml::array{});
      } else {
        table.insert(seg.name, toml::table{});
      }
      next = table.get(seg.name);
      ctx_.set_by.emplace(path_id(path_), arg_);
    }
    return next;
  }

  // The entry `seg` indexes in `array` (one past the end adds it); nullptr
  // once the value is set.
  toml::node* into_array(toml::array& array, const Segment& seg, bool last, bool next_is_index) {
    if (!seg.numeric) {
      fail("--set " + arg_ + ": " + display(path_) + " is an array; index it with a number, e.g. " + display(path_) +
           "[0]." + seg.name);
    }
    const std::size_t size = array.size();
    if (seg.index > size) {
      fail("--set " + arg_ + ": index " + std::to_string(seg.index) + " is out of range: " + display(path_) +
           " has " + std::to_string(size) + (size == 1 ? " entry" : " entries") + " (use 0.." +
           std::to_string(size) + ", where " + std::to_string(size) + " adds one)");
    }
    path_.push_back(index_part(seg.index));
    if (last) {
      if (seg.index == size) {
        array.push_back(*value_);
      } else {
        array.replace(array.cbegin() + static_cast<std::ptrdiff_t>(seg.index), *value_);
      }
      ctx_.set_by[path_id(path_)] = arg_;
      return nullptr;
    }
    if (seg.index == size) {
      if (next_is_index) {
        array.push_back(toml::array{});
      } else {
        array.push_back(toml::table{});
      }
      ctx_.set_by.emplace(path_id(path_), arg_);
    }
    return array.get(seg.index);
  }

  const std::string& arg_;
  const std::string& text_;
  toml::node* value_;
  Context& ctx_;
  KeyPath path_;
};

}  // namespace

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
  OverrideWalk(arg, text, holder.get("v"), ctx).run(root, segments);
}

}  // namespace kiln::manifest_detail
