// Small text helpers of the manifest code: messages, keys and values as text.
// Internal to config/. The "did you mean" of every message is the SDK's
// (kiln/detail/suggest.hpp), shared with plugins' config checks.
#pragma once

#include <string>
#include <vector>

namespace kiln::manifest_detail {

// Messages are exactly one line, whatever a user put in a key or a value:
// newlines are shown escaped. (util/errors.hpp's one_line is another thing:
// it cuts a C++ backtrace from an error's text.)
std::string escape_newlines(const std::string& s);

// Throws the InputError of the manifest code: `message` as one line.
[[noreturn]] void fail(const std::string& message);

bool ends_with(const std::string& s, const std::string& suffix);
bool starts_with(const std::string& s, const std::string& prefix);
std::string trim(const std::string& s);  // spaces and tabs
std::string lower(std::string s);
bool all_digits(const std::string& s);  // and not empty

// The shortest text that reads back as the same double (0.1, not 0.1000000000000000055).
std::string format_double(double d);

// 'a', 'b' or 'c'
std::string quoted_list(const std::vector<std::string>& items);
std::string join(const std::vector<std::string>& items, const std::string& separator);

}  // namespace kiln::manifest_detail
