// server/anthropic_handlers.cpp — POST /v1/messages and /v1/messages/count_tokens over the shared
// generation pipeline (server/generation.h); the translation is server/anthropic.h.
#include "anthropic_handlers.h"

#include <memory>

#include "generation.h"
#include "server/anthropic.h"

namespace k3::server {
namespace {

HttpResponse refusal(const ApiError& error) {
  return error_response(error, ErrorStyle::anthropic);
}

// The pipeline (tokenizer_or_503, admit, collect) writes its refusals in OpenAI's envelope:
// rewritten in Anthropic's, the status, headers and message kept.
void restyle(HttpResponse& res) {
  if (res.status < 400 || res.content_type != "application/json") return;
  const json body = json::parse(res.body, nullptr, false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return;
  const json& openai = body["error"];
  ApiError e;
  e.status = res.status;
  e.message = openai.value("message", "the request could not be served");
  if (openai.contains("code") && openai["code"].is_string()) e.code = openai["code"];
  if (openai.contains("param") && openai["param"].is_string()) e.param = openai["param"];
  res.body = anthropic_error_body(e).dump(-1, ' ', false, json::error_handler_t::replace);
}

// The validated request; false with `res` set to the refusal.
bool parse(const HandlerContext& c, const HttpRequest& req, bool count_only,
           std::shared_ptr<MessagesRequest>& request, HttpResponse& res) {
  auto parsed = parse_messages_request(req.body, c.options.api, count_only);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    res = refusal(*e);
    return false;
  }
  request = std::make_shared<MessagesRequest>(std::move(std::get<MessagesRequest>(parsed)));
  return true;
}

void stream_message(const HandlerContext& c, const HttpRequest& req, HttpResponse& res,
                    std::shared_ptr<RequestHandle> handle, const std::string& id,
                    const MessagesRequest& request, const ServiceEvent& accepted) {
  auto stream = std::make_shared<MessagesStream>(id, request.chat.model, request.omit_thinking);
  auto frames = [](NamedEvents events) {
    std::vector<SseFrame> out;
    for (auto& [name, data] : events) out.push_back(SseFrame{name, std::move(data)});
    return out;
  };
  SseStyle style;
  style.done_marker = false;
  style.ping = std::string(kAnthropicPing);
  style.error_frames = [](const ApiError& error) {
    return std::vector<SseFrame>{SseFrame{"error", anthropic_error_body(error)}};
  };
  serve_sse(
      c, req, res, std::move(handle), frames(stream->start(accepted.stats)),
      [stream, frames](const ServiceEvent& e) { return frames(stream->on_event(e)); },
      std::move(style));
}

}  // namespace

HttpResponse anthropic_messages(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  std::shared_ptr<MessagesRequest> request;
  if (c.draining.load()) return refusal(shutting_down());
  if (!parse(c, req, false, request, res)) return res;
  // Admitted as a chat completion is (render, context check, queue); its refusals restyled.
  ServiceEvent accepted;
  auto handle = admit_chat(c, request->chat, "messages", req, res, accepted);
  if (!handle) {
    restyle(res);
    return res;
  }
  const std::string id = new_response_ids("msg_").id;
  res.set_header("request-id", req.request_id);
  if (request->chat.stream) {
    stream_message(c, req, res, handle, id, *request, accepted);
    return res;
  }
  ChatResult result;
  if (collect(c, handle, req, res, result))
    set_json(res, 200,
             messages_response_json(result, id, request->chat.model, request->omit_thinking));
  else
    restyle(res);
  return res;
}

HttpResponse anthropic_count_tokens(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  std::shared_ptr<MessagesRequest> request;
  if (!parse(c, req, true, request, res)) return res;
  const text::Tokenizer* tokenizer = tokenizer_or_503(c, res);
  if (!tokenizer) {
    restyle(res);
    return res;
  }
  auto rendered = render_chat_prompt(request->chat, *tokenizer);  // counted whole: no context cap
  if (auto* e = std::get_if<ApiError>(&rendered)) return refusal(*e);
  set_json(
      res, 200,
      json{{"input_tokens", static_cast<int64_t>(std::get<RenderedPrompt>(rendered).ids.size())}});
  return res;
}

HttpResponse anthropic_post_only(const HttpRequest&) {
  HttpResponse res =
      refusal(api_error(405, "invalid_request_error", "method_not_allowed", "use POST"));
  res.set_header("Allow", "POST, OPTIONS");
  return res;
}

HttpResponse anthropic_not_found(const HttpRequest&) {
  return refusal(api_error(404, "invalid_request_error", "not_found", "no such path"));
}

}  // namespace k3::server
