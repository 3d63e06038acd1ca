// JSON Schema to GBNF (grammar/json_schema.h). The output is compact JSON; the rule set below
// (`value`, `string`, `char`, ...) is shared by every schema.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "utf8_ranges.h"

namespace k3::grammar {

using json = nlohmann::ordered_json;

SchemaError::SchemaError(std::string where, std::string keyword, const std::string& what)
    : std::runtime_error(what), where_(std::move(where)), keyword_(std::move(keyword)) {}

namespace {

// The shared rules: any JSON value, compact.
constexpr const char* kBaseRules = R"(value ::= object | array | string | number | boolean | null
object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
array ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex ) )
hex ::= [0-9a-fA-F]
number ::= "-"? int-part ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
int-part ::= "0" | [1-9] [0-9]{0,15}
integer ::= "-"? int-part
boolean ::= "true" | "false"
null ::= "null"
)";

// GBNF literal for raw bytes.
std::string literal(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hexd = "0123456789ABCDEF";
      out += "\\x";
      out += hexd[c >> 4];
      out += hexd[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A GBNF class body for code point ranges ("a-z0-9").
std::string class_body(const CodeRanges& ranges) {
  auto one = [](uint32_t cp) {
    char buf[16];
    if (cp < 0x20 || cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' ||
        cp >= 0x7F) {
      if (cp <= 0xFF)
        std::snprintf(buf, sizeof buf, "\\x%02X", cp);
      else if (cp <= 0xFFFF)
        std::snprintf(buf, sizeof buf, "\\u%04X", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08X", cp);
      return std::string(buf);
    }
    return std::string(1, static_cast<char>(cp));
  };
  std::string out;
  for (const auto& [lo, hi] : ranges) {
    out += one(lo);
    if (hi != lo) {
      out += '-';
      out += one(hi);
    }
  }
  return out;
}

// The GBNF of the JSON string-content encodings of the code points in `set`: raw where JSON
// allows, escaped for `"`, `\` and the controls.
std::string json_chars(const CodeRanges& set) {
  CodeRanges raw;
  std::vector<std::string> alts;
  for (const auto& [lo, hi] : normalise(set)) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\"\\\\u%04x\"", c);
      alts.push_back(buf);
    }
    const uint32_t from = std::max<uint32_t>(lo, 0x20);
    if (from > hi) continue;
    // Split out '"' (0x22) and '\' (0x5C).
    uint32_t a = from;
    for (uint32_t special : {0x22u, 0x5Cu}) {
      if (special < a || special > hi) continue;
      if (special > a) raw.push_back({a, special - 1});
      alts.push_back(special == 0x22 ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"");
      a = special + 1;
    }
    if (a <= hi) raw.push_back({a, hi});
  }
  if (!raw.empty()) {
    std::string cls = "[";
    cls += class_body(raw);
    cls += ']';
    alts.insert(alts.begin(), std::move(cls));
  }
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

CodeRanges single(uint32_t c) {
  return {{c, c}};
}

// ---- the regular-expression subset of `pattern` (ECMA-262 syntax) ------------------------------

class RegexConverter {
 public:
  RegexConverter(std::string_view re, std::string where) : re_(re), where_(std::move(where)) {}

  // The GBNF of the JSON string contents (without quotes) whose decoded text matches.
  std::string convert() {
    bool anchored_start = false, anchored_end = false;
    if (!re_.empty() && re_[0] == '^') anchored_start = true, ++pos_;
    std::string body = alternation();
    if (pos_ < re_.size() && re_[pos_] == '$') anchored_end = true, ++pos_;
    if (pos_ != re_.size()) fail("unsupported syntax at offset " + std::to_string(pos_));
    const std::string any = "char*";
    return (anchored_start ? "" : any + " ") + "(" + body + ")" + (anchored_end ? "" : " " + any);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw SchemaError(where_, "pattern", "pattern \"" + std::string(re_) + "\": " + what);
  }
  bool at_end() const { return pos_ >= re_.size() || (re_[pos_] == '$' && pos_ + 1 == re_.size()); }

  std::string alternation() {
    std::vector<std::string> alts = {sequence()};
    while (pos_ < re_.size() && re_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + ("(" + alts[i] + ")");
    return out;
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && re_[pos_] != '|' && re_[pos_] != ')') {
      std::string atom = this->atom();
      if (pos_ < re_.size()) {
        const char q = re_[pos_];
        std::string suffix;
        if (q == '*' || q == '+' || q == '?') {
          suffix = std::string(1, q);
          ++pos_;
        } else if (q == '{') {
          const size_t close = re_.find('}', pos_);
          if (close == std::string_view::npos) fail("unterminated {m,n}");
          suffix = std::string(re_.substr(pos_, close - pos_ + 1));
          pos_ = close + 1;
        }
        if (!suffix.empty() && pos_ < re_.size() && re_[pos_] == '?') ++pos_;  // lazy: same set
        atom = "(" + atom + ")" + suffix;
      }
      out += (out.empty() ? "" : " ") + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string atom() {
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (pos_ < re_.size() && re_[pos_] == '?') {
        if (re_.substr(pos_, 2) == "?:")
          pos_ += 2;
        else
          fail("lookarounds and named groups are not supported");
      }
      std::string inner = alternation();
      if (pos_ >= re_.size() || re_[pos_] != ')') fail("unmatched (");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') return json_chars(char_class());
    if (c == '.') {
      ++pos_;
      return json_chars(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++pos_;
      return json_chars(escape(false));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("a quantifier with nothing before it");
    if (c == '^' || c == '$') fail("^ and $ are supported only at the ends");
    return json_chars(single(code_point()));
  }

  uint32_t code_point() {
    const unsigned char c = static_cast<unsigned char>(re_[pos_]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (pos_ + len > re_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < len; ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(re_[pos_ + i]) & 0x3F);
    pos_ += len;
    return cp;
  }

  // After a backslash.
  CodeRanges escape(bool in_class) {
    if (pos_ >= re_.size()) fail("a \\ at the end");
    const char e = re_[pos_++];
    const CodeRanges digit = {{'0', '9'}};
    const CodeRanges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const CodeRanges space = {
        {'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
        {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    switch (e) {
      case 'd':
        return digit;
      case 'D':
        return complement(digit);
      case 'w':
        return word;
      case 'W':
        return complement(word);
      case 's':
        return space;
      case 'S':
        return complement(space);
      case 'n':
        return single('\n');
      case 'r':
        return single('\r');
      case 't':
        return single('\t');
      case 'f':
        return single('\f');
      case 'v':
        return single('\v');
      case 'b':
        if (in_class) return single('\b');
        fail("\\b (word boundary) is not supported");
      case 'u': {
        if (pos_ + 4 > re_.size()) fail("short \\u escape");
        const uint32_t v =
            static_cast<uint32_t>(std::stoul(std::string(re_.substr(pos_, 4)), nullptr, 16));
        pos_ += 4;
        return single(v);
      }
      case 'x': {
        if (pos_ + 2 > re_.size()) fail("short \\x escape");
        const uint32_t v =
            static_cast<uint32_t>(std::stoul(std::string(re_.substr(pos_, 2)), nullptr, 16));
        pos_ += 2;
        return single(v);
      }
      default:
        if ((e >= '1' && e <= '9') || e == 'k') fail("back-references are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
          fail(std::string("unsupported escape \\") + e);
        return single(static_cast<unsigned char>(e));
    }
  }

  CodeRanges char_class() {
    ++pos_;  // [
    bool negated = false;
    if (pos_ < re_.size() && re_[pos_] == '^') negated = true, ++pos_;
    CodeRanges set;
    bool first = true;
    for (;;) {
      if (pos_ >= re_.size()) fail("unterminated [class]");
      if (re_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      CodeRanges lo_set;
      if (re_[pos_] == '\\') {
        ++pos_;
        lo_set = escape(true);
      } else {
        lo_set = single(code_point());
      }
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && pos_ + 1 < re_.size() &&
          re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        CodeRanges hi_set;
        if (re_[pos_] == '\\') {
          ++pos_;
          hi_set = escape(true);
        } else {
          hi_set = single(code_point());
        }
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second ||
            hi_set[0].first < lo_set[0].first)
          fail("a bad range in a [class]");
        set.push_back({lo_set[0].first, hi_set[0].first});
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    return negated ? complement(set) : normalise(set);
  }

  std::string_view re_;
  std::string where_;
  size_t pos_ = 0;
};

// ---- integer ranges as digit patterns
// ------------------------------------------------------------

std::string digits_class(int lo, int hi) {
  std::string out;
  if (lo == hi) {
    out += '"';
    out += static_cast<char>('0' + lo);
    out += '"';
    return out;
  }
  out += '[';
  out += static_cast<char>('0' + lo);
  out += '-';
  out += static_cast<char>('0' + hi);
  out += ']';
  return out;
}

// Alternatives matching the decimal texts (no leading zeros) of [lo, hi], 0 <= lo <= hi.
void range_patterns(uint64_t lo, uint64_t hi, std::vector<std::string>& out) {
  const std::string a = std::to_string(lo), b = std::to_string(hi);
  if (a.size() < b.size()) {
    // Split at the powers of ten.
    uint64_t top = 9;
    for (size_t i = 1; i < a.size(); ++i) top = top * 10 + 9;
    range_patterns(lo, top, out);
    range_patterns(top + 1, hi, out);
    return;
  }
  // Same length: the common prefix, then one digit range and free digits, or a split.
  size_t p = 0;
  while (p < a.size() && a[p] == b[p]) ++p;
  if (p == a.size()) {
    out.push_back(literal(a));
    return;
  }
  const std::string prefix = a.substr(0, p);
  const size_t rest = a.size() - p - 1;
  const bool lo_tail_zero = a.find_first_not_of('0', p + 1) == std::string::npos;
  const bool hi_tail_nine = b.find_first_not_of('9', p + 1) == std::string::npos;
  auto free = [&](size_t n) { return n ? " [0-9]{" + std::to_string(n) + "}" : std::string(); };
  const auto pre = [&](const std::string& s) {
    return s.empty() ? std::string() : literal(s) + " ";
  };
  if (lo_tail_zero && hi_tail_nine) {
    out.push_back(pre(prefix) + digits_class(a[p] - '0', b[p] - '0') + free(rest));
    return;
  }
  // lo .. (a[p] followed by nines), the middle digits, (b[p] followed by zeros) .. hi.
  uint64_t pow = 1;
  for (size_t i = 0; i < rest; ++i) pow *= 10;
  const uint64_t block = (lo / pow) * pow;  // a[..p] a[p] 000
  uint64_t first_end = block + pow - 1, last_start = (hi / pow) * pow;
  if (lo_tail_zero) {
    first_end = lo - 1;  // no separate first block
  } else {
    range_patterns(lo, first_end, out);
  }
  const int mid_lo = (a[p] - '0') + (lo_tail_zero ? 0 : 1);
  const int mid_hi = (b[p] - '0') - (hi_tail_nine ? 0 : 1);
  if (mid_lo <= mid_hi) out.push_back(pre(prefix) + digits_class(mid_lo, mid_hi) + free(rest));
  if (!hi_tail_nine) range_patterns(last_start, hi, out);
}

std::string join_alts(const std::vector<std::string>& alts) {
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

constexpr uint64_t kNoLimit = UINT64_MAX;
// Numbers are written with at most this many integer digits (and 16 fraction digits, 3 exponent
// digits; kBaseRules): beyond 2^53 a JSON reader's double is not the integer written anyway, and a
// bounded number always ends, whatever the sampler does.
constexpr size_t kMostDigits = 16;

// Decimal texts of [lo, hi] (hi may be kNoLimit: any larger number too), lo >= 0.
std::string magnitude_range(uint64_t lo, uint64_t hi) {
  std::vector<std::string> alts;
  if (hi == kNoLimit) {
    const size_t n = std::to_string(lo).size();
    uint64_t top = 9;
    for (size_t i = 1; i < n; ++i) top = top * 10 + 9;
    range_patterns(lo, top, alts);
    if (n < kMostDigits)
      alts.push_back("[1-9] [0-9]{" + std::to_string(n) + "," + std::to_string(kMostDigits - 1) +
                     "}");
  } else {
    range_patterns(lo, hi, alts);
  }
  return join_alts(alts);
}

// ---- the converter
// -------------------------------------------------------------------------------

class Converter {
 public:
  Converter(json root, std::string prefix) : root_(std::move(root)), prefix_(std::move(prefix)) {}

  // The start rule `start` and the helper rules, without the shared ones (kBaseRules).
  std::string run(const std::string& start) {
    const std::string body = visit(root_, "#");
    std::string out = start + " ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& where, const std::string& keyword,
                                const std::string& what) {
    throw SchemaError(where, keyword, what + " (at " + where + ")");
  }

  std::string new_rule(const std::string& hint, const std::string& body) {
    std::string name;
    for (char c : hint)
      name +=
          (std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-');
    name = prefix_ + "s-" + name.substr(0, 40) + "-" + std::to_string(rules_.size());
    rules_[name] = body;
    return name;
  }

  // The GBNF expression of the instances of `s` at JSON pointer `where`.
  std::string visit(const json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return "value";
      fail(where, "", "the schema false matches nothing");
    }
    if (!s.is_object()) fail(where, "", "a schema must be an object or a boolean");
    static const std::set<std::string> annotations = {"$schema",         "$id",
                                                      "$comment",        "title",
                                                      "description",     "examples",
                                                      "default",         "deprecated",
                                                      "readOnly",        "writeOnly",
                                                      "$defs",           "definitions",
                                                      "$anchor",         "contentMediaType",
                                                      "contentEncoding", "strict"};
    static const std::set<std::string> known = {"type",
                                                "properties",
                                                "required",
                                                "additionalProperties",
                                                "items",
                                                "prefixItems",
                                                "minItems",
                                                "maxItems",
                                                "enum",
                                                "const",
                                                "anyOf",
                                                "oneOf",
                                                "allOf",
                                                "$ref",
                                                "minLength",
                                                "maxLength",
                                                "pattern",
                                                "format",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum"};
    for (const auto& [k, v] : s.items())
      if (!known.count(k) && !annotations.count(k))
        fail(where, k, "the keyword \"" + k + "\" cannot be enforced while sampling");

    if (s.contains("$ref")) {
      if (s.size() > 1) {
        for (const auto& [k, v] : s.items())
          if (k != "$ref" && known.count(k))
            fail(where, k, "\"" + k + "\" beside \"$ref\" is not supported");
      }
      return ref(s["$ref"], where);
    }
    if (s.contains("const")) return literal(s["const"].dump());
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        fail(where, "enum", "\"enum\" must be a non-empty array");
      std::vector<std::string> alts;
      for (const json& v : s["enum"]) alts.push_back(literal(v.dump()));
      return join_alts(alts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_array() || s[key].empty())
        fail(where, key, std::string("\"") + key + "\" must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < s[key].size(); ++i)
        alts.push_back(visit(s[key][i], where + "/" + key + "/" + std::to_string(i)));
      // Sibling keywords (other than annotations) would have to hold for every branch.
      for (const auto& [k, v] : s.items())
        if (known.count(k) && k != key && k != "type")
          fail(where, k, "\"" + k + "\" beside \"" + key + "\" is not supported");
      return join_alts(alts);
    }
    if (s.contains("allOf")) return all_of(s, where);

    std::vector<std::string> types;
    if (s.contains("type")) {
      if (s["type"].is_string()) {
        types.push_back(s["type"]);
      } else if (s["type"].is_array() && !s["type"].empty()) {
        for (const json& t : s["type"]) {
          if (!t.is_string()) fail(where, "type", "\"type\" entries must be strings");
          types.push_back(t);
        }
      } else {
        fail(where, "type", "\"type\" must be a string or a non-empty array of strings");
      }
    } else {
      // Implied by the keywords, else any value.
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        types.push_back("object");
      if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
          s.contains("maxItems"))
        types.push_back("array");
      if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
          s.contains("format"))
        types.push_back("string");
      if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
          s.contains("exclusiveMaximum"))
        types.push_back("number");
      if (types.empty()) return "value";
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      if (t == "object")
        alts.push_back(object(s, where));
      else if (t == "array")
        alts.push_back(array(s, where));
      else if (t == "string")
        alts.push_back(string(s, where));
      else if (t == "integer")
        alts.push_back(number(s, where, true));
      else if (t == "number")
        alts.push_back(number(s, where, false));
      else if (t == "boolean")
        alts.push_back("boolean");
      else if (t == "null")
        alts.push_back("null");
      else
        fail(where, "type", "unknown type \"" + t + "\"");
    }
    return join_alts(alts);
  }

  std::string ref(const json& r, const std::string& where) {
    if (!r.is_string()) fail(where, "$ref", "\"$ref\" must be a string");
    const std::string target = r;
    if (target.empty() || target[0] != '#')
      fail(where, "$ref", "remote \"$ref\" \"" + target + "\" is not supported (only #/...)");
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    json::json_pointer pointer;
    try {
      pointer = json::json_pointer(target.substr(1));
    } catch (const json::exception&) {
      fail(where, "$ref", "\"$ref\" \"" + target + "\" is not a JSON pointer");
    }
    if (!root_.contains(pointer)) fail(where, "$ref", "\"$ref\" \"" + target + "\" points nowhere");
    // The rule is named before its body is visited, so a recursive schema refers to itself.
    const std::string name = new_rule("ref-" + target.substr(target.rfind('/') + 1), "");
    refs_[target] = name;
    rules_[name] = visit(root_.at(pointer), target);
    return name;
  }

  std::string all_of(const json& s, const std::string& where) {
    const json& list = s["allOf"];
    if (!list.is_array() || list.empty())
      fail(where, "allOf", "\"allOf\" must be a non-empty array");
    // Objects merge: properties, required, and the strictest additionalProperties.
    json merged = json::object();
    merged["type"] = "object";
    merged["properties"] = json::object();
    merged["required"] = json::array();
    // A part with additionalProperties false admits only its own properties: a property may be
    // written only if every such part declares it.
    std::vector<std::set<std::string>> closed_parts;
    std::vector<json> parts(list.begin(), list.end());
    json rest = s;
    rest.erase("allOf");
    parts.push_back(rest);
    for (size_t i = 0; i < parts.size(); ++i) {
      json part = parts[i];
      const std::string at = where + "/allOf/" + std::to_string(i);
      while (part.is_object() && part.contains("$ref")) {
        const std::string target = part["$ref"];
        if (target.empty() || target[0] != '#')
          fail(at, "$ref", "remote \"$ref\" is not supported");
        part = root_.at(json::json_pointer(target.substr(1)));
      }
      if (!part.is_object()) fail(at, "allOf", "\"allOf\" merges only object schemas");
      for (const auto& [k, v] : part.items()) {
        if (k == "type") {
          if (v != "object") fail(at, "allOf", "\"allOf\" merges only object schemas");
        } else if (k == "properties") {
          for (const auto& [p, ps] : v.items()) {
            if (merged["properties"].contains(p))
              fail(at, "allOf", "property \"" + p + "\" is declared twice in \"allOf\"");
            merged["properties"][p] = ps;
          }
        } else if (k == "required") {
          for (const json& r : v) merged["required"].push_back(r);
        } else if (k == "additionalProperties") {
          if (v != false)
            fail(at, "allOf", "\"allOf\" merges objects with additionalProperties false or absent");
          std::set<std::string> own;
          if (part.contains("properties"))
            for (const auto& [p, ps] : part["properties"].items()) own.insert(p);
          closed_parts.push_back(std::move(own));
        } else if (k != "title" && k != "description" && k != "$comment" && k != "$defs" &&
                   k != "definitions") {
          fail(at, k, "\"" + k + "\" inside \"allOf\" is not supported");
        }
      }
    }
    std::set<std::string> required;
    for (const json& r : merged["required"]) required.insert(r.get<std::string>());
    json kept = json::object();
    for (const auto& [p, ps] : merged["properties"].items()) {
      bool admitted = true;
      for (const auto& own : closed_parts) admitted = admitted && own.count(p) > 0;
      if (admitted)
        kept[p] = ps;
      else if (required.count(p))
        fail(where, "allOf",
             "the required property \"" + p +
                 "\" is excluded by an \"allOf\" part with "
                 "additionalProperties false");
    }
    merged["properties"] = std::move(kept);
    merged["additionalProperties"] = false;
    return object(merged, where);
  }

  std::string string(const json& s, const std::string& where) {
    if (s.contains("format")) {
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      for (const char* k : {"pattern", "minLength", "maxLength"})
        if (s.contains(k))
          fail(where, k, std::string("\"") + k + "\" beside \"format\" is not supported");
      return "\"\\\"\" " + format(f, where) + " \"\\\"\"";
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(where, "pattern", "\"pattern\" must be a string");
      for (const char* k : {"minLength", "maxLength"})
        if (s.contains(k))
          fail(where, k, std::string("\"") + k + "\" beside \"pattern\" is not supported");
      const std::string body = RegexConverter(s["pattern"].get<std::string>(), where).convert();
      return "\"\\\"\" " + body + " \"\\\"\"";
    }
    const int64_t lo = count(s, "minLength", where, 0);
    const int64_t hi = count(s, "maxLength", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "maxLength", "\"maxLength\" is below \"minLength\"");
    if (lo == 0 && hi < 0) return "string";
    return "\"\\\"\" char{" + std::to_string(lo) + "," + (hi >= 0 ? std::to_string(hi) : "") +
           "} \"\\\"\"";
  }

  std::string format(const std::string& f, const std::string& where) {
    const std::string date =
        "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" "
        "[01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( "
        "\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )";
    const std::string time =
        "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( "
        "\"Z\" | [-+] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
    if (f == "date") return "( " + date + " )";
    if (f == "time") return "( " + time + " )";
    if (f == "date-time") return "( " + date + " \"T\" " + time + " )";
    if (f == "uuid")
      return "( [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
             "[0-9a-f]{12} )";
    if (f == "email") {
      const std::string label = "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,14} [a-zA-Z0-9] )?";
      return "( [a-zA-Z0-9_+-]{1,16} ( \".\" [a-zA-Z0-9_+-]{1,16} ){0,2} \"@\" " + label +
             " ( \".\" " + label + " ){1,3} )";
    }
    fail(where, "format",
         "the format \"" + f +
             "\" cannot be enforced (supported: date, time, date-time, uuid, email)");
  }

  static int64_t count(const json& s, const char* key, const std::string& where, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 100000)
      fail(where, key, std::string("\"") + key + "\" must be an integer from 0 to 100000");
    return v.get<int64_t>();
  }

  std::string number(const json& s, const std::string& where, bool integer) {
    // Bounds: integers exactly; numbers when the bounds are integers and the lower one >= 0.
    std::optional<double> lo, hi;
    bool lo_ex = false, hi_ex = false;
    auto bound = [&](const char* key, std::optional<double>& b, bool& ex, bool exclusive) {
      if (!s.contains(key)) return;
      if (!s[key].is_number()) fail(where, key, std::string("\"") + key + "\" must be a number");
      b = s[key].get<double>();
      ex = exclusive;
    };
    bound("minimum", lo, lo_ex, false);
    bound("exclusiveMinimum", lo, lo_ex, true);
    bound("maximum", hi, hi_ex, false);
    bound("exclusiveMaximum", hi, hi_ex, true);
    if (!lo && !hi) return integer ? "integer" : "number";
    if (integer) {
      int64_t a = INT64_MIN, b = INT64_MAX;
      if (lo)
        a = lo_ex ? static_cast<int64_t>(std::floor(*lo)) + 1
                  : static_cast<int64_t>(std::ceil(*lo));
      if (hi)
        b = hi_ex ? static_cast<int64_t>(std::ceil(*hi)) - 1
                  : static_cast<int64_t>(std::floor(*hi));
      if (a > b) fail(where, "minimum", "no integer lies within the bounds");
      return integer_range(lo ? std::optional<int64_t>(a) : std::nullopt,
                           hi ? std::optional<int64_t>(b) : std::nullopt);
    }
    const char* bad = nullptr;
    if (lo && (*lo < 0 || *lo != std::floor(*lo) || *lo > 1e15))
      bad = lo_ex ? "exclusiveMinimum" : "minimum";
    if (hi && (*hi < 0 || *hi != std::floor(*hi) || *hi > 1e15))
      bad = hi_ex ? "exclusiveMaximum" : "maximum";
    if (bad)
      fail(where, bad,
           std::string("\"") + bad +
               "\" on a number is enforced only as a whole number >= 0 (use an integer type or "
               "whole bounds)");
    const uint64_t a = lo ? static_cast<uint64_t>(*lo) : 0;
    const std::string frac = "( \".\" [0-9]{1,16} )?";
    const std::string nonzero_frac = "\".\" [0-9]{0,15} [1-9]";
    const std::string zero_frac = "( \".\" \"0\"{1,16} )?";
    std::vector<std::string> alts;
    if (!hi) {
      // [a, inf) or (a, inf)
      if (lo_ex) {
        alts.push_back(literal(std::to_string(a)) + " " + nonzero_frac);
        alts.push_back(magnitude_range(a + 1, kNoLimit) + " " + frac);
      } else {
        alts.push_back(magnitude_range(a, kNoLimit) + " " + frac);
      }
      return join_alts(alts);
    }
    const uint64_t b = static_cast<uint64_t>(*hi);
    if (b < a || (b == a && (lo_ex || hi_ex)))
      fail(where, "maximum", "no number lies within the bounds");
    // Integer part i: a (with a non-zero fraction if exclusive), a+1 .. b-1 (any fraction), b
    // (zero fraction, unless exclusive).
    if (b == a) return literal(std::to_string(a)) + " " + zero_frac;
    alts.push_back(literal(std::to_string(a)) + " " + (lo_ex ? nonzero_frac : frac));
    if (b > a + 1) alts.push_back(magnitude_range(a + 1, b - 1) + " " + frac);
    if (!hi_ex) alts.push_back(literal(std::to_string(b)) + " " + zero_frac);
    return join_alts(alts);
  }

  static std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<std::string> alts;
    // Non-negative part.
    if (!hi || *hi >= 0) {
      const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
      const uint64_t b = hi ? static_cast<uint64_t>(*hi) : kNoLimit;
      alts.push_back(magnitude_range(a, b));
    }
    // Negative part: -m with m in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const uint64_t m_lo = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi)) : 1;
      const uint64_t m_hi = lo ? static_cast<uint64_t>(-(*lo)) : kNoLimit;
      alts.push_back("\"-\" " + magnitude_range(m_lo, m_hi));
    }
    return join_alts(alts);
  }

  std::string array(const json& s, const std::string& where) {
    const int64_t lo = count(s, "minItems", where, 0);
    const int64_t hi = count(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "maxItems", "\"maxItems\" is below \"minItems\"");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array())
        fail(where, "prefixItems", "\"prefixItems\" must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        prefix.push_back(visit(s["prefixItems"][i], where + "/prefixItems/" + std::to_string(i)));
    }
    std::optional<std::string> item = "value";
    if (s.contains("items")) {
      if (s["items"] == false)
        item.reset();
      else
        item = visit(s["items"], where + "/items");
    }
    const int64_t P = static_cast<int64_t>(prefix.size());
    if (!item && lo > P)
      fail(where, "minItems", "\"minItems\" exceeds the prefixItems with items false");
    const int64_t most = item ? hi : (hi < 0 ? P : std::min(hi, P));
    // tail(i): the items from index i on, each after a comma.
    std::function<std::string(int64_t)> tail = [&](int64_t i) -> std::string {
      if (most >= 0 && i >= most) return "";
      if (i < P) {
        std::string t = tail(i + 1);
        std::string one = "\",\" " + prefix[static_cast<size_t>(i)] + (t.empty() ? "" : " " + t);
        return i >= lo ? "( " + one + " )?" : one;
      }
      const int64_t need = std::max<int64_t>(0, lo - i);
      const std::string rep = "( \",\" " + *item + " )";
      if (most < 0) return rep + "{" + std::to_string(need) + ",}";
      if (most - i <= 0) return "";
      return rep + "{" + std::to_string(need) + "," + std::to_string(most - i) + "}";
    };
    if (most == 0) return "\"[]\"";
    const std::string first = P > 0 ? prefix[0] : *item;
    const std::string rest = tail(1);
    const std::string body = first + (rest.empty() ? "" : " " + rest);
    return "\"[\" " + (lo == 0 ? "( " + body + " )?" : body) + " \"]\"";
  }

  std::string object(const json& s, const std::string& where) {
    struct Prop {
      std::string key;  // the JSON text of the name, quotes included
      std::string value;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required_names;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(where, "required", "\"required\" must be an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail(where, "required", "\"required\" entries must be strings");
        required_names.insert(r.get<std::string>());
      }
    }
    std::vector<std::string> names;
    if (s.contains("properties")) {
      if (!s["properties"].is_object())
        fail(where, "properties", "\"properties\" must be an object");
      for (const auto& [name, ps] : s["properties"].items()) {
        names.push_back(name);
        props.push_back({json(name).dump(), visit(ps, where + "/properties/" + name),
                         required_names.count(name) > 0});
      }
    }
    std::optional<std::string> extra;  // the value of additional properties, when allowed
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (ap != false) extra = visit(ap, where + "/additionalProperties");
    }
    for (const std::string& r : required_names)
      if (std::find(names.begin(), names.end(), r) == names.end()) {
        names.push_back(r);
        props.push_back({json(r).dump(), extra ? *extra : "value", true});
      }
    std::string extra_kv;
    if (extra) extra_kv = "( " + other_key(names) + " \":\" " + *extra + " )";
    // R(i, open): the properties from i on, `open` when none has been written yet.
    const size_t n = props.size();
    std::vector<std::string> closed(n + 1), open(n + 1);
    closed[n] = extra ? "( \",\" " + extra_kv + " )*" : "";
    open[n] = extra ? "( " + extra_kv + " ( \",\" " + extra_kv + " )* )?" : "";
    for (size_t k = n; k-- > 0;) {
      const std::string kv = literal(props[k].key) + " \":\" " + props[k].value;
      auto then = [](const std::string& a, const std::string& b) {
        return b.empty() ? a : a + " " + b;
      };
      const std::string c_rule = closed[k + 1].empty() ? "" : new_rule("obj", closed[k + 1]);
      if (props[k].required) {
        closed[k] = then("\",\" " + kv, c_rule);
        open[k] = then(kv, c_rule);
      } else {
        closed[k] = then("( \",\" " + kv + " )?", c_rule);
        const std::string o_rule = open[k + 1].empty() ? "" : new_rule("obj", open[k + 1]);
        open[k] = "( " + then(kv, c_rule) + (o_rule.empty() ? " )?" : " | " + o_rule + " )");
      }
    }
    return "\"{\" " + (open[0].empty() ? "" : open[0] + " ") + "\"}\"";
  }

  // A JSON string that is none of `names` (an additional property must not repeat a declared
  // one): the names' trie, leaving it at any point.
  std::string other_key(const std::vector<std::string>& names) {
    if (names.empty()) return "string";
    struct TrieNode {
      std::map<uint32_t, size_t> kids;
      bool end = false;
    };
    std::vector<TrieNode> trie(1);
    for (const std::string& name : names) {
      size_t at = 0;
      for (size_t i = 0; i < name.size();) {
        // UTF-8 decode (names are valid UTF-8: they came from JSON).
        const unsigned char c = static_cast<unsigned char>(name[i]);
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t j = 1; j < len && i + j < name.size(); ++j)
          cp = (cp << 6) | (static_cast<unsigned char>(name[i + j]) & 0x3F);
        i += len;
        auto it = trie[at].kids.find(cp);
        if (it == trie[at].kids.end()) {
          trie.push_back({});
          it = trie[at].kids.emplace(cp, trie.size() - 1).first;
        }
        at = it->second;
      }
      trie[at].end = true;
    }
    // rest(node): the rest of a key (closing quote included) that has followed the trie of
    // names to `node`: on along the trie, off it with any other character (then anything), or
    // the end where no name ends. Characters on the trie are written as json_chars spells them
    // (no \\u escapes), so a key that decodes to a name is never written.
    std::function<std::string(size_t)> rest = [&](size_t at) -> std::string {
      std::vector<std::string> alts;
      CodeRanges taken;
      for (const auto& [cp, kid] : trie[at].kids) {
        taken.push_back({cp, cp});
        alts.push_back(json_chars(single(cp)) + " " + rest(kid));
      }
      const std::string leave = json_chars(complement(taken));
      if (!leave.empty()) alts.push_back(leave + " char* \"\\\"\"");
      if (!trie[at].end) alts.push_back("\"\\\"\"");
      std::string body;
      for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
      return new_rule("key", body);
    };
    return "\"\\\"\" " + rest(0);
  }

  json root_;
  std::string prefix_;  // of the helper rules' names
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

namespace {

json parse_schema(std::string_view schema_json) {
  try {
    return json::parse(schema_json);
  } catch (const json::exception& e) {
    throw SchemaError("#", "", std::string("the schema is not valid JSON: ") + e.what());
  }
}

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema_json) {
  return Converter(parse_schema(schema_json), "").run("root") + kBaseRules;
}

std::string json_schemas_to_gbnf(const std::vector<std::string>& schemas_json,
                                 std::string_view root_prefix) {
  std::string out;
  for (size_t i = 0; i < schemas_json.size(); ++i) {
    const std::string start = std::string(root_prefix) + "-" + std::to_string(i);
    out += Converter(parse_schema(schemas_json[i]), start + "-").run(start);
  }
  return out + kBaseRules;
}

std::string json_object_gbnf() {
  return std::string("root ::= object\n") + kBaseRules;
}

}  // namespace k3::grammar
