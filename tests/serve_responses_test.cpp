// The OpenAI Responses API of `coli serve` without sockets (server/responses.h, docs/serving.md
// §3.17): input items translated into the chat messages a chat request with the same turns has,
// the refusals naming their field, the response object and the event stream (order, sequence
// numbers, the final response equal to what the deltas built), and POST /v1/responses through
// the route table over a demo checkpoint.
#include <gtest/gtest.h>

#include <thread>

#include "engine/service.h"
#include "server/responses.h"
#include "server/routes.h"
#include "test_util.h"

namespace k3::server {
namespace {

ResponsesRequest accepted_response(const std::string& body, const ApiConfig& config = ApiConfig{}) {
  auto r = parse_responses_request(body, config);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << "refused (" << e->code << ", " << e->param.value_or("-") << "): " << e->message
                  << "\n"
                  << body;
    return {};
  }
  return std::get<ResponsesRequest>(std::move(r));
}

ChatRequest chat(const std::string& body) {
  auto r = parse_chat_request(body, ApiConfig{});
  EXPECT_TRUE(std::holds_alternative<ChatRequest>(r)) << body;
  return std::holds_alternative<ChatRequest>(r) ? std::get<ChatRequest>(r) : ChatRequest{};
}

std::string dump(const text::PyValue& v) {
  return text::dumps(v, text::DumpStyle::kCompact);
}

// The Responses body renders the messages and tools the chat body has.
void expect_same_turns(const std::string& responses_body, const std::string& chat_body) {
  const ResponsesRequest r = accepted_response(responses_body);
  const ChatRequest c = chat(chat_body);
  EXPECT_EQ(dump(r.chat.messages), dump(c.messages)) << responses_body;
  EXPECT_EQ(dump(r.chat.tools), dump(c.tools)) << responses_body;
  EXPECT_EQ(dump(r.chat.tool_choice), dump(c.tool_choice)) << responses_body;
}

const char* kTool =
    R"({"type":"function","name":"get_weather","description":"Weather of a city.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true})";
const char* kChatTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";

TEST(ServeResponses, InputBecomesTheChatTurns) {
  // A string is one user message; instructions come first as the system message.
  expect_same_turns(R"({"model":"kimi-k3","input":"Hello"})",
                    R"({"model":"kimi-k3","messages":[{"role":"user","content":"Hello"}]})");
  expect_same_turns(
      R"({"model":"kimi-k3","instructions":"Be brief.","input":[)"
      R"({"role":"developer","content":"Use French."},)"
      R"({"type":"message","role":"user","content":[{"type":"input_text","text":"Hi"},)"
      R"({"type":"input_text","text":" there"}]}]})",
      R"({"model":"kimi-k3","messages":[{"role":"system","content":"Be brief."},)"
      R"({"role":"system","content":"Use French."},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":" there"}]}]})");
  // A previous answer sent back as its output items: reasoning, message and a call make one
  // assistant turn; the call's output is the tool message.
  const std::string turn =
      R"({"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Need the tool."}]},)"
      R"({"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[)"
      R"({"type":"output_text","text":"Checking.","annotations":[]}]},)"
      R"({"type":"function_call","id":"fc_1","call_id":"call_7","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},)"
      R"({"type":"function_call_output","call_id":"call_7","output":"18 C"})";
  expect_same_turns(
      R"({"model":"kimi-k3","tools":[)" + std::string(kTool) +
          R"(],"tool_choice":{"type":"function","name":"get_weather"},"input":[)"
          R"({"role":"user","content":"Weather in Paris?"},)" +
          turn + "]}",
      R"({"model":"kimi-k3","tools":[)" + std::string(kChatTool) +
          R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}},"messages":[)"
          R"({"role":"user","content":"Weather in Paris?"},)"
          R"({"role":"assistant","content":[{"type":"text","text":"Checking."}],)"
          R"("reasoning_content":"Need the tool.","tool_calls":[{"id":"call_7","type":"function",)"
          R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
          R"({"role":"tool","tool_call_id":"call_7","content":"18 C"}]})");
  // Two calls in a row join one turn; a reasoning summary stands in for missing content; an
  // output given as parts is joined.
  expect_same_turns(
      R"({"model":"kimi-k3","input":[{"role":"user","content":"Go"},)"
      R"({"type":"reasoning","summary":[{"type":"summary_text","text":"a"},{"type":"summary_text","text":"b"}]},)"
      R"({"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},)"
      R"({"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},)"
      R"({"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"x"},{"type":"input_text","text":"y"}]},)"
      R"({"type":"function_call_output","call_id":"c2","output":"z"},)"
      R"({"role":"assistant","content":"Done."}]})",
      R"({"model":"kimi-k3","messages":[{"role":"user","content":"Go"},)"
      R"({"role":"assistant","content":null,"reasoning_content":"a\n\nb","tool_calls":[)"
      R"({"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},)"
      R"({"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"xy"},)"
      R"({"role":"tool","tool_call_id":"c2","content":"z"},)"
      R"({"role":"assistant","content":"Done."}]})");
}

TEST(ServeResponses, SettingsMapToTheChatRequest) {
  const ResponsesRequest plain = accepted_response(R"({"model":"kimi-k3","input":"x"})");
  EXPECT_TRUE(plain.chat.thinking);
  EXPECT_EQ(plain.chat.effort, "max");  // as chat: no effort given → max
  EXPECT_EQ(plain.chat.max_tokens, ApiConfig{}.max_tokens_ceiling);
  EXPECT_FALSE(plain.chat.stream);
  // reasoning.effort maps as chat's reasoning_effort; none turns thinking off.
  const std::pair<const char*, const char*> efforts[] = {
      {"minimal", "low"}, {"low", "low"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"}};
  for (const auto& [given, effort] : efforts) {
    const ResponsesRequest r = accepted_response(std::string(R"({"model":"kimi-k3","input":"x",)") +
                                                 R"("reasoning":{"effort":")" + given + R"("}})");
    EXPECT_TRUE(r.chat.thinking) << given;
    EXPECT_EQ(r.chat.effort, effort) << given;
    EXPECT_EQ(r.echo["reasoning"]["effort"], given);
  }
  EXPECT_FALSE(accepted_response(R"({"model":"kimi-k3","input":"x","reasoning":{"effort":"none"}})")
                   .chat.thinking);
  const ResponsesRequest r = accepted_response(
      R"({"model":"kimi-k3","input":"x","max_output_tokens":40,"temperature":0,"top_p":0.5,)"
      R"("stream":true,"store":true,"metadata":{"k":"v"},"include":["reasoning.encrypted_content"],)"
      R"("reasoning":{"effort":"low","summary":"auto"},"text":{"format":{"type":"text"}}})");
  EXPECT_EQ(r.chat.max_tokens, 40);
  EXPECT_EQ(r.chat.temperature, 0.0);
  EXPECT_EQ(r.chat.top_p, 0.5);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_EQ(r.echo["max_output_tokens"], 40);
  EXPECT_EQ(r.echo["store"], false);  // accepted, nothing stored
  EXPECT_EQ(r.echo["metadata"]["k"], "v");
  EXPECT_EQ(r.echo["reasoning"]["summary"], "auto");
  // The ceiling still clamps.
  ApiConfig small;
  small.max_tokens_ceiling = 16;
  EXPECT_EQ(accepted_response(R"({"model":"kimi-k3","input":"x","max_output_tokens":400})", small)
                .chat.max_tokens,
            16);
  // The tools as the response repeats them.
  const ResponsesRequest t =
      accepted_response(R"({"model":"kimi-k3","input":"x","tools":[)" + std::string(kTool) + "]}");
  EXPECT_EQ(t.echo["tools"][0]["name"], "get_weather");
  EXPECT_EQ(t.echo["tools"][0]["strict"], true);
  EXPECT_EQ(t.echo["tool_choice"], "auto");
}

struct Refusal {
  std::string body;
  int status;
  std::string code;
  std::string param;
};

TEST(ServeResponses, RefusalsNameTheField) {
  const std::string m = R"({"model":"kimi-k3",)";
  const std::vector<Refusal> cases = {
      {"{", 400, "invalid_json", ""},
      {m + R"("input":"x","previous_response_id":"resp_1"})", 400, "unsupported_parameter",
       "previous_response_id"},
      {m + R"("previous_response_id":"resp_1"})", 400, "unsupported_parameter",
       "previous_response_id"},
      {m + R"("input":"x","conversation":"conv_1"})", 400, "unsupported_parameter", "conversation"},
      {m + R"("input":"x","background":true})", 400, "unsupported_parameter", "background"},
      {m + R"("input":"x","prompt":{"id":"p"}})", 400, "unsupported_parameter", "prompt"},
      {m + R"("input":"x","store":"yes"})", 400, "invalid_value", "store"},
      {m + "\"x\":1}", 400, "missing_required_parameter", "input"},
      {R"({"input":"x"})", 400, "missing_required_parameter", "model"},
      {m + R"("input":[]})", 400, "invalid_value", "input"},
      {m + R"("input":7})", 400, "invalid_value", "input"},
      {m + R"("input":"a\u0000b"})", 400, "invalid_value", "input"},
      {m + R"("input":[{"role":"wizard","content":"x"}]})", 400, "invalid_value", "input.0.role"},
      {m + R"("input":[{"role":"user"}]})", 400, "invalid_value", "input.0.content"},
      {m + R"("input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})", 400,
       "unsupported_content_type", "input.0.content.0"},
      {m + R"("input":[{"role":"user","content":[{"type":"bogus","text":"x"}]}]})", 400,
       "invalid_value", "input.0.content.0.type"},
      {m + R"("input":["x",{"type":"item_reference","id":"msg_1"}]})", 400, "invalid_value",
       "input.0"},
      {m + R"("input":[{"type":"item_reference","id":"msg_1"}]})", 400, "unsupported_parameter",
       "input.0"},
      {m + R"("input":[{"type":"web_search_call","id":"ws_1"}]})", 400, "unsupported_value",
       "input.0.type"},
      {m + R"("input":[{"type":"function_call","name":"f","arguments":"{}"}]})", 400,
       "invalid_value", "input.0.call_id"},
      {m + R"("input":[{"type":"function_call_output","call_id":"c"}]})", 400, "invalid_value",
       "input.0.output"},
      {m + R"("input":"x","instructions":5})", 400, "invalid_value", "instructions"},
      {m + R"("input":"x","tools":[{"type":"web_search"}]})", 400, "unsupported_value",
       "tools.0.type"},
      {m + R"("input":"x","tools":[{"type":"function"}]})", 400, "invalid_value", "tools.0.name"},
      {m + R"("input":"x","tool_choice":{"type":"web_search_preview"}})", 400, "unsupported_value",
       "tool_choice.type"},
      {m + R"("input":"x","tool_choice":{"type":"function","name":"nope"}})", 400, "invalid_value",
       "tool_choice.name"},
      {m + R"("input":"x","tool_choice":"sometimes"})", 400, "unsupported_value", "tool_choice"},
      {m + R"("input":"x","reasoning":{"effort":"huge"}})", 400, "unsupported_value",
       "reasoning.effort"},
      {m + R"("input":"x","reasoning":{"summary":"long"}})", 400, "invalid_value",
       "reasoning.summary"},
      {m + R"("input":"x","max_output_tokens":0})", 400, "invalid_value", "max_output_tokens"},
      {m + R"("input":"x","max_output_tokens":"9"})", 400, "invalid_value", "max_output_tokens"},
      {m + R"("input":"x","temperature":3})", 400, "invalid_value", "temperature"},
      {m + R"("input":"x","text":{"format":{"type":"json_schema"}}})", 400, "invalid_value",
       "text.format.schema"},
      {m + R"("input":"x","text":{"format":{"type":"yaml"}}})", 400, "unsupported_parameter",
       "text.format"},
      {m + R"("input":"x","truncation":"auto"})", 400, "unsupported_value", "truncation"},
      {m + R"("input":"x","top_logprobs":3})", 400, "unsupported_parameter", "top_logprobs"},
      {m + R"("input":"x","include":["message.output_text.logprobs"]})", 400,
       "unsupported_parameter", "include"},
      {m + R"("input":"x","metadata":{"k":1}})", 400, "invalid_value", "metadata"},
  };
  for (const Refusal& c : cases) {
    const auto r = parse_responses_request(c.body, ApiConfig{});
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << c.body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.message;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
}

// issue 28 item 5: the OpenAI fields a Responses body may carry by habit (n, logit_bias,
// response_format) were dropped silently; they are refused by name as chat refuses them, their
// neutral values pass; "required" without tools is refused as chat and Messages refuse it.
TEST(ServeResponses, UnimplementedChatFieldsAreRefused) {
  const std::string m = R"({"model":"kimi-k3","input":"x",)";
  const std::vector<Refusal> cases = {
      {m + R"("n":2})", 400, "unsupported_value", "n"},
      {m + R"("n":"2"})", 400, "invalid_value", "n"},
      {m + R"("logit_bias":{"5":1}})", 400, "unsupported_parameter", "logit_bias"},
      {m + R"("response_format":{"type":"json_object"}})", 400, "unsupported_parameter",
       "response_format"},
      {m + R"("response_format":"json"})", 400, "invalid_value", "response_format"},
      {m + R"("tool_choice":"required"})", 400, "invalid_value", "tool_choice"},
  };
  for (const Refusal& c : cases) {
    const auto r = parse_responses_request(c.body, ApiConfig{});
    if (!std::holds_alternative<ApiError>(r)) {
      ADD_FAILURE() << "accepted: " << c.body;
      continue;
    }
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.message;
    EXPECT_EQ(e.param.value_or(""), c.param) << c.body;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
  accepted_response(m + R"("n":1,"logit_bias":{},"response_format":{"type":"text"}})");
  accepted_response(m + R"("tools":[)" + std::string(kTool) + R"(],"tool_choice":"required"})");
  // A reasoning item alone makes an assistant turn without content or calls: still accepted.
  accepted_response(R"({"model":"kimi-k3","input":[{"role":"user","content":"a"},)"
                    R"({"type":"reasoning","summary":[{"type":"summary_text","text":"r"}]},)"
                    R"({"role":"user","content":"b"}]})");
}

GenerationStats response_stats(FinishReason finish) {
  GenerationStats s;
  s.finish = finish;
  s.prompt_tokens = 30;
  s.cached_tokens = 12;
  s.completion_tokens = 9;
  s.reasoning_tokens = 4;
  return s;
}

ServiceEvent text_event(ServiceEvent::Kind kind, std::string text) {
  ServiceEvent e;
  e.kind = kind;
  e.text = std::move(text);
  return e;
}

ServiceEvent call_event(int index) {
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::tool_call;
  e.call.name = "get_weather";
  e.call.arguments_json = R"({"city":"Paris"})";
  e.call.index = index;
  e.call.complete = true;
  return e;
}

ServiceEvent done_event(FinishReason finish) {
  ServiceEvent e;
  e.kind = ServiceEvent::Kind::done;
  e.stats = response_stats(finish);
  return e;
}

// What collect() would have gathered from the same events.
ChatResult collected(const std::vector<ServiceEvent>& events) {
  ChatResult r;
  for (const ServiceEvent& e : events) {
    if (e.kind == ServiceEvent::Kind::reasoning) r.reasoning += e.text;
    if (e.kind == ServiceEvent::Kind::content) r.content += e.text;
    if (e.kind == ServiceEvent::Kind::tool_call) r.tool_calls.push_back(e.call);
    if (e.kind == ServiceEvent::Kind::done) r.stats = e.stats;
  }
  return r;
}

struct Streamed {
  std::vector<json> events;
  std::vector<std::string> types;
};

Streamed run_stream(const ResponsesRequest& request, const ResponseIds& ids,
                    const std::vector<ServiceEvent>& events) {
  ResponsesStream stream(request, ids);
  Streamed out;
  out.events = stream.start();
  for (const ServiceEvent& e : events)
    for (json& j : stream.on_event(e)) out.events.push_back(std::move(j));
  for (const json& e : out.events) out.types.push_back(e["type"]);
  return out;
}

// The stream's invariants: sequence numbers 0, 1, 2, ...; the final response equals the
// non-streaming one; every text item's deltas add up to its text.
void expect_consistent(const Streamed& s, const json& non_streaming) {
  for (size_t i = 0; i < s.events.size(); ++i)
    EXPECT_EQ(s.events[i]["sequence_number"], static_cast<int64_t>(i)) << s.events[i].dump();
  json last = s.events.back()["response"];
  json expected = non_streaming;
  last.erase("completed_at");
  expected.erase("completed_at");
  EXPECT_EQ(last.dump(), expected.dump());
  std::map<std::string, std::string> deltas;
  for (const json& e : s.events) {
    const std::string type = e["type"];
    if (type.size() > 6 && type.substr(type.size() - 6) == ".delta")
      deltas[e["item_id"].get<std::string>()] += e["delta"].get<std::string>();
  }
  for (const json& item : last["output"]) {
    const std::string id = item["id"];
    const std::string text = item["type"] == "function_call"
                                 ? item["arguments"].get<std::string>()
                                 : item["content"][0]["text"].get<std::string>();
    EXPECT_EQ(deltas[id], text) << id;
  }
}

TEST(ServeResponses, StreamOfReasoningAndText) {
  const ResponsesRequest request =
      accepted_response(R"({"model":"kimi-k3","input":"x","stream":true})");
  const ResponseIds ids{"resp_0123456789abcdef0123456789abcdef", 1700000000};
  using K = ServiceEvent::Kind;
  const std::vector<ServiceEvent> events = {
      text_event(K::reasoning, "Let me "), text_event(K::reasoning, "think."),
      text_event(K::content, "Hello"),     text_event(K::content, ", world"),
      done_event(FinishReason::stop),
  };
  const Streamed s = run_stream(request, ids, events);
  const std::vector<std::string> expected = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(s.types, expected);
  const json final_json = responses_json(collected(events), request, ids);
  expect_consistent(s, final_json);
  // The opening events carry an in-progress response with no output and no usage.
  EXPECT_EQ(s.events[0]["response"]["status"], "in_progress");
  EXPECT_TRUE(s.events[0]["response"]["output"].empty());
  EXPECT_FALSE(s.events[0]["response"].contains("usage"));
  // The final shape: reasoning item (reasoning_text content), then the message.
  EXPECT_EQ(final_json["object"], "response");
  EXPECT_EQ(final_json["status"], "completed");
  EXPECT_TRUE(final_json["incomplete_details"].is_null());
  EXPECT_TRUE(final_json["completed_at"].is_number_integer());
  const json& out = final_json["output"];
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(out[0]["content"][0]["text"], "Let me think.");
  EXPECT_TRUE(out[0]["summary"].is_array());
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["role"], "assistant");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(out[1]["content"][0]["text"], "Hello, world");
  const json& u = final_json["usage"];
  EXPECT_EQ(u["input_tokens"], 30);
  EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], 12);
  EXPECT_EQ(u["output_tokens"], 9);
  EXPECT_EQ(u["output_tokens_details"]["reasoning_tokens"], 4);
  EXPECT_EQ(u["total_tokens"], 39);
  EXPECT_EQ(final_json["store"], false);
}

TEST(ServeResponses, StreamOfAFunctionCall) {
  const ResponsesRequest request =
      accepted_response(R"({"model":"kimi-k3","input":"x","tools":[)" + std::string(kTool) + "]}");
  const ResponseIds ids = new_response_ids("resp_");
  using K = ServiceEvent::Kind;
  const std::vector<ServiceEvent> events = {text_event(K::content, "Checking."), call_event(0),
                                            done_event(FinishReason::tool_calls)};
  const Streamed s = run_stream(request, ids, events);
  const std::vector<std::string> tail(s.types.end() - 5, s.types.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"response.output_item.added",
                                            "response.function_call_arguments.delta",
                                            "response.function_call_arguments.done",
                                            "response.output_item.done", "response.completed"}));
  const json final_json = responses_json(collected(events), request, ids);
  expect_consistent(s, final_json);
  const json& call = final_json["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(call["status"], "completed");
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_0_", 0), 0u);
  EXPECT_NE(call["id"], call["call_id"]);
  EXPECT_EQ(final_json["status"], "completed");
}

TEST(ServeResponses, CutRepliesAreIncomplete) {
  const ResponsesRequest request =
      accepted_response(R"({"model":"kimi-k3","input":"x","max_output_tokens":5})");
  const ResponseIds ids = new_response_ids("resp_");
  using K = ServiceEvent::Kind;
  // Cut while thinking: the reasoning item is the incomplete one, no message.
  const std::vector<ServiceEvent> thinking = {text_event(K::reasoning, "Hmm"),
                                              done_event(FinishReason::length)};
  const Streamed s = run_stream(request, ids, thinking);
  EXPECT_EQ(s.types.back(), "response.incomplete");
  const json cut = responses_json(collected(thinking), request, ids);
  expect_consistent(s, cut);
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_TRUE(cut["completed_at"].is_null());
  ASSERT_EQ(cut["output"].size(), 1u);
  EXPECT_EQ(cut["output"][0]["status"], "incomplete");
  EXPECT_EQ(cut["max_output_tokens"], 5);
  // Nothing written at all: one empty message.
  const std::vector<ServiceEvent> nothing = {done_event(FinishReason::stop)};
  const Streamed e = run_stream(request, ids, nothing);
  const json empty = responses_json(collected(nothing), request, ids);
  expect_consistent(e, empty);
  ASSERT_EQ(empty["output"].size(), 1u);
  EXPECT_EQ(empty["output"][0]["type"], "message");
  EXPECT_EQ(empty["output"][0]["content"][0]["text"], "");
}

TEST(ServeResponses, EngineFailureEndsTheStreamWithResponseFailed) {
  const ResponsesRequest request = accepted_response(R"({"model":"kimi-k3","input":"x"})");
  ResponsesStream stream(request, new_response_ids("resp_"));
  const size_t opening = stream.start().size();
  const auto deltas = stream.on_event(text_event(ServiceEvent::Kind::content, "Hal"));
  const auto failed = stream.on_error(
      api_error(500, "server_error", "engine_error", "engine failure during generation"));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]["type"], "response.failed");
  EXPECT_EQ(failed[0]["sequence_number"], static_cast<int64_t>(opening + deltas.size()));
  const json& r = failed[0]["response"];
  EXPECT_EQ(r["status"], "failed");
  EXPECT_EQ(r["error"]["code"], "server_error");
  EXPECT_EQ(r["error"]["message"], "engine failure during generation");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Hal");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
}

// POST /v1/responses through the route table, on a demo checkpoint (random weights).
struct DemoServer {
  std::unique_ptr<EngineService> service;
  DemoServer() {
    ServiceOptions o;
    o.model_dir = testing::kDemoDir;
    o.context = 512;
    o.ckpt_slots = 0;
    service = std::make_unique<EngineService>(o);
    for (int i = 0; i < 600 && !service->engine(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
};

HttpRequest post(const std::string& path, const std::string& body) {
  HttpRequest r;
  r.method = "POST";
  r.path = r.target = path;
  r.remote_addr = "127.0.0.1";
  r.headers = {{"Host", "127.0.0.1:8000"},
               {"Content-Type", "application/json"},
               {"Content-Length", std::to_string(body.size())}};
  r.body = body;
  return r;
}

// Output items with their ids (which name the response) left out.
std::string without_ids(json output) {
  for (json& item : output) item.erase("id");
  return output.dump();
}

struct StringSink : StreamSink {
  std::string bytes;
  bool write(std::string_view b) override {
    bytes.append(b);
    return true;
  }
};

TEST(ServeResponses, ServedThroughTheRouteTable) {
  static DemoServer demo;
  ASSERT_NE(demo.service->engine(), nullptr) << demo.service->stats().load_error;
  ServerOptions options;
  options.security.port = 8000;
  Router router(*demo.service, options);
  const std::string body =
      R"({"model":"kimi-k3","input":"Hi","max_output_tokens":3,"temperature":0,)"
      R"("reasoning":{"effort":"none"}})";
  const HttpResponse res = router.serve(post("/v1/responses", body));
  ASSERT_EQ(res.status, 200) << res.body;
  const json j = json::parse(res.body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["usage"]["output_tokens"], 3);
  // The same conversation as a chat completion: the same prompt, the same greedy text.
  const HttpResponse c = router.serve(
      post("/v1/chat/completions",
           R"({"model":"kimi-k3","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,)"
           R"("temperature":0,"reasoning_effort":"none"})"));
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = json::parse(c.body);
  EXPECT_EQ(j["usage"]["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(j["output"].back()["content"][0]["text"], cj["choices"][0]["message"]["content"]);
  // Streamed: named events, no [DONE], the terminal event's response equal to the JSON answer's
  // output.
  HttpResponse streamed =
      router.serve(post("/v1/responses", body.substr(0, body.size() - 1) + R"(,"stream":true})"));
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.content_type, "text/event-stream");
  ASSERT_TRUE(streamed.stream);
  StringSink sink;
  EXPECT_TRUE(streamed.stream(sink));
  EXPECT_EQ(sink.bytes.rfind("event: response.created\ndata: {", 0), 0u) << sink.bytes;
  EXPECT_EQ(sink.bytes.find("[DONE]"), std::string::npos);
  const size_t last = sink.bytes.rfind("event: response.incomplete\ndata: ");
  ASSERT_NE(last, std::string::npos) << sink.bytes;
  const json terminal = json::parse(sink.bytes.substr(last + 33));
  EXPECT_EQ(without_ids(terminal["response"]["output"]), without_ids(j["output"]));
  // Stateless: stored responses do not exist; GET is not the endpoint.
  HttpRequest get = post("/v1/responses/resp_123", "");
  get.method = "GET";
  const HttpResponse missing = router.serve(get);
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("stores nothing"), std::string::npos) << missing.body;
  HttpRequest list = post("/v1/responses", "");
  list.method = "GET";
  EXPECT_EQ(router.serve(list).status, 405);
  const HttpResponse refused =
      router.serve(post("/v1/responses", R"({"model":"kimi-k3","input":"x",)"
                                         R"("previous_response_id":"resp_1"})"));
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(json::parse(refused.body)["error"]["param"], "previous_response_id");
}

}  // namespace
}  // namespace k3::server
