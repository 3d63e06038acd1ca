// server/responses_handlers.h — the endpoints of the OpenAI Responses API (docs/serving.md §3.17),
// bound in the route table (server/routes.cpp). Stateless: nothing is stored between requests.
#pragma once

#include "handlers.h"

namespace k3::server {

// POST /v1/responses: a `response` object, or its SSE event stream (`stream: true`).
HttpResponse responses(const HandlerContext& c, const HttpRequest& req);
// Any method on /v1/responses/{id}[/...]: 404, this server stores no responses.
HttpResponse response_not_stored(const HandlerContext& c, const HttpRequest& req);

}  // namespace k3::server
