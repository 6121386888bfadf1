#include "util/shortest_double.hpp"

#include <cstdio>
#include <cstdlib>

namespace kiln {

std::string shortest_double(double value) {
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

}  // namespace kiln
