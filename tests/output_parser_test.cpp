// tests/output_parser_test.cpp — the streaming output parser on the real K3 vocabulary: model
// outputs are written as XTML text and encoded with specials allowed (so `<|open|>` and friends
// become the control ids), then fed id by id. Covers the channels, tool calls of every argument
// type, json blocks, escaped attributes, UTF-8 split across tokens, truncation, malformed
// structure, one-by-one versus all-at-once, and random id soup.
#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"
#include "text/utf8.h"
#include "text_fixtures.h"

namespace k3::text {
namespace {

using k3::testing::release_tokenizer;

using Kind = OutputEvent::Kind;

int32_t special(std::string_view name) {
  return release_tokenizer().special_id(name).value();
}

std::vector<int32_t> xtml(std::string_view text) {
  return release_tokenizer().encode(text, /*allow_special=*/true);
}

// What one-by-one feeding produced, with every text delta checked to be non-empty, valid UTF-8.
struct Streamed {
  std::string reasoning, content, raw;
  std::vector<ToolCallOut> calls;
  std::vector<OutputEvent> events;
  int ends = 0;
  bool saw_end = false;
};

Streamed stream(std::span<const int32_t> ids, bool starts_in_think) {
  OutputParser parser(release_tokenizer(), starts_in_think);
  Streamed out;
  for (int32_t id : ids) parser.push(id, out.events);
  parser.finish(out.events);
  for (const OutputEvent& event : out.events) {
    switch (event.kind) {
      case Kind::reasoning:
      case Kind::content:
        EXPECT_FALSE(event.text.empty());
        EXPECT_TRUE(is_valid_utf8(event.text));
        (event.kind == Kind::reasoning ? out.reasoning : out.content) += event.text;
        break;
      case Kind::tool_call:
        out.calls.push_back(event.call);
        break;
      case Kind::end_of_message:
        ++out.ends;
        break;
    }
  }
  out.raw = parser.raw_text();
  out.saw_end = parser.saw_end_of_message();
  return out;
}

Streamed stream_text(std::string_view text, bool starts_in_think) {
  return stream(xtml(text), starts_in_think);
}

const std::string kEnd = "<|close|>message<|sep|><|end_of_msg|>";

// ---- channels ----------------------------------------------------------------------------

TEST(OutputParser, ReasoningThenResponse) {
  const auto ids = xtml(
      "Let me think about it.<|close|>think<|sep|><|open|>response<|sep|>"
      "The answer is 4.<|close|>response<|sep|>" +
      kEnd);
  // The encoding really produced the control ids (the test would be vacuous otherwise).
  EXPECT_EQ(std::count(ids.begin(), ids.end(), special("<|open|>")), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), special("<|close|>")), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), special("<|sep|>")), 4);
  EXPECT_EQ(ids.back(), special("<|end_of_msg|>"));

  const Streamed out = stream(ids, /*starts_in_think=*/true);
  EXPECT_EQ(out.reasoning, "Let me think about it.");
  EXPECT_EQ(out.content, "The answer is 4.");
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.ends, 1);
  EXPECT_TRUE(out.saw_end);
  ASSERT_FALSE(out.events.empty());
  EXPECT_EQ(out.events.back().kind, Kind::end_of_message);
  EXPECT_EQ(out.raw, release_tokenizer().decode(ids));
  // Reasoning comes strictly before content.
  bool seen_content = false;
  for (const OutputEvent& event : out.events) {
    if (event.kind == Kind::content) seen_content = true;
    if (event.kind == Kind::reasoning) {
      EXPECT_FALSE(seen_content);
    }
  }
}

TEST(OutputParser, ThinkingOffStartsInResponse) {
  const std::string text = "Hi there!<|close|>response<|sep|>" + kEnd;
  const Streamed off = stream_text(text, /*starts_in_think=*/false);
  EXPECT_EQ(off.content, "Hi there!");
  EXPECT_EQ(off.reasoning, "");
  EXPECT_TRUE(off.saw_end);
  // The same ids read as if thinking were on: the text is reasoning and the close of a
  // response that was never opened is written out, not dropped.
  const Streamed on = stream_text(text, /*starts_in_think=*/true);
  EXPECT_EQ(on.reasoning, "Hi there!<|close|>response<|sep|>");
  EXPECT_EQ(on.content, "");
}

TEST(OutputParser, TagSpelledWithUnusualTokens) {
  // `think` and `response` written as two tokens each instead of their single ids.
  std::vector<int32_t> ids = release_tokenizer().encode("Hmm", false);
  const auto th = release_tokenizer().encode("th", false),
             ink = release_tokenizer().encode("ink", false);
  const auto res = release_tokenizer().encode("res", false),
             ponse = release_tokenizer().encode("ponse", false);
  ASSERT_NE(release_tokenizer().encode("think", false).size(), th.size() + ink.size());
  ids.push_back(special("<|close|>"));
  ids.insert(ids.end(), th.begin(), th.end());
  ids.insert(ids.end(), ink.begin(), ink.end());
  ids.push_back(special("<|sep|>"));
  ids.push_back(special("<|open|>"));
  ids.insert(ids.end(), res.begin(), res.end());
  ids.insert(ids.end(), ponse.begin(), ponse.end());
  ids.push_back(special("<|sep|>"));
  const auto ok = release_tokenizer().encode("ok", false);
  ids.insert(ids.end(), ok.begin(), ok.end());
  const Streamed out = stream(ids, true);
  EXPECT_EQ(out.reasoning, "Hmm");
  EXPECT_EQ(out.content, "ok");
}

// ---- tool calls --------------------------------------------------------------------------

// The assistant turn of docs/chat_format.md §6.8 Example F, ids exactly as the renderer built them
// (generated after `<|open|>think<|sep|>`).
TEST(OutputParser, ExampleFToolCall) {
  const std::vector<int32_t> ids = {
      4612,   276,    4453,   13,     163588, 39964,  163589, 163587, 12092,  163589,
      163588, 12092,  163589, 163587, 25385,  163589, 163587, 10257,  4453,   878,
      618,    21055,  2800,   1,      4002,   878,    16,     1,      163589, 163587,
      47185,  2355,   878,    37666,  1,      1798,   878,    2033,   1,      163589,
      113476, 163588, 47185,  163589, 163587, 47185,  2355,   878,    21030,  1,
      1798,   878,    10006,  1,      163589, 17,     163588, 47185,  163589, 163588,
      10257,  163589, 163588, 25385,  163589, 163588, 2778,   163589, 163586};
  const Streamed out = stream(ids, true);
  EXPECT_EQ(out.reasoning, "Call the tool.");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments_json, R"({"city":"Paris","days":2})");
  EXPECT_EQ(out.calls[0].index, 0);
  EXPECT_EQ(out.calls[0].declared_index, 1);
  EXPECT_TRUE(out.calls[0].complete);
  EXPECT_EQ(out.ends, 1);
  EXPECT_EQ(out.events.back().kind, Kind::end_of_message);

  // The same turn written as one string (different token boundaries) parses the same.
  const Streamed joined = stream_text(
      "Call the tool.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|close|>tools<|sep|>" +
          kEnd,
      true);
  ASSERT_EQ(joined.calls.size(), 1u);
  EXPECT_EQ(joined.calls[0].arguments_json, out.calls[0].arguments_json);
}

std::string call_text(std::string_view name, int index, std::string_view body) {
  return "<|open|>call tool=\"" + std::string(name) + "\" index=\"" + std::to_string(index) +
         "\"<|sep|>" + std::string(body) + "<|close|>call<|sep|>";
}

std::string argument_text(std::string_view key, std::string_view type, std::string_view value) {
  return "<|open|>argument key=\"" + std::string(key) + "\" type=\"" + std::string(type) +
         "\"<|sep|>" + std::string(value) + "<|close|>argument<|sep|>";
}

std::string tools_turn(std::string_view calls) {
  return "<|close|>response<|sep|><|open|>tools<|sep|>" + std::string(calls) +
         "<|close|>tools<|sep|>" + kEnd;
}

TEST(OutputParser, ArgumentsOfEveryType) {
  const std::string body =
      argument_text("s", "string", "say \"hi\"\n\tback\\slash \x01 €") +
      argument_text("n", "number", "1.5") + argument_text("e", "number", "-3e2") +
      argument_text("b", "boolean", "true") + argument_text("z", "null", "null") +
      argument_text("o", "object", R"({"k": "v", "n": [1, 2]})") +
      argument_text("a", "array", R"([1, "two", false])") +
      argument_text("big", "number", "123456789012345678901234567890");
  const Streamed out = stream_text(tools_turn(call_text("f", 1, body)), false);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments_json,
            R"({"s":"say \"hi\"\n\tback\\slash \u0001 €","n":1.5,"e":-3e2,"b":true,"z":null,)"
            R"("o":{"k": "v", "n": [1, 2]},"a":[1, "two", false],)"
            R"("big":123456789012345678901234567890})");
  const auto parsed = nlohmann::json::parse(out.calls[0].arguments_json);
  EXPECT_EQ(parsed["s"], "say \"hi\"\n\tback\\slash \x01 €");
  EXPECT_EQ(parsed["o"]["n"][1], 2);
  EXPECT_EQ(parsed["a"][1], "two");
}

TEST(OutputParser, ArgumentValuesThatAreNotTheirType) {
  const std::string body =
      argument_text("n", "number", "about 3") + argument_text("b", "boolean", "yes") +
      argument_text("o", "object", R"({"a": )") + argument_text("z", "null", "") +
      argument_text("nan", "number", "NaN") + argument_text("w", "number", " 5 \n") +
      argument_text("u", "integer", "7") +
      "<|open|>argument key=\"untyped\"<|sep|>5<|close|>argument<|sep|>" +
      argument_text("d", "number", "1") + argument_text("d", "number", "2");
  const Streamed out = stream_text(tools_turn(call_text("f", 1, body)), false);
  ASSERT_EQ(out.calls.size(), 1u);
  // Invalid JSON is kept as a string; whitespace around valid JSON is trimmed; an unknown type
  // still takes valid JSON; no type means a string; a repeated key keeps its first place and
  // takes the last value.
  EXPECT_EQ(out.calls[0].arguments_json,
            R"({"n":"about 3","b":"yes","o":"{\"a\": ","z":"","nan":"NaN","w":5,"u":7,)"
            R"("untyped":"5","d":2})");
  EXPECT_TRUE(nlohmann::json::accept(out.calls[0].arguments_json));
}

TEST(OutputParser, TwoCallsEachEmittedWhenItCloses) {
  const std::string first = call_text("get_weather", 1, argument_text("city", "string", "Paris"));
  const std::string second = call_text("get_time", 2, argument_text("tz", "string", "UTC"));
  const std::string head =
      "Plan.<|close|>think<|sep|><|open|>response<|sep|>Checking."
      "<|close|>response<|sep|><|open|>tools<|sep|>" +
      first;
  const std::string tail = second + "<|close|>tools<|sep|>" + kEnd;

  OutputParser parser(release_tokenizer(), true);
  std::vector<OutputEvent> events;
  for (int32_t id : xtml(head)) parser.push(id, events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, Kind::tool_call);  // the first call, as soon as it closed
  EXPECT_EQ(events.back().call.name, "get_weather");
  const size_t after_first = events.size();
  for (int32_t id : xtml(tail)) parser.push(id, events);
  parser.finish(events);

  std::vector<ToolCallOut> calls;
  for (const OutputEvent& event : events)
    if (event.kind == Kind::tool_call) calls.push_back(event.call);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].arguments_json, R"({"city":"Paris"})");
  EXPECT_EQ(calls[1].name, "get_time");
  EXPECT_EQ(calls[1].arguments_json, R"({"tz":"UTC"})");
  EXPECT_EQ(calls[0].index, 0);
  EXPECT_EQ(calls[1].index, 1);
  EXPECT_EQ(calls[0].declared_index, 1);
  EXPECT_EQ(calls[1].declared_index, 2);
  EXPECT_TRUE(calls[0].complete && calls[1].complete);
  EXPECT_EQ(events[after_first].kind, Kind::tool_call);
  EXPECT_EQ(events.back().kind, Kind::end_of_message);
}

TEST(OutputParser, JsonBlockIsTheArgumentsStringVerbatim) {
  const std::string bad = "<|open|>json type=\"object\"<|sep|>not json {<|close|>json<|sep|>";
  const std::string good = "<|open|>json type=\"object\"<|sep|>{\"a\": 1}<|close|>json<|sep|>";
  const Streamed out = stream_text(
      tools_turn(call_text("f", 1, bad) + call_text("g", 2, good) + call_text("h", 3, "")), false);
  ASSERT_EQ(out.calls.size(), 3u);
  EXPECT_EQ(out.calls[0].arguments_json, "not json {");
  EXPECT_EQ(out.calls[1].arguments_json, "{\"a\": 1}");
  EXPECT_EQ(out.calls[2].arguments_json, "{}");  // a call without arguments
  EXPECT_EQ(out.content, "");
}

TEST(OutputParser, EscapedAttributeValues) {
  const std::string body =
      argument_text("x&amp;quot;y", "string", "v") + argument_text("&lt;k&gt;", "string", "w");
  const Streamed out = stream_text(tools_turn(call_text("a&quot;b&amp;c", 1, body)), false);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "a\"b&c");
  // One left-to-right pass: `&amp;quot;` is `&quot;`, not `"`; other entities stay as written.
  EXPECT_EQ(out.calls[0].arguments_json, R"({"x&quot;y":"v","&lt;k&gt;":"w"})");
}

// ---- UTF-8 across tokens -----------------------------------------------------------------

TEST(OutputParser, EmojiSplitAcrossTokensStreamsWholeCharacters) {
  // ` 👋🏽` = bytes 20 F0 9F 91 | 8B | F0 9F 8F | BD (docs/tokenizer.md §5): both code points
  // straddle tokens.
  const std::vector<int32_t> wave = {130732, 233, 92949, 121};
  ASSERT_EQ(release_tokenizer().encode(" 👋🏽", false), wave);
  for (bool think : {false, true}) {
    OutputParser parser(release_tokenizer(), think);
    std::vector<std::string> deltas;
    std::string joined;
    for (int32_t id : wave) {
      std::vector<OutputEvent> events;
      parser.push(id, events);
      std::string delta;
      for (const OutputEvent& event : events) {
        EXPECT_EQ(event.kind, think ? Kind::reasoning : Kind::content);
        EXPECT_TRUE(is_valid_utf8(event.text));
        delta += event.text;
      }
      deltas.push_back(delta);
      joined += delta;
    }
    EXPECT_EQ(deltas, (std::vector<std::string>{" ", "👋", "", "🏽"}));
    EXPECT_EQ(joined, " 👋🏽");
  }
}

TEST(OutputParser, SpecialFlushesAnIncompleteCharacter) {
  OutputParser parser(release_tokenizer(), false);
  std::vector<OutputEvent> events;
  parser.push(130732, events);  // ` ` + the first 3 bytes of 👋
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, " ");
  events.clear();
  parser.push(special("<|close|>"), events);  // can never complete: U+FFFD at once
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, Kind::content);
  EXPECT_EQ(events[0].text, "\xEF\xBF\xBD");
  for (int32_t id : xtml("response<|sep|>")) parser.push(id, events);
  parser.finish(events);
  const std::vector<int32_t> all = {130732, special("<|close|>"), 12092, special("<|sep|>")};
  EXPECT_EQ(parser.raw_text(), release_tokenizer().decode(all));
}

// ---- truncation --------------------------------------------------------------------------

TEST(OutputParser, TruncatedInsideAHeader) {
  OutputParser parser(release_tokenizer(), true);
  std::vector<OutputEvent> events;
  for (int32_t id : xtml("Thinking<|close|>thi")) parser.push(id, events);
  std::string before;
  for (const OutputEvent& event : events) before += event.text;
  EXPECT_EQ(before, "Thinking");  // the header is held until it ends
  parser.finish(events);
  const ParsedOutput whole = parse_output(release_tokenizer(), xtml("Thinking<|close|>thi"), true);
  EXPECT_EQ(whole.reasoning, "Thinking<|close|>thi");  // written out, not lost
  EXPECT_FALSE(whole.saw_end_of_message);

  const Streamed call_header =
      stream_text("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_wea", false);
  EXPECT_TRUE(call_header.calls.empty());
  EXPECT_EQ(call_header.content, "<|open|>call tool=\"get_wea");
  EXPECT_EQ(call_header.ends, 0);
}

TEST(OutputParser, TruncatedInsideAnArgument) {
  const std::string head =
      "<|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"f\" index=\"1\"<|sep|>";
  {
    OutputParser parser(release_tokenizer(), false);
    std::vector<OutputEvent> events;
    parser.push(xtml(head + "<|open|>argument key=\"city\" type=\"string\"<|sep|>Par"), events);
    for (const OutputEvent& event : events) EXPECT_NE(event.kind, Kind::tool_call);
    parser.finish(events);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, Kind::tool_call);
    EXPECT_FALSE(events[0].call.complete);
    EXPECT_EQ(events[0].call.name, "f");
    EXPECT_EQ(events[0].call.arguments_json, R"({"city":"Par"})");
  }
  const ParsedOutput number =
      parse_output(release_tokenizer(),
                   xtml(head + "<|open|>argument key=\"n\" type=\"number\"<|sep|>12"), false);
  ASSERT_EQ(number.tool_calls.size(), 1u);
  EXPECT_EQ(number.tool_calls[0].arguments_json, R"({"n":12})");
  const ParsedOutput object = parse_output(
      release_tokenizer(),
      xtml(head + "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"a\": [1,"), false);
  ASSERT_EQ(object.tool_calls.size(), 1u);
  EXPECT_EQ(object.tool_calls[0].arguments_json, R"({"o":"{\"a\": [1,"})");
}

TEST(OutputParser, TruncatedInsideACall) {
  const std::string head =
      "<|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"f\" index=\"1\"<|sep|>" +
      argument_text("city", "string", "Paris");
  const ParsedOutput open = parse_output(release_tokenizer(), xtml(head), false);
  ASSERT_EQ(open.tool_calls.size(), 1u);
  EXPECT_FALSE(open.tool_calls[0].complete);
  EXPECT_EQ(open.tool_calls[0].arguments_json, R"({"city":"Paris"})");
  // Closed call, truncated before `<|close|>tools`: emitted once, complete.
  const ParsedOutput closed =
      parse_output(release_tokenizer(), xtml(head + "<|close|>call<|sep|>"), false);
  ASSERT_EQ(closed.tool_calls.size(), 1u);
  EXPECT_TRUE(closed.tool_calls[0].complete);
}

TEST(OutputParser, FinishIsFinal) {
  OutputParser parser(release_tokenizer(), false);
  std::vector<OutputEvent> events;
  parser.push(xtml("abc"), events);
  parser.finish(events);
  const size_t count = events.size();
  const std::string raw = parser.raw_text();
  parser.push(xtml("more"), events);
  parser.finish(events);
  EXPECT_EQ(events.size(), count);
  EXPECT_EQ(parser.raw_text(), raw);
}

// ---- malformed structure -----------------------------------------------------------------

TEST(OutputParser, UnknownTagAndStraySepAreText) {
  EXPECT_EQ(stream_text("a<|open|>b<|sep|>bold<|close|>b<|sep|>c", false).content,
            "a<|open|>b<|sep|>bold<|close|>b<|sep|>c");
  EXPECT_EQ(stream_text("a<|sep|>b", false).content, "a<|sep|>b");
  EXPECT_EQ(stream_text("a<|sep|>b", true).reasoning, "a<|sep|>b");
  // A known name with a malformed attribute list is not a tag either.
  const Streamed bad = stream_text(
      "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=get<|sep|>x", false);
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<|open|>call tool=get<|sep|>x");
  // A non-structural special is text, in a body and inside a header.
  EXPECT_EQ(stream_text("a[EOS]b<|reserved_token_163592|>", false).content,
            "a[EOS]b<|reserved_token_163592|>");
  EXPECT_EQ(stream_text("x<|open|>resp[EOS]onse<|sep|>y", false).content,
            "x<|open|>resp[EOS]onse<|sep|>y");
}

TEST(OutputParser, HeaderThatNeverEndsBecomesText) {
  const std::string filler(3 * kMaxHeaderBytes, 'x');
  OutputParser parser(release_tokenizer(), false);
  std::vector<OutputEvent> events;
  parser.push(xtml("<|open|>" + filler), events);
  std::string streamed;
  for (const OutputEvent& event : events) streamed += event.text;
  // Past the cap the header is text and streams without waiting for a `<|sep|>`.
  EXPECT_GT(streamed.size(), kMaxHeaderBytes);
  EXPECT_EQ(streamed.rfind("<|open|>xxx", 0), 0u);
  parser.push(xtml("<|sep|>tail"), events);
  parser.finish(events);
  std::string content;
  for (const OutputEvent& event : events) content += event.text;
  EXPECT_EQ(content, "<|open|>" + filler + "<|sep|>tail");
}

TEST(OutputParser, TextOutsideAnyElementGoesToContent) {
  const Streamed out = stream_text("ok<|close|>response<|sep|>\nstray<|open|>tools<|sep|>junk" +
                                       call_text("f", 1, "inner") +
                                       "<|close|>tools<|sep|>after<|close|>message<|sep|>late"
                                       "<|end_of_msg|>next",
                                   false);
  EXPECT_EQ(out.content, "ok\nstrayjunkinnerafterlatenext");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments_json, "{}");
  EXPECT_TRUE(out.calls[0].complete);
  EXPECT_EQ(out.ends, 1);
}

TEST(OutputParser, NestedOpens) {
  EXPECT_EQ(stream_text("a<|open|>response<|sep|>b", false).content, "ab");
  EXPECT_EQ(stream_text("r1<|open|>think<|sep|>r2", true).reasoning, "r1r2");
  // A call opened inside an unclosed call (with an unclosed argument) ends the first one.
  const Streamed calls = stream_text(
      "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"a\" type=\"number\"<|sep|>1" +
          call_text("g", 2, argument_text("b", "boolean", "false")) + "<|close|>tools<|sep|>" +
          kEnd,
      false);
  ASSERT_EQ(calls.calls.size(), 2u);
  EXPECT_EQ(calls.calls[0].name, "f");
  EXPECT_EQ(calls.calls[0].arguments_json, R"({"a":1})");
  EXPECT_FALSE(calls.calls[0].complete);
  EXPECT_EQ(calls.calls[1].arguments_json, R"({"b":false})");
  EXPECT_TRUE(calls.calls[1].complete);
  EXPECT_EQ(calls.content, "");
  // An argument opened inside an unclosed argument ends the first one.
  const ParsedOutput arguments =
      parse_output(release_tokenizer(),
                   xtml("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>"
                        "<|open|>argument key=\"a\" type=\"string\"<|sep|>x"
                        "<|open|>argument key=\"b\" type=\"string\"<|sep|>y<|close|>call<|sep|>"),
                   false);
  ASSERT_EQ(arguments.tool_calls.size(), 1u);
  EXPECT_EQ(arguments.tool_calls[0].arguments_json, R"({"a":"x","b":"y"})");
  EXPECT_TRUE(arguments.tool_calls[0].complete);
  EXPECT_EQ(arguments.tool_calls[0].declared_index, -1);
}

TEST(OutputParser, CloseOfATagThatIsNotOpenIsText) {
  EXPECT_EQ(stream_text("a<|close|>think<|sep|>b<|close|>argument<|sep|>c", false).content,
            "a<|close|>think<|sep|>b<|close|>argument<|sep|>c");
  EXPECT_EQ(stream_text("a<|close|>tools<|sep|>b", true).reasoning, "a<|close|>tools<|sep|>b");
}

TEST(OutputParser, ResponseWithoutClosingThink) {
  const Streamed out =
      stream_text("reason<|open|>response<|sep|>answer<|close|>response<|sep|>" + kEnd, true);
  EXPECT_EQ(out.reasoning, "reason");
  EXPECT_EQ(out.content, "answer");
  EXPECT_EQ(out.ends, 1);
}

TEST(OutputParser, ResponseAfterTools) {
  const Streamed out = stream_text(
      "first<|close|>response<|sep|><|open|>tools<|sep|>" + call_text("f", 1, "") +
          "<|close|>tools<|sep|><|open|>response<|sep|>, more<|close|>response<|sep|>" + kEnd,
      false);
  EXPECT_EQ(out.content, "first, more");
  ASSERT_EQ(out.calls.size(), 1u);
  // A response opened while a call is still open ends the call (incomplete).
  const Streamed open = stream_text(
      "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>"
      "<|open|>response<|sep|>text" +
          kEnd,
      false);
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_FALSE(open.calls[0].complete);
  EXPECT_EQ(open.content, "text");
}

TEST(OutputParser, ElementsInTheWrongPlaceAreText) {
  // A call outside tools, an argument outside a call.
  const std::string call = call_text("f", 1, "x");
  EXPECT_EQ(stream_text(call, false).content, call);
  EXPECT_TRUE(stream_text(call, false).calls.empty());
  const std::string argument = argument_text("k", "string", "v");
  const Streamed stray = stream_text("<|open|>tools<|sep|>" + argument, false);
  EXPECT_EQ(stray.content, argument);
  // A json block after arguments (or a second one) cannot be placed: its text is content.
  const std::string json = "<|open|>json type=\"object\"<|sep|>{}<|close|>json<|sep|>";
  const Streamed mixed =
      stream_text(tools_turn(call_text("f", 1, argument_text("k", "string", "v") + json)), false);
  ASSERT_EQ(mixed.calls.size(), 1u);
  EXPECT_EQ(mixed.calls[0].arguments_json, R"({"k":"v"})");
  EXPECT_EQ(mixed.content, json);
  const Streamed after_json = stream_text(
      tools_turn(call_text(
          "f", 1, "<|open|>json type=\"object\"<|sep|>raw<|close|>json<|sep|>" + argument)),
      false);
  ASSERT_EQ(after_json.calls.size(), 1u);
  EXPECT_EQ(after_json.calls[0].arguments_json, "raw");
  EXPECT_EQ(after_json.content, argument);
}

TEST(OutputParser, EndOfMessageInsideACall) {
  const Streamed out = stream_text(
      "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"a\" type=\"number\"<|sep|>7<|end_of_msg|>",
      false);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments_json, R"({"a":7})");
  EXPECT_FALSE(out.calls[0].complete);
  EXPECT_TRUE(out.saw_end);
  ASSERT_GE(out.events.size(), 2u);
  EXPECT_EQ(out.events[out.events.size() - 2].kind, Kind::tool_call);
  EXPECT_EQ(out.events.back().kind, Kind::end_of_message);
  // Inside a header: the header is text, then the message ends.
  const Streamed header = stream_text("a<|open|>respo<|end_of_msg|>", false);
  EXPECT_EQ(header.content, "a<|open|>respo");
  EXPECT_EQ(header.ends, 1);
}

// ---- one by one versus all at once, random soup -------------------------------------------

void expect_same(const Streamed& streamed, const ParsedOutput& whole) {
  EXPECT_EQ(streamed.reasoning, whole.reasoning);
  EXPECT_EQ(streamed.content, whole.content);
  EXPECT_EQ(streamed.raw, whole.raw_text);
  EXPECT_EQ(streamed.saw_end, whole.saw_end_of_message);
  ASSERT_EQ(streamed.calls.size(), whole.tool_calls.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    EXPECT_EQ(streamed.calls[i].name, whole.tool_calls[i].name);
    EXPECT_EQ(streamed.calls[i].arguments_json, whole.tool_calls[i].arguments_json);
    EXPECT_EQ(streamed.calls[i].index, whole.tool_calls[i].index);
    EXPECT_EQ(streamed.calls[i].declared_index, whole.tool_calls[i].declared_index);
    EXPECT_EQ(streamed.calls[i].complete, whole.tool_calls[i].complete);
  }
}

TEST(OutputParser, OneByOneEqualsAllAtOnce) {
  const std::string text =
      "Let me see 👋🏽 — ok.<|close|>think<|sep|><|open|>response<|sep|>Calling 🌍 now."
      "<|close|>response<|sep|><|open|>tools<|sep|>" +
      call_text("f", 1, argument_text("s", "string", "é✓") + argument_text("n", "number", "2")) +
      "<|close|>tools<|sep|>" + kEnd;
  const auto ids = xtml(text);
  const Streamed streamed = stream(ids, true);
  const ParsedOutput whole = parse_output(release_tokenizer(), ids, true);
  expect_same(streamed, whole);
  EXPECT_EQ(whole.reasoning, "Let me see 👋🏽 — ok.");
  EXPECT_EQ(whole.content, "Calling 🌍 now.");
  EXPECT_EQ(whole.raw_text, text);

  // Pushed as one span, a channel's text comes as one merged event.
  OutputParser parser(release_tokenizer(), true);
  std::vector<OutputEvent> events;
  parser.push(ids, events);
  parser.finish(events);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].kind, Kind::reasoning);
  EXPECT_EQ(events[1].kind, Kind::content);
  EXPECT_EQ(events[2].kind, Kind::tool_call);
  EXPECT_EQ(events[3].kind, Kind::end_of_message);
  EXPECT_GT(streamed.events.size(), events.size());
}

// Random but structured soup: well-formed headers, structural ids alone, tag words, emoji
// fragments, other specials and random base ids, in random order.
std::vector<int32_t> soup(uint32_t seed, size_t length, bool with_json_blocks) {
  std::vector<std::vector<int32_t>> fragments;
  for (const char* text : {"<|open|>think<|sep|>",
                           "<|close|>think<|sep|>",
                           "<|open|>response<|sep|>",
                           "<|close|>response<|sep|>",
                           "<|open|>tools<|sep|>",
                           "<|close|>tools<|sep|>",
                           "<|open|>call tool=\"f\" index=\"1\"<|sep|>",
                           "<|open|>call tool=\"a&quot;b\"<|sep|>",
                           "<|close|>call<|sep|>",
                           "<|open|>argument key=\"k\" type=\"string\"<|sep|>",
                           "<|open|>argument key=\"n\" type=\"number\"<|sep|>",
                           "<|open|>argument key=\"o\" type=\"object\"<|sep|>",
                           "<|close|>argument<|sep|>",
                           "<|close|>message<|sep|>",
                           "<|open|>message role=\"assistant\"<|sep|>",
                           "{\"a\": [1, 2]}",
                           "42",
                           "true",
                           "think",
                           "response",
                           "tools",
                           "call",
                           "argument",
                           "message",
                           " tool",
                           " key",
                           " type",
                           "=\"",
                           "\"",
                           "string",
                           "number"}) {
    fragments.push_back(xtml(text));
  }
  if (with_json_blocks) {
    fragments.push_back(xtml("<|open|>json type=\"object\"<|sep|>"));
    fragments.push_back(xtml("<|close|>json<|sep|>"));
    fragments.push_back(xtml("json"));
  }
  const std::vector<int32_t> structural = {special("<|open|>"), special("<|close|>"),
                                           special("<|sep|>"), special("<|end_of_msg|>")};
  const std::vector<int32_t> emoji = {130732, 233, 92949, 121};
  std::mt19937 rng(seed);
  const auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  std::vector<int32_t> ids;
  while (ids.size() < length) {
    const size_t what = pick(10);
    if (what < 3) {
      const auto& fragment = fragments[pick(fragments.size())];
      ids.insert(ids.end(), fragment.begin(), fragment.end());
    } else if (what < 5) {
      ids.push_back(structural[pick(structural.size())]);
    } else if (what < 6) {
      ids.push_back(emoji[pick(emoji.size())]);
    } else if (what < 7) {
      ids.push_back(release_tokenizer().base_vocab_size() + static_cast<int32_t>(pick(256)));
    } else {
      ids.push_back(
          static_cast<int32_t>(pick(static_cast<size_t>(release_tokenizer().base_vocab_size()))));
    }
  }
  if (!with_json_blocks) {  // random base ids could still spell `json`: drop that id
    const int32_t json_id = xtml("json").front();
    std::erase(ids, json_id);
  }
  return ids;
}

TEST(OutputParser, RandomIdSoupNeverBreaks) {
  size_t total_calls = 0, total_reasoning = 0, total_content = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    const bool with_json = seed % 2 == 0;
    const auto ids = soup(seed, 4000, with_json);
    for (bool think : {true, false}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (think ? " think" : " response"));
      const Streamed streamed = stream(ids, think);  // checks every delta is valid UTF-8
      EXPECT_EQ(streamed.raw, release_tokenizer().decode(ids));
      const ParsedOutput whole = parse_output(release_tokenizer(), ids, think);
      expect_same(streamed, whole);
      const auto end_ids = std::count(ids.begin(), ids.end(), special("<|end_of_msg|>"));
      EXPECT_EQ(streamed.ends, end_ids);
      for (size_t i = 0; i < streamed.calls.size(); ++i) {
        EXPECT_EQ(streamed.calls[i].index, static_cast<int>(i));
        EXPECT_TRUE(is_valid_utf8(streamed.calls[i].name));
        EXPECT_TRUE(is_valid_utf8(streamed.calls[i].arguments_json));
        if (!with_json) {  // without json blocks every arguments text is a JSON object
          const auto parsed =
              nlohmann::json::parse(streamed.calls[i].arguments_json, nullptr, false);
          EXPECT_TRUE(parsed.is_object()) << streamed.calls[i].arguments_json;
        }
      }
      total_calls += streamed.calls.size();
      total_reasoning += streamed.reasoning.size();
      total_content += streamed.content.size();
    }
  }
  // The soup exercised the interesting paths.
  EXPECT_GT(total_calls, 20u);
  EXPECT_GT(total_reasoning, 1000u);
  EXPECT_GT(total_content, 1000u);
}

}  // namespace
}  // namespace k3::text
