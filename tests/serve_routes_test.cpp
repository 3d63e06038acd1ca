// The route table of `coli serve` called with no socket (server/routes.h): the API-key guard and
// its brake, unknown paths and wrong methods, /v1/models and /tokenize answered by the handlers
// over a demo checkpoint (real tokenizer, random weights), the body limit before and after the
// body is read, and the labels /metrics counts under.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "engine/service.h"
#include "io/model_files.h"
#include "model/tensor_names.h"
#include "serve_demo.h"
#include "server/routes.h"
#include "test_util.h"

namespace k3::server {
namespace {

// One service for every test (a Router per test: the brake and the counters start empty).
ServerOptions server_options() {
  ServerOptions o;
  o.security.port = 8000;
  o.security.api_keys = {"sk-test"};
  o.max_body_bytes = 1024;
  return o;
}

HttpRequest request(std::string method, std::string path, std::string body = "",
                    const char* key = "sk-test") {
  return testing::demo_request(std::move(method), std::move(path), std::move(body), key);
}

json body_of(const HttpResponse& res) {
  return json::parse(res.body);
}

void expect_error(const HttpResponse& res, int status, const std::string& code) {
  EXPECT_EQ(res.status, status) << res.body;
  ASSERT_EQ(res.content_type, "application/json");
  const json b = body_of(res);
  ASSERT_TRUE(b.contains("error")) << res.body;
  EXPECT_EQ(b["error"]["code"], code) << res.body;
  EXPECT_TRUE(b["error"].contains("message") && b["error"].contains("type") &&
              b["error"].contains("param"));
  EXPECT_FALSE(res.header("x-request-id").empty());
}

void wait_ready(EngineService& service) {
  for (int i = 0; i < 600 && !service.engine(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(service.engine(), nullptr) << service.stats().load_error;
}

TEST(ServeApi, RoutesRefuseAMissingOrWrongKey) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  for (const char* key : {static_cast<const char*>(nullptr), "sk-wrong"}) {
    const HttpResponse res = router.serve(request("GET", "/v1/models", "", key));
    expect_error(res, 401, "invalid_api_key");
    EXPECT_EQ(res.header("WWW-Authenticate"), "Bearer");
    EXPECT_TRUE(res.closes());
  }
  // The same class for every API path, known or not, and for another method on it.
  expect_error(router.serve(request("POST", "/tokenize", "{}", nullptr)), 401, "invalid_api_key");
  expect_error(router.serve(request("GET", "/v1/nope", "", nullptr)), 401, "invalid_api_key");
  expect_error(router.serve(request("PUT", "/metrics", "", nullptr)), 401, "invalid_api_key");
  // /health and the web page are open.
  EXPECT_NE(router.serve(request("GET", "/health", "", nullptr)).status, 401);
  EXPECT_EQ(router.serve(request("GET", "/", "", nullptr)).status, 200);
  // A valid key passes.
  const HttpResponse ok = router.serve(request("GET", "/v1/models"));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(body_of(ok)["data"][0]["id"], "kimi-k3");
}

TEST(ServeApi, RoutesBrakeRepeatedKeyFailures) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  for (int i = 0; i < 20; ++i)
    expect_error(router.serve(request("GET", "/slots", "", "sk-guess")), 401, "invalid_api_key");
  // Blocked now for wrong keys; the right key still passes.
  const HttpResponse res = router.serve(request("GET", "/slots", "", "sk-guess"));
  expect_error(res, 429, "too_many_auth_failures");
  EXPECT_FALSE(res.header("Retry-After").empty());
  EXPECT_EQ(router.serve(request("GET", "/slots")).status, 200);
  HttpRequest other = request("GET", "/slots", "", "sk-guess");
  other.remote_addr = "10.0.0.2";  // another address is not blocked
  expect_error(router.serve(other), 401, "invalid_api_key");
}

TEST(ServeApi, RoutesUnknownPathsAndWrongMethods) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  expect_error(router.serve(request("GET", "/v1/nope")), 404, "not_found");
  expect_error(router.serve(request("POST", "/v1/nope", "{}")), 404, "not_found");
  expect_error(router.serve(request("GET", "/v1/models/")), 404, "not_found");
  EXPECT_EQ(body_of(router.serve(request("GET", "/v1/models/kimi-k3")))["id"], "kimi-k3");
  const HttpResponse get = router.serve(request("GET", "/v1/chat/completions"));
  expect_error(get, 405, "method_not_allowed");
  EXPECT_EQ(get.header("Allow"), "POST, OPTIONS");
  expect_error(router.serve(request("POST", "/health", "{}")), 404, "not_found");
  // The web page: `/` and its files; any other path is a JSON 404 (another server's API paths
  // that clients probe included), and no hidden files.
  EXPECT_EQ(router.serve(request("GET", "/")).content_type.rfind("text/html", 0), 0u);
  EXPECT_EQ(router.serve(request("GET", "/index.html")).content_type.rfind("text/html", 0), 0u);
  for (const char* path : {"/some/page", "/api/tags", "/version", "/api/version", "/v2/models"})
    expect_error(router.serve(request("GET", path)), 404, "not_found");
  expect_error(router.serve(request("GET", "/.env")), 404, "not_found");
  // The preflight and a foreign Host.
  HttpRequest preflight = request("OPTIONS", "/v1/chat/completions", "", nullptr);
  preflight.headers.emplace_back("Origin", "http://localhost:8000");
  const HttpResponse cors = router.serve(preflight);
  EXPECT_EQ(cors.status, 204);
  EXPECT_EQ(cors.header("Access-Control-Allow-Origin"), "http://localhost:8000");
  HttpRequest rebound = request("GET", "/v1/models");
  rebound.headers[0].second = "evil.example";
  expect_error(router.serve(rebound), 403, "host_not_allowed");
}

TEST(ServeApi, RoutesTokenizeThroughTheTable) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  wait_ready(service);
  const HttpResponse res =
      router.serve(request("POST", "/tokenize", R"({"content":"hello world"})"));
  ASSERT_EQ(res.status, 200) << res.body;
  std::vector<int32_t> expected;
  service.engine()->tokenizer()->encode("hello world", false, expected);
  EXPECT_EQ(body_of(res)["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_FALSE(expected.empty());
  const HttpResponse back =
      router.serve(request("POST", "/detokenize", json{{"tokens", expected}}.dump()));
  ASSERT_EQ(back.status, 200) << back.body;
  EXPECT_EQ(body_of(back)["content"], "hello world");
  expect_error(router.serve(request("POST", "/tokenize", R"({"content":1})")), 400,
               "invalid_value");
  // Content-Type is checked before the route runs.
  HttpRequest text = request("POST", "/tokenize", R"({"content":"x"})");
  text.headers[2].second = "text/plain";
  expect_error(router.serve(text), 415, "unsupported_media_type");
}

TEST(ServeApi, RoutesBodyLimit) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  const std::string big = R"({"content":")" + std::string(2000, 'a') + R"("})";
  // Refused on its Content-Length, before any body is read: the connection closes, what the
  // client still sends is drained.
  HttpRequest head = request("POST", "/tokenize", big);
  head.body.clear();
  const HttpResponse early = router.serve(head);
  expect_error(early, 413, "request_too_large");
  EXPECT_TRUE(early.closes());
  EXPECT_TRUE(early.unread_body);
  // A chunked body (no Content-Length) past the limit once read.
  HttpRequest chunked = request("POST", "/tokenize", big);
  chunked.headers.back() = {"Transfer-Encoding", "chunked"};
  const HttpResponse late = router.serve(chunked);
  expect_error(late, 413, "request_too_large");
  EXPECT_TRUE(late.closes());
  // No length at all.
  HttpRequest none = request("POST", "/tokenize", "{}");
  none.headers.pop_back();
  expect_error(router.serve(none), 411, "length_required");
  EXPECT_EQ(router.find("POST", "/tokenize")->body_limit, 1024u);
}

TEST(ServeApi, RouteTableLabelsAndLogging) {
  EngineService& service = testing::serve_demo_service();
  Router router(service, server_options());
  EXPECT_EQ(router.label("GET", "/v1/models/kimi-k3"), "/v1/models/{id}");
  EXPECT_EQ(router.label("HEAD", "/v1/models"), "/v1/models");
  EXPECT_EQ(router.label("POST", "/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(router.label("GET", "/app.js"), "static");
  EXPECT_EQ(router.label("GET", "/v1/unknown/a/b"), "/v1/*");
  EXPECT_EQ(router.find("GET", "/health")->auth, AuthClass::open);
  EXPECT_EQ(router.find("GET", "/v1/health")->auth, AuthClass::open);  // the same route
  EXPECT_EQ(router.label("GET", "/v1/health"), "/health");
  EXPECT_FALSE(router.record("GET", "/v1/health", 200));
  EXPECT_FALSE(router.record("GET", "/health", 200));  // not logged
  EXPECT_TRUE(router.record("POST", "/v1/chat/completions", 200));
  const HttpResponse m = router.serve(request("GET", "/metrics"));
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("k3_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1\n"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("k3_requests_total{endpoint=\"/health\",status=\"200\"} 2\n"),
            std::string::npos);
  // Labels are route-table entries: fifty probed paths add one label, not fifty.
  for (int i = 0; i < 50; ++i) router.record("GET", "/probe-" + std::to_string(i), 404);
  const std::string after = router.serve(request("GET", "/metrics")).body;
  EXPECT_EQ(after.find("probe-"), std::string::npos);
  EXPECT_NE(after.find("k3_requests_total{endpoint=\"static\",status=\"404\"} 50\n"),
            std::string::npos)
      << after;
}

// Anthropic's routes answer in Anthropic's envelope, the guards' refusals included; a Message
// and count_tokens through the table over the demo model (docs/serving.md §3.15).
void expect_anthropic_error(const HttpResponse& res, int status, const std::string& type) {
  EXPECT_EQ(res.status, status) << res.body;
  const json b = body_of(res);
  EXPECT_EQ(b["type"], "error") << res.body;
  EXPECT_EQ(b["error"]["type"], type) << res.body;
  EXPECT_FALSE(b["error"]["message"].get<std::string>().empty());
  EXPECT_FALSE(b.contains("code"));
}

TEST(ServeApi, RoutesAnthropicMessages) {
  EngineService& service = testing::serve_demo_service();
  wait_ready(service);
  Router router(service, server_options());
  const std::string body =
      R"({"model":"kimi-k3","max_tokens":3,"temperature":0,"thinking":{"type":"disabled"},
          "messages":[{"role":"user","content":"Hello"}]})";
  expect_anthropic_error(router.serve(request("POST", "/v1/messages", body, nullptr)), 401,
                         "authentication_error");
  expect_anthropic_error(router.serve(request("POST", "/v1/messages/count_tokens", body, "bad")),
                         401, "authentication_error");
  HttpRequest text = request("POST", "/v1/messages", body);
  for (auto& [k, v] : text.headers)
    if (k == "Content-Type") v = "text/plain";
  expect_anthropic_error(router.serve(text), 415, "invalid_request_error");
  expect_anthropic_error(router.serve(request("POST", "/v1/messages", std::string(2000, ' '))), 413,
                         "request_too_large");
  expect_anthropic_error(router.serve(request("POST", "/v1/messages", "{")), 400,
                         "invalid_request_error");
  expect_anthropic_error(router.serve(request("GET", "/v1/messages")), 405,
                         "invalid_request_error");
  expect_anthropic_error(router.serve(request("GET", "/v1/messages/batches")), 404,
                         "not_found_error");
  expect_anthropic_error(router.serve(request("DELETE", "/v1/messages")), 404, "not_found_error");
  // The OpenAI routes keep OpenAI's envelope.
  expect_error(router.serve(request("POST", "/v1/chat/completions", "{}", nullptr)), 401,
               "invalid_api_key");
  // A prompt longer than the context: 400 in Anthropic's envelope, the code in details.
  std::string words;
  for (int i = 0; i < 440; ++i) words += "a ";  // one token a word: more than the 256 of context
  const HttpResponse big = router.serve(
      request("POST", "/v1/messages",
              R"({"model":"kimi-k3","max_tokens":3,"messages":[{"role":"user","content":")" +
                  words + "\"}]}"));
  expect_anthropic_error(big, 400, "invalid_request_error");
  EXPECT_EQ(body_of(big)["error"]["details"]["error_code"], "context_length_exceeded");

  const HttpResponse res = router.serve(request("POST", "/v1/messages", body));
  ASSERT_EQ(res.status, 200) << res.body;
  const json m = body_of(res);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(m["usage"]["output_tokens"], 3);
  EXPECT_EQ(res.header("request-id"), res.header("x-request-id"));
  const HttpResponse count = router.serve(request("POST", "/v1/messages/count_tokens", body));
  ASSERT_EQ(count.status, 200) << count.body;
  EXPECT_EQ(body_of(count)["input_tokens"],
            m["usage"]["input_tokens"].get<int64_t>() +
                m["usage"]["cache_read_input_tokens"].get<int64_t>());
  EXPECT_EQ(router.label("POST", "/v1/messages"), "/v1/messages");
}

// Any model name is the served model (/v1/models/{name} answers the served id), /v1/models lists
// the id and every alias; --strict-model makes other names a 404 naming what is served.
TEST(ServeApi, ModelsListAliasesAndAnswerAnyNameUnlessStrict) {
  EngineService& service = testing::serve_demo_service();
  ServerOptions o = server_options();
  o.api.aliases = {"k3", "kimi"};
  Router loose(service, o);
  const json list = body_of(loose.serve(request("GET", "/v1/models")));
  ASSERT_EQ(list["data"].size(), 3u) << list;
  EXPECT_EQ(list["data"][0]["id"], "kimi-k3");
  EXPECT_EQ(list["data"][1]["id"], "k3");
  EXPECT_EQ(list["data"][2]["id"], "kimi");
  EXPECT_EQ(body_of(loose.serve(request("GET", "/v1/models/k3")))["id"], "k3");
  const HttpResponse any = loose.serve(request("GET", "/v1/models/gpt-4o-mini"));
  EXPECT_EQ(any.status, 200) << any.body;
  EXPECT_EQ(body_of(any)["id"], "kimi-k3");
  o.api.strict_model = true;
  Router strict(service, o);
  const HttpResponse refused = strict.serve(request("GET", "/v1/models/gpt-4o-mini"));
  expect_error(refused, 404, "model_not_found");
  EXPECT_EQ(body_of(refused)["error"]["param"], "model");
  EXPECT_NE(body_of(refused)["error"]["message"].get<std::string>().find("'kimi'"),
            std::string::npos);
  EXPECT_EQ(strict.serve(request("GET", "/v1/models/kimi")).status, 200);
  // The generation routes: a chat for another name is a 404 only when strict.
  wait_ready(service);
  const std::string chat =
      R"({"model":"gpt-4o-mini","max_tokens":1,"messages":[{"role":"user","content":"hi"}]})";
  const HttpResponse served = loose.serve(request("POST", "/v1/chat/completions", chat));
  ASSERT_EQ(served.status, 200) << served.body;
  EXPECT_EQ(body_of(served)["model"], "kimi-k3");
  expect_error(strict.serve(request("POST", "/v1/chat/completions", chat)), 404, "model_not_found");
}

// The log line names the request's path (not the route's label), its bytes outside printable
// ASCII percent-encoded so a path cannot forge a line.
TEST(ServeApi, LogLineNamesThePath) {
  Router router(testing::serve_demo_service(), server_options());
  EXPECT_EQ(router.log_line("GET", "/favicon.ico", 404, "req-1"),
            "[http] req-1 GET /favicon.ico 404\n");
  EXPECT_EQ(router.log_line("GET", "/v1/models/gpt-4o", 200, "req-2"),
            "[http] req-2 GET /v1/models/gpt-4o 200\n");
  EXPECT_EQ(router.log_line("POST", "/v1/messages", 200, "req-3"),
            "[http] req-3 POST /v1/messages 200\n");
  EXPECT_EQ(router.log_line("GET", "/a b\n[http] forged%", 404, "req-4"),
            "[http] req-4 GET /a%20b%0A[http]%20forged%25 404\n");
  const std::string long_line = router.log_line("GET", "/" + std::string(1000, 'x'), 404, "r");
  EXPECT_LT(long_line.size(), 300u);
  EXPECT_NE(long_line.find("x... 404"), std::string::npos) << long_line;
}

// /health and /v1/health answer alike: status, Retry-After and body, for a client with and without
// the key, while ok and while draining (issue 28 item 11: /v1/health was a 401 without a key
// where /health said ok, and the draining 503 had no Retry-After).
void expect_same_health(Router& router, int status, const std::string& state) {
  for (const char* key : {static_cast<const char*>(nullptr), "sk-test"}) {
    const HttpResponse a = router.serve(request("GET", "/health", "", key));
    const HttpResponse b = router.serve(request("GET", "/v1/health", "", key));
    EXPECT_EQ(a.status, status) << a.body;
    EXPECT_EQ(b.status, status) << b.body;
    EXPECT_EQ(a.header("Retry-After"), b.header("Retry-After"));
    EXPECT_EQ(a.header("Retry-After").empty(), status == 200) << "a 503 carries Retry-After";
    json ja = body_of(a), jb = body_of(b);
    EXPECT_EQ(ja["status"], state) << a.body;
    // Read at two moments: the uptime, and the resident memory (the second path can fault in
    // another 64 KB window of code, as it did once the test programs were grouped).
    for (json* j : {&ja, &jb}) {
      j->erase("uptime_s");
      j->erase("memory");
    }
    EXPECT_EQ(ja, jb) << (key ? "with" : "without") << " the key";
    EXPECT_EQ(ja.contains("model"), key != nullptr) << "details only with the key";
  }
}

TEST(ServeApi, HealthAndV1HealthFollowOneRule) {
  EngineService service(testing::serve_demo_options());
  wait_ready(service);
  Router router(service, server_options());
  expect_same_health(router, 200, "ok");
  router.drain();  // nothing runs: returns at once, the service refusing new work
  expect_same_health(router, 503, "stopping");
}

// /health while every generation fails: 503 "degraded" (a probe notices), back to 200 "ok" once
// one ends normally. The scripted 3rd id is outside the vocabulary: fed back, it faults.
TEST(ServeApi, HealthReportsDegradedWhileGenerationsFail) {
  ServiceOptions o = testing::serve_demo_options();
  o.scripted_tokens = {1000, 1001, -5};
  EngineService service(o);
  wait_ready(service);
  Router router(service, server_options());
  auto chat = [&](int max_tokens) {
    return router.serve(
        request("POST", "/v1/chat/completions",
                json{{"model", "kimi-k3"},
                     {"max_tokens", max_tokens},
                     {"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})}}
                    .dump()));
  };
  EXPECT_EQ(router.serve(request("GET", "/health")).status, 200);
  expect_error(chat(8), 500, "engine_error");
  const HttpResponse bad = router.serve(request("GET", "/health"));
  EXPECT_EQ(bad.status, 503) << bad.body;
  EXPECT_EQ(body_of(bad)["status"], "degraded");
  EXPECT_EQ(body_of(bad)["failed_in_a_row"], 1);
  EXPECT_FALSE(body_of(bad)["last_error"].get<std::string>().empty());
  expect_same_health(router, 503, "degraded");
  EXPECT_EQ(chat(2).status, 200);  // the faulting id is never fed back
  const HttpResponse good = router.serve(request("GET", "/health"));
  EXPECT_EQ(good.status, 200) << good.body;
  EXPECT_EQ(body_of(good)["status"], "ok");
}

// A routed expert whose MXFP4 scale byte is 255 (NaN): the server starts (the experts are streamed,
// not read at load), and the read that finds it fails the request with a 500 naming the tensor —
// plain and streamed — and /health turns degraded with the same message (issue 28, item 3).
TEST(ServeApi, ADamagedExpertScaleIsA500NamingTheTensorAndHealthDegrades) {
  testing::TempDir dir("serve-nan-scale");
  std::string shard;
  for (int64_t e = 0; e < 16; ++e) {  // every expert of layer 1: whatever the routing picks
    const std::string name = names::expert(1, e, names::kExpertTensors[1]);
    if (e == 0) {
      shard = testing::poisoned_copy(testing::kDemoDir, dir.path(), name, 0, "\xFF");
      continue;
    }
    const ModelFiles files(dir.path());
    const LocatedTensor t = files.find(name);
    ASSERT_EQ(t.shard->path(), shard);
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.info->file_offset));
    f.put('\xFF');
  }
  ServiceOptions o = testing::serve_demo_options();
  o.model_dir = dir.path();
  EngineService service(o);
  wait_ready(service);
  Router router(service, server_options());
  EXPECT_EQ(router.serve(request("GET", "/health")).status, 200);
  const std::string tensor = ".block_sparse_moe.experts.";
  const std::string what = ".w1.weight_scale holds exponent byte 255 (NaN in MXFP4)";
  const json chat = {{"model", "kimi-k3"},
                     {"max_tokens", 4},
                     {"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})}};
  const HttpResponse plain = router.serve(request("POST", "/v1/chat/completions", chat.dump()));
  expect_error(plain, 500, "engine_error");
  const std::string message = body_of(plain)["error"]["message"];
  EXPECT_HAS(message, "engine failure during prefill: " + shard + ": tensor ");
  EXPECT_HAS(message, tensor);
  EXPECT_HAS(message, what);
  json streamed = chat;
  streamed["stream"] = true;
  const HttpResponse sse = router.serve(request("POST", "/v1/chat/completions", streamed.dump()));
  ASSERT_TRUE(sse.stream) << sse.body;
  struct Events : StreamSink {
    std::string bytes;
    bool write(std::string_view b) override {
      bytes.append(b);
      return true;
    }
  } events;
  sse.stream(events);
  EXPECT_HAS(events.bytes, "\"code\":\"engine_error\"");
  EXPECT_HAS(events.bytes, what);
  const HttpResponse health = router.serve(request("GET", "/health"));
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_EQ(body_of(health)["status"], "degraded");
  EXPECT_HAS(body_of(health)["last_error"].get<std::string>(), what);
}

}  // namespace
}  // namespace k3::server
