#include "config/duration.hpp"

#include <vector>

namespace kiln {

std::optional<int64_t> parse_duration_seconds(const std::string& text) {
  std::vector<int64_t> parts;
  std::string digits;
  auto take = [&]() -> bool {
    if (digits.empty() || digits.size() > 6) return false;
    parts.push_back(std::stoll(digits));
    digits.clear();
    return true;
  };
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      digits += c;
    } else if (c == ':') {
      if (!take()) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!take()) return std::nullopt;
  if (parts.size() != 3 && parts.size() != 4) return std::nullopt;
  const bool days = parts.size() == 4;
  const int64_t d = days ? parts[0] : 0;
  const int64_t h = parts[parts.size() - 3], m = parts[parts.size() - 2], s = parts[parts.size() - 1];
  if (m >= 60 || s >= 60 || (days && h >= 24)) return std::nullopt;
  return ((d * 24 + h) * 60 + m) * 60 + s;
}

}  // namespace kiln
