// The shortest decimal text that reads back (strtod) as exactly the same
// double: 0.1, not 0.1000000000000000055. One formatter for every text that
// shows a number a person may copy back (manifest messages), and one that
// spells it as Python's repr does (metrics.csv, metrics.jsonl, TensorBoard's
// hparams text).
#pragma once

#include <string>

namespace kiln {

// `value` must be finite (callers decide how to spell nan and inf).
// `plain`: no exponent where a person expects none (1e-4 <= |value| < 1e15:
// 60, not 6e+01), for documentation.
std::string shortest_double(double value, bool plain = false);

// Exactly CPython's repr(float) of a finite double: the shortest digits that
// read back as the same double (the nearest such where several are as
// short), written as 0.DIGITS x 10^decpt in fixed notation when
// -4 < decpt <= 16, with a '.' and at least one digit after it (10.0,
// 0.0001, 1000000000000000.0, -0.0), else in exponent notation, a '.' only
// after a first of several digits and the exponent signed and at least two
// digits (1e+16, 1.5e+16, 1e-05, 5e-324). `finite_value` must be finite.
std::string python_float_repr(double finite_value);
// The same, appended to `out` (no allocation beyond out's growth): for
// loggers that write a point every step.
void append_python_float_repr(std::string& out, double finite_value);

}  // namespace kiln
