// The shortest decimal text that reads back (strtod) as exactly the same
// double: 0.1, not 0.1000000000000000055. One formatter for every text that
// shows a number a person may copy back (manifest messages, metrics.jsonl).
#pragma once

#include <string>

namespace kiln {

// `value` must be finite (callers decide how to spell nan and inf).
// `plain`: no exponent where a person expects none (1e-4 <= |value| < 1e15:
// 60, not 6e+01), for documentation.
std::string shortest_double(double value, bool plain = false);

}  // namespace kiln
