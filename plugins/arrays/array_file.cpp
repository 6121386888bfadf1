#include "array_file.hpp"

#include "kiln_plugins/one_line.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <zlib.h>

namespace kiln_arrays {
namespace {

// One line whatever the file holds: control characters as \xNN.
using kiln_plugins::one_line;

// Text taken from a file (a key, a dtype) as a message shows it: at most 64
// characters of it.
std::string shown(const std::string& text) { return text.size() <= 64 ? text : text.substr(0, 64) + "..."; }

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw ArrayFileError(one_line("'" + name + "': " + what));
}

// shape's element count times the item size, or nullopt on overflow.
std::optional<size_t> byte_count(const std::vector<int64_t>& shape, DType dtype) {
  unsigned __int128 total = item_size(dtype);
  for (const int64_t d : shape) {
    if (d < 0) return std::nullopt;
    total *= static_cast<uint64_t>(d);
    if (total > std::numeric_limits<size_t>::max()) return std::nullopt;
  }
  return static_cast<size_t>(total);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// --- .npy: a Python dict literal -------------------------------------------

// The header's dict: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
struct NpyHeader {
  std::optional<std::string> descr;
  bool descr_is_string = true;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

class DictReader {
 public:
  DictReader(const std::string& name, const std::string& text) : name_(name), text_(text) {}

  NpyHeader read() {
    NpyHeader header;
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() == '\'' || peek() == '"') {
          header.descr = quoted();
        } else {
          header.descr_is_string = false;  // a structured dtype: a list of fields
          skip_value();
        }
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
      } else if (key == "shape") {
        header.shape = tuple();
      } else {
        bad("an unexpected key '" + shown(key) + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != '}') bad("',' or '}' expected");
    }
    ++at_;
    return header;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(name_, "the .npy header is not a NumPy header (" + what + " at offset " + std::to_string(at_) + ")");
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n')) ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) bad(std::string("'") + c + "' expected");
    ++at_;
  }
  std::string quoted() {
    skip_space();
    const char q = peek();
    if (q != '\'' && q != '"') bad("a quoted string expected");
    const size_t end = text_.find(q, at_ + 1);
    if (end == std::string::npos) bad("an unterminated string");
    std::string out = text_.substr(at_ + 1, end - at_ - 1);
    at_ = end + 1;
    return out;
  }
  bool boolean() {
    if (text_.compare(at_, 4, "True") == 0) return at_ += 4, true;
    if (text_.compare(at_, 5, "False") == 0) return at_ += 5, false;
    bad("True or False expected");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> out;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      size_t digits = 0;
      int64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (value > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("a dimension too large");
        value = value * 10 + (peek() - '0');
        ++at_;
        ++digits;
      }
      if (peek() == 'L') ++at_;  // written by Python 2's NumPy
      if (digits == 0) bad("a dimension expected");
      if (out.size() >= 64) bad("more than 64 dimensions");
      out.push_back(value);
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != ')') bad("',' or ')' expected");
    }
    ++at_;
    return out;
  }
  // A structured descr: a bracketed list, skipped to its matching bracket.
  void skip_value() {
    int depth = 0;
    do {
      const char c = peek();
      if (c == '\0') bad("an unterminated value");
      if (c == '[' || c == '(' || c == '{') ++depth;
      if (c == ']' || c == ')' || c == '}') --depth;
      if (c == '\'' || c == '"') {
        quoted();
        continue;
      }
      ++at_;
    } while (depth > 0);
  }

  const std::string& name_;
  const std::string& text_;
  size_t at_ = 0;
};

DType npy_dtype(const std::string& name, const std::string& descr) {
  if (descr.size() < 2) fail(name, "dtype '" + shown(descr) + "' is not one kiln reads");
  const char order = descr[0];
  const std::string kind = descr.substr(1);
  static const std::map<std::string, DType> kinds = {
      {"f8", DType::float64}, {"f4", DType::float32}, {"f2", DType::float16}, {"i8", DType::int64},
      {"i4", DType::int32},   {"i2", DType::int16},   {"i1", DType::int8},    {"u1", DType::uint8},
      {"b1", DType::boolean}};
  const auto it = kinds.find(kind);
  if (it == kinds.end()) {
    if (kind == "O") fail(name, "holds Python objects (dtype 'O'); save a numeric array");
    fail(name, "dtype '" + shown(descr) +
                   "' is not one kiln reads (float64/32/16, int64/32/16/8, uint8, bool; convert with "
                   "array.astype(...))");
  }
  if (order == '>' && item_size(it->second) > 1)
    fail(name, "holds big-endian data (dtype '" + shown(descr) + "'); save it with array.astype('<" + shown(kind) + "')");
  if (order != '<' && order != '|' && order != '=' && order != '>')
    fail(name, "dtype '" + shown(descr) + "' has no byte order kiln knows");
  return it->second;
}

// --- .safetensors: a small JSON reader for its header ----------------------

struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  bool flag = false;
  double num = 0;
  bool integral = false;
  int64_t integer = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonReader {
 public:
  JsonReader(const std::string& name, const char* begin, size_t size) : name_(name), p_(begin), end_(begin + size) {}

  Json document() {
    Json value = read(0);
    space();
    if (p_ != end_) bad("text after the header's object");
    return value;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail(name_, "the safetensors header is not valid JSON: " + what); }
  void space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  Json read(int depth) {
    if (depth > 16) bad("nested too deeply");
    space();
    if (p_ == end_) bad("unexpected end");
    Json v;
    switch (*p_) {
      case '{': {
        v.kind = Json::object;
        ++p_;
        space();
        if (p_ != end_ && *p_ == '}') return ++p_, v;
        for (;;) {
          space();
          std::string key = str();
          space();
          if (p_ == end_ || *p_ != ':') bad("':' expected");
          ++p_;
          v.members.emplace_back(std::move(key), read(depth + 1));
          space();
          if (p_ != end_ && *p_ == ',') { ++p_; continue; }
          if (p_ != end_ && *p_ == '}') return ++p_, v;
          bad("',' or '}' expected");
        }
      }
      case '[': {
        v.kind = Json::array;
        ++p_;
        space();
        if (p_ != end_ && *p_ == ']') return ++p_, v;
        for (;;) {
          v.items.push_back(read(depth + 1));
          space();
          if (p_ != end_ && *p_ == ',') { ++p_; continue; }
          if (p_ != end_ && *p_ == ']') return ++p_, v;
          bad("',' or ']' expected");
        }
      }
      case '"': v.kind = Json::string; v.text = str(); return v;
      case 't': word("true"); v.kind = Json::boolean; v.flag = true; return v;
      case 'f': word("false"); v.kind = Json::boolean; return v;
      case 'n': word("null"); return v;
      default: return number();
    }
  }
  void word(const char* w) {
    const size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, w, n) != 0) bad("unexpected character");
    p_ += n;
  }
  Json number() {
    const char* start = p_;
    bool integral = true;
    if (p_ != end_ && *p_ == '-') ++p_;
    while (p_ != end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E' || *p_ == '+' ||
                          *p_ == '-')) {
      if (*p_ < '0' || *p_ > '9') integral = false;
      ++p_;
    }
    if (p_ == start || (p_ - start == 1 && *start == '-')) bad("unexpected character");
    Json v;
    v.kind = Json::number;
    const std::string text(start, p_);
    v.integral = integral;
    if (integral) {
      errno = 0;
      char* stop = nullptr;
      const long long parsed = std::strtoll(text.c_str(), &stop, 10);
      if (errno == ERANGE || *stop != '\0') bad("an integer out of range");
      v.integer = parsed;
      v.num = static_cast<double>(parsed);
    } else {
      v.num = std::strtod(text.c_str(), nullptr);
    }
    return v;
  }
  std::string str() {
    if (p_ == end_ || *p_ != '"') bad("a string expected");
    ++p_;
    std::string out;
    for (;;) {
      if (p_ == end_) bad("an unterminated string");
      const char c = *p_++;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) bad("a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ == end_) bad("an unterminated escape");
      const char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (end_ - p_ < 4) bad("a short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = *p_++;
            code <<= 4;
            if (h >= '0' && h <= '9') code |= h - '0';
            else if (h >= 'a' && h <= 'f') code |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') code |= h - 'A' + 10;
            else bad("a bad \\u escape");
          }
          // UTF-8 of the code unit (a surrogate half stays as its own three bytes).
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: bad("an unknown escape");
      }
    }
  }

  const std::string& name_;
  const char* p_;
  const char* end_;
};

std::optional<DType> safetensors_dtype(const std::string& dtype) {
  static const std::map<std::string, DType> dtypes = {
      {"F64", DType::float64}, {"F32", DType::float32}, {"F16", DType::float16}, {"BF16", DType::bfloat16},
      {"I64", DType::int64},   {"I32", DType::int32},   {"I16", DType::int16},   {"I8", DType::int8},
      {"U8", DType::uint8},    {"BOOL", DType::boolean}};
  const auto it = dtypes.find(dtype);
  if (it == dtypes.end()) return std::nullopt;
  return it->second;
}

// A safetensors header far larger than this is not one: refuse before reading it.
constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;

}  // namespace

size_t item_size(DType dtype) {
  switch (dtype) {
    case DType::float64: case DType::int64: return 8;
    case DType::float32: case DType::int32: return 4;
    case DType::float16: case DType::bfloat16: case DType::int16: return 2;
    case DType::int8: case DType::uint8: case DType::boolean: return 1;
  }
  return 1;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int64: return "int64";
    case DType::int32: return "int32";
    case DType::int16: return "int16";
    case DType::int8: return "int8";
    case DType::uint8: return "uint8";
    case DType::boolean: return "bool";
  }
  return "?";
}

ArrayView parse_npy(const std::string& name, const std::string& key, const unsigned char* bytes, size_t size) {
  static const unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(bytes, kMagic, 6) != 0) fail(name, "is not a .npy file (no \\x93NUMPY magic)");
  const unsigned major = bytes[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = bytes[8] | (size_t{bytes[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) fail(name, "is truncated inside its .npy header");
    header_len = bytes[8] | (size_t{bytes[9]} << 8) | (size_t{bytes[10]} << 16) | (size_t{bytes[11]} << 24);
    header_start = 12;
  } else {
    fail(name, ".npy format version " + std::to_string(major) + " is not one kiln reads (1, 2 or 3)");
  }
  if (header_len > size - header_start)
    fail(name, "is truncated: its .npy header says " + std::to_string(header_len) + " bytes, the file has " +
                   std::to_string(size - header_start) + " after the preamble");
  const std::string text(reinterpret_cast<const char*>(bytes + header_start), header_len);
  const NpyHeader header = DictReader(name, text).read();
  if (!header.descr_is_string)
    fail(name, "holds a structured array (fields); save each field as its own array");
  if (!header.descr || !header.fortran_order || !header.shape)
    fail(name, "the .npy header lacks 'descr', 'fortran_order' or 'shape'");
  ArrayView view;
  view.key = key;
  view.dtype = npy_dtype(name, *header.descr);
  view.shape = *header.shape;
  view.fortran_order = *header.fortran_order;
  const size_t data_start = header_start + header_len;
  const auto expected = byte_count(view.shape, view.dtype);
  if (!expected) fail(name, "shape " + shape_text(view.shape) + " is too large");
  const size_t present = size - data_start;
  if (*expected != present)
    fail(name, std::string(present < *expected ? "is truncated" : "has bytes its header does not account for") +
                   ": shape " + shape_text(view.shape) + " of " + dtype_name(view.dtype) + " is " +
                   std::to_string(*expected) + " bytes, the file holds " + std::to_string(present));
  view.data = bytes + data_start;
  view.bytes = *expected;
  return view;
}

std::vector<ArrayView> parse_safetensors(const std::string& name, const unsigned char* bytes, size_t size) {
  if (size < 8) fail(name, "is not a .safetensors file (shorter than its 8-byte header size)");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | bytes[i];
  if (header_size > kMaxSafetensorsHeader || header_size > size - 8)
    fail(name, "is truncated or not a .safetensors file: its header size says " + std::to_string(header_size) +
                   " bytes, the file has " + std::to_string(size - 8) + " after it");
  const Json root = JsonReader(name, reinterpret_cast<const char*>(bytes + 8), header_size).document();
  if (root.kind != Json::object) fail(name, "the safetensors header is not a JSON object");
  const size_t data_start = 8 + header_size;
  const size_t data_size = size - data_start;
  std::vector<ArrayView> out;
  for (const auto& member : root.members) {
    // Named, not a structured binding: a lambda below uses `entry` (C++17).
    const std::string key = shown(member.first);
    const Json& entry = member.second;
    if (member.first == "__metadata__") continue;
    const auto field = [&](const char* wanted) -> const Json* {
      for (const auto& [k, v] : entry.members)
        if (k == wanted) return &v;
      return nullptr;
    };
    if (entry.kind != Json::object) fail(name, "'" + key + "': its entry is not an object");
    const Json* dtype = field("dtype");
    const Json* shape = field("shape");
    const Json* offsets = field("data_offsets");
    if (!dtype || dtype->kind != Json::string || !shape || shape->kind != Json::array || !offsets ||
        offsets->kind != Json::array || offsets->items.size() != 2)
      fail(name, "'" + key + "': its entry lacks dtype, shape or data_offsets");
    const auto type = safetensors_dtype(dtype->text);
    if (!type)
      fail(name, "'" + key + "' has dtype " + shown(dtype->text) +
                     ", not one kiln reads (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
    ArrayView view;
    view.key = member.first;
    view.dtype = *type;
    for (const Json& d : shape->items) {
      if (d.kind != Json::number || !d.integral || d.integer < 0)
        fail(name, "'" + key + "': a dimension of its shape is not a non-negative integer");
      if (view.shape.size() >= 64) fail(name, "'" + key + "' has more than 64 dimensions");
      view.shape.push_back(d.integer);
    }
    for (const Json& o : offsets->items)
      if (o.kind != Json::number || !o.integral || o.integer < 0)
        fail(name, "'" + key + "': its data_offsets are not non-negative integers");
    const auto begin = static_cast<uint64_t>(offsets->items[0].integer);
    const auto end = static_cast<uint64_t>(offsets->items[1].integer);
    const auto expected = byte_count(view.shape, view.dtype);
    if (!expected) fail(name, "'" + key + "': shape " + shape_text(view.shape) + " is too large");
    if (end < begin || end > data_size)
      fail(name, "is truncated or its header lies: '" + key + "' spans bytes " + std::to_string(begin) + ".." +
                     std::to_string(end) + " of a data section of " + std::to_string(data_size));
    if (end - begin != *expected)
      fail(name, "'" + key + "': shape " + shape_text(view.shape) + " of " + dtype_name(view.dtype) + " is " +
                     std::to_string(*expected) + " bytes, its data_offsets span " + std::to_string(end - begin));
    view.data = bytes + data_start + begin;
    view.bytes = *expected;
    out.push_back(std::move(view));
  }
  return out;
}

namespace {

// Little-endian fields of a zip archive, each read only after its bounds
// were checked by the caller.
uint16_t u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const unsigned char* p) { return u16(p) | (static_cast<uint32_t>(u16(p + 2)) << 16); }
uint64_t u64(const unsigned char* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

struct ZipMember {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, uncompressed = 0, local_offset = 0;
};

// Where the central directory lies and how many entries it holds, from the
// end-of-central-directory record (and its zip64 twin when a field is full).
struct CentralDirectory {
  uint64_t offset = 0, size = 0, entries = 0;
};

CentralDirectory find_central_directory(const std::string& name, const unsigned char* bytes, size_t size) {
  constexpr size_t kEocd = 22;
  if (size < kEocd) fail(name, "is not a .npz file (too short for a zip archive)");
  // The record ends the file, after a comment of at most 65535 bytes; the
  // one whose comment reaches exactly the end is the real one.
  const size_t lowest = size - kEocd > 65535 ? size - kEocd - 65535 : 0;
  for (size_t at = size - kEocd + 1; at-- > lowest;) {
    const unsigned char* e = bytes + at;
    if (u32(e) != 0x06054b50u || at + kEocd + u16(e + 20) != size) continue;
    if (u16(e + 4) != 0 || u16(e + 6) != 0) fail(name, "is a zip archive split over several disks");
    CentralDirectory cd{u32(e + 16), u32(e + 12), u16(e + 10)};
    if (cd.entries == 0xFFFF || cd.size == 0xFFFFFFFFu || cd.offset == 0xFFFFFFFFu) {
      if (at < 20 || u32(e - 20) != 0x07064b50u) fail(name, "is a zip64 archive without its zip64 locator");
      const uint64_t z = u64(e - 20 + 8);
      if (z > at || at - z < 56 || u32(bytes + z) != 0x06064b50u)
        fail(name, "is a zip64 archive whose zip64 end record is missing or out of place");
      const unsigned char* r = bytes + z;
      cd = CentralDirectory{u64(r + 48), u64(r + 40), u64(r + 32)};
      at = static_cast<size_t>(z);
    }
    if (cd.offset > at || cd.size > at - cd.offset)
      fail(name, "is truncated or not a zip archive: its central directory (" + std::to_string(cd.size) +
                     " bytes at " + std::to_string(cd.offset) + ") lies outside the file");
    return cd;
  }
  fail(name, "is truncated or not a .npz file (no zip end-of-central-directory record at its end)");
}

std::vector<ZipMember> read_members(const std::string& name, const unsigned char* bytes, const CentralDirectory& cd) {
  std::vector<ZipMember> members;
  const unsigned char* p = bytes + cd.offset;
  const unsigned char* const end = p + cd.size;
  for (uint64_t i = 0; i < cd.entries; ++i) {
    if (end - p < 46 || u32(p) != 0x02014b50u)
      fail(name, "its central directory is damaged (entry " + std::to_string(i) + " of " +
                     std::to_string(cd.entries) + ")");
    ZipMember m;
    m.flags = u16(p + 8);
    m.method = u16(p + 10);
    m.crc = u32(p + 16);
    m.compressed = u32(p + 20);
    m.uncompressed = u32(p + 24);
    const size_t name_len = u16(p + 28), extra_len = u16(p + 30), comment_len = u16(p + 32);
    m.local_offset = u32(p + 42);
    if (static_cast<size_t>(end - p - 46) < name_len + extra_len + comment_len)
      fail(name, "its central directory is damaged (entry " + std::to_string(i) + " overruns it)");
    m.name.assign(reinterpret_cast<const char*>(p + 46), name_len);
    // The zip64 extra field holds, in this order, whichever of the three
    // fields above are full.
    const unsigned char* x = p + 46 + name_len;
    const unsigned char* const x_end = x + extra_len;
    while (x_end - x >= 4) {
      const uint16_t id = u16(x), len = u16(x + 2);
      if (len > x_end - x - 4) break;
      if (id == 0x0001) {
        const unsigned char* f = x + 4;
        const unsigned char* const f_end = f + len;
        for (uint64_t* field : {&m.uncompressed, &m.compressed, &m.local_offset}) {
          if (*field != 0xFFFFFFFFu) continue;
          if (f_end - f < 8) fail(name, "'" + shown(m.name) + "': its zip64 sizes are missing");
          *field = u64(f);
          f += 8;
        }
      }
      x += 4 + len;
    }
    members.push_back(std::move(m));
    p += 46 + name_len + extra_len + comment_len;
  }
  return members;
}

}  // namespace

std::vector<ArrayView> parse_npz(const std::string& name, const unsigned char* bytes, size_t size,
                                 std::vector<std::shared_ptr<const Buffer>>& inflated) {
  const CentralDirectory cd = find_central_directory(name, bytes, size);
  std::vector<ArrayView> out;
  std::set<std::string> keys;
  for (const ZipMember& m : read_members(name, bytes, cd)) {
    const std::string member = name + ":" + shown(m.name);
    if (m.name.size() < 5 || m.name.compare(m.name.size() - 4, 4, ".npy") != 0)
      fail(member, "is not a .npy member; a .npz holds arrays saved by numpy.savez");
    const std::string key = m.name.substr(0, m.name.size() - 4);
    if (!keys.insert(key).second) fail(member, "appears twice in the archive");
    if (m.flags & 1) fail(member, "is encrypted");
    // The local header repeats the name and has its own extra field; the
    // data follows it.
    if (m.local_offset > cd.offset || cd.offset - m.local_offset < 30 || u32(bytes + m.local_offset) != 0x04034b50u)
      fail(member, "its local header is missing or out of place (a truncated or damaged archive)");
    const unsigned char* local = bytes + m.local_offset;
    const uint64_t data_at = m.local_offset + 30 + u16(local + 26) + u16(local + 28);
    if (data_at > cd.offset || m.compressed > cd.offset - data_at)
      fail(member, "is truncated: " + std::to_string(m.compressed) + " bytes at " + std::to_string(data_at) +
                       " run past the archive's data");
    const unsigned char* data = bytes + data_at;
    const unsigned char* array = data;
    if (m.method == 0) {
      if (m.compressed != m.uncompressed)
        fail(member, "is stored uncompressed but its two sizes differ (" + std::to_string(m.compressed) + ", " +
                         std::to_string(m.uncompressed) + ")");
    } else if (m.method == 8) {
      // Deflate never expands more than 1032-fold: a larger claim is a lie,
      // refused before anything is allocated for it.
      if (m.uncompressed / 1032 > m.compressed)
        fail(member, "claims " + std::to_string(m.uncompressed) + " bytes from " + std::to_string(m.compressed) +
                         " compressed ones, more than deflate can give");
      auto buffer = std::make_shared<Buffer>(static_cast<size_t>(m.uncompressed));
      z_stream z{};
      if (inflateInit2(&z, -MAX_WBITS) != Z_OK) fail(member, "could not be inflated (zlib would not start)");
      // zlib counts in 32 bits: feed and drain it in chunks.
      uint64_t in_left = m.compressed, out_left = m.uncompressed;
      z.next_in = const_cast<unsigned char*>(data);
      z.next_out = buffer->data();
      int status = Z_OK;
      for (;;) {
        if (z.avail_in == 0 && in_left > 0) {
          z.avail_in = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
          in_left -= z.avail_in;
        }
        if (z.avail_out == 0 && out_left > 0) {
          z.avail_out = static_cast<uInt>(std::min<uint64_t>(out_left, 1u << 30));
          out_left -= z.avail_out;
        }
        status = inflate(&z, Z_NO_FLUSH);
        // Z_BUF_ERROR: no progress without more input or room; there is
        // more of either only while a chunk is left to hand over.
        const bool more = (z.avail_in == 0 && in_left > 0) || (z.avail_out == 0 && out_left > 0);
        if (status == Z_OK || (status == Z_BUF_ERROR && more)) continue;
        break;  // the end, corrupt data, input that ended early or output that would overflow the claim
      }
      const bool whole = status == Z_STREAM_END && z.avail_out == 0 && out_left == 0;
      inflateEnd(&z);
      if (!whole)
        fail(member, "does not inflate to the " + std::to_string(m.uncompressed) + " bytes the archive says (" +
                         (status == Z_DATA_ERROR ? "corrupt deflate data" : "a size that lies") + ")");
      array = buffer->data();
      inflated.push_back(buffer);
    } else {
      fail(member, "is compressed with zip method " + std::to_string(m.method) +
                       "; kiln reads stored and deflated members (numpy.savez, numpy.savez_compressed)");
    }
    const auto length = static_cast<size_t>(m.uncompressed);
    // crc32 takes 32-bit lengths too.
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < length;) {
      const auto chunk = static_cast<uInt>(std::min<size_t>(length - done, 1u << 30));
      crc = crc32(crc, array + done, chunk);
      done += chunk;
    }
    if (crc != m.crc) fail(member, "fails its CRC-32 check (the archive is damaged)");
    out.push_back(parse_npy(member, key, array, length));
  }
  return out;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot be opened: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      fail(path, std::string("cannot be mapped: ") + std::strerror(error));
    }
    data_ = static_cast<const unsigned char*>(mapped);
  }
  fd_ = fd;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::read_at(uint64_t offset, void* out, size_t size) const {
  auto* to = static_cast<unsigned char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, to, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path_, n == 0 ? "ends early (changed while the run reads it?)" : std::string("cannot be read: ") + std::strerror(errno));
    to += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

ArrayFile ArrayFile::open(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string extension = p.extension().string();
  if (extension != ".npy" && extension != ".npz" && extension != ".safetensors")
    fail(path, "is not .npy, .npz nor .safetensors (the formats kiln_arrays reads)");
  ArrayFile file;
  file.path = path;
  file.mapping = std::make_shared<MappedFile>(path);
  if (extension == ".npy")
    file.arrays.push_back(parse_npy(path, p.stem().string(), file.mapping->data(), file.mapping->size()));
  else if (extension == ".npz")
    file.arrays = parse_npz(path, file.mapping->data(), file.mapping->size(), file.inflated);
  else
    file.arrays = parse_safetensors(path, file.mapping->data(), file.mapping->size());
  return file;
}

std::string key_list(std::vector<std::string> keys) {
  if (keys.empty()) return "none";
  std::sort(keys.begin(), keys.end());
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + one_line(shown(k));
  return out;
}

}  // namespace kiln_arrays
