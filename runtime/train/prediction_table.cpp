#include "train/prediction_table.hpp"

#include <cstdint>

namespace kiln {

namespace {

void skip_space(const std::string& t, size_t& i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
}

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::optional<uint32_t> hex4(const std::string& t, size_t i) {
  if (i + 4 > t.size()) return std::nullopt;
  uint32_t v = 0;
  for (size_t k = i; k < i + 4; ++k) {
    const char c = t[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
    else return std::nullopt;
  }
  return v;
}

std::optional<std::string> parse_string(const std::string& t, size_t& i) {
  if (i >= t.size() || t[i] != '"') return std::nullopt;
  std::string out;
  for (++i; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '"') {
      ++i;
      return out;
    }
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= t.size()) return std::nullopt;
    switch (t[i]) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        std::optional<uint32_t> cp = hex4(t, i + 1);
        if (!cp) return std::nullopt;
        i += 4;
        if (*cp >= 0xd800 && *cp < 0xdc00 && i + 6 < t.size() && t[i + 1] == '\\' && t[i + 2] == 'u') {
          const std::optional<uint32_t> low = hex4(t, i + 3);
          if (low && *low >= 0xdc00 && *low < 0xe000) {
            *cp = 0x10000 + ((*cp - 0xd800) << 10) + (*low - 0xdc00);
            i += 6;
          }
        }
        put_utf8(out, *cp);
        break;
      }
      default: return std::nullopt;
    }
  }
  return std::nullopt;
}

// A field as RFC 4180 writes it: quoted when it holds a comma, a quote or a
// line end.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::optional<std::vector<std::string>> parse_string_array(const std::string& text) {
  size_t i = 0;
  skip_space(text, i);
  if (i >= text.size() || text[i] != '[') return std::nullopt;
  ++i;
  std::vector<std::string> out;
  skip_space(text, i);
  if (i < text.size() && text[i] == ']') {
    ++i;
  } else {
    for (;;) {
      skip_space(text, i);
      std::optional<std::string> s = parse_string(text, i);
      if (!s) return std::nullopt;
      out.push_back(std::move(*s));
      skip_space(text, i);
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == ']') {
        ++i;
        break;
      }
      return std::nullopt;
    }
  }
  skip_space(text, i);
  if (i != text.size()) return std::nullopt;
  return out;
}

std::optional<std::string> prediction_table(const at::Tensor& outputs, const std::vector<std::string>& classes,
                                            const std::vector<std::string>& names, std::string* warning) {
  at::Tensor predicted;
  if (outputs.dim() == 2 && outputs.is_floating_point() && outputs.size(1) >= 2) {
    predicted = outputs.argmax(1);
  } else if (outputs.dim() == 1 && !outputs.is_floating_point() && outputs.scalar_type() != at::kBool) {
    predicted = outputs;
  } else {
    return std::nullopt;
  }
  predicted = predicted.to(at::kLong).contiguous();
  const int64_t rows = predicted.size(0);
  const int64_t width = outputs.dim() == 2 ? outputs.size(1) : -1;
  bool use_classes = !classes.empty(), use_names = !names.empty();
  if (use_classes && width >= 0 && static_cast<int64_t>(classes.size()) != width) {
    *warning = "the model's " + std::to_string(width) + " outputs per row are not the data module's " +
               std::to_string(classes.size()) + " classes: predictions.csv has no class names";
    use_classes = false;
  }
  if (use_names && static_cast<int64_t>(names.size()) < rows) {
    *warning = std::to_string(names.size()) + " sample names for " + std::to_string(rows) +
               " rows: predictions.csv has no names";
    use_names = false;
  }
  std::string out = std::string("index") + (use_names ? ",name" : "") + ",prediction" + (use_classes ? ",class" : "") + "\n";
  const int64_t* p = predicted.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    out += std::to_string(r);
    if (use_names) out += "," + csv_field(names[static_cast<size_t>(r)]);
    out += "," + std::to_string(p[r]);
    if (use_classes)
      out += "," + (p[r] >= 0 && p[r] < static_cast<int64_t>(classes.size()) ? csv_field(classes[static_cast<size_t>(p[r])]) : "");
    out += "\n";
  }
  return out;
}

}  // namespace kiln
