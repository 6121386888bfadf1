// The manifest's input guard (config/input_guard.hpp).
//
// Valid TOML never has a non-ASCII byte outside a string or a comment (bare
// keys are ASCII), and toml++ 3.3 reaches __builtin_unreachable() while
// classifying some such characters as whitespace or not (is_non_ascii_
// horizontal_whitespace: U+00A1-U+0499, U+2C5E-U+3057, U+FB26-U+FEFE, e.g.
// U+0193; found by tests/fuzz): text that would take that path never reaches
// it.
#include "config/input_guard.hpp"

#include <algorithm>
#include <sstream>
#include <vector>

#include "config/text.hpp"

namespace kiln::manifest_detail {

namespace {

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
constexpr std::string_view kTripleQuote = "\"\"\"", kTripleApostrophe = "'''";

bool ascii(char c) { return static_cast<unsigned char>(c) < 0x80; }
bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// The scan behind non_ascii_outside_strings, one character at a time.
//
// "Inside a string" is what toml++ will read as one: a quote opens a string
// only where a key or a value starts (at a line's start, after '=', '[', '{'
// or ',', or after a '.' of a dotted key), never inside a bare value, which
// toml++ reads up to whitespace, ',', ']', '}' or '#' whatever it holds
// (1e'...', 1$a="..."); and so does this scan. Inside a
// multi-line basic string, toml++ also classifies the character after a
// backslash and those it skips after a line-ending backslash: they must be
// ASCII too.
class NonAsciiScan {
 public:
  explicit NonAsciiScan(std::string_view text) : text_(text) {}

  std::string run() {
    for (i_ = 0; i_ < text_.size(); ++i_) {
      ++column_;
      if (!step(text_[i_])) return std::to_string(line_) + ":" + std::to_string(column_);
      if (text_[i_] == '\n') line_ += 1, column_ = 0;
    }
    return "";
  }

 private:
  enum class In { code, comment, basic, literal, multi_basic, multi_literal, escape, line_ending };

  bool starts(std::string_view s) const { return text_.substr(i_, s.size()) == s; }
  void skip(size_t n) { i_ += n, column_ += n; }

  // false: a non-ASCII byte toml++ would classify.
  bool step(char c) {
    switch (in_) {
      case In::comment:
        if (c != '\n') return true;
        in_ = In::code;
        return code(c);
      case In::code: return code(c);
      case In::basic:
        if (c == '\\' && i_ + 1 < text_.size() && text_[i_ + 1] != '\n') skip(1);
        else if (c == '"' || c == '\n') in_ = In::code, last_ = c;
        return true;
      case In::literal:
        if (c == '\'' || c == '\n') in_ = In::code, last_ = c;
        return true;
      case In::escape:  // the character after a backslash in a multi-line basic string
        if (!ascii(c)) return false;
        in_ = blank(c) ? In::line_ending : In::multi_basic;
        return true;
      case In::line_ending:  // what toml++ skips after a line-ending backslash
        if (!ascii(c)) return false;
        if (blank(c)) return true;
        in_ = In::multi_basic;
        return multi_basic(c);
      case In::multi_basic: return multi_basic(c);
      case In::multi_literal:
        if (starts(kTripleApostrophe)) in_ = In::code, last_ = '\'', skip(2);
        return true;
    }
    return true;
  }

  bool multi_basic(char c) {
    if (c == '\\') in_ = In::escape;
    else if (starts(kTripleQuote)) in_ = In::code, last_ = '"', skip(2);
    return true;
  }

  bool code(char c) {
    if (!ascii(c)) return false;
    if (bare_) {
      // toml++ reads a bare value (a number, a date, true, or junk) up to
      // one of these, classifying every character: nothing in it opens
      // a string, an array or a table.
      if (!blank(c) && c != ',' && c != ']' && c != '}' && c != '#') {
        last_ = c;
        return true;
      }
      bare_ = false;
    }
    const bool opens = last_ == '\n' || last_ == '=' || last_ == '[' || last_ == '{' || last_ == ',' ||
                       (last_ == '.' && key_side_);
    if (c == '#') {
      in_ = In::comment;
    } else if ((c == '"' || c == '\'') && opens) {
      open_string(c);
    } else if (c == '=' && key_side_ && !header_) {
      key_side_ = false;
    } else if (!key_side_ && !header_ && !blank(c) && c != '[' && c != '{' && c != ']' && c != '}' && c != ',') {
      bare_ = true;  // a value that is not a string, an array or an inline table
    } else {
      structure(c);
    }
    if (c == '\n' || !blank(c)) last_ = c;
    return true;
  }

  void open_string(char c) {
    if (starts(kTripleQuote)) {
      in_ = In::multi_basic, skip(2);
    } else if (starts(kTripleApostrophe)) {
      in_ = In::multi_literal, skip(2);
    } else {
      in_ = c == '"' ? In::basic : In::literal;
    }
  }

  // Brackets, braces, commas and line ends: tables, arrays and which side
  // of a key's '=' comes next.
  void structure(char c) {
    if (c == '{') {
      open_.push_back('{'), key_side_ = true;
    } else if (c == '[') {
      if (last_ == '\n' && open_.empty()) header_ = true, key_side_ = true;
      else if (!header_) open_.push_back('['), key_side_ = false;
    } else if (c == ']' || c == '}') {
      if (!open_.empty()) open_.pop_back(), key_side_ = false;
      else header_ = false;
    } else if (c == ',') {
      key_side_ = !open_.empty() && open_.back() == '{';
    } else if (c == '\n' && open_.empty()) {
      key_side_ = true, header_ = false;
    }
  }

  std::string_view text_;
  size_t i_ = 0, line_ = 1, column_ = 0;
  In in_ = In::code;
  char last_ = '\n';       // the last character of code other than blanks; '\n' at a line's start
  bool key_side_ = true;   // a '.' here joins a dotted key (not a number's point)
  bool header_ = false;    // inside the brackets of [table] or [[table]]
  bool bare_ = false;      // inside a bare value (not a string, array or table)
  std::vector<char> open_; // the '[' of arrays and '{' of inline tables open in a value
};

// The byte offset of "line:col" (as non_ascii_outside_strings gives it:
// columns count bytes from 1) in `text`.
size_t byte_at(const std::string& text, const std::string& line_col) {
  const size_t colon = line_col.find(':');
  size_t line = std::stoul(line_col.substr(0, colon));
  const size_t column = std::stoul(line_col.substr(colon + 1));
  size_t offset = 0;
  while (--line > 0 && offset < text.size()) {
    const size_t newline = text.find('\n', offset);
    if (newline == std::string::npos) return text.size();
    offset = newline + 1;
  }
  return std::min(text.size(), offset + column - 1);
}

}  // namespace

std::string non_ascii_outside_strings(std::string_view text) { return NonAsciiScan(text).run(); }

toml::table parse_manifest_text(std::string text, const std::string& shown) {
  // A UTF-8 byte-order mark before the first line (editors on Windows write
  // one) is not part of the TOML: dropped, so line 1 column 1 is the first
  // character an editor shows. Anywhere else it is refused, by name.
  if (text.rfind(kUtf8Bom, 0) == 0) text.erase(0, kUtf8Bom.size());
  if (const std::string at = non_ascii_outside_strings(text); !at.empty()) {
    if (text.compare(byte_at(text, at), kUtf8Bom.size(), kUtf8Bom) == 0)
      fail(shown + ":" + at + ": a byte-order mark (U+FEFF) outside a string, not at the start of the file "
           "(only the file's first bytes may hold one); delete it");
    fail(shown + ":" + at + ": a non-ASCII character outside a string or comment (TOML keys are ASCII; "
         "quote the key or the value)");
  }
  try {
    return toml::parse(std::string_view(text), std::string_view(shown));
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    std::string where = shown;
    if (begin.line > 0) where += ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column);
    fail(where + ": " + std::string(e.description()));
  }
}

std::optional<toml::table> parse_one_value(const std::string& text) {
  const std::string line = "v = " + text;
  if (!non_ascii_outside_strings(line).empty()) return std::nullopt;
  try {
    toml::table parsed = toml::parse(std::string_view(line));
    if (parsed.size() == 1 && parsed.contains("v")) return parsed;
  } catch (const toml::parse_error&) {
  }
  return std::nullopt;
}

std::string toml_text(const toml::table& table) {
  std::ostringstream out;
  out << toml::toml_formatter{table};
  return out.str();
}

}  // namespace kiln::manifest_detail
