// chat_spec_test — the XTML renderer (text/chat.h) against the rules of docs/chat_format.md
// §6.2–6.6 and the "Chat semantics" of tests/data/text/README.md, for behaviour the 71 golden
// conversations do not exercise. Every expectation is written out segment by segment from the
// spec's element shape (§6.2):
//   open   C<|open|> T"tag" (T" key" T"=\"" T"escaped value" T"\"")* C<|sep|>
//   close  C<|close|> T"tag" C<|sep|>           end of message  C<|end_of_msg|>
//   empty strings give no segment.
// Where the spec leaves a detail to Python (`if name:` truthiness, `str()` of non-strings, dict
// iteration, `json.loads` strictness, `kwargs` key presence) the comment says what Python does.
// The renderer is Moonshot's `encoding_k3.build_chat_segments`; a request is run through
// `render_request`, i.e. every key of `options` but `entry` is passed to it as a keyword.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "text/chat.h"
#include "text/pyjson.h"

namespace {

using k3::text::PyValue;
using k3::text::Segment;

// ---- expected-segment builder (spec §6.2, independent of the implementation) ------------------

using Attrs = std::vector<std::pair<std::string, std::string>>;  // values already escaped

class Want {
 public:
  Want& C(const std::string& s) {
    segs_.push_back({s, true});
    return *this;
  }
  Want& T(const std::string& s) {
    if (!s.empty()) segs_.push_back({s, false});
    return *this;
  }
  Want& open(const std::string& tag, const Attrs& attrs = {}) {
    C("<|open|>").T(tag);
    for (const auto& [k, v] : attrs) T(" " + k).T("=\"").T(v).T("\"");
    return C("<|sep|>");
  }
  Want& close(const std::string& tag) { return C("<|close|>").T(tag).C("<|sep|>"); }
  Want& eom() { return C("<|end_of_msg|>"); }
  // A whole message element with one body segment.
  Want& message(const Attrs& attrs, const std::string& body) {
    return open("message", attrs).T(body).close("message").eom();
  }
  Want& internal(const std::string& type, const std::string& body) {
    return message({{"role", "system"}, {"type", type}}, body);
  }
  // Closed `tools` block helpers.
  Want& call_open(const std::string& tool, int index) {
    return open("call", {{"tool", tool}, {"index", std::to_string(index)}});
  }
  Want& argument(const std::string& key, const std::string& type, const std::string& value) {
    return open("argument", {{"key", key}, {"type", type}}).T(value).close("argument");
  }
  // Non-thinking assistant turn with a plain-string content and no calls.
  Want& assistant_plain(const std::string& content) {
    return open("message", {{"role", "assistant"}})
        .open("response")
        .T(content)
        .close("response")
        .close("message")
        .eom();
  }
  const std::vector<Segment>& segments() const { return segs_; }

 private:
  std::vector<Segment> segs_;
};

std::string show(const std::vector<Segment>& segs) {
  std::string out;
  for (const Segment& s : segs) out += (s.special ? "C[" : "T[") + s.text + "] ";
  return out;
}

k3::Result<std::vector<Segment>> render_request(const std::string& messages,
                                                const std::string& options = "{}",
                                                const std::string& tools = "null") {
  const std::string request =
      R"({"messages": )" + messages + R"(, "tools": )" + tools + R"(, "options": )" + options + "}";
  auto parsed = k3::text::parse_pyjson(request);
  EXPECT_TRUE(parsed.ok()) << request << ": " << (parsed.ok() ? "" : parsed.status().message());
  if (!parsed.ok()) return parsed.status();
  return k3::text::render_request(parsed.value());
}

// Options used by most cases: no think channel and no generation prompt, to keep them short.
constexpr const char* kPlain = R"({"thinking": false, "add_generation_prompt": false})";

// Non-fatal, so every sub-case of a loop is reported.
#define EXPECT_SEGMENTS(result, want)                                               \
  do {                                                                              \
    const auto& r_ = (result);                                                      \
    if (!r_.ok()) {                                                                 \
      ADD_FAILURE() << "render failed: " << r_.status().message();                  \
    } else {                                                                        \
      EXPECT_TRUE(r_.value() == (want).segments())                                  \
          << "got:  " << show(r_.value()) << "\nwant: " << show((want).segments()); \
    }                                                                               \
  } while (0)

// ---- wire constants (§6.5) ---------------------------------------------------------------------

const std::string kStaticDeclare =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
const std::string kDynamicDeclare =
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n";
const std::string kJsonEnd = "\n```";
std::string effort_body(const std::string& effort) {
  return "`thinking_effort` guides on how much to think in your thinking channel "
         "(not including the response channel), supported values include `low`, "
         "`medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=" +
         effort + "`.";
}
const std::string kChoiceRequired =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
const std::string kChoiceNone =
    "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next "
    "message.";
const std::string kFormatObject =
    "The system is invoked with `response_format=json_object`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional "
    "formatting.";
std::string format_schema(const std::string& compact_schema) {
  return "The system is invoked with `response_format=json_schema`.\n"
         "Your response must be raw JSON data without markdown code blocks (```json) or any "
         "additional formatting.\n"
         "The JSON data must match the following schema:\n```json\n" +
         compact_schema + "\n```";
}

// =================================================================================================
// §6.3 pre-processing 1: tool-result ordering

// Two calls answered in reverse order: the run is stable-sorted by call position, `tool` is set
// from the matched call (overriding a stale explicit `tool`), and `index` is the rendered counter.
TEST(ChatSpecToolOrder, RunIsSortedByCallPositionAndToolIsTheMatchedName) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "function": {"name": "fa", "arguments": {}}},
          {"id": "b", "function": {"name": "fb", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "b", "content": "B"},
      {"role": "tool", "tool_call_id": "a", "tool": "stale", "content": "A"}])",
                                kPlain);
  Want w;
  w.open("message", {{"role", "assistant"}}).open("response").close("response");
  w.open("tools").call_open("fa", 1).close("call").call_open("fb", 2).close("call").close("tools");
  w.close("message").eom();
  w.message({{"role", "tool"}, {"tool", "fa"}, {"index", "1"}}, "A");
  w.message({{"role", "tool"}, {"tool", "fb"}, {"index", "2"}}, "B");
  EXPECT_SEGMENTS(r, w);
}

// Ids are compared as str(): str(1) = "1", str(True) = "True", str(2.0) = "2.0" on both sides.
TEST(ChatSpecToolOrder, IdsAreComparedAsPythonStr) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": 1, "function": {"name": "f1", "arguments": {}}},
          {"id": true, "function": {"name": "f2", "arguments": {}}},
          {"id": 2.0, "function": {"name": "f3", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "2.0", "content": "c3"},
      {"role": "tool", "tool_call_id": "True", "content": "c2"},
      {"role": "tool", "tool_call_id": "1", "content": "c1"}])",
                                kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = k3::text::join_segments(r.value());
  const std::string tail =
      "<|open|>message role=\"tool\" tool=\"f1\" "
      "index=\"1\"<|sep|>c1<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"tool\" tool=\"f2\" "
      "index=\"2\"<|sep|>c2<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"tool\" tool=\"f3\" "
      "index=\"3\"<|sep|>c3<|close|>message<|sep|><|end_of_msg|>";
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << text;
}

// `2.0` and `2` are different ids: str(2.0) = "2.0" != "2". The run is left unchanged and the
// names come from call order (tool_calls[counter-1]).
TEST(ChatSpecToolOrder, IntAndFloatIdsDoNotMatch) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "x", "function": {"name": "f1", "arguments": {}}},
          {"id": 2.0, "function": {"name": "f2", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": 2, "content": "second"},
      {"role": "tool", "tool_call_id": "x", "content": "first"}])",
                                kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = k3::text::join_segments(r.value());
  EXPECT_NE(text.find("tool=\"f1\" index=\"1\"<|sep|>second"), std::string::npos) << text;
  EXPECT_NE(text.find("tool=\"f2\" index=\"2\"<|sep|>first"), std::string::npos) << text;
}

// Two results for the same call share its position; the sort is stable, so they keep their order.
// Their `tool` is set, so the counter running past the number of calls needs no lookup.
TEST(ChatSpecToolOrder, SortIsStableForRepeatedIds) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "function": {"name": "fa", "arguments": {}}},
          {"id": "b", "function": {"name": "fb", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "b", "content": "B1"},
      {"role": "tool", "tool_call_id": "a", "content": "A"},
      {"role": "tool", "tool_call_id": "b", "content": "B2"}])",
                                kPlain);
  Want w;
  w.open("message", {{"role", "assistant"}}).open("response").close("response");
  w.open("tools").call_open("fa", 1).close("call").call_open("fb", 2).close("call").close("tools");
  w.close("message").eom();
  w.message({{"role", "tool"}, {"tool", "fa"}, {"index", "1"}}, "A");
  w.message({{"role", "tool"}, {"tool", "fb"}, {"index", "2"}}, "B1");
  w.message({{"role", "tool"}, {"tool", "fb"}, {"index", "3"}}, "B2");
  EXPECT_SEGMENTS(r, w);
}

// An id-less call still advances the position, and the first occurrence of a duplicated id wins
// (position and name).
TEST(ChatSpecToolOrder, IdlessCallsAdvanceThePositionAndTheFirstDuplicateWins) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"function": {"name": "n1", "arguments": {}}},
          {"id": "y", "function": {"name": "n2", "arguments": {}}},
          {"id": "x", "function": {"name": "n3", "arguments": {}}},
          {"id": "y", "function": {"name": "n4", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "x", "content": "X"},
      {"role": "tool", "tool_call_id": "y", "content": "Y"}])",
                                kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = k3::text::join_segments(r.value());
  // y → (position 2, n2), x → (position 3, n3): Y before X.
  EXPECT_NE(text.find("tool=\"n2\" index=\"1\"<|sep|>Y<|close|>message<|sep|><|end_of_msg|>"
                      "<|open|>message role=\"tool\" tool=\"n3\" index=\"2\"<|sep|>X"),
            std::string::npos)
      << text;
}

// All or nothing: one unmatched id leaves the whole run as it came, so `tool` is not set and
// names are resolved by order.
TEST(ChatSpecToolOrder, OneUnmatchedIdLeavesTheRunUntouched) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "function": {"name": "fa", "arguments": {}}},
          {"id": "b", "function": {"name": "fb", "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "b", "content": "B"},
      {"role": "tool", "tool_call_id": "zz", "content": "Z"}])",
                                kPlain);
  Want w;
  w.open("message", {{"role", "assistant"}}).open("response").close("response");
  w.open("tools").call_open("fa", 1).close("call").call_open("fb", 2).close("call").close("tools");
  w.close("message").eom();
  w.message({{"role", "tool"}, {"tool", "fa"}, {"index", "1"}}, "B");
  w.message({{"role", "tool"}, {"tool", "fb"}, {"index", "2"}}, "Z");
  EXPECT_SEGMENTS(r, w);
}

// `id` is used only when `tool_call_id` is absent; the map survives a user message (it is only
// rebuilt at assistant messages), a user message ends a run, and the counter keeps running.
TEST(ChatSpecToolOrder, IdFallbackRunsEndAtOtherMessagesAndTheMapPersists) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "function": {"name": "fa", "arguments": {}}},
          {"id": "b", "function": {"name": "fb", "arguments": {}}}]},
      {"role": "tool", "id": "b", "content": "B"},
      {"role": "user", "content": "u"},
      {"role": "tool", "id": "a", "content": "A"}])",
                                kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = k3::text::join_segments(r.value());
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"fb\" "
                      "index=\"1\"<|sep|>B<|close|>message<|sep|><|end_of_msg|>"
                      "<|open|>message role=\"user\"<|sep|>u<|close|>message<|sep|><|end_of_msg|>"
                      "<|open|>message role=\"tool\" tool=\"fa\" index=\"2\"<|sep|>A"),
            std::string::npos)
      << text;
}

// The map is rebuilt (empty) at an assistant message without calls, so an id from an earlier
// assistant no longer matches; the name is then resolved from this message's `name`.
TEST(ChatSpecToolOrder, MapIsRebuiltAtEveryAssistantMessage) {
  const std::string history = R"([
      {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "fa", "arguments": {}}}]},
      {"role": "assistant", "content": "later"},
      {"role": "tool", "tool_call_id": "a", "content": "A"NAME}])";
  auto with = [&](const std::string& name) {
    std::string m = history;
    m.replace(m.find("NAME"), 4, name);
    return m;
  };
  // No name, no calls on the latest assistant: unresolvable (§6.3 "none → error").
  EXPECT_FALSE(render_request(with(""), kPlain).ok());
  const auto r = render_request(with(R"(, "name": "given")"), kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = k3::text::join_segments(r.value());
  EXPECT_NE(text.find("<|open|>message role=\"tool\" tool=\"given\" index=\"1\"<|sep|>A"),
            std::string::npos)
      << text;
}

// A matched call whose function name is null does not set `tool`; the message keeps its own.
TEST(ChatSpecToolOrder, MatchedCallWithoutNameKeepsTheMessageName) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": null, "arguments": {}}}]},
      {"role": "tool", "tool_call_id": "a", "name": "given", "content": "A"}])",
                                kPlain);
  Want w;
  // The call itself renders tool=str(None) = "None".
  w.open("message", {{"role", "assistant"}}).open("response").close("response");
  w.open("tools").call_open("None", 1).close("call").close("tools").close("message").eom();
  w.message({{"role", "tool"}, {"tool", "given"}, {"index", "1"}}, "A");
  EXPECT_SEGMENTS(r, w);
}

// =================================================================================================
// §6.3 emission 3 (`tool`): name resolution and the counter

// `message.get("tool", message.get("name"))`: a present-but-null `tool` hides `name`, so the name
// comes from call order. A present empty-string `tool` is used as is: the attribute value is
// empty and produces no segment.
TEST(ChatSpecToolName, NullToolHidesNameAndEmptyToolGivesAnEmptyAttribute) {
  const auto r = render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [
          {"function": {"name": "f1", "arguments": {}}}, {"function": {"name": "f2", "arguments": {}}}]},
      {"role": "tool", "tool": null, "name": "ignored", "content": "one"},
      {"role": "tool", "tool": "", "content": "two"}])",
                                kPlain);
  Want w;
  w.open("message", {{"role", "assistant"}}).open("response").close("response");
  w.open("tools").call_open("f1", 1).close("call").call_open("f2", 2).close("call").close("tools");
  w.close("message").eom();
  w.message({{"role", "tool"}, {"tool", "f1"}, {"index", "1"}}, "one");
  // T" tool" T"=\"" T"\"" — no segment for the empty value.
  w.message({{"role", "tool"}, {"tool", ""}, {"index", "2"}}, "two");
  EXPECT_SEGMENTS(r, w);
}

// A tool message before any assistant message counts from 1 and needs its own name; a counter
// past the end of the calls is an error.
TEST(ChatSpecToolName, CounterStartsAtOneAndRunningPastTheCallsIsAnError) {
  const auto r = render_request(
      R"([{"role": "tool", "tool": "early", "content": "x"}, {"role": "tool", "name": 7, "content": "y"}])",
      kPlain);
  Want w;
  w.message({{"role", "tool"}, {"tool", "early"}, {"index", "1"}}, "x");
  w.message({{"role", "tool"}, {"tool", "7"}, {"index", "2"}}, "y");
  EXPECT_SEGMENTS(r, w);
  EXPECT_FALSE(render_request(R"([
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
      {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])",
                              kPlain)
                   .ok());
  // An assistant message with an empty tool_calls list resolves nothing.
  EXPECT_FALSE(
      render_request(
          R"([{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "1"}])",
          kPlain)
          .ok());
}

// =================================================================================================
// §6.3 pre-processing 2 and §6.4: argument normalisation and typed values

std::string one_call(const std::string& arguments) {
  return R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": )" +
         arguments + "}}]}]";
}

Want call_frame_open() {
  Want w;
  w.open("message", {{"role", "assistant"}})
      .open("response")
      .close("response")
      .open("tools")
      .call_open("f", 1);
  return w;
}
Want& call_frame_close(Want& w) {
  return w.close("call").close("tools").close("message").eom();
}

// A dict is used as is: keys in insertion order, nested objects NOT key-sorted, non-string values
// as json.dumps(ensure_ascii=False) with the default ", " / ": " separators.
TEST(ChatSpecArguments, DictArgumentsKeepOrderAndUseDefaultSeparators) {
  const auto r = render_request(
      one_call(R"({"b": {"z": 1, "a": [1, "two", false, null, {}]}, "a": null, "t": true,
                                     "s": "", "": "v", "u": {"é": "中\u0001\u2028"}, "f": 2.50, "i": -0})"),
      kPlain);
  Want w = call_frame_open();
  w.argument("b", "object", "{\"z\": 1, \"a\": [1, \"two\", false, null, {}]}");
  w.argument("a", "null", "null");
  w.argument("t", "boolean", "true");
  w.argument("s", "string", "");  // empty value: no segment between the tags
  w.argument("", "string", "v");  // empty key: T" key" T"=\"" T"\""
  w.argument("u", "object", "{\"é\": \"中\\u0001\u2028\"}");
  w.argument("f", "number", "2.5");
  w.argument("i", "number", "0");
  call_frame_close(w);
  EXPECT_SEGMENTS(r, w);
}

// A JSON string is parsed with json.loads: key order kept, a repeated key keeps its first position
// and its last value, int/float kept apart, 1E5 → 100000.0, out-of-range → Infinity / -0.0, big
// integers exact; leading/trailing JSON whitespace is fine.
TEST(ChatSpecArguments, JsonStringArgumentsKeepPythonNumberSemantics) {
  // (One JSON string: the outer request JSON may not hold a raw newline inside it.)
  const auto r = render_request(
      one_call(R"(" {\"n\": 1E5, \"m\": -0, \"k\": 1e400, \"j\": -1e-400, \"n\": 7, )"
               R"(\"big\": 123456789012345678901234567890, \"e\": 1e-7, \"x\": [1.0, 1e16]}\n")"),
      kPlain);
  Want w = call_frame_open();
  w.argument("n", "number", "7");
  w.argument("m", "number", "0");
  w.argument("k", "number", "Infinity");
  w.argument("j", "number", "-0.0");
  w.argument("big", "number", "123456789012345678901234567890");
  w.argument("e", "number", "1e-07");
  w.argument("x", "array", "[1.0, 1e+16]");
  call_frame_close(w);
  EXPECT_SEGMENTS(r, w);
}

// Strings that json.loads rejects become a json block with the raw text: a raw control character
// inside a string (strict mode), a leading form feed (JSON whitespace is only space/tab/CR/LF,
// although str.strip() would remove it, so the string is not blank), a byte-order mark, trailing
// data.
TEST(ChatSpecArguments, WhatJsonLoadsRejectsBecomesAJsonBlock) {
  for (const std::string raw_json :
       {R"("{\"a\": \"x\ny\"}")", R"("\f{}")", R"("\ufeff{}")", R"("{} {}")", R"("{\"a\": 01}")"}) {
    SCOPED_TRACE(raw_json);
    const std::string raw = k3::text::parse_pyjson(raw_json).value().as_string();
    Want w = call_frame_open();
    w.open("json", {{"type", "object"}}).T(raw).close("json");
    call_frame_close(w);
    EXPECT_SEGMENTS(render_request(one_call(raw_json), kPlain), w);
  }
}

// Blank by str.strip() (any Python whitespace, U+001C..U+001F included) → {} → no arguments.
TEST(ChatSpecArguments, BlankStringsAreEmptyArguments) {
  for (const std::string blank : {R"("")", R"(" ")", R"("\u001c\u3000\u0085\f")"}) {
    SCOPED_TRACE(blank);
    Want w = call_frame_open();
    call_frame_close(w);
    EXPECT_SEGMENTS(render_request(one_call(blank), kPlain), w);
  }
}

// Valid JSON that is not an object, and arguments of any other type, are errors.
TEST(ChatSpecArguments, NonObjectJsonAndOtherTypesAreErrors) {
  for (const std::string bad :
       {R"("null")", R"("NaN")", R"("[]")", R"("2")", "5", "1.5", "false", R"(["a"])"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(render_request(one_call(bad), kPlain).ok());
  }
}

// Normalisation pops any `_xtml_json_block` the caller put on the function (or on a flat call)
// when the arguments are not a raw block: `fn.pop("_xtml_json_block", None)`. So a caller key
// of that name never turns a call into a json block.
TEST(ChatSpecArguments, CallerSuppliedJsonBlockKeyIsDropped) {
  const auto wrapped = render_request(
      R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}, "_xtml_json_block": "raw"}}]}])",
      kPlain);
  Want w = call_frame_open();
  w.argument("a", "number", "1");
  call_frame_close(w);
  EXPECT_SEGMENTS(wrapped, w);

  const auto flat = render_request(
      R"([{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": "{}", "_xtml_json_block": "raw"}]}])",
      kPlain);
  Want w2 = call_frame_open();
  call_frame_close(w2);
  EXPECT_SEGMENTS(flat, w2);
}

// A flat call (no `function`): name and arguments are read from the call itself; `str()` of a
// non-string name; attribute escaping & → &amp; first, then " → &quot;.
TEST(ChatSpecArguments, FlatCallsAndEscapedNamesAndKeys) {
  const auto r = render_request(
      R"([{"role": "assistant", "content": "", "tool_calls": [
            {"name": "a&\"b", "arguments": "{\"k\\\"&\": \"&quot;\"}"},
            {"name": 1.0, "arguments": null}]}])",
      kPlain);
  Want w;
  w.open("message", {{"role", "assistant"}}).open("response").close("response").open("tools");
  w.call_open("a&amp;&quot;b", 1).argument("k&quot;&amp;", "string", "&quot;").close("call");
  w.call_open("1.0", 2).close("call");
  w.close("tools").close("message").eom();
  EXPECT_SEGMENTS(r, w);
}

// Python normalises `tool_calls` on EVERY message, but only assistant messages render them. For
// other roles the reference tolerates shapes it never renders: a non-list truthy value is merely
// iterated (dict → its keys, str → its characters), entries that are not dicts are kept as they
// are, and a `function` that is not a dict sends normalisation to the call's own `arguments`.
// Only an arguments value normalize_tool_arguments refuses raises.
TEST(ChatSpecArguments, ToolCallsOnNonAssistantMessagesAreOnlyNormalised) {
  Want w;
  w.message({{"role", "user"}}, "x");
  for (const std::string calls :
       {R"({"a": 1})", R"("abc")", R"([1, "s", null])", R"([{"function": "f"}])",
        R"([{"function": null, "arguments": "{}"}])"}) {
    SCOPED_TRACE(calls);
    EXPECT_SEGMENTS(
        render_request(R"([{"role": "user", "content": "x", "tool_calls": )" + calls + "}]",
                       kPlain),
        w);
  }
  Want s;
  s.message({{"role", "system"}}, "x");
  EXPECT_SEGMENTS(
      render_request(R"([{"role": "system", "content": "x", "tool_calls": [5]}])", kPlain), s);
  Want t;
  t.message({{"role", "tool"}, {"tool", "t"}, {"index", "1"}}, "x");
  EXPECT_SEGMENTS(
      render_request(R"([{"role": "tool", "tool": "t", "content": "x", "tool_calls": {"k": 1}}])",
                     kPlain),
      t);
  EXPECT_SEGMENTS(
      render_request(R"([{"role": "developer", "content": "x", "tool_calls": [null]}])", kPlain),
      Want());
  // These still raise in Python: the arguments themselves are refused, or the value is not
  // iterable.
  EXPECT_FALSE(
      render_request(
          R"([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])",
          kPlain)
          .ok());
  EXPECT_FALSE(
      render_request(
          R"([{"role": "user", "content": "x", "tool_calls": [{"function": null, "arguments": "[1]"}]}])",
          kPlain)
          .ok());
  EXPECT_FALSE(
      render_request(R"([{"role": "user", "content": "x", "tool_calls": 5}])", kPlain).ok());
}

// json.loads in CPython accepts nesting far deeper than 512 (the recursion limit is 1000 in
// 3.11 and higher in later versions): 600 levels render as a typed argument, not an error.
TEST(ChatSpecArguments, NestingWithinPythonsRecursionLimitIsAccepted) {
  const std::string deep = std::string(600, '[') + std::string(600, ']');
  const auto r = render_request(one_call("\"{\\\"a\\\": " + deep + "}\""), kPlain);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::string value;
  for (int i = 0; i < 600; ++i) value += '[';
  for (int i = 0; i < 600; ++i) value += ']';
  Want w = call_frame_open();
  w.argument("a", "array", value);
  call_frame_close(w);
  EXPECT_SEGMENTS(r, w);
}

// =================================================================================================
// §6.4 think channel

std::string assistant_with(const std::string& fields) {
  return R"([{"role": "assistant", "content": "c")" + fields + "}]";
}
Want think_turn(const std::string& reasoning) {
  Want w;
  w.open("message", {{"role", "assistant"}}).open("think").T(reasoning).close("think");
  w.open("response").T("c").close("response").close("message").eom();
  return w;
}
constexpr const char* kThinkNoPrompt = R"({"add_generation_prompt": false})";

TEST(ChatSpecThink, ReasoningFallbackIsPythonOr) {
  // `reasoning_content or reasoning`: a truthy whitespace-only reasoning_content wins over the
  // alias and then fails the strip test, so the channel stays empty.
  EXPECT_SEGMENTS(
      render_request(assistant_with(R"(, "reasoning_content": "  ", "reasoning": "alias")"),
                     kThinkNoPrompt),
      think_turn(""));
  // Falsy non-strings fall through: 0 or False → False, and str(False) = "False" is not blank.
  EXPECT_SEGMENTS(render_request(assistant_with(R"(, "reasoning_content": 0, "reasoning": false)"),
                                 kThinkNoPrompt),
                  think_turn("False"));
  // null or 0 → 0 → "0".
  EXPECT_SEGMENTS(render_request(assistant_with(R"(, "reasoning_content": null, "reasoning": 0)"),
                                 kThinkNoPrompt),
                  think_turn("0"));
  // Neither key: None → empty channel.
  EXPECT_SEGMENTS(render_request(assistant_with(""), kThinkNoPrompt), think_turn(""));
}

TEST(ChatSpecThink, StripTestUsesPythonWhitespaceButEmitsUnstripped) {
  EXPECT_SEGMENTS(
      render_request(assistant_with(R"(, "reasoning_content": "\u3000\u001c\u2029\u0085\u00a0")"),
                     kThinkNoPrompt),
      think_turn(""));
  // U+200B is not whitespace for str.strip().
  EXPECT_SEGMENTS(
      render_request(assistant_with(R"(, "reasoning_content": "\u200b")"), kThinkNoPrompt),
      think_turn("\u200b"));
  EXPECT_SEGMENTS(
      render_request(assistant_with(R"(, "reasoning_content": "\n r \u3000")"), kThinkNoPrompt),
      think_turn("\n r \u3000"));
  // A non-string reasoning is str()-ed.
  EXPECT_SEGMENTS(
      render_request(assistant_with(R"(, "reasoning_content": ["a", 1.0])"), kThinkNoPrompt),
      think_turn("['a', 1.0]"));
}

// thinking=false: no think element in any turn, reasoning discarded, prompt opens `response`;
// an effort (even an invalid one) is ignored.
TEST(ChatSpecThink, ThinkingOffDropsEveryThinkElement) {
  const auto r =
      render_request(R"([{"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                            {"role": "assistant", "content": "a2", "reasoning": "r2"}])",
                     R"({"thinking": false, "thinking_effort": "medium"})");
  Want w;
  w.assistant_plain("a1").assistant_plain("a2");
  w.open("message", {{"role", "assistant"}}).open("response");
  EXPECT_SEGMENTS(r, w);
}

// =================================================================================================
// §6.6 names and content

// `if message.get("name"):` — Python truthiness; the value is str()-ed.
TEST(ChatSpecNames, NameOnlyWhenTruthyAndStrOfTheValue) {
  for (const std::string falsy : {R"("")", "0", "0.0", "-0.0", "false", "[]", "{}", "null"}) {
    SCOPED_TRACE(falsy);
    Want w;
    w.message({{"role", "user"}}, "x");
    EXPECT_SEGMENTS(
        render_request(R"([{"role": "user", "content": "x", "name": )" + falsy + "}]", kPlain), w);
  }
  const std::vector<std::pair<std::string, std::string>> truthy = {
      {"1.0", "1.0"},
      {"true", "True"},
      {"1e16", "1e+16"},
      {"NaN", "nan"},
      {R"(" ")", " "},
      {R"([1, "a"])", "[1, 'a']"},
      {R"({"k": "v\""})", "{'k': 'v&quot;'}"},
      {R"("&quot;")", "&amp;quot;"}};
  for (const auto& [json, escaped] : truthy) {
    SCOPED_TRACE(json);
    Want w;
    w.message({{"role", "system"}, {"name", escaped}}, "x");
    EXPECT_SEGMENTS(
        render_request(R"([{"role": "system", "content": "x", "name": )" + json + "}]", kPlain), w);
  }
  Want a;
  a.open("message", {{"role", "assistant"}, {"name", "bot"}})
      .open("response")
      .T("x")
      .close("response")
      .close("message")
      .eom();
  EXPECT_SEGMENTS(
      render_request(R"([{"role": "assistant", "content": "x", "name": "bot"}])", kPlain), a);
}

// str() of a list holding a string uses repr(), which escapes non-printable characters: format
// characters (U+0601 ARABIC SIGN SANAH, category Cf) and unassigned code points (U+0378) are
// written as \uXXXX.
TEST(ChatSpecNames, ReprEscapesEveryNonPrintableCodePoint) {
  Want w;
  w.message({{"role", "user"}, {"name", "['\\u0601', '\\u0378', '\\xad']"}}, "x");
  EXPECT_SEGMENTS(
      render_request(
          R"([{"role": "user", "content": "x", "name": ["\u0601", "\u0378", "\u00ad"]}])", kPlain),
      w);
}

TEST(ChatSpecContent, EmptyShapesGiveNoBodySegment) {
  for (const std::string empty : {"null", R"("")", "[]", "{}"}) {
    SCOPED_TRACE(empty);
    Want w;
    w.open("message", {{"role", "user"}}).close("message").eom();
    EXPECT_SEGMENTS(render_request(R"([{"role": "user", "content": )" + empty + "}]", kPlain), w);
  }
  Want w;
  w.open("message", {{"role", "user"}}).close("message").eom();
  EXPECT_SEGMENTS(render_request(R"([{"role": "user"}])", kPlain), w);
}

// One segment per non-image part, `part["text"]` str()-ed whatever the part type.
TEST(ChatSpecContent, PartsAreStrOfTheirText) {
  const auto r = render_request(R"([{"role": "tool", "tool": "t", "content": [
      {"type": "text", "text": null}, {"type": "input_text", "text": 5}, {"type": "x", "text": ""},
      {"type": "text", "text": [true]}, {"type": "text", "text": "<|open|>"}]}])",
                                kPlain);
  Want w;
  w.open("message", {{"role", "tool"}, {"tool", "t"}, {"index", "1"}});
  w.T("None").T("5").T("[True]").T("<|open|>");
  w.close("message").eom();
  EXPECT_SEGMENTS(r, w);
}

TEST(ChatSpecContent, MalformedContentIsAnError) {
  for (const std::string bad : {"5", "true", R"({"a": 1})", R"(["text"])",
                                R"([{"text": "no type"}])", R"([{"type": "text"}])"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(render_request(R"([{"role": "user", "content": )" + bad + "}]", kPlain).ok());
  }
}

// =================================================================================================
// Message-level `tools`, declarations and compact JSON

// A system message with non-empty `tools` is a dynamic declaration (deep-sorted; content and
// name ignored). Empty `tools` leaves an ordinary system message; `tools` on other roles is
// ignored.
TEST(ChatSpecTools, MessageLevelTools) {
  const auto r = render_request(R"([
      {"role": "system", "content": "ignored", "name": "n", "tools": [{"z": {"b": 1, "a": 2}, "a": "é"}]},
      {"role": "system", "content": "plain", "tools": []},
      {"role": "user", "content": "u", "tools": [{"x": 1}]},
      {"role": "system", "content": "mapping", "tools": {"b": 1, "a": 0}}])",
                                kPlain);
  Want w;
  w.internal("tool-declare",
             kDynamicDeclare + "[{\"a\":\"é\",\"z\":{\"a\":2,\"b\":1}}]" + kJsonEnd);
  w.message({{"role", "system"}}, "plain");
  w.message({{"role", "user"}}, "u");
  w.internal("tool-declare", kDynamicDeclare + "{\"a\":0,\"b\":1}" + kJsonEnd);
  EXPECT_SEGMENTS(r, w);
}

// COMPACT_JSON: keys sorted by code point at every depth, arrays in order, non-ASCII raw,
// \" \\ \n \t \b \f escaped, other C0 as lowercase \u00xx, DEL and U+2028 raw, Python float repr.
TEST(ChatSpecTools, CompactJsonOfTools) {
  const auto r = render_request(
      "[]", kPlain,
      R"([{"name": "é\"\\\n\t\b\f\u0001\u001f\u007f\u2028😀", "b": [{"y": 1.0, "x": 1e16}, 2],
                             "a": 100000000000000000000, "Z": -1e-5, "\u00e9": null, "\uffff": 0, "\ud83d\ude00": 0}])");
  Want w;
  w.internal("tool-declare",
             kStaticDeclare +
                 "[{\"Z\":-1e-05,\"a\":100000000000000000000,\"b\":[{\"x\":1e+16,\"y\":1.0},2],"
                 "\"name\":\"é\\\"\\\\\\n\\t\\b\\f\\u0001\\u001f\x7f\u2028😀\","
                 "\"é\":null,\"\uffff\":0,\"😀\":0}]" +
                 kJsonEnd);
  EXPECT_SEGMENTS(r, w);
}

// =================================================================================================
// Internal system messages: order and options

// Everything at once: declaration, effort, conversation, tool choice, response format, prompt.
TEST(ChatSpecInternal, EmissionOrder) {
  const auto r = render_request(
      R"([{"role": "user", "content": "q"}])",
      R"({"thinking_effort": "low", "tool_choice": "none", "response_format": {"type": "json_object"}})",
      R"([{"t": 1}])");
  Want w;
  w.internal("tool-declare", kStaticDeclare + "[{\"t\":1}]" + kJsonEnd);
  w.internal("thinking-effort", effort_body("low"));
  w.message({{"role", "user"}}, "q");
  w.internal("tool-choice", kChoiceNone);
  w.internal("response-format", kFormatObject);
  w.open("message", {{"role", "assistant"}}).open("think");
  EXPECT_SEGMENTS(r, w);
}

TEST(ChatSpecInternal, ToolChoiceOnlyRequiredAndNone) {
  for (const std::string other :
       {R"("auto")", R"("REQUIRED")", "null", R"({"type": "function", "function": {"name": "f"}})",
        R"(["none"])"}) {
    SCOPED_TRACE(other);
    EXPECT_SEGMENTS(
        render_request(
            "[]",
            R"({"thinking": false, "add_generation_prompt": false, "tool_choice": )" + other + "}"),
        Want());
  }
  Want w;
  w.internal("tool-choice", kChoiceRequired);
  EXPECT_SEGMENTS(
      render_request(
          "[]",
          R"({"thinking": false, "add_generation_prompt": false, "tool_choice": "required"})"),
      w);
}

std::string with_format(const std::string& extra) {
  return R"({"thinking": false, "add_generation_prompt": false, )" + extra + "}";
}

TEST(ChatSpecInternal, ResponseFormatStringsAndDicts) {
  Want object;
  object.internal("response-format", kFormatObject);
  EXPECT_SEGMENTS(render_request("[]", with_format(R"("response_format": "json_object")")), object);
  // A bare "json_schema" string has no schema to extract: json.dumps(None) = "null".
  Want null_schema;
  null_schema.internal("response-format", format_schema("null"));
  EXPECT_SEGMENTS(render_request("[]", with_format(R"("response_format": "json_schema")")),
                  null_schema);
  // A dict without `type` is compared as a whole and matches nothing; other types nothing.
  EXPECT_SEGMENTS(
      render_request("[]", with_format(R"("response_format": {"json_schema": {"schema": {}}})")),
      Want());
  EXPECT_SEGMENTS(render_request("[]", with_format(R"("response_format": {"type": "text"})")),
                  Want());
  EXPECT_SEGMENTS(
      render_request("[]", with_format(R"("response_format": {"type": "JSON_OBJECT"})")), Want());
  // response_schema is not used for json_object.
  EXPECT_SEGMENTS(
      render_request(
          "[]", with_format(
                    R"("response_format": {"type": "json_object"}, "response_schema": {"a": 1})")),
      object);
}

TEST(ChatSpecInternal, ResponseSchemaExtraction) {
  auto schema_of = [](const std::string& json_schema) {
    return render_request(
        "[]", with_format(R"("response_format": {"type": "json_schema", "json_schema": )" +
                          json_schema + "}"));
  };
  auto want = [](const std::string& compact) {
    Want w;
    w.internal("response-format", format_schema(compact));
    return w;
  };
  // `schema` first, else `json_schema`, else the object itself; deep-sorted.
  EXPECT_SEGMENTS(
      schema_of(R"({"json_schema": {"q": 1}, "schema": {"b": [{"d": 1, "c": 2}], "a": 1}})"),
      want("{\"a\":1,\"b\":[{\"c\":2,\"d\":1}]}"));
  EXPECT_SEGMENTS(schema_of(R"({"name": "n", "json_schema": {"z": 0, "y": 1}})"),
                  want("{\"y\":1,\"z\":0}"));
  EXPECT_SEGMENTS(schema_of(R"({"strict": true, "name": "n"})"),
                  want("{\"name\":\"n\",\"strict\":true}"));
  // dict.get("schema", ...) returns a present None: the schema is null.
  EXPECT_SEGMENTS(schema_of(R"({"schema": null, "json_schema": {"a": 1}})"), want("null"));
  // A non-dict json_schema is the schema itself.
  EXPECT_SEGMENTS(schema_of(R"("str")"), want("\"str\""));
  EXPECT_SEGMENTS(schema_of(R"([{"b": 1, "a": 2}])"), want("[{\"a\":2,\"b\":1}]"));
  // No json_schema at all: null.
  EXPECT_SEGMENTS(
      render_request("[]", with_format(R"("response_format": {"type": "json_schema"})")),
      want("null"));
  // An explicit response_schema wins (deep-sorted).
  EXPECT_SEGMENTS(
      render_request(
          "[]",
          with_format(
              R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"a": 1}}},
                                              "response_schema": {"z": {"b": 1, "a": 2}})")),
      want("{\"z\":{\"a\":2,\"b\":1}}"));
}

// `if "response_schema" not in kwargs:` — extraction happens only when the key is absent. Every
// option key is passed as a keyword (fixtures README), so an explicit null stays null and the
// schema written is json.dumps(None).
TEST(ChatSpecInternal, ExplicitNullResponseSchemaIsNotReplacedByExtraction) {
  Want w;
  w.internal("response-format", format_schema("null"));
  EXPECT_SEGMENTS(
      render_request(
          "[]",
          with_format(
              R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"a": 1}}},
                                              "response_schema": null)")),
      w);
}

// apply_chat_template: thinking_effort defaults to "max" only when the key is absent; with
// thinking off the effort is ignored; the effort message follows the tool declaration.
TEST(ChatSpecInternal, ApplyChatTemplateEffortDefault) {
  Want w;
  w.internal("tool-declare", kStaticDeclare + "[1]" + kJsonEnd);
  w.internal("thinking-effort", effort_body("max"));
  EXPECT_SEGMENTS(
      render_request("[]", R"({"entry": "apply_chat_template", "add_generation_prompt": false})",
                     "[1]"),
      w);
  EXPECT_SEGMENTS(
      render_request(
          "[]",
          R"({"entry": "apply_chat_template", "add_generation_prompt": false, "thinking_effort": null})"),
      Want());
  Want off;
  off.open("message", {{"role", "assistant"}}).open("response");
  EXPECT_SEGMENTS(render_request("[]", R"({"entry": "apply_chat_template", "thinking": false})"),
                  off);
  EXPECT_FALSE(
      render_request("[]", R"({"entry": "apply_chat_template", "thinking_effort": "medium"})")
          .ok());
}

// =================================================================================================
// The message list itself

// `for message in messages` skips anything that is not a dict; `messages` itself is only
// iterated, so a dict (its keys) or a string (its characters) renders no message at all.
TEST(ChatSpecMessages, NonListMessagesAreIteratedAndSkipped) {
  for (const std::string messages : {R"({"role": "user", "content": "x"})", R"("abc")", "{}"}) {
    SCOPED_TRACE(messages);
    Want w;
    w.open("message", {{"role", "assistant"}}).open("response");
    EXPECT_SEGMENTS(render_request(messages, R"({"thinking": false})"), w);
  }
  // None and numbers are not iterable.
  EXPECT_FALSE(render_request("null", kPlain).ok());
  EXPECT_FALSE(render_request("5", kPlain).ok());
}

// normalize_conversation treats a list whose FIRST element is a list as a batch and normalises
// every element as a list of messages: a later dict becomes the list of its keys (then skipped
// as a non-dict), a later None/number raises (not iterable), and inner messages are normalised
// (so bad arguments inside raise).
TEST(ChatSpecMessages, FirstElementListTriggersBatchNormalisation) {
  EXPECT_SEGMENTS(render_request(R"([[], {"role": "user", "content": "hi"}])", kPlain), Want());
  EXPECT_SEGMENTS(render_request(R"([[{"role": "user", "content": "inner"}], "str"])", kPlain),
                  Want());
  EXPECT_FALSE(render_request(R"([[], 5])", kPlain).ok());
  EXPECT_FALSE(render_request(R"([[], null])", kPlain).ok());
  EXPECT_FALSE(
      render_request(
          R"([[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]])",
          kPlain)
          .ok());
}

TEST(ChatSpecMessages, UnknownRolesAndNonDictsAreSkippedButARoleIsRequired) {
  Want w;
  w.message({{"role", "user"}}, "kept");
  EXPECT_SEGMENTS(
      render_request(
          R"([{"role": "developer", "content": "d"}, 1, null, "s", true, {"role": "User", "content": "u"},
                            {"role": ["user"]}, {"role": "user", "content": "kept"}])",
          kPlain),
      w);
  EXPECT_FALSE(render_request(R"([{"content": "no role"}])", kPlain).ok());
}

}  // namespace
