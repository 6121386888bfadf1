// Text from a user's file as a one-line message shows it: control
// characters as \xNN. No LibTorch (the fuzz targets include it).
#pragma once

#include <string>

namespace kiln_plugins {

inline std::string one_line(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace kiln_plugins
