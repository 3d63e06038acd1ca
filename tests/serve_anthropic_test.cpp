// The Anthropic Messages translation of `coli serve` without sockets (server/anthropic.h,
// docs/serving.md §3.18): refusals name the field, a Messages conversation renders the same
// XTML prompt as the equivalent OpenAI one, the Message JSON and stop reasons, the named SSE
// event order, and the Anthropic error envelope. The routes through the table are tested in
// serve_routes_test.cpp.
#include <gtest/gtest.h>

#include "server/anthropic.h"
#include "text/chat.h"

namespace k3::server {
namespace {

ApiConfig config() {
  return ApiConfig{};
}

MessagesRequest accepted(const std::string& body, bool count_only = false) {
  auto r = parse_messages_request(body, config(), count_only);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused (" << e->code << ", " << e->param.value_or("-") << "): " << e->message
                  << "\n"
                  << body;
    return {};
  }
  return std::get<MessagesRequest>(r);
}

std::string messages_body(const std::string& extra,
                          const std::string& messages = R"([{"role":"user","content":"hi"}])") {
  return R"({"model":"kimi-k3","max_tokens":64,"messages":)" + messages +
         (extra.empty() ? "" : "," + extra) + "}";
}

// The rendered XTML text of a request (what render_chat_prompt tokenizes).
std::string rendered(const ChatRequest& r) {
  text::ChatOptions options;
  options.thinking = r.thinking;
  if (r.thinking && !r.effort.empty()) options.thinking_effort = text::PyValue::string(r.effort);
  options.tool_choice = r.tool_choice;
  auto segments = text::build_chat_segments(r.messages, r.tools, options);
  EXPECT_TRUE(segments.ok()) << segments.status().message();
  return segments.ok() ? text::join_segments(*segments) : "";
}

ChatRequest openai(const std::string& body) {
  auto r = parse_chat_request(body, config());
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(r)) << std::get<ApiError>(r).message;
  return std::holds_alternative<ChatRequest>(r) ? std::get<ChatRequest>(r) : ChatRequest{};
}

TEST(ServeAnthropic, RefusalsNameTheField) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::string user = R"([{"role":"user","content":"hi"}])";
  const std::vector<Case> cases = {
      {"{", 400, ""},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":"hi"}]})", 400, "max_tokens"},
      {R"({"max_tokens":5,"messages":[{"role":"user","content":"hi"}]})", 400, "model"},
      {R"({"model":"kimi-k3","max_tokens":5})", 400, "messages"},
      {messages_body(R"("max_tokens":0)"), 400, "max_tokens"},
      {messages_body(R"("temperature":1.5)"), 400, "temperature"},
      {messages_body(R"("top_p":0)"), 400, "top_p"},
      {messages_body(R"("top_k":-1)"), 400, "top_k"},
      {messages_body(R"("stop_sequences":"END")"), 400, "stop_sequences"},
      {messages_body(R"("stop_sequences":["ok",""])"), 400, "stop_sequences.1"},
      {messages_body(R"("stream":"yes")"), 400, "stream"},
      {messages_body(R"("system":[{"type":"image"}])"), 400, "system.0.type"},
      {messages_body("", R"([{"role":"wizard","content":"hi"}])"), 400, "messages.0.role"},
      {messages_body("", R"([{"role":"system","content":[{"type":"image"}]}])"), 400,
       "messages.0.content.0.type"},
      {messages_body("", R"([{"role":"user"}])"), 400, "messages.0.content"},
      {messages_body("", R"([{"role":"user","content":[{"type":"image","source":{}}]}])"), 400,
       "messages.0.content.0"},
      {messages_body("", R"([{"role":"user","content":[{"type":"document"}]}])"), 400,
       "messages.0.content.0"},
      {messages_body("", R"([{"role":"user","content":[{"type":"text"}]}])"), 400,
       "messages.0.content.0.text"},
      {messages_body("", R"([{"role":"user","content":[{"type":"tool_use"}]}])"), 400,
       "messages.0.content.0.type"},
      {messages_body("",
                     R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"x"}]}])"),
       400, "messages.0.content.0.tool_use_id"},
      {messages_body("", R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"}])"),
       400, "messages.1"},
      {messages_body("", R"([{"role":"assistant","content":[{"type":"tool_use","id":"t",
          "name":"f","input":"{}"}]},{"role":"user","content":"x"}])"),
       400, "messages.0.content.0.input"},
      {messages_body(R"("tools":[{"type":"web_search_20250305","name":"web_search"}])"), 400,
       "tools.0.type"},
      {messages_body(R"("tools":[{"name":"f"}])"), 400, "tools.0.input_schema"},
      {messages_body(R"("tools":[{"name":"","input_schema":{}}])"), 400, "tools.0.name"},
      {messages_body(R"("tool_choice":{"type":"any"})"), 400, "tool_choice"},
      {messages_body(R"("tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool"})"),
       400, "tool_choice.name"},
      {messages_body(
           R"("tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"g"})"),
       400, "tool_choice.name"},
      {messages_body(R"("tool_choice":{"type":"sometimes"})"), 400, "tool_choice.type"},
      {messages_body(R"("thinking":{"type":"maybe"})"), 400, "thinking.type"},
      {messages_body(R"("thinking":{"type":"enabled"})"), 400, "thinking.budget_tokens"},
      {messages_body(R"("thinking":{"type":"enabled","budget_tokens":100})"), 400,
       "thinking.budget_tokens"},
      {messages_body(R"("thinking":{"type":"enabled","budget_tokens":2048})"), 400,
       "thinking.budget_tokens"},  // not below max_tokens (64)
      {messages_body(R"("mcp_servers":[{}])"), 400, "mcp_servers"},
      {messages_body(R"("thinking":{"type":"adaptive","display":7})"), 400, "thinking.display"},
      {messages_body(R"("output_config":{"effort":"extreme"})"), 400, "output_config.effort"},
      {messages_body(R"("output_config":{"format":{"type":"json_schema"}})"), 400,
       "output_config.format"},
      {messages_body(R"("metadata":"x")"), 400, "metadata"},
  };
  for (const Case& c : cases) {
    const auto r = parse_messages_request(c.body, config());
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body << "\n" << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  // count_tokens needs no max_tokens (and no budget below it).
  accepted(R"({"model":"kimi-k3","messages":[{"role":"user","content":"hi"}],
               "thinking":{"type":"enabled","budget_tokens":4096}})",
           true);
}

// issue 28 item 5: an empty turn (no blocks, an empty text block, an empty string) and the OpenAI
// fields Messages does not have (n, logit_bias, response_format) were accepted and dropped; each
// is a 400 naming the field, in the Anthropic envelope (the route's error style).
TEST(ServeAnthropic, EmptyTurnsAndForeignFieldsAreRefused) {
  struct Case {
    std::string body;
    std::string code;
    std::string param;
  };
  const std::vector<Case> cases = {
      {messages_body("", R"([{"role":"user","content":[]}])"), "invalid_value",
       "messages.0.content"},
      {messages_body("", R"([{"role":"user","content":""}])"), "invalid_value",
       "messages.0.content"},
      {messages_body("", R"([{"role":"user","content":[{"type":"text","text":""}]}])"),
       "invalid_value", "messages.0.content.0.text"},
      {messages_body("", R"([{"role":"user","content":"a"},{"role":"assistant","content":[]},)"
                         R"({"role":"user","content":"b"}])"),
       "invalid_value", "messages.1.content"},
      {messages_body("", R"([{"role":"user","content":"a"},{"role":"assistant","content":)"
                         R"([{"type":"text","text":""}]},{"role":"user","content":"b"}])"),
       "invalid_value", "messages.1.content.0.text"},
      {messages_body(R"("n":2)"), "unsupported_value", "n"},
      {messages_body(R"("logit_bias":{"5":1})"), "unsupported_parameter", "logit_bias"},
      {messages_body(R"("response_format":{"type":"json_object"})"), "unsupported_parameter",
       "response_format"},
  };
  for (const Case& c : cases) {
    const auto r = parse_messages_request(c.body, config());
    if (!std::holds_alternative<ApiError>(r)) {
      ADD_FAILURE() << "accepted: " << c.body;
      continue;
    }
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body << "\n" << e.message;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body << "\n" << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
    const HttpResponse res = error_response(e, error_style_for("/v1/messages"));
    EXPECT_EQ(json::parse(res.body)["type"], "error") << res.body;
  }
  // Their neutral values, and a turn of tool calls only, pass.
  accepted(messages_body(R"("n":1,"logit_bias":{},"response_format":{"type":"text"})"));
  accepted(messages_body(
      "", R"([{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use",)"
          R"("id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result",)"
          R"("tool_use_id":"t1","content":"1"}]}])"));
}

// A Messages conversation with a system prompt, thinking, a tool call and its result renders the
// exact XTML the equivalent OpenAI chat request renders.
TEST(ServeAnthropic, RendersAsTheEquivalentOpenAIConversation) {
  const MessagesRequest a = accepted(R"({"model":"kimi-k3","max_tokens":2000,
    "system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
    "thinking":{"type":"enabled","budget_tokens":1024},
    "tools":[{"name":"get_weather","description":"Weather.","cache_control":{"type":"ephemeral"},
              "input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
    "messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"Use the tool.","signature":"s"},
                                     {"type":"text","text":"Checking."},
                                     {"type":"tool_use","id":"toolu_1","name":"get_weather",
                                      "input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",
                                 "content":[{"type":"text","text":"Sunny"}]},
                                {"type":"text","text":"And tomorrow?"}]}]})");
  const ChatRequest o = openai(R"({"model":"kimi-k3","reasoning_effort":"low",
    "messages":[
      {"role":"system","content":[{"type":"text","text":"Be brief."}]},
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":"Checking.","reasoning_content":"Use the tool.",
       "tool_calls":[{"id":"toolu_1","type":"function",
                      "function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
      {"role":"tool","tool_call_id":"toolu_1","name":"get_weather",
       "content":[{"type":"text","text":"Sunny"}]},
      {"role":"user","content":[{"type":"text","text":"And tomorrow?"}]}],
    "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.",
              "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]})");
  EXPECT_TRUE(a.chat.thinking);
  EXPECT_EQ(a.budget_tokens, 1024);
  EXPECT_EQ(a.chat.effort, "low");
  EXPECT_EQ(a.chat.max_tokens, 2000);
  const std::string text = rendered(a.chat);
  EXPECT_EQ(text, rendered(o));
  EXPECT_NE(text.find("Be brief."), std::string::npos);
  EXPECT_NE(text.find("Sunny"), std::string::npos);
  EXPECT_EQ(text.find("ephemeral"), std::string::npos) << "cache_control reached the prompt";
}

TEST(ServeAnthropic, SettingsMapToTheEngine) {
  const MessagesRequest a = accepted(messages_body(
      R"("temperature":0.2,"top_p":0.5,"top_k":7,"stop_sequences":["END","##"],"stream":true,
         "metadata":{"user_id":"u"},"thinking":{"type":"disabled"},"max_tokens":999999)"));
  EXPECT_DOUBLE_EQ(a.chat.temperature, 0.2);
  EXPECT_DOUBLE_EQ(a.chat.top_p, 0.5);
  EXPECT_EQ(a.chat.top_k, 7);
  EXPECT_EQ(a.chat.stop, (std::vector<std::string>{"END", "##"}));
  EXPECT_TRUE(a.chat.stream);
  EXPECT_FALSE(a.chat.thinking);
  EXPECT_EQ(a.chat.max_tokens, config().max_tokens_ceiling);  // clamped, as the OpenAI path
  // Absent thinking: the server's default; the budget picks the effort message.
  EXPECT_EQ(accepted(messages_body("")).chat.thinking, config().default_thinking);
  for (auto [budget, effort] : {std::pair{1024, "low"}, {4096, "high"}, {31999, "max"}})
    EXPECT_EQ(accepted(messages_body(R"("max_tokens":32000,"thinking":{"type":"enabled",
                                        "budget_tokens":)" +
                                     std::to_string(budget) + "}"))
                  .chat.effort,
              effort);
  // Adaptive thinking (what Claude Code sends): on, the effort from output_config.
  const MessagesRequest adaptive = accepted(messages_body(
      R"("thinking":{"type":"adaptive","display":"omitted"},"output_config":{"effort":"medium"})"));
  EXPECT_TRUE(adaptive.chat.thinking);
  EXPECT_TRUE(adaptive.omit_thinking);
  EXPECT_EQ(adaptive.chat.effort, "high");
  // A system message between the turns renders as the OpenAI system message does.
  EXPECT_EQ(rendered(accepted(messages_body("", R"([{"role":"user","content":"hi"},
              {"role":"system","content":[{"type":"text","text":"Be brief."}]}])"))
                         .chat),
            rendered(openai(R"({"model":"kimi-k3","messages":[{"role":"user","content":"hi"},
              {"role":"system","content":[{"type":"text","text":"Be brief."}]}]})")));
  // tool_choice: any → required; tool → required with only that tool declared; none → none.
  const std::string tools =
      R"("tools":[{"name":"f","input_schema":{}},{"name":"g","input_schema":{}}],)";
  const MessagesRequest any = accepted(messages_body(tools + R"("tool_choice":{"type":"any"})"));
  EXPECT_EQ(text::dumps(any.chat.tool_choice, text::DumpStyle::kCompact), "\"required\"");
  EXPECT_EQ(any.chat.tools.as_array().size(), 2u);
  const MessagesRequest one =
      accepted(messages_body(tools + R"("tool_choice":{"type":"tool","name":"g",
                                              "disable_parallel_tool_use":true})"));
  ASSERT_EQ(one.chat.tools.as_array().size(), 1u);
  EXPECT_NE(text::dumps(one.chat.tools, text::DumpStyle::kCompact).find("\"g\""),
            std::string::npos);
  const MessagesRequest none = accepted(messages_body(tools + R"("tool_choice":{"type":"none"})"));
  EXPECT_EQ(text::dumps(none.chat.tool_choice, text::DumpStyle::kCompact), "\"none\"");
  EXPECT_TRUE(accepted(messages_body(tools + R"("tool_choice":{"type":"auto"})"))
                  .chat.tool_choice.is_null());
}

GenerationStats stats(FinishReason finish, std::string stop = "") {
  GenerationStats s;
  s.finish = finish;
  s.stop_sequence = std::move(stop);
  s.prompt_tokens = 40;
  s.cached_tokens = 30;
  s.completion_tokens = 5;
  return s;
}

TEST(ServeAnthropic, MessageShape) {
  ChatResult result;
  result.reasoning = "Think.";
  result.content = "Answer.";
  text::ToolCallOut call;
  call.name = "get_weather";
  call.arguments_json = R"({"city":"Paris"})";
  result.tool_calls = {call};
  result.stats = stats(FinishReason::tool_calls);
  const json m = messages_response_json(result, "msg_0123456789abcdef", "kimi-k3");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "kimi-k3");
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "Think.");
  EXPECT_EQ(m["content"][0]["signature"], thinking_signature("Think."));
  EXPECT_EQ(m["content"][1], (json{{"type", "text"}, {"text", "Answer."}}));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["id"], "toolu_0_456789abcdef");
  EXPECT_EQ(m["content"][2]["input"], (json{{"city", "Paris"}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"], (json{{"input_tokens", 10},
                              {"cache_creation_input_tokens", 0},
                              {"cache_read_input_tokens", 30},
                              {"output_tokens", 5}}));
  EXPECT_STREQ(anthropic_stop_reason(stats(FinishReason::stop)), "end_turn");
  EXPECT_STREQ(anthropic_stop_reason(stats(FinishReason::length)), "max_tokens");
  result.stats = stats(FinishReason::stop, "END");
  const json s = messages_response_json(result, "msg_x", "kimi-k3");
  EXPECT_EQ(s["stop_reason"], "stop_sequence");
  EXPECT_EQ(s["stop_sequence"], "END");
  // thinking.display omitted: the block keeps its signature, not its text.
  const json omitted = messages_response_json(result, "msg_x", "kimi-k3", true);
  EXPECT_EQ(omitted["content"][0]["thinking"], "");
  EXPECT_EQ(omitted["content"][0]["signature"], thinking_signature("Think."));
  // Arguments that are not a JSON object are kept whole.
  call.arguments_json = "not json";
  EXPECT_EQ(tool_input_json(call), (json{{"arguments", "not json"}}));
}

ServiceEvent event(ServiceEvent::Kind kind, std::string text = "") {
  ServiceEvent e;
  e.kind = kind;
  e.text = std::move(text);
  return e;
}

// The documented event order: message_start, ping, then per block content_block_start,
// deltas, (signature_delta for thinking), content_block_stop; message_delta; message_stop.
TEST(ServeAnthropic, StreamEventOrder) {
  MessagesStream stream("msg_0123456789abcdef", "kimi-k3");
  std::vector<std::string> names;
  std::vector<json> data;
  auto take = [&](const NamedEvents& events) {
    for (const auto& [name, d] : events) {
      names.push_back(name);
      data.push_back(d);
      EXPECT_EQ(d["type"], name) << d.dump();
    }
  };
  GenerationStats accepted_stats = stats(FinishReason::length);
  take(stream.start(accepted_stats));
  using K = ServiceEvent::Kind;
  take(stream.on_event(event(K::reasoning, "a")));
  take(stream.on_event(event(K::reasoning, "b")));
  take(stream.on_event(event(K::content, "Hi")));
  ServiceEvent call = event(K::tool_call);
  call.call.name = "f";
  call.call.arguments_json = R"({"x":1})";
  take(stream.on_event(call));
  take(stream.on_event(event(K::progress)));
  ServiceEvent done = event(K::done);
  done.stats = stats(FinishReason::tool_calls);
  take(stream.on_event(done));
  const std::vector<std::string> expected = {"message_start",       "ping",
                                             "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",  "content_block_start",
                                             "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta",
                                             "content_block_stop",  "message_delta",
                                             "message_stop"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(data[0]["message"]["usage"]["input_tokens"], 10);
  EXPECT_EQ(data[0]["message"]["usage"]["output_tokens"], 0);
  EXPECT_EQ(data[0]["message"]["content"], json::array());
  EXPECT_EQ(data[2]["content_block"]["type"], "thinking");
  EXPECT_EQ(data[2]["index"], 0);
  EXPECT_EQ(data[3]["delta"], (json{{"type", "thinking_delta"}, {"thinking", "a"}}));
  EXPECT_EQ(data[5]["delta"]["type"], "signature_delta");
  EXPECT_EQ(data[5]["delta"]["signature"], thinking_signature("ab"));
  EXPECT_EQ(data[7]["content_block"], (json{{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(data[7]["index"], 1);
  EXPECT_EQ(data[8]["delta"], (json{{"type", "text_delta"}, {"text", "Hi"}}));
  EXPECT_EQ(data[10]["content_block"]["type"], "tool_use");
  EXPECT_EQ(data[10]["content_block"]["name"], "f");
  EXPECT_EQ(data[10]["content_block"]["input"], json::object());
  EXPECT_EQ(data[10]["index"], 2);
  EXPECT_EQ(data[11]["delta"], (json{{"type", "input_json_delta"}, {"partial_json", "{\"x\":1}"}}));
  EXPECT_EQ(data[13]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(data[13]["usage"]["output_tokens"], 5);
}

TEST(ServeAnthropic, StreamOmitsThinkingText) {
  MessagesStream stream("msg_x", "kimi-k3", true);
  std::vector<std::string> deltas;
  for (const ServiceEvent& e :
       {event(ServiceEvent::Kind::reasoning, "a"), event(ServiceEvent::Kind::content, "b")})
    for (const auto& [name, d] : stream.on_event(e))
      if (name == "content_block_delta") deltas.push_back(d["delta"]["type"]);
  EXPECT_EQ(deltas, (std::vector<std::string>{"signature_delta", "text_delta"}));
}

TEST(ServeAnthropic, ErrorEnvelope) {
  EXPECT_EQ(error_style_for("/v1/messages"), ErrorStyle::anthropic);
  EXPECT_EQ(error_style_for("/v1/messages/count_tokens"), ErrorStyle::anthropic);
  EXPECT_EQ(error_style_for("/v1/messagesX"), ErrorStyle::openai);
  EXPECT_EQ(error_style_for("/v1/chat/completions"), ErrorStyle::openai);
  for (auto [status, type] : {std::pair{400, "invalid_request_error"},
                              {401, "authentication_error"},
                              {403, "permission_error"},
                              {404, "not_found_error"},
                              {413, "request_too_large"},
                              {415, "invalid_request_error"},
                              {429, "rate_limit_error"},
                              {500, "api_error"},
                              {503, "overloaded_error"}}) {
    const ApiError e = api_error(status, "x", "", "the message");
    EXPECT_EQ(anthropic_error_body(e),
              (json{{"type", "error"}, {"error", {{"type", type}, {"message", "the message"}}}}))
        << status;
    const HttpResponse res = error_response(e, ErrorStyle::anthropic);
    EXPECT_EQ(res.status, status);
    EXPECT_EQ(json::parse(res.body)["error"]["type"], type);
  }
  // Our code and parameter travel in details (the SDK's errorCode).
  EXPECT_EQ(anthropic_error_body(invalid_value("max_tokens", "bad"))["error"]["details"],
            (json{{"error_code", "invalid_value"}, {"param", "max_tokens"}}));
}

}  // namespace
}  // namespace k3::server
