// text/pyjson.h — a JSON value with Python `json` semantics, for the chat renderer and the
// request bodies it reads.
//
// nlohmann cannot do what exact prompt rendering needs: integers of any size kept exactly,
// the int/float distinction (`2` vs `2.0`, `1e5` → `100000.0`), NaN and Infinity, Python's
// duplicate-key rule (first position, last value), and output byte-identical to
// `json.dumps(x, ensure_ascii=False)` with Python's float repr. This file provides:
//
//   parse_pyjson(text)      json.loads: strict strings (raw control characters rejected), NaN /
//                           Infinity / -Infinity accepted, \uXXXX with surrogate pairs (a lone
//                           surrogate becomes U+FFFD), invalid UTF-8 repaired to U+FFFD first,
//                           trailing garbage rejected, nesting deeper than kMaxPyjsonDepth
//                           rejected.
//   dumps(value, style)     json.dumps(value, ensure_ascii=False) with the compact (",", ":")
//                           or the default (", ", ": ") separators.
//   sort_keys_deep(value)   object keys sorted recursively by code point; arrays keep order.
//   is_truthy(value)        Python bool(value).
//   python_str(value)       Python str(value): strings as is, True/False/None, float repr,
//                           containers as Python repr ({'a': 1, 'b': [True, None]}), with
//                           str.isprintable() (Unicode 16) deciding which characters of a
//                           quoted string are escaped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace k3::text {

struct PyMember;

class PyValue {
 public:
  enum class Kind { kNull, kBool, kInteger, kFloat, kString, kArray, kObject };
  using Array = std::vector<PyValue>;
  using Object = std::vector<PyMember>;  // insertion order; keys unique

  PyValue() = default;  // None
  static PyValue boolean(bool value);
  static PyValue integer(int64_t value);
  // `decimal` must be canonical: an optional '-', then digits without leading zeros ("0", not
  // "-0"). Callers holding arbitrary text should go through parse_pyjson.
  static PyValue integer_text(std::string decimal);
  static PyValue floating(double value);
  static PyValue string(std::string utf8);
  static PyValue array(Array items = {});
  static PyValue object(Object members = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_integer() const { return kind_ == Kind::kInteger; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_integer() || is_float(); }  // bool is not a number here
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  // Accessors; each requires the matching kind.
  bool as_bool() const { return boolean_; }
  double as_float() const { return floating_; }
  const std::string& as_string() const { return text_; }        // kString
  const std::string& integer_decimal() const { return text_; }  // kInteger
  const Array& as_array() const { return items_; }
  Array& as_array() { return items_; }
  const Object& as_object() const;
  Object& as_object();

  // Object lookup: the value under `key`, or nullptr when absent or when this is no object.
  const PyValue* find(std::string_view key) const;
  PyValue* find(std::string_view key);
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // Python `self[key] = value` on an object: replaces in place, or appends a new key.
  void set(std::string key, PyValue value);

  // Structural equality with Python's numeric rule for ints and floats of equal value being
  // equal only within the same kind (enough for the renderer, which compares strings).
  friend bool operator==(const PyValue& a, const PyValue& b);

 private:
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  double floating_ = 0;
  std::string text_;  // kString: the UTF-8 text; kInteger: the canonical decimal
  Array items_;
  std::vector<PyMember> members_;
};

struct PyMember {
  std::string key;
  PyValue value;
  friend bool operator==(const PyMember& a, const PyMember& b) {
    return a.key == b.key && a.value == b.value;
  }
};

inline const PyValue::Object& PyValue::as_object() const {
  return members_;
}
inline PyValue::Object& PyValue::as_object() {
  return members_;
}

// Deeper nesting is rejected with too_large. CPython 3.11's json.loads, json.dumps and repr()
// count each level against the recursion limit of 1000 frames, so they fail (RecursionError) at
// about this depth, less the caller's frames; the renderer's other paths can fail earlier in
// Python (deep_sort_dict of 900-deep tools does). parse_pyjson keeps its open containers on the
// heap; the other functions (dumps, sort_keys_deep, str/repr, ==, copies) recurse once per
// level, which at this depth fits a 2 MiB stack even in an ASan -O0 build (8 MiB is the default;
// tests/chat_test.cpp EveryRecursiveFunctionHandlesTheDepthLimit).
inline constexpr int kMaxPyjsonDepth = 990;
// Python 3.11+ refuses to convert integers longer than this
// (sys.int_info.str_digits_check_threshold default 4300): json.loads raises ValueError, not
// JSONDecodeError.
inline constexpr size_t kMaxPyjsonIntegerDigits = 4300;

// json.loads. Errors: invalid_argument for malformed JSON (Python's JSONDecodeError),
// too_large for nesting deeper than kMaxPyjsonDepth or an integer longer than
// kMaxPyjsonIntegerDigits digits (Python's RecursionError / ValueError).
Result<PyValue> parse_pyjson(std::string_view text);

enum class DumpStyle {
  kCompact,  // json.dumps(x, ensure_ascii=False, separators=(",", ":"))
  kDefault,  // json.dumps(x, ensure_ascii=False): ", " and ": "
  // kCompact, but always valid JSON that every reader accepts (RFC 8259 has no NaN or Infinity,
  // and readers differ on 1e999): a non-finite number is written as null. For the machine
  // interfaces' output lines (coli tokenize / render), never for text the model sees.
  kStrictCompact,
};
std::string dumps(const PyValue& value, DumpStyle style);

// Python float.__repr__ (shortest round trip; "1.5", "2.0", "1e-05", "1e+16", "inf", "nan").
std::string python_float_repr(double value);
// A JSON string literal as json.dumps(s, ensure_ascii=False) writes it.
std::string json_quote(std::string_view utf8);

PyValue sort_keys_deep(const PyValue& value);
bool is_truthy(const PyValue& value);
std::string python_str(const PyValue& value);
// Python repr(value): strings quoted ('a', "it's"), everything else as python_str.
std::string python_repr(const PyValue& value);

// Python str.isspace() for one code point, and str.strip() with no argument.
bool python_isspace(char32_t cp);
std::string_view python_strip(std::string_view utf8);

}  // namespace k3::text
