#include "ckpt/section_fields.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

#include "ckpt/checkpoint_file.hpp"
#include "ckpt/checkpoint_meta.hpp"

namespace kiln {

SectionFieldsWriter& SectionFieldsWriter::add(std::string_view key, std::string_view value) {
  text_.append(key).append(" ").append(value).append("\n");
  return *this;
}

SectionFieldsWriter& SectionFieldsWriter::add(std::string_view key, int64_t value) {
  return add(key, std::to_string(value));
}

SectionFields::SectionFields(std::string where, std::string_view text) : where_(std::move(where)) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    const size_t space = line.find(' ');
    lines_.emplace_back(line.substr(0, space), space == std::string_view::npos ? "" : line.substr(space + 1));
  }
}

SectionFields::SectionFields(const CheckpointFile& file, std::string_view name)
    : SectionFields(file.path().string() + ": section '" + std::string(name) + "'", file.section(name)) {}

std::optional<std::string_view> SectionFields::find(std::string_view key) const {
  for (auto it = lines_.rbegin(); it != lines_.rend(); ++it)
    if (it->first == key) return it->second;
  return std::nullopt;
}

std::string_view SectionFields::get(std::string_view key) const {
  const auto value = find(key);
  if (!value) throw CheckpointError(where_ + " has no field '" + std::string(key) + "'");
  return *value;
}

int64_t SectionFields::count(std::string_view key) const {
  const std::string_view value = get(key);
  const auto n = parse_field_count(value);
  if (!n)
    throw CheckpointError(where_ + ": field '" + std::string(key) + "' is not a non-negative integer (" + shown(value) +
                          ")");
  return *n;
}

double SectionFields::number(std::string_view key) const {
  const std::string_view value = get(key);
  const auto x = parse_field_number(value);
  if (!x) throw CheckpointError(where_ + ": field '" + std::string(key) + "' is not a finite number (" + shown(value) + ")");
  return *x;
}

std::optional<int64_t> parse_field_count(std::string_view text) {
  int64_t value = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0) return std::nullopt;
  return value;
}

std::optional<double> parse_field_number(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace kiln
