// server/handlers.h — every endpoint of `coli serve` as a function HttpRequest → HttpResponse
// over one EngineService (docs/serving.md). The route table (server/routes.cpp) binds them to
// methods and paths; nothing here knows sockets: a waiting handler polls
// HttpRequest::client_gone, a streamed answer is an HttpResponse::stream producer. This file
// and handlers.cpp are the only ones of server/ that speak to the engine's service.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/service.h"
#include "server/error.h"
#include "server/http_types.h"
#include "server/server_options.h"

namespace k3::server {

// HTTP responses by route label and status, for /metrics; and the generation figures of requests
// whose log line is not written yet (by request id; Router::log_line takes them out).
struct RequestCounters {
  std::mutex mutex;
  std::map<std::pair<std::string, int>, int64_t> by_route_status;
  std::map<std::string, GenerationStats> finished;
  // A generation of request `id` ended with `stats` (kept for its log line; bounded).
  void note(const std::string& id, const GenerationStats& stats);
};

// What the handlers share (owned by the Router).
struct HandlerContext {
  EngineService& service;
  const ServerOptions& options;
  RequestCounters& counters;
  const std::atomic<bool>& draining;  // shutting down: generations answer 503
  double started = 0;                 // now_seconds() at start-up
  int64_t started_unix = 0;
};

// The request carries a valid API key (always true when no key is configured).
bool authorised(const ServerOptions& options, const HttpRequest& request);

void set_json(HttpResponse& res, int status, const json& body);

// Shutdown: the service stops admitting, the active generation may finish within the drain
// timeout, then it is cancelled.
void drain_generations(const HandlerContext& c);

// GET /health, /v1/health: 503 with progress while loading; details only with a valid key.
HttpResponse health(const HandlerContext& c, const HttpRequest& req);
// GET /v1/models, /v1/models/{id}.
HttpResponse list_models(const HandlerContext& c, const HttpRequest& req);
HttpResponse get_model(const HandlerContext& c, const HttpRequest& req);
// POST /v1/chat/completions and /v1/completions: JSON, or an SSE stream.
HttpResponse chat_completions(const HandlerContext& c, const HttpRequest& req);
HttpResponse completions(const HandlerContext& c, const HttpRequest& req);
// POST /completion: llama-server's native completion (prompt, n_predict, json_schema, grammar).
HttpResponse llama_completion(const HandlerContext& c, const HttpRequest& req);
// GET /metrics (Prometheus), GET /slots, POST /slots/0?action=erase.
HttpResponse metrics(const HandlerContext& c, const HttpRequest& req);
HttpResponse slots(const HandlerContext& c, const HttpRequest& req);
HttpResponse erase_slot(const HandlerContext& c, const HttpRequest& req);
// GET /props: llama-server's server properties (model, context, default generation settings,
// chat template, build); 503 while loading.
HttpResponse props(const HandlerContext& c, const HttpRequest& req);
// POST /apply-template: a chat body's messages (tools, thinking) → {"prompt": rendered text}.
HttpResponse apply_template(const HandlerContext& c, const HttpRequest& req);
// POST /tokenize, /detokenize.
HttpResponse tokenize(const HandlerContext& c, const HttpRequest& req);
HttpResponse detokenize(const HandlerContext& c, const HttpRequest& req);
// GET of the embedded web page: `/` and the page's own files, nothing else (an unknown path such
// as /props or /api/tags is a JSON 404, never the page: a client probing for another server's API
// must not read HTML as success); 404 when the page is off.
HttpResponse web_page(const HandlerContext& c, const HttpRequest& req);
// 404 "no such path" (GET of an unknown API path).
HttpResponse no_such_path(const HttpRequest& req);
// 404 as the HTTP library answers it (another method on a known path, an unknown POST path).
HttpResponse not_found(const HttpRequest& req);
// 405 for GET on a POST route.
HttpResponse post_only(const HttpRequest& req);

}  // namespace k3::server
