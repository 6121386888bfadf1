// The shortest decimal text that reads back (strtod) as exactly the same
// double: 0.1, not 0.1000000000000000055. One formatter for every text that
// shows a number a person may copy back (manifest messages, metrics.jsonl).
#pragma once

#include <string>

namespace kiln {

// `value` must be finite (callers decide how to spell nan and inf).
std::string shortest_double(double value);

}  // namespace kiln
