// text/pyjson.cpp — Python `json` semantics for PyValue: json.loads (CPython's scanner rules:
// strict strings, NaN/Infinity, surrogate pairs, first-position/last-value duplicate keys, the
// 4300-digit integer limit), json.dumps with ensure_ascii=False and either separator set,
// Python float repr, str()/repr() of values, truthiness, str.isspace()/strip() and the
// recursive key sort by code point.
#include "text/pyjson.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "text/unicode.h"
#include "text/utf8.h"

namespace k3::text {

// ---- PyValue -------------------------------------------------------------------------------

PyValue PyValue::boolean(bool value) {
  PyValue v;
  v.kind_ = Kind::kBool;
  v.boolean_ = value;
  return v;
}

PyValue PyValue::integer(int64_t value) {
  PyValue v;
  v.kind_ = Kind::kInteger;
  v.text_ = std::to_string(value);
  return v;
}

PyValue PyValue::integer_text(std::string decimal) {
  PyValue v;
  v.kind_ = Kind::kInteger;
  v.text_ = std::move(decimal);
  return v;
}

PyValue PyValue::floating(double value) {
  PyValue v;
  v.kind_ = Kind::kFloat;
  v.floating_ = value;
  return v;
}

PyValue PyValue::string(std::string utf8) {
  PyValue v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(utf8);
  return v;
}

PyValue PyValue::array(Array items) {
  PyValue v;
  v.kind_ = Kind::kArray;
  v.items_ = std::move(items);
  return v;
}

PyValue PyValue::object(Object members) {
  PyValue v;
  v.kind_ = Kind::kObject;
  v.members_ = std::move(members);
  return v;
}

const PyValue* PyValue::find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const PyMember& m : members_)
    if (m.key == key) return &m.value;
  return nullptr;
}

PyValue* PyValue::find(std::string_view key) {
  return const_cast<PyValue*>(static_cast<const PyValue&>(*this).find(key));
}

void PyValue::set(std::string key, PyValue value) {
  if (PyValue* existing = find(key)) {
    *existing = std::move(value);
    return;
  }
  members_.push_back({std::move(key), std::move(value)});
}

bool operator==(const PyValue& a, const PyValue& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case PyValue::Kind::kNull:
      return true;
    case PyValue::Kind::kBool:
      return a.boolean_ == b.boolean_;
    case PyValue::Kind::kFloat:
      return a.floating_ == b.floating_;
    case PyValue::Kind::kInteger:
    case PyValue::Kind::kString:
      return a.text_ == b.text_;
    case PyValue::Kind::kArray:
      return a.items_ == b.items_;
    case PyValue::Kind::kObject:
      // Python dict equality ignores order.
      if (a.members_.size() != b.members_.size()) return false;
      for (const PyMember& m : a.members_) {
        const PyValue* other = b.find(m.key);
        if (!other || !(*other == m.value)) return false;
      }
      return true;
  }
  return false;
}

// ---- Python whitespace -----------------------------------------------------------------------

bool python_isspace(char32_t cp) {
  if (cp <= 0x20) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

// Decodes the code point starting at s[i] of valid UTF-8; `length` receives its byte count.
char32_t decode_at(std::string_view s, size_t i, size_t& length) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80 || i + 1 >= s.size()) {
    length = 1;
    return b0;
  }
  auto cont = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F);
  };
  if (b0 < 0xE0) {
    length = 2;
    return (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
  }
  if (b0 < 0xF0 && i + 2 < s.size()) {
    length = 3;
    return (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  }
  if (i + 3 < s.size()) {
    length = 4;
    return (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  }
  length = 1;
  return b0;
}

}  // namespace

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t length = 0;
    if (!python_isspace(decode_at(s, begin, length))) break;
    begin += length;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t length = 0;
    if (!python_isspace(decode_at(s, start, length))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// ---- parsing ---------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<PyValue> parse_document() {
    skip_whitespace();
    PyValue value;
    if (Status s = parse_value(value); !s.ok()) return s;
    skip_whitespace();
    if (pos_ != text_.size()) return error("Extra data");
    return value;
  }

 private:
  Status error(const std::string& what) const {
    return Status::invalid(what + " at byte " + std::to_string(pos_));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool consume_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  // One JSON value, containers included, without recursion: the open containers are a stack of
  // frames on the heap, so the nesting depth costs no machine stack (kMaxPyjsonDepth is a
  // policy, not a stack guard).
  struct Frame {
    PyValue container;                              // an array or an object
    std::string key;                                // objects: the key whose value is being parsed
    std::unordered_map<std::string, size_t> index;  // objects: key → position, once large
  };

  Status parse_value(PyValue& out) {
    std::vector<Frame> open;
    PyValue value;
    while (true) {
      // A value starts here: open a container, or read a scalar into `value`.
      const char c = peek();
      if (c == '[' || c == '{') {
        if (open.size() >= static_cast<size_t>(kMaxPyjsonDepth))
          return Status(Status::Code::too_large,
                        "JSON nested deeper than " + std::to_string(kMaxPyjsonDepth));
        ++pos_;
        open.push_back({c == '[' ? PyValue::array() : PyValue::object(), {}, {}});
        skip_whitespace();
        if (peek() == (c == '[' ? ']' : '}')) {
          ++pos_;
          value = std::move(open.back().container);
          open.pop_back();
        } else {
          if (c == '{') {
            if (Status st = parse_key(open.back().key); !st.ok()) return st;
          }
          continue;  // the first element
        }
      } else if (Status st = parse_scalar(value); !st.ok()) {
        return st;
      }
      // `value` is complete: it is the document, or the next element of the innermost container.
      while (true) {
        if (open.empty()) {
          out = std::move(value);
          return {};
        }
        Frame& frame = open.back();
        const bool is_array = frame.container.is_array();
        if (is_array)
          frame.container.as_array().push_back(std::move(value));
        else
          add_member(frame, std::move(value));
        skip_whitespace();
        if (peek() == ',') {
          ++pos_;
          skip_whitespace();
          if (!is_array) {
            if (Status st = parse_key(frame.key); !st.ok()) return st;
          }
          break;  // the next element
        }
        if (peek() != (is_array ? ']' : '}')) return error("Expecting ',' delimiter");
        ++pos_;
        value = std::move(frame.container);
        open.pop_back();
      }
    }
  }

  // `"key"` then `:` and the whitespace before the value.
  Status parse_key(std::string& key) {
    if (peek() != '"') return error("Expecting property name enclosed in double quotes");
    key.clear();
    if (Status st = parse_string(key); !st.ok()) return st;
    skip_whitespace();
    if (peek() != ':') return error("Expecting ':' delimiter");
    ++pos_;
    skip_whitespace();
    return {};
  }

  // A repeated key keeps its first position and takes the last value (dict(pairs)).
  static void add_member(Frame& frame, PyValue value) {
    PyValue::Object& members = frame.container.as_object();
    size_t existing = members.size();
    if (members.size() < 16) {
      for (size_t k = 0; k < members.size(); ++k)
        if (members[k].key == frame.key) existing = k;
    } else {
      if (frame.index.empty())
        for (size_t k = 0; k < members.size(); ++k) frame.index.emplace(members[k].key, k);
      if (auto it = frame.index.find(frame.key); it != frame.index.end())
        existing = it->second;
      else
        frame.index.emplace(frame.key, members.size());
    }
    if (existing < members.size())
      members[existing].value = std::move(value);
    else
      members.push_back({std::move(frame.key), std::move(value)});
  }

  // Anything but a container.
  Status parse_scalar(PyValue& out) {
    if (at_end()) return error("Expecting value");
    switch (text_[pos_]) {
      case '"': {
        std::string s;
        if (Status st = parse_string(s); !st.ok()) return st;
        out = PyValue::string(std::move(s));
        return {};
      }
      case 'n':
        if (consume_literal("null")) {
          out = PyValue();
          return {};
        }
        break;
      case 't':
        if (consume_literal("true")) {
          out = PyValue::boolean(true);
          return {};
        }
        break;
      case 'f':
        if (consume_literal("false")) {
          out = PyValue::boolean(false);
          return {};
        }
        break;
      case 'N':
        if (consume_literal("NaN")) {
          out = PyValue::floating(std::numeric_limits<double>::quiet_NaN());
          return {};
        }
        break;
      case 'I':
        if (consume_literal("Infinity")) {
          out = PyValue::floating(std::numeric_limits<double>::infinity());
          return {};
        }
        break;
      case '-':
        if (consume_literal("-Infinity")) {
          out = PyValue::floating(-std::numeric_limits<double>::infinity());
          return {};
        }
        return parse_number(out);
      default:
        if (text_[pos_] >= '0' && text_[pos_] <= '9') return parse_number(out);
        break;
    }
    return error("Expecting value");
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? — a fraction or exponent that is not followed by a
  // digit is not part of the number (the rest is then "extra data" for the caller).
  Status parse_number(PyValue& out) {
    const size_t start = pos_;
    size_t i = pos_;
    const bool negative = text_[i] == '-';
    if (negative) ++i;
    if (i >= text_.size() || !is_digit(text_[i])) return error("Expecting value");
    const size_t int_start = i;
    if (text_[i] == '0') {
      ++i;
    } else {
      while (i < text_.size() && is_digit(text_[i])) ++i;
    }
    const size_t int_end = i;
    bool is_float = false;
    if (i + 1 < text_.size() && text_[i] == '.' && is_digit(text_[i + 1])) {
      is_float = true;
      i += 1;
      while (i < text_.size() && is_digit(text_[i])) ++i;
    }
    if (i < text_.size() && (text_[i] == 'e' || text_[i] == 'E')) {
      size_t j = i + 1;
      if (j < text_.size() && (text_[j] == '+' || text_[j] == '-')) ++j;
      if (j < text_.size() && is_digit(text_[j])) {
        while (j < text_.size() && is_digit(text_[j])) ++j;
        is_float = true;
        i = j;
      }
    }
    pos_ = i;
    const std::string_view number = text_.substr(start, i - start);
    if (!is_float) {
      const std::string_view digits = text_.substr(int_start, int_end - int_start);
      if (digits.size() > kMaxPyjsonIntegerDigits)
        return Status(Status::Code::too_large, "integer of " + std::to_string(digits.size()) +
                                                   " digits exceeds the limit of " +
                                                   std::to_string(kMaxPyjsonIntegerDigits));
      std::string decimal;
      if (negative && digits != "0") decimal = "-";
      decimal.append(digits);
      out = PyValue::integer_text(std::move(decimal));
      return {};
    }
    out = PyValue::floating(parse_double(number, negative, int_start - start));
    return {};
  }

  // Correctly rounded like Python's float(); out of range gives ±inf or ±0.
  static double parse_double(std::string_view number, bool negative, size_t int_offset) {
    double value = 0;
    const auto result = std::from_chars(number.data(), number.data() + number.size(), value);
    if (result.ec != std::errc::result_out_of_range) return value;
    // Decimal magnitude estimate: position of the first non-zero digit plus the exponent.
    long long magnitude = 0;
    size_t i = int_offset;
    bool seen_nonzero = false;
    long long leading = 0;  // digits before the point once a non-zero digit was seen
    long long zeros_after_point = 0;
    bool after_point = false;
    for (; i < number.size() && number[i] != 'e' && number[i] != 'E'; ++i) {
      const char c = number[i];
      if (c == '.') {
        after_point = true;
        continue;
      }
      if (!seen_nonzero && c == '0') {
        if (after_point) ++zeros_after_point;
        continue;
      }
      seen_nonzero = true;
      if (!after_point) ++leading;
    }
    long long exponent = 0;
    if (i < number.size()) {
      ++i;
      bool exponent_negative = false;
      if (number[i] == '+' || number[i] == '-') exponent_negative = number[i++] == '-';
      for (; i < number.size(); ++i)
        exponent = std::min<long long>(exponent * 10 + (number[i] - '0'), 1LL << 40);
      if (exponent_negative) exponent = -exponent;
    }
    magnitude = (leading > 0 ? leading : -zeros_after_point) + exponent;
    const double huge = std::numeric_limits<double>::infinity();
    const double result_value = magnitude > 0 ? huge : 0.0;
    return negative ? -result_value : result_value;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Four hex digits at text_[at]; -1 when they are not.
  int read_hex4(size_t at) const {
    if (at + 4 > text_.size()) return -1;
    int value = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int h = hex_value(text_[at + k]);
      if (h < 0) return -1;
      value = value * 16 + h;
    }
    return value;
  }

  Status parse_string(std::string& out) {
    ++pos_;  // opening quote
    while (true) {
      if (at_end()) return error("Unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return {};
      }
      if (static_cast<unsigned char>(c) < 0x20) return error("Invalid control character");
      if (c != '\\') {
        // Copy the run up to the next quote, backslash or control character.
        size_t end = pos_ + 1;
        while (end < text_.size()) {
          const auto b = static_cast<unsigned char>(text_[end]);
          if (b == '"' || b == '\\' || b < 0x20) break;
          ++end;
        }
        out.append(text_.substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      if (pos_ + 1 >= text_.size()) return error("Unterminated string");
      const char escape = text_[pos_ + 1];
      switch (escape) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          int unit = read_hex4(pos_ + 2);
          if (unit < 0) return error("Invalid \\uXXXX escape");
          pos_ += 6;
          char32_t cp = static_cast<char32_t>(unit);
          if (unit >= 0xD800 && unit <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const int low = read_hex4(pos_ + 2);
            if (low < 0) return error("Invalid \\uXXXX escape");
            if (low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((static_cast<char32_t>(unit) - 0xD800) << 10) +
                   (static_cast<char32_t>(low) - 0xDC00);
              pos_ += 6;
            }
          }
          // A lone surrogate cannot be UTF-8; Python keeps it, the tokenizer would make it U+FFFD.
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = kReplacement;
          append_utf8(out, cp);
          continue;
        }
        default:
          return error("Invalid \\escape");
      }
      pos_ += 2;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Result<PyValue> parse_pyjson(std::string_view text) {
  if (is_valid_utf8(text)) return Parser(text).parse_document();
  const std::string repaired = repair_utf8(text);
  return Parser(repaired).parse_document();
}

// ---- float repr ------------------------------------------------------------------------------

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits and exponent: "d[.ddd]e±XX".
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string_view scientific(buffer, static_cast<size_t>(result.ptr - buffer));
  const size_t e = scientific.find('e');
  std::string_view mantissa = scientific.substr(0, e);
  const bool negative = !mantissa.empty() && mantissa[0] == '-';
  if (negative) mantissa.remove_prefix(1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  int exponent = 0;
  std::from_chars(scientific.data() + e + 1 + (scientific[e + 1] == '+' ? 1 : 0),
                  scientific.data() + scientific.size(), exponent);
  const int decimal_point = exponent + 1;  // value = 0.DIGITS × 10^decimal_point
  const int n = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decimal_point), '0');
      out += digits;
    } else if (decimal_point >= n) {
      out += digits;
      out.append(static_cast<size_t>(decimal_point - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decimal_point));
      out += '.';
      out += digits.substr(static_cast<size_t>(decimal_point));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out += digits.substr(1);
  }
  out += exponent < 0 ? "e-" : "e+";
  const int magnitude = exponent < 0 ? -exponent : exponent;
  if (magnitude < 10) out += '0';
  out += std::to_string(magnitude);
  return out;
}

// ---- dumps -----------------------------------------------------------------------------------

std::string json_quote(std::string_view utf8) {
  std::string out;
  out.reserve(utf8.size() + 2);
  out.push_back('"');
  static const char kHex[] = "0123456789abcdef";
  for (char c : utf8) {
    const auto b = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (b < 0x20) {
      out += "\\u00";
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

namespace {

void dump_into(std::string& out, const PyValue& value, DumpStyle style) {
  const bool compact = style != DumpStyle::kDefault;
  const char* item_separator = compact ? "," : ", ";
  const char* key_separator = compact ? ":" : ": ";
  switch (value.kind()) {
    case PyValue::Kind::kNull:
      out += "null";
      return;
    case PyValue::Kind::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case PyValue::Kind::kInteger:
      out += value.integer_decimal();
      return;
    case PyValue::Kind::kFloat: {
      const double x = value.as_float();
      const bool strict = style == DumpStyle::kStrictCompact;
      if (strict && !std::isfinite(x))
        out += "null";
      else if (std::isnan(x))
        out += "NaN";
      else if (std::isinf(x))
        out += x < 0 ? "-Infinity" : "Infinity";
      else
        out += python_float_repr(x);
      return;
    }
    case PyValue::Kind::kString:
      out += json_quote(value.as_string());
      return;
    case PyValue::Kind::kArray: {
      out.push_back('[');
      bool first = true;
      for (const PyValue& item : value.as_array()) {
        if (!first) out += item_separator;
        first = false;
        dump_into(out, item, style);
      }
      out.push_back(']');
      return;
    }
    case PyValue::Kind::kObject: {
      out.push_back('{');
      bool first = true;
      for (const PyMember& m : value.as_object()) {
        if (!first) out += item_separator;
        first = false;
        out += json_quote(m.key);
        out += key_separator;
        dump_into(out, m.value, style);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

std::string dumps(const PyValue& value, DumpStyle style) {
  std::string out;
  dump_into(out, value, style);
  return out;
}

// ---- sorting, truthiness, str/repr -----------------------------------------------------------

PyValue sort_keys_deep(const PyValue& value) {
  if (value.is_array()) {
    PyValue::Array items;
    items.reserve(value.as_array().size());
    for (const PyValue& item : value.as_array()) items.push_back(sort_keys_deep(item));
    return PyValue::array(std::move(items));
  }
  if (value.is_object()) {
    PyValue::Object members;
    members.reserve(value.as_object().size());
    for (const PyMember& m : value.as_object()) members.push_back({m.key, sort_keys_deep(m.value)});
    // UTF-8 byte order is code point order (std::string compares bytes as unsigned char).
    std::stable_sort(members.begin(), members.end(),
                     [](const PyMember& a, const PyMember& b) { return a.key < b.key; });
    return PyValue::object(std::move(members));
  }
  return value;
}

bool is_truthy(const PyValue& value) {
  switch (value.kind()) {
    case PyValue::Kind::kNull:
      return false;
    case PyValue::Kind::kBool:
      return value.as_bool();
    case PyValue::Kind::kInteger:
      return value.integer_decimal() != "0";
    case PyValue::Kind::kFloat:
      return value.as_float() != 0.0;  // NaN is truthy
    case PyValue::Kind::kString:
      return !value.as_string().empty();
    case PyValue::Kind::kArray:
      return !value.as_array().empty();
    case PyValue::Kind::kObject:
      return !value.as_object().empty();
  }
  return false;
}

namespace {

void repr_string_into(std::string& out, std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  static const char kHex[] = "0123456789abcdef";
  out.push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    size_t length = 0;
    const char32_t cp = decode_at(s, i, length);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (!unicode_printable(cp)) {
      int hex_digits = 8;
      if (cp <= 0xFF) {
        out += "\\x";
        hex_digits = 2;
      } else if (cp <= 0xFFFF) {
        out += "\\u";
        hex_digits = 4;
      } else {
        out += "\\U";
      }
      for (int shift = (hex_digits - 1) * 4; shift >= 0; shift -= 4)
        out.push_back(kHex[(cp >> shift) & 15]);
    } else {
      out.append(s.substr(i, length));
    }
    i += length;
  }
  out.push_back(quote);
}

void str_into(std::string& out, const PyValue& value, bool as_repr) {
  switch (value.kind()) {
    case PyValue::Kind::kNull:
      out += "None";
      return;
    case PyValue::Kind::kBool:
      out += value.as_bool() ? "True" : "False";
      return;
    case PyValue::Kind::kInteger:
      out += value.integer_decimal();
      return;
    case PyValue::Kind::kFloat:
      out += python_float_repr(value.as_float());
      return;
    case PyValue::Kind::kString:
      if (as_repr)
        repr_string_into(out, value.as_string());
      else
        out += value.as_string();
      return;
    case PyValue::Kind::kArray: {
      out.push_back('[');
      bool first = true;
      for (const PyValue& item : value.as_array()) {
        if (!first) out += ", ";
        first = false;
        str_into(out, item, true);
      }
      out.push_back(']');
      return;
    }
    case PyValue::Kind::kObject: {
      out.push_back('{');
      bool first = true;
      for (const PyMember& m : value.as_object()) {
        if (!first) out += ", ";
        first = false;
        repr_string_into(out, m.key);
        out += ": ";
        str_into(out, m.value, true);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

std::string python_str(const PyValue& value) {
  if (value.is_string()) return value.as_string();
  std::string out;
  str_into(out, value, false);
  return out;
}

std::string python_repr(const PyValue& value) {
  std::string out;
  str_into(out, value, true);
  return out;
}

}  // namespace k3::text
