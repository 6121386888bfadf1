#include "util/shortest_double.hpp"

#include <algorithm>
#include <charconv>
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

// The shortest significant digits of |value| that read back as |value|, the
// nearest such among those as short: |value| is d1.d2...dn x 10^exponent
// (n >= 1, no trailing zero but for 0 itself). std::to_chars without a
// precision gives exactly these (the standard's rule is CPython's dtoa mode
// 0: shortest, then nearest, ties to even) in one pass; trying "%.*e" at
// each precision cost up to 17 snprintf/strtod pairs a value, which a logger
// of step rows paid for every point. Returns n; `digits` holds 17 or more.
int shortest_digits(double value, char* digits, int& exponent) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, std::fabs(value), std::chars_format::scientific);
  const char* end = result.ptr;  // 32 bytes hold any double's shortest scientific form
  const char* e = std::find(static_cast<const char*>(buffer), end, 'e');
  int n = 0;
  for (const char* p = buffer; p != e; ++p)
    if (*p != '.') digits[n++] = *p;
  exponent = 0;
  std::from_chars(e + 1 + (e[1] == '+'), end, exponent);
  while (n > 1 && digits[n - 1] == '0') --n;
  return n;
}

}  // namespace

void append_python_float_repr(std::string& out, double finite_value) {
  char digits[24];
  int exponent = 0;
  const int n = shortest_digits(finite_value, digits, exponent);
  const int decpt = exponent + 1;  // the value is 0.DIGITS x 10^decpt
  if (std::signbit(finite_value)) out += '-';
  if (decpt <= -4 || decpt > 16) {  // CPython's format_float_short, 'r'
    out += digits[0];
    if (n > 1) {
      out += '.';
      out.append(digits + 1, n - 1);
    }
    char tail[16];
    const int length = std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out.append(tail, length);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(-decpt, '0');
    out.append(digits, n);
  } else if (decpt >= n) {
    out.append(digits, n);
    out.append(decpt - n, '0');
    out += ".0";
  } else {
    out.append(digits, decpt);
    out += '.';
    out.append(digits + decpt, n - decpt);
  }
}

std::string python_float_repr(double finite_value) {
  std::string out;
  append_python_float_repr(out, finite_value);
  return out;
}

}  // namespace kiln
