#include "distributed/agreement.hpp"

#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace kiln {

namespace {

// Unit and record separators: they do not occur in manifests, ids or names.
constexpr char kUnit = '\x1f';
constexpr char kRecord = '\x1e';

Facts decode(const std::string& blob) {
  Facts out;
  size_t at = 0;
  while (at < blob.size()) {
    const size_t unit = blob.find(kUnit, at);
    const size_t record = unit == std::string::npos ? std::string::npos : blob.find(kRecord, unit);
    if (record == std::string::npos) break;
    out.emplace_back(blob.substr(at, unit - at), blob.substr(unit + 1, record - unit - 1));
    at = record + 1;
  }
  return out;
}

}  // namespace

std::string encode_facts(const Facts& facts) {
  std::string out;
  for (const auto& [what, text] : facts) out += what + kUnit + text + kRecord;
  return out;
}

std::optional<std::string> first_difference(const std::vector<std::string>& encoded) {
  for (size_t r = 1; r < encoded.size(); ++r) {
    if (encoded[r] == encoded[0]) continue;
    const Facts a = decode(encoded[0]), b = decode(encoded[r]);
    for (size_t i = 0; i < a.size() || i < b.size(); ++i) {
      const std::string what = i < a.size() ? a[i].first : b[i].first;
      const std::string text_a = i < a.size() ? a[i].second : "", text_b = i < b.size() ? b[i].second : "";
      if (text_a == text_b) continue;
      std::istringstream la(text_a), lb(text_b);
      std::string x, y;
      for (;;) {
        const bool more_a = static_cast<bool>(std::getline(la, x));
        const bool more_b = static_cast<bool>(std::getline(lb, y));
        if (!more_a) x = "(nothing)";
        if (!more_b) y = "(nothing)";
        if (x != y || (!more_a && !more_b)) break;
      }
      const std::string rs = std::to_string(r);
      return "ranks 0 and " + rs + " differ in their " + what + ": rank 0 has '" + x + "', rank " + rs + " has '" + y +
             "'; every rank must run the same manifest, plugins and model";
    }
  }
  return std::nullopt;
}

std::string file_digest(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) XXH64_update(state, buffer, static_cast<size_t>(in.gcount()));
  const unsigned long long digest = XXH64_digest(state);
  XXH64_freeState(state);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", digest);
  return text;
}

}  // namespace kiln
