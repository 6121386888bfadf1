// kiln_plugins/checks.hpp — range checks for plugin config values. The SDK
// checks types; these check meaning, with one-line errors that name the key
// (the host's error line already names the plugin and its manifest table).
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "kiln/config.hpp"

namespace kiln_plugins {

// "0.5" rather than std::to_string's "0.500000".
inline std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

inline int64_t positive(const std::string& key, int64_t value) {
  if (value <= 0)
    throw kiln::ConfigError("'" + key + "' must be positive, got " + std::to_string(value));
  return value;
}

inline int64_t non_negative(const std::string& key, int64_t value) {
  if (value < 0)
    throw kiln::ConfigError("'" + key + "' must be 0 or more, got " + std::to_string(value));
  return value;
}

inline double non_negative(const std::string& key, double value) {
  if (!(value >= 0.0) || std::isinf(value))
    throw kiln::ConfigError("'" + key + "' must be a finite number >= 0, got " + number(value));
  return value;
}

// A dropout rate: 1 would zero every activation, so it is excluded.
inline double dropout_rate(const std::string& key, double value) {
  if (!(value >= 0.0 && value < 1.0))
    throw kiln::ConfigError("'" + key + "' must be in [0, 1), got " + number(value));
  return value;
}

}  // namespace kiln_plugins
