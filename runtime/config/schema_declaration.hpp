// How manifest_schema.cpp declares a table: a key at a time, each bound to
// the member it fills, whose type gives the key's kind. Internal to config/;
// included by manifest_schema.cpp only.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/manifest_schema.hpp"

namespace kiln::manifest_detail {

inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// How a member's type reads from and shows in the manifest.
template <class T>
struct MemberType;
template <>
struct MemberType<bool> {
  static constexpr ValueKind kind = ValueKind::boolean;
  static bool from(const SchemaValue& v) { return std::get<bool>(v); }
  static std::string show(bool v) { return v ? "true" : "false"; }
};
template <>
struct MemberType<int64_t> {
  static constexpr ValueKind kind = ValueKind::integer;
  static int64_t from(const SchemaValue& v) { return std::get<int64_t>(v); }
  static std::string show(int64_t v) { return std::to_string(v); }
};
template <>
struct MemberType<int> {  // bounded by the schema to fit
  static constexpr ValueKind kind = ValueKind::integer;
  static int from(const SchemaValue& v) { return static_cast<int>(std::get<int64_t>(v)); }
  static std::string show(int v) { return std::to_string(v); }
};
template <>
struct MemberType<uint64_t> {  // bounded by the schema to >= 0
  static constexpr ValueKind kind = ValueKind::integer;
  static uint64_t from(const SchemaValue& v) { return static_cast<uint64_t>(std::get<int64_t>(v)); }
  static std::string show(uint64_t v) { return std::to_string(v); }
};
template <>
struct MemberType<double> {
  static constexpr ValueKind kind = ValueKind::number;
  static double from(const SchemaValue& v) { return std::get<double>(v); }
  static std::string show(double v) { return float_text(v); }
};
template <>
struct MemberType<std::string> {
  static constexpr ValueKind kind = ValueKind::string;
  static std::string from(const SchemaValue& v) { return std::get<std::string>(v); }
  static std::string show(const std::string& v) { return quoted(v); }
};
template <>
struct MemberType<std::filesystem::path> {
  static constexpr ValueKind kind = ValueKind::path;
  static std::filesystem::path from(const SchemaValue& v) { return std::get<std::filesystem::path>(v); }
  static std::string show(const std::filesystem::path& v) { return quoted(v.string()); }
};
template <>
struct MemberType<BatchLimit> {
  static constexpr ValueKind kind = ValueKind::batch_limit;
  static BatchLimit from(const SchemaValue& v) { return std::get<BatchLimit>(v); }
  static std::string show(const BatchLimit& v) {
    return v.is_fraction ? float_text(v.fraction) : std::to_string(v.count);
  }
};

template <>
struct MemberType<std::pair<double, double>> {
  static constexpr ValueKind kind = ValueKind::betas;
  static std::pair<double, double> from(const SchemaValue& v) { return std::get<std::pair<double, double>>(v); }
  static std::string show(const std::pair<double, double>& v) {
    return "[" + float_text(v.first) + ", " + float_text(v.second) + "]";
  }
};
template <>
struct MemberType<std::vector<std::string>> {  // patterns; .choices() makes it a choice_list
  static constexpr ValueKind kind = ValueKind::patterns;
  static std::vector<std::string> from(const SchemaValue& v) { return std::get<std::vector<std::string>>(v); }
  static std::string show(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + quoted(s);
    return "[" + out + "]";
  }
};
template <>
struct MemberType<std::map<std::string, std::string>> {  // string_table
  static constexpr ValueKind kind = ValueKind::string_table;
  static std::map<std::string, std::string> from(const SchemaValue& v) {
    return std::get<std::map<std::string, std::string>>(v);
  }
  static std::string show(const std::map<std::string, std::string>& v) {
    std::string out;
    for (const auto& [k, s] : v) out += (out.empty() ? "" : ", ") + quoted(k) + " = " + quoted(s);
    return "{" + out + "}";
  }
};
template <>
struct MemberType<CountOrAuto> {
  static constexpr ValueKind kind = ValueKind::count_or_auto;
  static CountOrAuto from(const SchemaValue& v) { return CountOrAuto{std::get<int64_t>(v)}; }
  static std::string show(const CountOrAuto& v) { return v.is_auto() ? quoted("auto") : std::to_string(v.value); }
};

// An option a group may leave to [optimizer]: absent until set.
template <class T>
struct MemberType<std::optional<T>> {
  static constexpr ValueKind kind = MemberType<T>::kind;
  static std::optional<T> from(const SchemaValue& v) { return MemberType<T>::from(v); }
  static std::string show(const std::optional<T>& v) { return v ? MemberType<T>::show(*v) : ""; }
};

// Declares the keys of one table, each bound to a member of `Section`: a
// member of the Manifest, or (for an array of tables) of its newest entry.
template <class Section>
class TableDeclaration {
 public:
  using Access = std::function<Section&(Manifest&)>;
  using ConstAccess = std::function<const Section&(const Manifest&)>;

  TableDeclaration(std::string name, Section Manifest::*section, std::string doc)
      : TableDeclaration(
            std::move(name), [section](Manifest& m) -> Section& { return m.*section; },
            [section](const Manifest& m) -> const Section& { return m.*section; }, std::move(doc)) {}
  TableDeclaration(std::string name, Access access, ConstAccess shown, std::string doc)
      : access_(std::move(access)), shown_(std::move(shown)) {
    table_.name = std::move(name);
    table_.doc = std::move(doc);
  }

  // A key filling `member`; its kind follows the member's type.
  template <class T>
  TableDeclaration& key(std::string name, T Section::*member, std::string doc) {
    KeySchema k = declare(std::move(name), std::move(doc));
    const Access access = access_;
    const ConstAccess shown = shown_;
    if constexpr (std::is_enum_v<T>) {
      k.kind = ValueKind::choice;
      k.choices = option_names<T>();
      k.store = [access, member](Manifest& m, const SchemaValue& v) {
        access(m).*member = static_cast<T>(std::get<ChoiceIndex>(v).index);
      };
      k.show = [shown, member](const Manifest& m) { return quoted(option_name(shown(m).*member)); };
    } else {
      k.kind = MemberType<T>::kind;
      k.store = [access, member](Manifest& m, const SchemaValue& v) { access(m).*member = MemberType<T>::from(v); };
      k.show = [shown, member](const Manifest& m) { return MemberType<T>::show(shown(m).*member); };
    }
    table_.keys.push_back(std::move(k));
    return *this;
  }

  // A key whose reading needs more than one member (optimizer.betas).
  TableDeclaration& key(std::string name, ValueKind kind, std::function<void(Manifest&, const SchemaValue&)> store,
                        std::function<std::string(const Manifest&)> show, std::string doc) {
    KeySchema k = declare(std::move(name), std::move(doc));
    k.kind = kind;
    k.store = std::move(store);
    k.show = std::move(show);
    table_.keys.push_back(std::move(k));
    return *this;
  }

  // Constraints on the key declared last.
  // Integer bounds (int: a literal picks these, not the double ones).
  TableDeclaration& at_least(int min) { return last().int_min = min, *this; }
  TableDeclaration& between(int min, int max) { return last().int_min = min, last().int_max = max, *this; }
  // Number bounds.
  TableDeclaration& above(double min) { return last().min = min, last().min_exclusive = true, *this; }
  TableDeclaration& at_least(double min) { return last().min = min, *this; }
  TableDeclaration& between(double min, double max) { return last().min = min, last().max = max, *this; }
  TableDeclaration& nonempty() { return last().nonempty = true, *this; }
  TableDeclaration& kind(ValueKind kind) { return last().kind = kind, *this; }
  // A list of names out of a closed set (logging.loggers).
  TableDeclaration& choices(std::vector<std::string> names) {
    last().kind = ValueKind::choice_list;
    return last().choices = std::move(names), *this;
  }
  TableDeclaration& refuse(decltype(KeySchema::refuse) check, std::string allowed) {
    last().refuse = std::move(check);
    last().allowed_text = std::move(allowed);
    return *this;
  }
  TableDeclaration& allowed(std::string text) { return last().allowed_text = std::move(text), *this; }
  // A count-or-fraction key whose integer is not a number of batches.
  TableDeclaration& counts(std::string what) { return last().counts = std::move(what), *this; }
  TableDeclaration& default_text(std::string text) { return last().default_text = std::move(text), *this; }
  TableDeclaration& required() { return last().required = true, last().default_text = "required", *this; }
  // Makes the table an array of tables whose entries `add_entry` opens.
  TableDeclaration& array_of_tables(std::function<void(Manifest&, const std::string&)> add_entry) {
    table_.array_of_tables = true;
    table_.add_entry = std::move(add_entry);
    return *this;
  }

  TableSchema done() {
    for (auto& k : table_.keys) k.in_array = table_.array_of_tables;
    return std::move(table_);
  }

 private:
  KeySchema declare(std::string name, std::string doc) {
    KeySchema k;
    k.table = table_.name;
    k.key = std::move(name);
    k.doc = std::move(doc);
    return k;
  }
  KeySchema& last() { return table_.keys.back(); }

  Access access_;
  ConstAccess shown_;
  TableSchema table_;
};

}  // namespace kiln::manifest_detail
