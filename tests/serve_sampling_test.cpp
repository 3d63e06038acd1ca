// The sampling extras of `coli serve` through the route table, with no socket, over a demo
// checkpoint (real tokenizer, random weights): log-probabilities on chat (OpenAI's shape) and
// completions (the legacy lists), streamed and not; the penalties as the sampler sees them (the
// chosen token is the argmax of the penalised logits, the reported logprobs are the raw ones);
// GET /props and POST /apply-template (docs/serving.md §3.15, §3.16).
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "engine/service.h"
#include "serve_demo.h"
#include "server/routes.h"
#include "test_util.h"
#include "text/chat.h"
#include "text/pyjson.h"

namespace k3::server {
namespace {

Router& router() {
  static Router r(testing::serve_demo_service(), [] {
    ServerOptions o;
    o.security.port = 8000;
    return o;
  }());
  for (int i = 0; i < 600 && !testing::serve_demo_service().engine(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(testing::serve_demo_service().engine(), nullptr)
      << testing::serve_demo_service().stats().load_error;
  return r;
}

HttpResponse call(std::string method, std::string path, std::string body = "") {
  return router().serve(testing::demo_request(std::move(method), std::move(path), std::move(body)));
}

json post_json(const std::string& path, const std::string& body) {
  const HttpResponse res = call("POST", path, body);
  EXPECT_EQ(res.status, 200) << res.body;
  EXPECT_FALSE(res.stream) << "expected a JSON answer";
  return json::parse(res.body);
}

// The data frames of a streamed answer, [DONE] excluded.
std::vector<json> post_stream(const std::string& path, const std::string& body) {
  HttpResponse res = call("POST", path, body);
  EXPECT_EQ(res.status, 200) << res.body;
  struct Sink : StreamSink {
    std::string bytes;
    bool write(std::string_view b) override {
      bytes.append(b);
      return true;
    }
  } sink;
  EXPECT_TRUE(res.stream) << res.body;
  if (!res.stream) return {};
  EXPECT_TRUE(res.stream(sink));
  if (res.on_finish) res.on_finish(true);
  std::vector<json> out;
  size_t at = 0;
  while ((at = sink.bytes.find("data: ", at)) != std::string::npos) {
    const size_t end = sink.bytes.find("\n\n", at);
    const std::string data = sink.bytes.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data));
    at = end;
  }
  return out;
}

std::string bytes_of(const json& entry) {
  std::string out;
  for (const json& b : entry["bytes"]) out += static_cast<char>(b.get<int>());
  return out;
}

// One chat logprobs entry: the OpenAI fields, top_logprobs sorted, the token among its
// alternatives' ranking consistent with greedy (the chosen one is the most likely).
void expect_greedy_entry(const json& e, size_t top) {
  ASSERT_TRUE(e.contains("token") && e.contains("logprob") && e.contains("bytes") &&
              e.contains("top_logprobs"))
      << e.dump();
  EXPECT_LE(e["logprob"].get<double>(), 0.0);
  ASSERT_EQ(e["top_logprobs"].size(), top) << e.dump();
  for (size_t i = 0; i < top; ++i) {
    const json& alt = e["top_logprobs"][i];
    ASSERT_TRUE(alt.contains("token") && alt.contains("logprob") && alt.contains("bytes"));
    EXPECT_FALSE(alt.contains("top_logprobs"));
    if (i > 0) {
      EXPECT_GE(e["top_logprobs"][i - 1]["logprob"], alt["logprob"]);
    }
  }
  // Temperature 0 and no penalty: the chosen token is the argmax of the very logits reported.
  EXPECT_EQ(bytes_of(e), bytes_of(e["top_logprobs"][0])) << e.dump();
  EXPECT_DOUBLE_EQ(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>());
}

const char* kChat =
    R"({"model":"kimi-k3","messages":[{"role":"user","content":"Count: one two three"}],
        "temperature":0,"max_tokens":8,"reasoning_effort":"none","logprobs":true,"top_logprobs":3)";

TEST(ServeSampling, ChatLogprobsNonStreamingAndStreamed) {
  const json whole = post_json("/v1/chat/completions", std::string(kChat) + "}");
  const json& choice = whole["choices"][0];
  ASSERT_TRUE(choice["logprobs"].is_object()) << whole.dump();
  EXPECT_TRUE(choice["logprobs"]["refusal"].is_null());
  const json& content = choice["logprobs"]["content"];
  ASSERT_TRUE(content.is_array());
  // Thinking off: every generated token but a stop id is a content token.
  const int64_t generated = whole["usage"]["completion_tokens"].get<int64_t>();
  const bool stopped = choice["finish_reason"] == "stop";
  EXPECT_EQ(static_cast<int64_t>(content.size()), generated - (stopped ? 1 : 0)) << whole.dump();
  ASSERT_FALSE(content.empty());
  std::string joined;
  for (const json& e : content) {
    expect_greedy_entry(e, 3);
    joined += bytes_of(e);
  }
  EXPECT_EQ(joined, choice["message"]["content"].get<std::string>());

  // Streamed: the same entries, spread over the content chunks; the others carry null.
  json streamed = json::array();
  for (const json& chunk :
       post_stream("/v1/chat/completions", std::string(kChat) + R"(,"stream":true})")) {
    if (chunk["choices"].empty()) continue;
    const json& c = chunk["choices"][0];
    if (c["delta"].contains("content") && !c["logprobs"].is_null()) {
      for (const json& e : c["logprobs"]["content"]) streamed.push_back(e);
    } else {
      EXPECT_TRUE(c["logprobs"].is_null()) << chunk.dump();
    }
  }
  EXPECT_EQ(streamed, content);

  // Not asked for: null, and the same text (logprobs change no token).
  json plain_body = json::parse(std::string(kChat) + "}");
  plain_body.erase("logprobs");
  plain_body.erase("top_logprobs");
  const json plain = post_json("/v1/chat/completions", plain_body.dump());
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(plain["choices"][0]["message"]["content"], choice["message"]["content"]);
}

TEST(ServeSampling, CompletionLogprobsLegacyShape) {
  const std::string body =
      R"({"model":"kimi-k3","prompt":"Once upon a time","temperature":0,"max_tokens":6,"logprobs":2)";
  const json whole = post_json("/v1/completions", body + "}");
  const json& lp = whole["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << whole.dump();
  const size_t n = lp["tokens"].size();
  ASSERT_GT(n, 0u);
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  std::string joined;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), static_cast<int64_t>(joined.size()));
    joined += lp["tokens"][i].get<std::string>();
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 2u) << top.dump();
    // Greedy: the chosen token's logprob is the best of its alternatives.
    double best = -1e300;
    for (auto it = top.begin(); it != top.end(); ++it) best = std::max(best, it->get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best);
  }
  EXPECT_EQ(joined, whole["choices"][0]["text"].get<std::string>());

  // Streamed: the lists split over the chunks, offsets running on.
  json tokens = json::array(), offsets = json::array();
  for (const json& chunk : post_stream("/v1/completions", body + R"(,"stream":true})")) {
    if (chunk["choices"].empty()) continue;
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const json& t : l["tokens"]) tokens.push_back(t);
    for (const json& o : l["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

TEST(ServeSampling, PenaltiesChooseTheArgmaxOfThePenalisedLogits) {
  // Greedy with frequency and presence penalties: each chosen token beats every reported
  // alternative once c x frequency + presence is taken off each token generated c times so far
  // (the reported logprobs are the raw log-softmax, before the penalties: the same shift for
  // every token, so differences compare). The demo model's logits are flat and its greedy reply
  // never repeats, so the penalties are negative: they reward repeats, which changes the reply.
  const double frequency = -2.0, presence = -2.0;
  const json base = json::parse(
      R"({"model":"kimi-k3","prompt":"a b c","temperature":0,"max_tokens":32,"logprobs":20})");
  json body = base;
  body["frequency_penalty"] = frequency;
  body["presence_penalty"] = presence;
  const json out = post_json("/v1/completions", body.dump());
  const json& lp = out["choices"][0]["logprobs"];
  std::map<std::string, int> count;
  auto penalised = [&](const std::string& token, double logprob) {
    const auto it = count.find(token);
    return it == count.end() ? logprob : logprob - (it->second * frequency + presence);
  };
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const std::string chosen = lp["tokens"][i];
    const double score = penalised(chosen, lp["token_logprobs"][i].get<double>());
    const json& top = lp["top_logprobs"][i];
    for (auto it = top.begin(); it != top.end(); ++it)
      EXPECT_GE(score + 1e-9, penalised(it.key(), it->get<double>()))
          << "step " << i << ": '" << chosen << "' chosen over '" << it.key() << "'";
    ++count[chosen];
  }
  EXPECT_LT(count.size(), lp["tokens"].size()) << "the rewarded reply should repeat a token";
  const json plain = post_json("/v1/completions", base.dump());
  EXPECT_NE(out["choices"][0]["text"], plain["choices"][0]["text"]);
  // Neutral values are no penalty at all: the same tokens as without them.
  json neutral = base;
  neutral["frequency_penalty"] = 0;
  neutral["presence_penalty"] = 0;
  neutral["repeat_penalty"] = 1;
  EXPECT_EQ(post_json("/v1/completions", neutral.dump())["choices"][0]["text"],
            plain["choices"][0]["text"]);
  // The repeat penalty reaches the sampler too (below 1 it rewards the window's tokens).
  json repeat = base;
  repeat["repeat_penalty"] = 0.05;
  repeat["repeat_last_n"] = -1;
  EXPECT_NE(post_json("/v1/completions", repeat.dump())["choices"][0]["text"],
            plain["choices"][0]["text"]);
}

// The filters reach the sampler on every API shape: a sampled request (temperature 1, a seed)
// whose sampled text differs from the greedy one gives the greedy text with top_k 1, and with
// min_p 1 (only the most likely token passes), where the API has min_p.
TEST(ServeSampling, TopKOneAndMinPOneMakeASampledRequestGreedy) {
  struct Api {
    std::string path;
    std::string body;  // without the closing brace
    std::string (*text)(const json&);
    bool has_min_p;
  };
  const std::vector<Api> apis = {
      {"/v1/chat/completions",
       R"({"model":"kimi-k3","messages":[{"role":"user","content":"Tell me a story."}],
           "max_tokens":12,"reasoning_effort":"none")",
       [](const json& j) { return j["choices"][0]["message"]["content"].get<std::string>(); },
       true},
      {"/v1/completions", R"({"model":"kimi-k3","prompt":"Once upon a time","max_tokens":12)",
       [](const json& j) { return j["choices"][0]["text"].get<std::string>(); }, true},
      {"/v1/messages",
       R"({"model":"kimi-k3","messages":[{"role":"user","content":"Tell me a story."}],
           "max_tokens":12,"thinking":{"type":"disabled"})",
       [](const json& j) {
         std::string out;
         for (const json& b : j["content"])
           if (b["type"] == "text") out += b["text"].get<std::string>();
         return out;
       },
       false},
      {"/v1/responses",
       R"({"model":"kimi-k3","input":"Tell me a story.","max_output_tokens":12,
           "reasoning":{"effort":"none"})",
       [](const json& j) {
         std::string out;
         for (const json& item : j["output"])
           if (item["type"] == "message")
             for (const json& part : item["content"]) out += part["text"].get<std::string>();
         return out;
       },
       true},
  };
  for (const Api& api : apis) {
    auto text = [&](const std::string& extra) {
      return api.text(post_json(api.path, api.body + "," + extra + "}"));
    };
    const std::string greedy = text(R"("temperature":0)");
    ASSERT_FALSE(greedy.empty()) << api.path;
    // The case can tell: without a filter the sampled text is another.
    EXPECT_NE(text(R"("temperature":1,"seed":11)"), greedy) << api.path;
    EXPECT_EQ(text(R"("temperature":1,"seed":11,"top_k":1)"), greedy) << api.path << " top_k 1";
    if (api.has_min_p) {
      EXPECT_EQ(text(R"("temperature":1,"seed":11,"min_p":1)"), greedy) << api.path << " min_p 1";
    }
  }
}

// GET /v1/models says what the model is when the server was told (coli serve on the built-in
// model), and says nothing otherwise.
TEST(ServeSampling, ModelsCarryTheDescription) {
  const json plain = json::parse(call("GET", "/v1/models").body);
  EXPECT_FALSE(plain["data"][0]["meta"].contains("description")) << plain.dump();
  ServerOptions o;
  o.api.model_description = "k3-mini: a small model.";
  Router described(testing::serve_demo_service(), o);
  const HttpResponse res = described.serve(testing::demo_request("GET", "/v1/models"));
  ASSERT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(json::parse(res.body)["data"][0]["meta"]["description"], "k3-mini: a small model.");
  const HttpResponse one = described.serve(testing::demo_request("GET", "/v1/models/kimi-k3"));
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(json::parse(one.body)["meta"]["description"], "k3-mini: a small model.");
}

TEST(ServeSampling, PropsDescribeTheServer) {
  const HttpResponse res = call("GET", "/props");
  ASSERT_EQ(res.status, 200) << res.body;
  const json p = json::parse(res.body);
  EXPECT_EQ(p["model_alias"], "kimi-k3");
  EXPECT_EQ(p["model_path"], testing::kDemoDir);
  EXPECT_EQ(p["total_slots"], 1);
  EXPECT_EQ(p["default_generation_settings"]["n_ctx"], 256);
  const json& params = p["default_generation_settings"]["params"];
  const ApiConfig api;
  EXPECT_EQ(params["temperature"], api.default_temperature);
  EXPECT_EQ(params["top_p"], api.default_top_p);
  EXPECT_EQ(params["n_predict"], api.max_tokens_ceiling);
  EXPECT_EQ(params["repeat_penalty"], 1.0);
  EXPECT_EQ(params["repeat_last_n"], 64);
  EXPECT_EQ(params["frequency_penalty"], 0.0);
  EXPECT_TRUE(p["chat_template"].is_string());
  EXPECT_EQ(p["modalities"]["vision"], false);
  EXPECT_NE(p["build_info"].get<std::string>().find("coli"), std::string::npos);
  EXPECT_EQ(call("POST", "/props", "{}").status, 404);
}

TEST(ServeSampling, ApplyTemplateIsWhatRenderPrints) {
  const std::string messages =
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
          {"role":"assistant","content":"Hello.","reasoning_content":"greet"},
          {"role":"user","content":"Bye"}])";
  // What `coli render` prints for the same messages (apps/coli.cpp: render_request + join).
  auto expect_render = [&](const std::string& body, const std::string& options) {
    const json got = post_json("/apply-template", body);
    auto request =
        text::parse_pyjson(R"({"messages":)" + messages + R"(,"options":)" + options + "}");
    ASSERT_TRUE(request.ok());
    auto segments = text::render_request(*request);
    ASSERT_TRUE(segments.ok()) << segments.status().message();
    EXPECT_EQ(got["prompt"], text::join_segments(*segments)) << body;
  };
  expect_render(R"({"messages":)" + messages + "}", R"({"thinking_effort":"max"})");
  expect_render(R"({"messages":)" + messages + R"(,"reasoning_effort":"none"})",
                R"({"thinking":false})");
  const json got = post_json("/apply-template", R"({"messages":)" + messages + "}");
  EXPECT_NE(got["prompt"].get<std::string>().find("Bye"), std::string::npos);
  // The chat body's validation.
  EXPECT_EQ(call("POST", "/apply-template", R"({"messages":[]})").status, 400);
  EXPECT_EQ(call("POST", "/apply-template", R"({"messages":[{"role":"wizard"}]})").status, 400);
  EXPECT_EQ(call("GET", "/apply-template").status, 405);
}

}  // namespace
}  // namespace k3::server
