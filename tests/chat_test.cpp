// chat_test — the XTML chat renderer (text/chat.h) against the 71 golden conversations of
// tests/data/text/chat_cases.jsonl (segments, text, and ids through the tokenizer), renderer
// edge cases the goldens do not cover, and the Python-json value type (text/pyjson.h): parse and
// dumps against hand-checked Python outputs, duplicate keys, the depth limit, malformed input,
// and the code-point key sort.
#include "text/chat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "text/prompt.h"
#include "text/pyjson.h"
#include "text/tokenizer.h"
#include "text_fixtures.h"

namespace {

using k3::testing::kReleaseDir;

using k3::Status;
using k3::text::ChatOptions;
using k3::text::DumpStyle;
using k3::text::PyValue;
using k3::text::Segment;

const std::string kChatCases = std::string(K3_SOURCE_DIR) + "/tests/data/text/chat_cases.jsonl";

PyValue parse(std::string_view text) {
  auto r = k3::text::parse_pyjson(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
  return r.ok() ? r.value() : PyValue();
}

// Python json.dumps(json.loads(text), ensure_ascii=False) with the given separators.
std::string roundtrip(std::string_view text, DumpStyle style = DumpStyle::kDefault) {
  return k3::text::dumps(parse(text), style);
}

std::vector<PyValue> load_cases() {
  std::ifstream in(kChatCases);
  EXPECT_TRUE(in.good()) << kChatCases;
  std::vector<PyValue> cases;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) cases.push_back(parse(line));
  return cases;
}

std::vector<Segment> golden_segments(const PyValue& c) {
  std::vector<Segment> out;
  for (const PyValue& s : c.find("segments")->as_array())
    out.push_back({s.find("text")->as_string(), s.find("special")->as_bool()});
  return out;
}

bool is_error_case(const PyValue& c) {
  const PyValue* e = c.find("error");
  return e && k3::text::is_truthy(*e);
}

// ---------------------------------------------------------------------------------------------
// Golden conversations

TEST(ChatGolden, EveryCaseRendersTheGoldenSegments) {
  const std::vector<PyValue> cases = load_cases();
  ASSERT_EQ(cases.size(), 71u);
  int rendered = 0, rejected = 0;
  for (const PyValue& c : cases) {
    const std::string& name = c.find("name")->as_string();
    SCOPED_TRACE(name);
    const auto result = k3::text::render_request(c);
    if (is_error_case(c)) {
      // The reference raises AssertionError, ValueError or TypeError, each for a request the
      // caller got wrong: here an invalid_argument Status (HTTP 400, not a 5xx), with the
      // reference's own message (error_text).
      const std::string& type = c.find("error_type")->as_string();
      EXPECT_FALSE(result.ok()) << "the reference raises " << type;
      if (result.ok()) continue;
      EXPECT_EQ(result.status().code(), Status::Code::invalid_argument)
          << "the reference raises " << type << ": " << result.status().message();
      EXPECT_EQ(result.status().message(), c.find("error_text")->as_string()) << type;
      ++rejected;
      continue;
    }
    ASSERT_TRUE(result.ok()) << result.status().message();
    const std::vector<Segment> want = golden_segments(c);
    const std::vector<Segment>& got = result.value();
    EXPECT_EQ(got.size(), want.size());
    bool same = got.size() == want.size();
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      if (got[i] == want[i]) continue;
      ADD_FAILURE() << "segment " << i << ": got '" << got[i].text << "' special=" << got[i].special
                    << ", want '" << want[i].text << "' special=" << want[i].special;
      same = false;
      break;
    }
    EXPECT_EQ(k3::text::join_segments(got), c.find("text")->as_string());
    for (const Segment& s : got) {
      if (s.special) {
        EXPECT_TRUE(s.text == "<|open|>" || s.text == "<|close|>" || s.text == "<|sep|>" ||
                    s.text == "<|end_of_msg|>")
            << s.text;
      }
    }
    if (same) ++rendered;
  }
  EXPECT_EQ(rendered, 66);
  EXPECT_EQ(rejected, 5);
}

// Each segment encoded on its own (control segments with specials allowed), concatenated.
TEST(ChatGolden, SegmentsEncodeToTheGoldenIds) {
  const k3::text::Tokenizer tokenizer = k3::text::Tokenizer::load(kReleaseDir);
  for (const PyValue& c : load_cases()) {
    if (is_error_case(c)) continue;
    SCOPED_TRACE(c.find("name")->as_string());
    const auto result = k3::text::render_request(c);
    ASSERT_TRUE(result.ok()) << result.status().message();
    std::vector<int32_t> ids;
    k3::text::encode_segments(tokenizer, result.value(), ids);
    std::vector<int32_t> want;
    for (const PyValue& id : c.find("ids")->as_array())
      want.push_back(std::stoi(id.integer_decimal()));
    EXPECT_EQ(ids, want);
  }
}

// ---------------------------------------------------------------------------------------------
// Renderer behaviour beyond the goldens

k3::Result<std::vector<Segment>> render(std::string_view messages_json,
                                        const ChatOptions& options = {},
                                        std::string_view tools_json = "null") {
  return k3::text::build_chat_segments(parse(messages_json), parse(tools_json), options);
}

std::string render_text(std::string_view messages_json, const ChatOptions& options = {},
                        std::string_view tools_json = "null") {
  auto r = render(messages_json, options, tools_json);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? k3::text::join_segments(r.value()) : "";
}

ChatOptions no_prompt() {
  ChatOptions o;
  o.add_generation_prompt = false;
  return o;
}

// Each image part is the reference's placeholder, a special segment (no `text` needed). It is no
// vocabulary special, so encoding it with specials allowed gives the ordinary-text ids.
TEST(ChatRender, ImagePartsAreThePlaceholder) {
  auto r = render(
      R"([{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"x"}},{"type":"image"}]}])",
      no_prompt());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& s = r.value();
  ASSERT_EQ(s.size(), 14u);
  EXPECT_EQ(s[7], (Segment{"see", false}));
  EXPECT_EQ(s[8], (Segment{"<|kimi_image_placeholder|>", true}));
  EXPECT_EQ(s[9], (Segment{"<|kimi_image_placeholder|>", true}));
  const k3::text::Tokenizer tokenizer = k3::text::Tokenizer::load(kReleaseDir);
  EXPECT_EQ(tokenizer.encode(s[8].text, true), tokenizer.encode(s[8].text, false));
}

TEST(ChatRender, ContentPartsAreSeparateSegments) {
  auto r = render(
      R"([{"role":"user","content":[{"type":"text","text":"你好 "},{"type":"text","text":""},{"type":"text","text":"world"}]}])",
      no_prompt());
  ASSERT_TRUE(r.ok());
  const auto& s = r.value();
  ASSERT_EQ(s.size(), 13u);
  EXPECT_EQ(s[7].text, "你好 ");
  EXPECT_EQ(s[8].text, "world");
}

TEST(ChatRender, EffortIsValidatedOnlyWhenThinking) {
  ChatOptions o;
  o.thinking_effort = PyValue::string("medium");
  EXPECT_FALSE(render(R"([{"role":"user","content":"x"}])", o).ok());
  o.thinking_effort = PyValue::integer(1);
  EXPECT_FALSE(render(R"([{"role":"user","content":"x"}])", o).ok());
  o.thinking_effort = PyValue::string("");
  EXPECT_FALSE(render(R"([{"role":"user","content":"x"}])", o).ok());
  o.thinking = false;
  o.thinking_effort = PyValue::string("medium");
  EXPECT_EQ(render_text(R"([{"role":"user","content":"x"}])", o),
            "<|open|>message role=\"user\"<|sep|>x<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

TEST(ChatRender, ArgumentNormalisation) {
  const std::string call =
      R"([{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":ARGS}}]}])";
  auto with = [&](const std::string& args) {
    std::string m = call;
    m.replace(m.find("ARGS"), 4, args);
    return m;
  };
  ChatOptions o = no_prompt();
  o.thinking = false;
  const std::string head =
      "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>";
  const std::string tail =
      "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  EXPECT_EQ(render_text(with("null"), o), head + tail);
  EXPECT_EQ(render_text(with("\"\\u3000\\n\""), o), head + tail);  // blank by str.strip()
  EXPECT_EQ(render_text(
                with(R"("{\"a\": 1e400, \"b\": NaN, \"c\": {\"x\": [1, 2.50]}, \"a\": true}")"), o),
            head +
                "<|open|>argument key=\"a\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>"
                "<|open|>argument key=\"b\" type=\"number\"<|sep|>NaN<|close|>argument<|sep|>"
                "<|open|>argument key=\"c\" type=\"object\"<|sep|>{\"x\": [1, "
                "2.5]}<|close|>argument<|sep|>" +
                tail);
  EXPECT_EQ(render_text(with(R"("{\"a\": 1,}")"), o),
            head + "<|open|>json type=\"object\"<|sep|>{\"a\": 1,}<|close|>json<|sep|>" + tail);
  EXPECT_FALSE(render(with(R"("\"text\"")"), o).ok());  // valid JSON, not an object
  EXPECT_FALSE(render(with("true"), o).ok());
  EXPECT_FALSE(render(with("[]"), o).ok());
  // Nesting Python would refuse with RecursionError is an error, not a json block; one level
  // less (the object is a level) renders.
  const int depth = k3::text::kMaxPyjsonDepth;
  const auto nested = [&](int levels) {
    return with("\"{\\\"a\\\": " + std::string(levels, '[') + std::string(levels, ']') + "}\"");
  };
  EXPECT_EQ(render_text(nested(depth - 1), o),
            head + "<|open|>argument key=\"a\" type=\"array\"<|sep|>" +
                std::string(depth - 1, '[') + std::string(depth - 1, ']') +
                "<|close|>argument<|sep|>" + tail);
  const auto too_deep = render(nested(depth), o);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_EQ(too_deep.status().code(), Status::Code::too_large);
}

TEST(ChatRender, ToolNamesAndIndices) {
  ChatOptions o = no_prompt();
  o.thinking = false;
  // A run with an unmatched id stays in order; names come from `tool`, `name`, or call order.
  const std::string text = render_text(
      R"([{"role":"assistant","content":"","tool_calls":[
            {"id":7,"function":{"name":"a","arguments":{}}},
            {"id":"8","function":{"name":"b","arguments":{}}}]},
          {"role":"tool","tool_call_id":"8","content":"B","name":"stale"},
          {"role":"tool","tool_call_id":7,"content":"A"},
          {"role":"user","content":"u"},
          {"role":"tool","content":"C","tool":true}])",
      o);
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"a\" index=\"1\"<|sep|>A"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"b\" index=\"2\"<|sep|>B"),
            std::string::npos)
      << text;
  EXPECT_LT(text.find(">A<"), text.find(">B<"));
  // The counter keeps running after the user message; `tool` is str()-ed.
  EXPECT_NE(text.find("tool=\"True\" index=\"3\"<|sep|>C"), std::string::npos) << text;
  // `tool_call_id` present but null does not fall back to `id`.
  EXPECT_FALSE(render(R"([{"role":"tool","tool_call_id":null,"id":"x","content":"c"}])", o).ok());
}

TEST(ChatRender, ResponseFormatAndSchema) {
  ChatOptions o = no_prompt();
  o.response_format =
      parse(R"({"type":"json_schema","json_schema":{"json_schema":{"b":1,"a":[{"d":2,"c":3}]}}})");
  EXPECT_NE(render_text("[]", o).find("```json\n{\"a\":[{\"c\":3,\"d\":2}],\"b\":1}\n```"),
            std::string::npos);
  o.response_schema = parse(R"({"z":1,"y":2})");
  EXPECT_NE(render_text("[]", o).find("```json\n{\"y\":2,\"z\":1}\n```"), std::string::npos);
  o.response_format = parse(R"({"json_schema":{}})");  // no type: nothing
  EXPECT_EQ(render_text("[]", o), "");
  o.tool_choice = parse(R"({"type":"function","function":{"name":"x"}})");
  EXPECT_EQ(render_text("[]", o), "");
}

TEST(ChatRender, SkipsAndErrors) {
  ChatOptions o = no_prompt();
  EXPECT_EQ(render_text(R"([1, "x", null, {"role":"developer","content":"d"}, {"role":5}])", o),
            "");
  EXPECT_FALSE(render(R"([{"content":"no role"}])", o).ok());
  // `messages` is only iterated: a dict gives its keys, a string its characters (no messages);
  // null and numbers are not iterable.
  EXPECT_EQ(render_text(R"({"role":"user"})", o), "");
  EXPECT_EQ(render_text(R"("abc")"),
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  EXPECT_FALSE(render("null", o).ok());
  EXPECT_FALSE(render("5", o).ok());
  EXPECT_FALSE(render(R"([{"role":"user","content":5}])", o).ok());
  EXPECT_FALSE(render(R"([{"role":"assistant","tool_calls":{"a":1}}])", o).ok());
  EXPECT_FALSE(
      render(R"([{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}])", o).ok());
  // Reasoning: `reasoning_content` falsy → `reasoning`, str()-ed, kept unstripped.
  EXPECT_NE(render_text(R"([{"role":"assistant","reasoning_content":"","reasoning":" r\n"}])", o)
                .find("<|open|>think<|sep|> r\n<|close|>think<|sep|>"),
            std::string::npos);
  // Tools given as a mapping are declared too.
  EXPECT_NE(render_text("[]", o, R"({"b":{"y":1,"x":2},"a":1})")
                .find("```json\n{\"a\":1,\"b\":{\"x\":2,\"y\":1}}\n```"),
            std::string::npos);
}

TEST(ChatRender, RenderRequestOptions) {
  const PyValue req = parse(
      R"({"messages":[{"role":"user","content":"x"}],"options":{"entry":"apply_chat_template"}})");
  auto r = k3::text::render_request(req);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(k3::text::join_segments(r.value()).find("`thinking_effort=max`"), std::string::npos);
  EXPECT_FALSE(
      k3::text::render_request(parse(R"({"messages":[],"options":{"entry":"other"}})")).ok());
  EXPECT_FALSE(k3::text::render_request(parse(R"({"options":{}})")).ok());
  auto plain = k3::text::render_request(parse(R"({"messages":[]})"));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(k3::text::join_segments(plain.value()),
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
}

// ---------------------------------------------------------------------------------------------
// PyValue: json.loads / json.dumps

TEST(PyJson, FloatRepr) {
  using k3::text::python_float_repr;
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1.5), "1.5");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(2.5e-05), "2.5e-05");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(9999999999999998.0), "9999999999999998.0");
  EXPECT_EQ(python_float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float_repr(100000.0), "100000.0");
  EXPECT_EQ(python_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(python_float_repr(1e100), "1e+100");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
  EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(-12.75), "-12.75");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(std::nan("")), "nan");
}

TEST(PyJson, Numbers) {
  EXPECT_EQ(roundtrip("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(roundtrip("-123456789012345678901234567890"), "-123456789012345678901234567890");
  EXPECT_EQ(roundtrip("-0"), "0");
  EXPECT_EQ(roundtrip("-0.0"), "-0.0");
  EXPECT_EQ(roundtrip("2"), "2");
  EXPECT_EQ(roundtrip("2.0"), "2.0");
  EXPECT_EQ(roundtrip("1e5"), "100000.0");
  EXPECT_EQ(roundtrip("1E+2"), "100.0");
  EXPECT_EQ(roundtrip("1e16"), "1e+16");
  EXPECT_EQ(roundtrip("0.00001"), "1e-05");
  EXPECT_EQ(roundtrip("1e400"), "Infinity");
  EXPECT_EQ(roundtrip("-1e400"), "-Infinity");
  EXPECT_EQ(roundtrip("1e-400"), "0.0");
  EXPECT_EQ(roundtrip("-1e-400"), "-0.0");
  EXPECT_EQ(roundtrip("[NaN, Infinity, -Infinity]"), "[NaN, Infinity, -Infinity]");
  EXPECT_TRUE(parse("2").is_integer());
  EXPECT_TRUE(parse("2.0").is_float());
  EXPECT_TRUE(parse("2e0").is_float());
  // Python 3.11+ refuses integers of more than 4300 digits (ValueError, not JSONDecodeError).
  EXPECT_EQ(roundtrip(std::string(4300, '7')), std::string(4300, '7'));
  auto big = k3::text::parse_pyjson(std::string(4301, '7'));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), Status::Code::too_large);
}

TEST(PyJson, StringsAndEscapes) {
  EXPECT_EQ(roundtrip(R"("a\u00e9\n")"), "\"aé\\n\"");
  EXPECT_EQ(roundtrip(R"("\"\\\/\b\f\n\r\t")"), R"("\"\\/\b\f\n\r\t")");
  EXPECT_EQ(roundtrip(R"("\u0001\u001F\u007f")"), "\"\\u0001\\u001f\x7f\"");
  EXPECT_EQ(roundtrip(R"("\u2028\u2029\u00a0")"), "\"\u2028\u2029\u00a0\"");
  EXPECT_EQ(roundtrip("\"naïve 中文 😀\""), "\"naïve 中文 😀\"");
  EXPECT_EQ(roundtrip(R"("\ud83d\ude00")"), "\"😀\"");
  // Lone surrogates become U+FFFD (what tiktoken would make of them).
  EXPECT_EQ(roundtrip(R"("\ud83d")"), "\"\uFFFD\"");
  EXPECT_EQ(roundtrip(R"("\ude00x")"), "\"\uFFFDx\"");
  EXPECT_EQ(roundtrip(R"("\ud83d\u0041")"), "\"\uFFFDA\"");
  // Invalid UTF-8 in the input is repaired first.
  EXPECT_EQ(parse("\"a\xFF"
                  "b\"")
                .as_string(),
            "a\uFFFDb");
  EXPECT_EQ(parse("\"\xE4\xB8\"").as_string(), "\uFFFD");
}

TEST(PyJson, DumpStyles) {
  const char* doc = R"({"z": 1, "a": [true, null, {"k": "v"}, [], {}], "e": ""})";
  EXPECT_EQ(roundtrip(doc), R"({"z": 1, "a": [true, null, {"k": "v"}, [], {}], "e": ""})");
  EXPECT_EQ(roundtrip(doc, DumpStyle::kCompact),
            R"({"z":1,"a":[true,null,{"k":"v"},[],{}],"e":""})");
  EXPECT_EQ(roundtrip(" \t\n\r[ 1 ,\n2 ] \n"), "[1, 2]");
}

TEST(PyJson, DuplicateKeysKeepFirstPositionLastValue) {
  EXPECT_EQ(roundtrip(R"({"a": 1, "b": 2, "a": 3})"), R"({"a": 3, "b": 2})");
  std::string many = "{";
  for (int i = 0; i < 40; ++i)
    many += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ", ";
  many += "\"k5\": \"x\", \"k39\": null, \"new\": 0}";
  const PyValue v = parse(many);
  ASSERT_EQ(v.as_object().size(), 41u);
  EXPECT_EQ(v.as_object()[5].key, "k5");
  EXPECT_EQ(*v.find("k5"), PyValue::string("x"));
  EXPECT_TRUE(v.find("k39")->is_null());
  EXPECT_EQ(v.as_object().back().key, "new");
}

TEST(PyJson, DepthLimit) {
  const int ok_depth = k3::text::kMaxPyjsonDepth;
  EXPECT_TRUE(k3::text::parse_pyjson(std::string(ok_depth, '[') + std::string(ok_depth, ']')).ok());
  auto deep =
      k3::text::parse_pyjson(std::string(ok_depth + 1, '[') + std::string(ok_depth + 1, ']'));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), Status::Code::too_large);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_FALSE(k3::text::parse_pyjson(objects).ok());  // no stack overflow
  EXPECT_FALSE(k3::text::parse_pyjson(std::string(1000000, '[')).ok());
}

// Values at the depth limit go through every recursive function (parse, dumps, sort, str/repr,
// ==, copies) and the renderer without exhausting the stack (run under the sanitizers too).
TEST(PyJson, EveryRecursiveFunctionHandlesTheDepthLimit) {
  const int depth = k3::text::kMaxPyjsonDepth;
  ASSERT_EQ(depth, 990);  // CPython 3.11 parses ~990 levels
  for (const bool objects : {false, true}) {
    SCOPED_TRACE(objects ? "objects" : "arrays");
    const auto nested = [&](int levels) {
      std::string text;
      for (int i = 0; i < levels; ++i) text += objects ? "{\"k\": " : "[";
      text += "1";
      for (int i = 0; i < levels; ++i) text += objects ? "}" : "]";
      return text;
    };
    const std::string text = nested(depth);
    auto deepest = k3::text::parse_pyjson(text);
    ASSERT_TRUE(deepest.ok()) << deepest.status().message();
    const PyValue value = deepest.value();  // copy
    EXPECT_EQ(value, deepest.value());
    EXPECT_EQ(k3::text::dumps(value, DumpStyle::kDefault), text);
    EXPECT_EQ(k3::text::dumps(k3::text::sort_keys_deep(value), DumpStyle::kCompact).size(),
              objects ? text.size() - depth : text.size());
    EXPECT_EQ(k3::text::python_str(value).size(), text.size());
    EXPECT_EQ(k3::text::python_repr(value).size(), text.size());
    auto too_deep = k3::text::parse_pyjson(nested(depth + 1));
    ASSERT_FALSE(too_deep.ok());
    EXPECT_EQ(too_deep.status().code(), Status::Code::too_large);

    // Through the renderer: as a name (repr), as tools (sort + compact dumps), as arguments
    // (typed value) and as a response schema.
    PyValue call = PyValue::object();
    call.set("name", PyValue::string("f"));
    call.set("arguments", PyValue::object({{"a", value}}));
    PyValue calls = PyValue::array();
    calls.as_array().push_back(PyValue::object({{"function", call}}));
    PyValue messages = PyValue::array();
    messages.as_array().push_back(PyValue::object(
        {{"role", PyValue::string("user")}, {"content", PyValue::string("x")}, {"name", value}}));
    messages.as_array().push_back(PyValue::object({{"role", PyValue::string("assistant")},
                                                   {"content", PyValue::string("")},
                                                   {"tool_calls", calls}}));
    ChatOptions options;
    options.response_format = PyValue::string("json_schema");
    options.response_schema = value;
    auto r = k3::text::build_chat_segments(messages, value, options);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_GT(k3::text::join_segments(r.value()).size(), 3 * text.size());
  }
}

TEST(PyJson, MalformedInputIsRejected) {
  for (const char* bad : {"",           " ",           "[1,]",
                          "{\"a\":1,}", "[,1]",        "{'a':1}",
                          "[1 2]",      "{\"a\" 1}",   "{\"a\":}",
                          "{1:2}",      "\"abc",       "\"\\x\"",
                          "\"\\u12\"",  "\"\\u12g4\"", "\"\\ud83d\\u12\"",
                          "01",         "1.",          ".5",
                          "+1",         "-",           "--1",
                          "1e",         "[1e]",        "1.e5",
                          "nan",        "infinity",    "-NaN",
                          "True",       "None",        "nul",
                          "[1]x",       "[1]]",        "{} {}",
                          "\"a\tb\"",   "\"a\nb\"",    "\xEF\xBB\xBF[]",
                          "[",          "{",           "{\"a\"",
                          "{\"a\":1"}) {
    auto r = k3::text::parse_pyjson(bad);
    EXPECT_FALSE(r.ok()) << "accepted: " << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Status::Code::invalid_argument) << bad;
    }
  }
}

TEST(PyJson, SortKeysDeepByCodePoint) {
  const PyValue sorted = k3::text::sort_keys_deep(
      parse(R"({"z": 1, "é": 2, "Z": 3, "a": {"y": [{"d": 1, "c": 2}], "b": 2}})"));
  EXPECT_EQ(k3::text::dumps(sorted, DumpStyle::kCompact),
            R"({"Z":3,"a":{"b":2,"y":[{"c":2,"d":1}]},"z":1,"é":2})");
  // U+FFFF sorts before U+1F600 (UTF-16 order would put the surrogate pair D83D first).
  const PyValue astral = k3::text::sort_keys_deep(
      parse(R"({"\ud83d\ude00": 1, "\uffff": 2, "\uff5e": 3, "\ue000": 4})"));
  EXPECT_EQ(k3::text::dumps(astral, DumpStyle::kCompact),
            "{\"\ue000\":4,\"\uff5e\":3,\"\uffff\":2,\"😀\":1}");
  EXPECT_EQ(roundtrip("[3, 1, 2]"), "[3, 1, 2]");
}

TEST(PyJson, TruthinessStrAndStrip) {
  using k3::text::is_truthy;
  using k3::text::python_str;
  for (const char* falsy : {"null", "false", "0", "-0", "0.0", "-0.0", "\"\"", "[]", "{}"})
    EXPECT_FALSE(is_truthy(parse(falsy))) << falsy;
  for (const char* truthy : {"true", "1", "-1", "0.5", "NaN", "\" \"", "[0]", "{\"a\":null}"})
    EXPECT_TRUE(is_truthy(parse(truthy))) << truthy;
  EXPECT_EQ(python_str(parse("null")), "None");
  EXPECT_EQ(python_str(parse("true")), "True");
  EXPECT_EQ(python_str(parse("12345678901234567890")), "12345678901234567890");
  EXPECT_EQ(python_str(parse("1.0")), "1.0");
  EXPECT_EQ(python_str(parse("1e16")), "1e+16");
  EXPECT_EQ(python_str(parse("Infinity")), "inf");
  EXPECT_EQ(python_str(parse("NaN")), "nan");
  EXPECT_EQ(python_str(parse("\"a\\\"b\"")), "a\"b");
  EXPECT_EQ(python_str(parse(R"([1, "a", null, true, {"k": "it's"}, "q\"'", "\n\u0001é"])")),
            "[1, 'a', None, True, {'k': \"it's\"}, 'q\"\\'', '\\n\\x01é']");
  EXPECT_EQ(k3::text::python_strip("\u3000\t x y \x1c\u2029\u0085"), "x y");
  EXPECT_EQ(k3::text::python_strip("\u200b"), "\u200b");  // ZERO WIDTH SPACE is no whitespace
  EXPECT_EQ(k3::text::python_strip(" \n "), "");
}

}  // namespace
