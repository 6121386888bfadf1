#include "util/shortest_double.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln {

std::string shortest_double(double value, bool plain) {
  char buffer[32];
  const bool exponent_unwanted = plain && std::fabs(value) >= 1e-4 && std::fabs(value) < 1e15;
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
    if (exponent_unwanted && std::strchr(buffer, 'e') != nullptr) continue;
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

}  // namespace kiln
