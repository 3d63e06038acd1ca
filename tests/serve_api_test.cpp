// Request-level tests of `coli serve` without sockets: request validation, response and chunk
// shapes, the security checks and the /metrics text (docs/serving.md). The route table and its
// handlers are tested in serve_routes_test.cpp.
#include <gtest/gtest.h>

#include <functional>

#include "server/anthropic.h"
#include "server/api.h"
#include "server/http_server.h"
#include "server/responses.h"
#include "server/routes.h"
#include "server/security.h"

namespace k3::server {
namespace {

ApiConfig config() {
  return ApiConfig{};
}

ChatRequest accepted(const std::string& body) {
  auto r = parse_chat_request(body, config());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused (" << e->code << ", " << e->param.value_or("-") << "): " << e->message
                  << "\n"
                  << body;
    return {};
  }
  return std::get<ChatRequest>(r);
}

std::string with(const std::string& extra) {
  return R"({"model":"kimi-k3","messages":[{"role":"user","content":"hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

struct Case {
  std::string body;
  int status;
  std::string code;
  std::string param;  // "" = null
};

// Each body is refused with its status, code and parameter, in OpenAI's error envelope.
template <class Parse>
void expect_refusals(const std::vector<Case>& cases, Parse parse) {
  for (const Case& c : cases) {
    const auto r = parse(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body;
    EXPECT_FALSE(e.message.empty());
    const json body = error_body(e);
    EXPECT_TRUE(body["error"].contains("message") && body["error"].contains("type") &&
                body["error"].contains("param") && body["error"].contains("code"));
  }
}

TEST(ServeApi, RefusalsNameTheParameter) {
  const std::vector<Case> cases = {
      {"{", 400, "invalid_json", ""},
      {"[1,2]", 400, "invalid_json", ""},
      {"{\"model\":\"kimi-k3\"} trailing", 400, "invalid_json", ""},
      {"\"just a string\"", 400, "invalid_json", ""},
      {std::string(100, '[') + std::string(100, ']'), 400, "invalid_json", ""},
      {"{\"model\":\"kimi-k3\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400,
       "invalid_json", ""},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":"\ud800"}]})", 400,
       "invalid_json", ""},
      {R"({"messages":[{"role":"user","content":"hi"}]})", 400, "missing_required_parameter",
       "model"},
      {R"({"model":"kimi-k3"})", 400, "missing_required_parameter", "messages"},
      {R"({"model":"kimi-k3","messages":{}})", 400, "invalid_value", "messages"},
      {R"({"model":"kimi-k3","messages":[]})", 400, "invalid_value", "messages"},
      {R"({"model":7,"messages":[{"role":"user","content":"hi"}]})", 400, "invalid_value", "model"},
      {R"({"model":"kimi-k3","messages":[{"role":"wizard","content":"hi"}]})", 400, "invalid_value",
       "messages.0.role"},
      {R"({"model":"kimi-k3","messages":[{"content":"hi"}]})", 400, "invalid_value",
       "messages.0.role"},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":5}]})", 400, "invalid_value",
       "messages.0.content"},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":"a\u0000b"}]})", 400,
       "invalid_value", "messages.0.content"},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]})",
       400, "unsupported_content_type", "messages.0.content.1"},
      {R"({"model":"kimi-k3","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})",
       400, "unsupported_content_type", "messages.0.content.0"},
      {with(R"("temperature":"hot")"), 400, "invalid_value", "temperature"},
      {with(R"("temperature":2.5)"), 400, "invalid_value", "temperature"},
      {with(R"("top_p":0)"), 400, "invalid_value", "top_p"},
      {with(R"("top_k":-1)"), 400, "invalid_value", "top_k"},
      {with(R"("min_p":1.5)"), 400, "invalid_value", "min_p"},
      {with(R"("stream":"yes")"), 400, "invalid_value", "stream"},
      {with(R"("stream_options":{"include_usage":1})"), 400, "invalid_value",
       "stream_options.include_usage"},
      {with(R"("max_tokens":0)"), 400, "invalid_value", "max_tokens"},
      {with(R"("max_completion_tokens":2147483648)"), 400, "invalid_value",
       "max_completion_tokens"},
      {with(R"("max_tokens":1.5)"), 400, "invalid_value", "max_tokens"},
      {with(R"("seed":"abc")"), 400, "invalid_value", "seed"},
      {with(R"("stop":["ok",""])"), 400, "invalid_value", "stop.1"},
      {with(R"("stop":7)"), 400, "invalid_value", "stop"},
      {with(R"("stop":[)" + std::string("\"a\",", 0) +
            R"("1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])"),
       400, "invalid_value", "stop"},
      {with(R"("n":2)"), 400, "unsupported_value", "n"},
      {with(R"("frequency_penalty":2.5)"), 400, "invalid_value", "frequency_penalty"},
      {with(R"("presence_penalty":-2.01)"), 400, "invalid_value", "presence_penalty"},
      {with(R"("presence_penalty":"1")"), 400, "invalid_value", "presence_penalty"},
      {with(R"("repeat_penalty":0)"), 400, "invalid_value", "repeat_penalty"},
      {with(R"("repeat_penalty":-1.1)"), 400, "invalid_value", "repeat_penalty"},
      {with(R"("repeat_last_n":-2)"), 400, "invalid_value", "repeat_last_n"},
      {with(R"("repeat_last_n":1.5)"), 400, "invalid_value", "repeat_last_n"},
      {with(R"("repetition_penalty":1.2)"), 400, "unsupported_parameter", "repetition_penalty"},
      {with(R"("logit_bias":{"5":1})"), 400, "unsupported_parameter", "logit_bias"},
      {with(R"("logprobs":1)"), 400, "invalid_value", "logprobs"},
      {with(R"("logprobs":true,"top_logprobs":21)"), 400, "invalid_value", "top_logprobs"},
      {with(R"("logprobs":true,"top_logprobs":-1)"), 400, "invalid_value", "top_logprobs"},
      {with(R"("top_logprobs":3)"), 400, "invalid_value", "top_logprobs"},
      {with(R"("logprobs":false,"top_logprobs":3)"), 400, "invalid_value", "top_logprobs"},
      {with(R"("response_format":{"type":"yaml"})"), 400, "unsupported_value",
       "response_format.type"},
      {with(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"not":{}}}})"), 400,
       "unsupported_schema", "response_format.json_schema.schema"},
      {with(R"("grammar":"root ::= x")"), 400, "invalid_grammar", "grammar"},
      {with(R"("functions":[{"name":"f"}])"), 400, "unsupported_parameter", "functions"},
      {with(R"("reasoning_effort":"extreme")"), 400, "unsupported_value", "reasoning_effort"},
      {with(R"("chat_template_kwargs":{"enable_thinking":"yes"})"), 400, "invalid_value",
       "chat_template_kwargs.enable_thinking"},
      {with(R"("tools":{})"), 400, "invalid_value", "tools"},
      {with(R"("tools":[{"type":"function","function":{}}])"), 400, "invalid_value",
       "tools.0.function.name"},
      {with(R"("tool_choice":"sometimes")"), 400, "unsupported_value", "tool_choice"},
  };
  expect_refusals(cases,
                  [](const std::string& body) { return parse_chat_request(body, config()); });
}

// issue 28 item 5: a message with nothing to say, and a tool_choice that cannot be honoured, are
// 400s naming the field (they were accepted: the empty turn rendered as "", the choice ignored).
TEST(ServeApi, EmptyMessagesAndUnsatisfiableToolChoicesAreRefused) {
  const std::string tool =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  auto msgs = [](const std::string& list) {
    return R"({"model":"kimi-k3","messages":)" + list + "}";
  };
  const std::vector<Case> cases = {
      {msgs(R"([{"role":"user"}])"), 400, "invalid_value", "messages.0.content"},
      {msgs(R"([{"role":"user","content":null}])"), 400, "invalid_value", "messages.0.content"},
      {msgs(R"([{"role":"user","content":[]}])"), 400, "invalid_value", "messages.0.content"},
      {msgs(R"([{"role":"system","content":null},{"role":"user","content":"hi"}])"), 400,
       "invalid_value", "messages.0.content"},
      {msgs(
           R"([{"role":"user","content":"hi"},{"role":"assistant"},{"role":"user","content":"x"}])"),
       400, "invalid_value", "messages.1.content"},
      {msgs(R"([{"role":"user","content":"hi"},{"role":"assistant","content":[],"tool_calls":[]},)"
            R"({"role":"user","content":"x"}])"),
       400, "invalid_value", "messages.1.content"},
      {msgs(R"([{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"c"}])"), 400,
       "invalid_value", "messages.1.content"},
      {with(tool + R"(,"tool_choice":{"type":"function","function":{"name":"g"}})"), 400,
       "invalid_value", "tool_choice.function.name"},
      {with(R"("tool_choice":{"type":"function","function":{"name":"f"}})"), 400, "invalid_value",
       "tool_choice.function.name"},
      {with(tool + R"(,"tool_choice":{"type":"function","function":{}})"), 400, "invalid_value",
       "tool_choice.function.name"},
      {with(R"("tool_choice":"required")"), 400, "invalid_value", "tool_choice"},
      {with(R"("tools":[],"tool_choice":"required")"), 400, "invalid_value", "tool_choice"},
  };
  for (const Case& c : cases)  // one by one: each case reports on its own
    expect_refusals({c},
                    [](const std::string& body) { return parse_chat_request(body, config()); });
  // An assistant turn that carries tool calls, or its reasoning, needs no content; "" is content;
  // the choices that name a declared tool, or need none, pass.
  const std::string call =
      R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}])";
  accepted(msgs(R"([{"role":"user","content":"hi"},{"role":"assistant",)" + call +
                R"(},{"role":"tool","tool_call_id":"c1","content":"1"}])"));
  accepted(msgs(R"([{"role":"user","content":"a"},{"role":"assistant","reasoning_content":"r"},)"
                R"({"role":"user","content":"b"}])"));
  accepted(msgs(R"([{"role":"user","content":""}])"));
  accepted(with(tool + R"(,"tool_choice":{"type":"function","function":{"name":"f"}})"));
  accepted(with(tool + R"(,"tool_choice":"required")"));
  accepted(with(R"("tool_choice":"none")"));
  accepted(with(R"("tool_choice":"auto")"));
}

// Any model name reaches the one served model on every API (Claude Code sends claude-sonnet-4-5-…,
// OpenAI apps gpt-4o-mini), and the request names the served id from then on; --strict-model
// refuses names other than the id and the aliases, and its 404 lists what is served.
TEST(ServeApi, AnyModelNameGetsTheServedModelUnlessStrict) {
  ApiConfig loose;
  loose.aliases = {"k3"};
  ApiConfig strict = loose;
  strict.strict_model = true;
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  using Model = std::variant<std::string, ApiError>;
  auto model_of = [](auto parsed, auto get) -> Model {
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    return get(std::get<0>(parsed));
  };
  struct Api {
    const char* name;
    std::function<Model(const std::string&, const ApiConfig&)> model;
  };
  const std::vector<Api> apis = {
      {"chat",
       [&](const std::string& m, const ApiConfig& c) {
         return model_of(parse_chat_request(R"({"model":")" + m + "\"," + user + "}", c),
                         [](const ChatRequest& r) { return r.model; });
       }},
      {"completions",
       [&](const std::string& m, const ApiConfig& c) {
         return model_of(parse_completion_request(R"({"model":")" + m + R"(","prompt":"x"})", c),
                         [](const CompletionRequest& r) { return r.model; });
       }},
      {"messages",
       [&](const std::string& m, const ApiConfig& c) {
         return model_of(
             parse_messages_request(R"({"model":")" + m + R"(","max_tokens":8,)" + user + "}", c),
             [](const MessagesRequest& r) { return r.chat.model; });
       }},
      {"responses",
       [&](const std::string& m, const ApiConfig& c) {
         return model_of(parse_responses_request(R"({"model":")" + m + R"(","input":"x"})", c),
                         [](const ResponsesRequest& r) { return r.chat.model; });
       }},
  };
  for (const Api& api : apis) {
    SCOPED_TRACE(api.name);
    for (const char* name : {"gpt-4o-mini", "claude-sonnet-4-5-20250929", "k3", "kimi-k3", "x"}) {
      const Model got = api.model(name, loose);
      ASSERT_TRUE(std::holds_alternative<std::string>(got))
          << name << ": " << std::get<ApiError>(got).message;
      EXPECT_EQ(std::get<std::string>(got), "kimi-k3") << name;  // responses name the served id
    }
    for (const char* name : {"kimi-k3", "k3"}) {
      const Model got = api.model(name, strict);
      ASSERT_TRUE(std::holds_alternative<std::string>(got)) << name;
      EXPECT_EQ(std::get<std::string>(got), "kimi-k3");
    }
    for (const char* name : {"", "  ", "kimi-k3\\u0000", "a\\nb"}) {  // not a name: 400 either way
      const Model bad = api.model(name, loose);
      ASSERT_TRUE(std::holds_alternative<ApiError>(bad)) << name;
      EXPECT_EQ(std::get<ApiError>(bad).status, 400) << name;
      EXPECT_EQ(std::get<ApiError>(bad).param.value_or(""), "model") << name;
    }
    const Model refused = api.model("gpt-4o-mini", strict);
    ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
    const ApiError& e = std::get<ApiError>(refused);
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.code, "model_not_found");
    EXPECT_EQ(e.param.value_or(""), "model");
    for (const char* part : {"'gpt-4o-mini'", "'kimi-k3'", "'k3'", "--strict-model"})
      EXPECT_NE(e.message.find(part), std::string::npos) << part << ": " << e.message;
  }
  // The served id is what a response names, whatever the request said.
  const ChatRequest r = accepted(R"({"model":"gpt-4o-mini",)" + user + "}");
  EXPECT_EQ(chat_completion_json(ChatResult{}, r, loose, new_response_ids())["model"], "kimi-k3");
}

// The refusals carry the value that was refused and the limit it broke (and, for a server limit,
// the setting that raises it).
TEST(ServeApi, RefusalsCarryTheirNumbers) {
  auto message = [](const std::string& body) -> std::string {
    const auto r = parse_chat_request(body, config());
    return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r).message : "accepted";
  };
  auto has = [](const std::string& text, std::initializer_list<const char*> parts) {
    for (const char* part : parts)
      EXPECT_NE(text.find(part), std::string::npos) << part << ": " << text;
  };
  has(message(with(R"("temperature":2.5)")), {"'temperature' is 2.5", "[0, 2]"});
  has(message(with(R"("max_tokens":0)")), {"'max_tokens' is 0", "[1, 2147483647]"});
  has(message(with(R"("logprobs":true,"top_logprobs":21)")), {"is 21", "[0, 20]"});
  has(message(with(R"("stop":")" + std::string(300, 'x') + "\"")), {"300", "256"});
  std::string stops;
  for (int i = 0; i < 17; ++i) stops += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  has(message(with(R"("stop":[)" + stops + "]")), {"holds 17", "16"});
  has(message(with(R"("stop":["a",")" + std::string(300, 'y') + "\"]")), {"(it is 300)"});
  std::string many;
  for (int i = 0; i < 4100; ++i)
    many += std::string(i ? "," : "") + R"({"role":"user","content":"a"})";
  has(message(R"({"model":"kimi-k3","messages":[)" + many + "]}"), {"holds 4100", "4096"});
  // A value quoted in a message is cut at 40 bytes: the message stays short whatever the body.
  const auto cut = parse_responses_request(
      R"({"model":"kimi-k3","input":"x","max_output_tokens":")" + std::string(5000, 'z') + "\"}",
      config());
  ASSERT_TRUE(std::holds_alternative<ApiError>(cut));
  has(std::get<ApiError>(cut).message, {"'max_output_tokens' is \"zzz", "zzz...; it must be"});
  EXPECT_LT(std::get<ApiError>(cut).message.size(), 120u);
  // The server's own limits: the value, the limit and the setting.
  has(body_too_large(1048576, 2097152).message,
      {"2097152 bytes", "1048576 bytes", "1 MiB", "--max-body-mb", "COLI_MAX_BODY_MB"});
  has(body_too_large(1048576, 1048600, true).message, {"at least 1048600"});
  has(body_too_slow(30).message, {"30 s", "--read-deadline"});
  const ApiError context = context_exceeded(300, 256, "messages");
  EXPECT_EQ(context.code, "context_length_exceeded");
  EXPECT_EQ(context.param.value_or(""), "messages");
  has(context.message, {"300 tokens", "256", "raise --ctx to 301", "COLI_CTX"});
}

TEST(ServeApi, AcceptsWhatSdksSend) {
  const ChatRequest r = accepted(R"({"model":"kimi-k3","messages":[
      {"role":"developer","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Capital"},{"type":"input_text","text":" of France?"}]},
      {"role":"assistant","content":"Paris.","reasoning":"Easy."},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"},
      {"role":"user","content":"And Italy?"}],
    "stream":true,"stream_options":{"include_usage":true},"max_tokens":256.0,"max_completion_tokens":64,
    "temperature":0,"top_p":1,"top_k":40,"min_p":0.05,"seed":-7,"stop":"\n\nUser:",
    "reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true},"n":1,"user":"u","metadata":{"a":"b"},
    "frequency_penalty":0,"presence_penalty":0.0,"logprobs":false,"response_format":{"type":"text"},
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"tool_choice":"auto",
    "parallel_tool_calls":true,"unknown_future_field":{"x":1},"model":"kimi-k3"})");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 64);  // max_completion_tokens wins
  EXPECT_EQ(r.top_k, 40);
  EXPECT_DOUBLE_EQ(r.min_p, 0.05);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(static_cast<int64_t>(*r.seed), -7);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\nUser:"});
  EXPECT_TRUE(r.thinking);  // the explicit enable_thinking wins over reasoning_effort none
  const auto& messages = r.messages.as_array();
  ASSERT_EQ(messages.size(), 6u);
  EXPECT_EQ(messages[0].find("role")->as_string(), "system");
  EXPECT_EQ(messages[2].find("reasoning_content")->as_string(), "Easy.");
  EXPECT_TRUE(r.tools.is_array());
  // Duplicate keys: the last wins; ceilings clamp.
  EXPECT_EQ(accepted(with(R"("temperature":2,"temperature":0.5)")).temperature, 0.5);
  EXPECT_EQ(accepted(with(R"("max_tokens":999999999)")).max_tokens, config().max_tokens_ceiling);
  EXPECT_FALSE(accepted(with(R"("reasoning_effort":"none")")).thinking);
  EXPECT_FALSE(accepted(with(R"("thinking":{"type":"disabled"})")).thinking);
  EXPECT_TRUE(accepted(with(R"("reasoning_format":"none")")).reasoning_inline);
  EXPECT_EQ(accepted(with(R"("tool_choice":"none")")).tool_choice.as_string(), "none");
  // Log-probabilities and penalties.
  EXPECT_EQ(r.top_logprobs, -1);  // logprobs false
  EXPECT_EQ(accepted(with(R"("logprobs":true)")).top_logprobs, 0);
  EXPECT_EQ(accepted(with(R"("logprobs":true,"top_logprobs":20)")).top_logprobs, 20);
  EXPECT_EQ(accepted(with(R"("logprobs":null,"top_logprobs":null)")).top_logprobs, -1);
  EXPECT_EQ(accepted(with(R"("top_logprobs":0)")).top_logprobs, -1);  // neutral without logprobs
  const ChatRequest p = accepted(with(
      R"("frequency_penalty":-2,"presence_penalty":1.5,"repeat_penalty":1.1,"repeat_last_n":-1,"repetition_penalty":1)"));
  EXPECT_DOUBLE_EQ(p.frequency_penalty, -2.0);
  EXPECT_DOUBLE_EQ(p.presence_penalty, 1.5);
  EXPECT_DOUBLE_EQ(p.repeat_penalty, 1.1);
  EXPECT_EQ(p.repeat_last_n, -1);
  const ChatRequest neutral = accepted(with(""));
  EXPECT_EQ(neutral.frequency_penalty, 0.0);
  EXPECT_EQ(neutral.repeat_penalty, 1.0);
  EXPECT_EQ(neutral.repeat_last_n, 64);  // llama.cpp's default window
}

// An out-of-range number is a 400 whose message names the field, the value sent and the range,
// on every API shape that takes sampling fields.
TEST(ServeApi, OutOfRangeMessagesNameTheFieldTheValueAndTheRange) {
  struct RangeCase {
    std::variant<ChatRequest, ApiError> (*parse)(const std::string&);
    std::string extra, param, message;
  };
  auto chat =
      +[](const std::string& extra) { return parse_chat_request(with(extra), ApiConfig{}); };
  auto completion = +[](const std::string& extra) {
    auto r =
        parse_completion_request(R"({"model":"kimi-k3","prompt":"x",)" + extra + "}", ApiConfig{});
    if (auto* e = std::get_if<ApiError>(&r)) return std::variant<ChatRequest, ApiError>(*e);
    return std::variant<ChatRequest, ApiError>(ChatRequest{});
  };
  auto messages = +[](const std::string& extra) {
    auto r = parse_messages_request(
        R"({"model":"kimi-k3","max_tokens":8,"messages":[{"role":"user","content":"hi"}],)" +
            extra + "}",
        ApiConfig{}, false);
    if (auto* e = std::get_if<ApiError>(&r)) return std::variant<ChatRequest, ApiError>(*e);
    return std::variant<ChatRequest, ApiError>(ChatRequest{});
  };
  auto responses = +[](const std::string& extra) {
    auto r =
        parse_responses_request(R"({"model":"kimi-k3","input":"hi",)" + extra + "}", ApiConfig{});
    if (auto* e = std::get_if<ApiError>(&r)) return std::variant<ChatRequest, ApiError>(*e);
    return std::variant<ChatRequest, ApiError>(ChatRequest{});
  };
  const std::vector<RangeCase> cases = {
      {chat, R"("top_k":-1)", "top_k", "'top_k' is -1; it must be in [0, 1073741824]"},
      {chat, R"("top_k":18446744073709551615)", "top_k",
       "'top_k' is 18446744073709551615; it must be in [0, 1073741824]"},
      {chat, R"("top_k":1e20)", "top_k", "'top_k' is 1e+20; it must be in [0, 1073741824]"},
      {chat, R"("min_p":1.5)", "min_p", "'min_p' is 1.5; it must be in [0, 1]"},
      {chat, R"("top_p":0)", "top_p", "'top_p' is 0; it must be in (0, 1]"},
      {chat, R"("temperature":2.5)", "temperature", "'temperature' is 2.5; it must be in [0, 2]"},
      {chat, R"("frequency_penalty":-3)", "frequency_penalty",
       "'frequency_penalty' is -3; it must be in [-2, 2]"},
      {chat, R"("presence_penalty":2.25)", "presence_penalty",
       "'presence_penalty' is 2.25; it must be in [-2, 2]"},
      {chat, R"("repeat_penalty":0)", "repeat_penalty",
       "'repeat_penalty' is 0; it must be in (0, 10]"},
      {chat, R"("repeat_last_n":-2)", "repeat_last_n",
       "'repeat_last_n' is -2; it must be in [-1, 1073741824]"},
      {chat, R"("max_tokens":0)", "max_tokens", "'max_tokens' is 0; it must be in [1, 2147483647]"},
      {chat, R"("n_predict":-2)", "n_predict", "'n_predict' is -2; it must be in [-1, 2147483647]"},
      {chat, R"("n_predict":0)", "n_predict",
       "'n_predict' is 0; it must be -1 (up to --max-tokens) or in [1, 2147483647]"},
      {completion, R"("top_k":-5)", "top_k", "'top_k' is -5; it must be in [0, 1073741824]"},
      {completion, R"("n_predict":0)", "n_predict",
       "'n_predict' is 0; it must be -1 (up to --max-tokens) or in [1, 2147483647]"},
      {messages, R"("temperature":1.5)", "temperature",
       "'temperature' is 1.5; it must be in [0, 1]"},
      {messages, R"("top_k":-1)", "top_k", "'top_k' is -1; it must be in [0, 1073741824]"},
      {messages, R"("top_p":1.01)", "top_p", "'top_p' is 1.01; it must be in (0, 1]"},
      {responses, R"("top_p":2)", "top_p", "'top_p' is 2; it must be in (0, 1]"},
      {responses, R"("temperature":-0.5)", "temperature",
       "'temperature' is -0.5; it must be in [0, 2]"},
      {responses, R"("min_p":7)", "min_p", "'min_p' is 7; it must be in [0, 1]"},
  };
  for (const RangeCase& c : cases) {
    const auto r = c.parse(c.extra);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.extra;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, 400) << c.extra;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.extra;
    EXPECT_EQ(e.message, c.message) << c.extra;
  }
}

// llama-server's n_predict on the OpenAI routes: the reply budget, winning over max_tokens as
// there; -1 is the --max-tokens ceiling; larger values clamp to it.
TEST(ServeApi, NPredictIsTheReplyBudget) {
  EXPECT_EQ(accepted(with(R"("n_predict":5)")).max_tokens, 5);
  EXPECT_EQ(accepted(with(R"("max_tokens":100,"n_predict":5)")).max_tokens, 5);
  EXPECT_EQ(accepted(with(R"("n_predict":5,"max_completion_tokens":100)")).max_tokens, 5);
  EXPECT_EQ(accepted(with(R"("n_predict":-1,"max_tokens":100)")).max_tokens,
            config().max_tokens_ceiling);
  EXPECT_EQ(accepted(with(R"("n_predict":999999999)")).max_tokens, config().max_tokens_ceiling);
  EXPECT_EQ(accepted(with(R"("n_predict":null,"max_tokens":7)")).max_tokens, 7);
  auto completion =
      parse_completion_request(R"({"model":"kimi-k3","prompt":"x","n_predict":3})", ApiConfig{});
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(completion));
  EXPECT_EQ(std::get<CompletionRequest>(completion).max_tokens, 3);
  const std::vector<Case> cases = {
      {with(R"("n_predict":"5")"), 400, "invalid_value", "n_predict"},
      {with(R"("n_predict":2.5)"), 400, "invalid_value", "n_predict"},
      {with(R"("n_predict":0)"), 400, "invalid_value", "n_predict"},
      {with(R"("n_predict":2147483648)"), 400, "invalid_value", "n_predict"},
  };
  expect_refusals(cases,
                  [](const std::string& body) { return parse_chat_request(body, config()); });
}

TEST(ServeApi, CompletionRequests) {
  auto parse = [](const std::string& body) { return parse_completion_request(body, ApiConfig{}); };
  auto text = parse(R"({"model":"kimi-k3","prompt":"Once upon","stop":["\n"],"seed":3})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(text));
  EXPECT_EQ(std::get<CompletionRequest>(text).prompt, "Once upon");
  EXPECT_EQ(std::get<CompletionRequest>(text).max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(std::get<CompletionRequest>(text).top_logprobs, -1);
  auto with_logprobs = parse(R"({"model":"kimi-k3","prompt":"x","logprobs":5})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(with_logprobs));
  EXPECT_EQ(std::get<CompletionRequest>(with_logprobs).top_logprobs, 5);
  auto one = parse(R"({"model":"kimi-k3","prompt":["Once"]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(one));
  auto ids = parse(R"({"model":"kimi-k3","prompt":[1,2,3],"max_tokens":5})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  EXPECT_TRUE(std::get<CompletionRequest>(ids).ids_given);
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompt_ids, (std::vector<int64_t>{1, 2, 3}));
  const std::vector<Case> cases = {
      {R"({"model":"kimi-k3"})", 400, "missing_required_parameter", "prompt"},
      {R"({"model":"kimi-k3","prompt":["a","b"]})", 400, "unsupported_value", "prompt"},
      {R"({"model":"kimi-k3","prompt":[1,-2]})", 400, "invalid_value", "prompt.1"},
      {R"({"model":"kimi-k3","prompt":""})", 400, "invalid_value", "prompt"},
      {R"({"model":"kimi-k3","prompt":"x","echo":true})", 400, "unsupported_parameter", "echo"},
      {R"({"model":"kimi-k3","prompt":"x","suffix":"y"})", 400, "unsupported_parameter", "suffix"},
      {R"({"model":"kimi-k3","prompt":"x","best_of":2})", 400, "unsupported_value", "best_of"},
      {R"({"model":"kimi-k3","prompt":"x","logprobs":21})", 400, "invalid_value", "logprobs"},
      {R"({"model":"kimi-k3","prompt":"x","logprobs":true})", 400, "invalid_value", "logprobs"},
      {R"({"model":"kimi-k3","prompt":"x","frequency_penalty":3})", 400, "invalid_value",
       "frequency_penalty"},
      {R"({"model":"kimi-k3","prompt":"x","n":3})", 400, "unsupported_value", "n"},
      {R"({"model":"kimi-k3","prompt":"x","temperature":-1})", 400, "invalid_value", "temperature"},
  };
  expect_refusals(cases, parse);
  GenerationStats stats;
  stats.finish = FinishReason::stop;
  stats.prompt_tokens = 3;
  stats.completion_tokens = 2;
  const ResponseIds rid = new_response_ids("cmpl-");
  const json out = completion_json(" there", stats, "kimi-k3", ApiConfig{}, rid);
  EXPECT_EQ(out["object"], "text_completion");
  EXPECT_EQ(out["choices"][0]["text"], " there");
  EXPECT_EQ(out["usage"]["total_tokens"], 5);
  EXPECT_FALSE(completion_chunk_json(rid, ApiConfig{}, "x", nullptr).contains("usage"));
}

TEST(ServeApi, ResponseShapes) {
  ChatResult result;
  result.reasoning = "Because.";
  result.content = "Rome.";
  result.stats.finish = FinishReason::stop;
  result.stats.prompt_tokens = 412;
  result.stats.cached_tokens = 380;
  result.stats.completion_tokens = 57;
  result.stats.prefill_ms = 1000;
  result.stats.decode_ms = 2000;
  result.stats.reuse = ReuseKind::checkpoint;
  result.stats.restored_at = 380;
  ChatRequest request = accepted(with(""));
  const ResponseIds ids = new_response_ids();
  EXPECT_EQ(ids.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(ids.id.size(), 9u + 32u);
  const json r = chat_completion_json(result, request, config(), ids);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Rome.");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "Because.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 469);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 380);
  EXPECT_EQ(r["timings"]["prompt_n"], 32);
  EXPECT_DOUBLE_EQ(r["timings"]["predicted_per_second"].get<double>(), 28.5);
  EXPECT_EQ(r["x_k3"]["reuse"], "checkpoint");
  EXPECT_EQ(r["x_k3"]["checkpoint_restored_at"], 380);
  request.reasoning_inline = true;
  EXPECT_EQ(
      chat_completion_json(result, request, config(), ids)["choices"][0]["message"]["content"],
      "Because.</think>Rome.");
  ApiConfig both = config();
  both.reasoning_field = "both";
  json delta = json::object();
  put_reasoning(delta, "x", both);
  EXPECT_EQ(delta["reasoning"], "x");
  EXPECT_EQ(delta["reasoning_content"], "x");
  // Tool calls.
  text::ToolCallOut call;
  call.name = "get_weather";
  call.arguments_json = R"({"city":"Paris"})";
  result.tool_calls = {call};
  result.stats.finish = FinishReason::tool_calls;
  const json t = chat_completion_json(result, accepted(with("")), config(), ids);
  EXPECT_EQ(t["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(t["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city":"Paris"})");
  EXPECT_EQ(t["choices"][0]["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(t["choices"][0]["finish_reason"], "tool_calls");
  // Chunks.
  const json c = chunk_json(ids, config(), json{{"content", "Ro"}}, nullptr);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c["usage"].is_null());
  const json u = usage_chunk_json(ids, config(), result.stats);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 57);
  const json p = progress_chunk_json(ids, config(), 412, 380, 396, 30.5);
  EXPECT_EQ(p["prompt_progress"]["processed"], 396);
}

// issue 28 item 11: a reply the server cancels (a drain that timed out, a second SIGTERM) ends with
// a finish reason each API's schema has. It was "cancelled" (not an OpenAI value) and Anthropic's
// "end_turn" (a cut reply passed for a finished one); now the cut-short value of each: "length",
// "max_tokens", Responses' incomplete "max_output_tokens". x_k3.finish keeps the engine's word.
TEST(ServeApi, ServerCancelledRepliesEndWithAValidFinishReason) {
  ChatResult result;
  result.stats.finish = FinishReason::cancelled;
  ChatRequest request;
  request.model = "kimi-k3";
  const json chat = chat_completion_json(result, request, config(), new_response_ids());
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chat["x_k3"]["finish"], "cancelled");
  const json text = completion_json("", result.stats, "kimi-k3", config(), new_response_ids());
  EXPECT_EQ(text["choices"][0]["finish_reason"], "length");
  EXPECT_STREQ(anthropic_stop_reason(result.stats), "max_tokens");
  const json response = response_object(ResponsesRequest{}, new_response_ids("resp_"), "incomplete",
                                        json::array(), &result.stats, nullptr);
  EXPECT_EQ(response["incomplete_details"], (json{{"reason", "max_output_tokens"}}));
  // Every finish the engine reports maps into OpenAI's enum.
  for (FinishReason f : {FinishReason::stop, FinishReason::length, FinishReason::tool_calls,
                         FinishReason::cancelled}) {
    result.stats.finish = f;
    const std::string reason = chat_completion_json(
        result, request, config(), new_response_ids())["choices"][0]["finish_reason"];
    EXPECT_TRUE(reason == "stop" || reason == "length" || reason == "tool_calls" ||
                reason == "content_filter" || reason == "function_call")
        << reason;
  }
}

TEST(ServeApi, Guards) {
  SecurityOptions o;
  o.port = 8000;
  EXPECT_TRUE(host_allowed("127.0.0.1:8000", o));
  EXPECT_TRUE(host_allowed("localhost", o));
  EXPECT_TRUE(host_allowed("[::1]:8000", o));
  EXPECT_FALSE(host_allowed("evil.example", o));
  EXPECT_FALSE(host_allowed("evil.example:8000", o));
  EXPECT_FALSE(host_allowed("", o));
  o.allowed_hosts = {"box.lan"};
  EXPECT_TRUE(host_allowed("BOX.lan:8000", o));
  o.allowed_hosts = {"*"};
  EXPECT_TRUE(host_allowed("evil.example", o));

  SecurityOptions c;
  c.port = 8000;
  EXPECT_TRUE(origin_allowed("http://127.0.0.1:8000", c));
  EXPECT_TRUE(origin_allowed("http://localhost:8000", c));
  EXPECT_FALSE(origin_allowed("http://localhost:5173", c));  // no hard-coded extras
  EXPECT_FALSE(origin_allowed("http://127.0.0.1:8001", c));
  EXPECT_FALSE(origin_allowed("https://evil.example", c));
  EXPECT_FALSE(origin_allowed("null", c));
  c.cors_origins = {"https://app.example"};
  EXPECT_TRUE(origin_allowed("https://app.example", c));

  EXPECT_EQ(presented_key("Bearer  sk-1 ", ""), "sk-1");
  EXPECT_EQ(presented_key("bearer sk-1", ""), "sk-1");
  EXPECT_EQ(presented_key("Basic abc", "sk-1"), "");  // another scheme counts as missing
  EXPECT_EQ(presented_key("", " sk-2 "), "sk-2");
  const std::vector<std::string> keys = {"sk-1", "another-key"};
  EXPECT_TRUE(key_matches("sk-1", keys));
  EXPECT_TRUE(key_matches("another-key", keys));
  EXPECT_FALSE(key_matches("sk-", keys));
  EXPECT_FALSE(key_matches("sk-12", keys));
  EXPECT_FALSE(key_matches("", keys));
  EXPECT_FALSE(key_matches(std::string(600, 'a'), {std::string(512, 'a')}));

  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("192.168.1.5"));
}

TEST(ServeApi, MetricsText) {
  ServiceStats s;
  s.generated_tokens = 57;
  s.decode_seconds = 2;
  s.prompt_tokens = 412;
  s.cached_tokens = 380;
  s.prefill_seconds = 1;
  s.experts.busy_seconds = 4.5;
  s.experts.wait_seconds = 0.25;
  s.experts.prefetch_issued = 40;
  s.experts.prefetch_used = 30;
  s.experts.predicted_hits = 3;
  s.experts.predicted_total = 4;
  const std::string text =
      metrics_text(s, {{"endpoint=\"/v1/chat/completions\",status=\"200\"", 3}});
  EXPECT_NE(text.find("k3_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("k3_generated_tokens_total 57\n"), std::string::npos);
  EXPECT_NE(text.find("k3_prompt_tokens_cached_total 380\n"), std::string::npos);
  EXPECT_NE(text.find("k3_decode_tokens_per_second 28.5\n"), std::string::npos);
  EXPECT_NE(text.find("k3_prefill_tokens_per_second 32\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE k3_requests_queued gauge"), std::string::npos);
  EXPECT_NE(text.find("k3_expert_read_busy_seconds_total 4.5\n"), std::string::npos);
  EXPECT_NE(text.find("k3_expert_read_wait_seconds_total 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("k3_expert_prefetch_reads_total 40\n"), std::string::npos);
  EXPECT_NE(text.find("k3_expert_prefetch_used_total 30\n"), std::string::npos);
  EXPECT_NE(text.find("k3_expert_prefetch_recall 0.75\n"), std::string::npos);
  // Resident memory by use and by backing (engine.h: MemorySplit).
  ServiceStats m;
  m.memory.dense_weights = 2900;
  m.memory.expert_cache = 840;
  m.memory.expert_slots_used = 48;
  m.memory.expert_slots_budget = 192;
  m.memory.kda_state = 5;
  m.memory.mla_cache = 6;
  m.memory.activations = 7;
  m.memory.io_buffers = 8;
  m.memory.anonymous = 3800;
  m.memory.file_backed = 9;
  const std::string mem = metrics_text(m, {});
  for (const char* line :
       {"k3_memory_bytes{part=\"dense_weights\"} 2900\n",
        "k3_memory_bytes{part=\"expert_cache\"} 840\n", "k3_memory_bytes{part=\"kda_state\"} 5\n",
        "k3_memory_bytes{part=\"mla_cache\"} 6\n", "k3_memory_bytes{part=\"activations\"} 7\n",
        "k3_memory_bytes{part=\"io_buffers\"} 8\n", "k3_memory_bytes{part=\"anonymous\"} 3800\n",
        "k3_memory_bytes{part=\"file_backed\"} 9\n", "k3_expert_slots_used 48\n",
        "k3_expert_slots_budget 192\n"})
    EXPECT_NE(mem.find(line), std::string::npos) << line;
}

}  // namespace
}  // namespace k3::server
