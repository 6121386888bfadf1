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

namespace {

// `digits` (d1 d2 ... dn) as the double d1.d2...dn x 10^exponent.
double read_back(const std::string& digits, int exponent) {
  std::string text = digits.substr(0, 1) + "." + digits.substr(1) + "e" + std::to_string(exponent);
  return std::strtod(text.c_str(), nullptr);
}

// The shortest significant digits of |value| that read back as |value|, the
// nearest such among those as short, with their exponent: |value| is
// d1.d2...dn x 10^exponent (n >= 1, no trailing zero but for 0 itself).
// The correctly rounded p digits ("%.*e") are the nearest p-digit decimal;
// where they fall just outside the interval that reads back as |value| (a
// power of two, whose interval is twice as wide above it as below), the
// p-digit decimal next to them on the value's other side may lie inside it,
// and is then the shortest (CPython's dtoa mode 0 finds it; "%.*e" alone
// would give 17 digits for 2^-1017, 7.120236347223045e-307).
void shortest_digits(double value, std::string& digits, int& exponent) {
  const double magnitude = std::fabs(value);
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*e", precision - 1, magnitude);
    const char* e = std::strchr(buffer, 'e');
    digits.clear();
    for (const char* p = buffer; p != e; ++p)
      if (*p != '.') digits += *p;
    exponent = std::atoi(e + 1);
    const double rounded = std::strtod(buffer, nullptr);
    if (rounded == magnitude) break;
    // The neighbour on the other side of the value: one unit in the last
    // digit up (or down).
    std::string neighbour = digits;
    int neighbour_exponent = exponent;
    if (rounded < magnitude) {
      int i = static_cast<int>(neighbour.size()) - 1;
      while (i >= 0 && neighbour[i] == '9') neighbour[i--] = '0';
      if (i >= 0) {
        ++neighbour[i];
      } else {  // 99..9 + 1 = 100..0: one digit more, as many significant
        neighbour.insert(neighbour.begin(), '1');
        neighbour.pop_back();
        ++neighbour_exponent;
      }
    } else {
      int i = static_cast<int>(neighbour.size()) - 1;
      while (i >= 0 && neighbour[i] == '0') neighbour[i--] = '9';
      if (i >= 0) --neighbour[i];  // never all zeros: the value is not 0 here
      if (neighbour[0] == '0') {  // 10..0 - 1 = 09..9: the same digits a place lower
        neighbour.erase(neighbour.begin());
        neighbour += '9';
        --neighbour_exponent;
      }
    }
    if (read_back(neighbour, neighbour_exponent) == magnitude) {
      digits = neighbour;
      exponent = neighbour_exponent;
      break;
    }
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
}

}  // namespace

std::string python_float_repr(double finite_value) {
  std::string digits;
  int exponent = 0;
  shortest_digits(finite_value, digits, exponent);
  const int n = static_cast<int>(digits.size());
  const int decpt = exponent + 1;  // the value is 0.DIGITS x 10^decpt
  std::string out = std::signbit(finite_value) ? "-" : "";
  if (decpt <= -4 || decpt > 16) {  // CPython's format_float_short, 'r'
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += tail;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

}  // namespace kiln
