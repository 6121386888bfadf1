// The one key/value text a checkpoint section may hold: "key value\n" lines,
// in the order written ("meta", "amp/scaler"). A line without a space is a
// key with an empty value; readers skip keys they do not know, so a newer
// kiln may add some. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class CheckpointFile;

// Encoding: the fields in the order added, each "key value\n" (the value
// may be empty: "key \n").
class SectionFieldsWriter {
 public:
  SectionFieldsWriter& add(std::string_view key, std::string_view value);
  SectionFieldsWriter& add(std::string_view key, int64_t value);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// Decoding one section's text. `where` names it in messages, e.g.
// "run/last.ckpt: section 'amp/scaler'".
class SectionFields {
 public:
  SectionFields(std::string where, std::string_view text);
  // Section `name` of `file`; throws CheckpointError when it is absent.
  SectionFields(const CheckpointFile& file, std::string_view name);

  // Every line's key and value, in file order (duplicates kept).
  const std::vector<std::pair<std::string_view, std::string_view>>& lines() const { return lines_; }
  // The last value of `key`, if any.
  std::optional<std::string_view> find(std::string_view key) const;
  // The same; throws CheckpointError "<where> has no field 'key'" when absent.
  std::string_view get(std::string_view key) const;
  // A non-negative decimal integer that is the whole value of `key`;
  // CheckpointError "<where>: field 'key' is not a non-negative integer ('v')"
  // when it is not, "<where> has no field 'key'" when absent.
  int64_t count(std::string_view key) const;
  // A finite double (strtod's syntax, the whole value), or the same errors.
  double number(std::string_view key) const;

  const std::string& where() const { return where_; }

 private:
  std::string where_;
  std::vector<std::pair<std::string_view, std::string_view>> lines_;
};

// The non-negative decimal integer that is the whole of `text`, or nullopt.
std::optional<int64_t> parse_field_count(std::string_view text);
// The finite double that is the whole of `text` (strtod's syntax), or nullopt.
std::optional<double> parse_field_number(std::string_view text);

}  // namespace kiln
