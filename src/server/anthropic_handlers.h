// server/anthropic_handlers.h — the handlers of the Anthropic Messages API (docs/serving.md
// §3.18), bound by the route table (server/routes.cpp). Every answer, refusals included, is in
// Anthropic's error envelope (server/error.h).
#pragma once

#include "handlers.h"

namespace k3::server {

// POST /v1/messages: a Message as JSON, or the named SSE events when `stream`.
HttpResponse anthropic_messages(const HandlerContext& c, const HttpRequest& req);
// POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt the same body would be given.
HttpResponse anthropic_count_tokens(const HandlerContext& c, const HttpRequest& req);
// 405 for GET on a Messages route; 404 for anything else under /v1/messages.
HttpResponse anthropic_post_only(const HttpRequest& req);
HttpResponse anthropic_not_found(const HttpRequest& req);

}  // namespace k3::server
