// server/responses_handlers.cpp — POST /v1/responses over the shared generation pipeline
// (server/generation.h): the body is translated into a chat request (server/responses.h), admitted
// like a chat completion, then answered as a `response` object or a stream of typed events.
#include "responses_handlers.h"

#include <memory>
#include <vector>

#include "generation.h"
#include "server/responses.h"

namespace k3::server {
namespace {

// Every Responses event is a named SSE event: `event: <type>` over `data: <event>`.
std::vector<SseFrame> named_frames(std::vector<json> events) {
  std::vector<SseFrame> frames;
  for (json& e : events) {
    std::string name = e["type"].get<std::string>();
    frames.push_back(SseFrame{std::move(name), std::move(e)});
  }
  return frames;
}

}  // namespace

HttpResponse responses(const HandlerContext& c, const HttpRequest& req) {
  HttpResponse res;
  auto parsed = parse_responses_request(req.body, c.options.api);
  if (auto* e = std::get_if<ApiError>(&parsed)) return error_response(*e);
  auto request =
      std::make_shared<const ResponsesRequest>(std::move(std::get<ResponsesRequest>(parsed)));
  ServiceEvent accepted;
  auto handle = admit_chat(c, request->chat, "input", req, res, accepted);
  if (!handle) return res;
  const ResponseIds ids = new_response_ids("resp_");
  if (!request->chat.stream) {
    ChatResult result;
    if (collect(c, handle, req, res, result))
      set_json(res, 200, responses_json(result, *request, ids));
    return res;
  }
  // The stream refers to the request: every callback holds both.
  auto stream = std::make_shared<ResponsesStream>(*request, ids);
  SseStyle style;
  style.done_marker = false;  // the terminal event ends the stream; no [DONE]
  style.error_frames = [request, stream](const ApiError& error) {
    return named_frames(stream->on_error(error));
  };
  serve_sse(
      c, req, res, handle, named_frames(stream->start()),
      [request, stream](const ServiceEvent& e) { return named_frames(stream->on_event(e)); },
      std::move(style));
  return res;
}

HttpResponse response_not_stored(const HandlerContext&, const HttpRequest& req) {
  return error_response(api_error(404, "invalid_request_error", "not_found",
                                  "no stored response '" + req.path_param +
                                      "': this server stores nothing and serves only "
                                      "POST /v1/responses",
                                  "response_id"));
}

}  // namespace k3::server
