// The manifest's input guard: what toml++ is never handed. Internal to
// config/. Every toml::parse of the manifest code (the file, a --set value, a
// quoted value probed for "write 3 without quotes") goes through here, after
// the guard; and toml++'s parser and formatter are compiled in this one file.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <toml++/toml.h>

namespace kiln::manifest_detail {

// Where `text` has a non-ASCII byte outside a string or a comment, as
// "line:col" (columns count bytes from 1); empty when it has none.
std::string non_ascii_outside_strings(std::string_view text);

// The manifest file's text as TOML. A UTF-8 byte-order mark before the first
// line is dropped; a non-ASCII character outside a string or comment, or a
// syntax error, fails with "<shown>:<line>:<col>: ...".
toml::table parse_manifest_text(std::string text, const std::string& shown);

// `text` as one TOML value ("v = <text>" with a single key "v"), when it is
// one that toml++ may read; nullopt otherwise.
std::optional<toml::table> parse_one_value(const std::string& text);

// A table as TOML text.
std::string toml_text(const toml::table& table);

}  // namespace kiln::manifest_detail
