// A data module's class names as <run dir>/<plugin id>/classes.json: a JSON
// array in class-index order, which `kiln predict` reads to name each row's
// class (predictions.csv) and Python reads with json.load. No LibTorch.
#pragma once

#include <string>
#include <vector>

#include "kiln/plugin.hpp"

namespace kiln_plugins {

// `s` as a JSON string: quotes, backslashes and control characters escaped.
inline std::string json_string(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Writes classes.json; false from a host older than ABI 1.3 (nothing written).
inline bool save_class_list(const kiln::Host& host, const std::vector<std::string>& names) {
  std::string json = "[";
  for (size_t i = 0; i < names.size(); ++i) json += (i ? ", " : "") + json_string(names[i]);
  return host.write_run_file("classes.json", json + "]\n");
}

}  // namespace kiln_plugins
