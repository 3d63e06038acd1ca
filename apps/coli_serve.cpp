// apps/coli_serve.cpp — `coli serve` and `coli web`: the engine service behind the HTTP server.
// The listener is up before the model loads (/health answers 503 with progress meanwhile);
// SIGTERM / SIGINT drain gracefully and exit 143 / 130; a second signal ends the running request
// with its stream's terminator and exits at once.
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "apps/coli_commands.h"
#include "apps/stop_signals.h"
#include "engine/service.h"
#include "server/http_server.h"
#include "util/error.h"
#include "util/sys.h"

namespace coli {
namespace {

// Keys from --api-key-file: one per line, '#' comments; refused when group or world readable.
std::vector<std::string> read_key_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UsageError(path + ": cannot read the API key file");
  if ((st.st_mode & 0077) != 0)
    throw UsageError(path + ": the API key file is readable by other users (chmod 600 it)");
  std::ifstream in(path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t start = 0;
    while (start < line.size() && std::isspace(static_cast<unsigned char>(line[start]))) ++start;
    if (start < line.size()) keys.push_back(line.substr(start));
  }
  if (in.bad() || !in.eof()) throw UsageError(path + ": cannot read the API key file");
  if (keys.empty())
    throw UsageError(path + ": the API key file holds no key (one per line, '#' comments)");
  return keys;
}

// What the built-in model is (assets/k3-mini/README.md), said on the web page's start screen
// (GET /v1/models meta.description): people who open it should not expect answers.
constexpr const char* kBuiltinModelDescription =
    "k3-mini: an 11M-parameter model of the Kimi K3 architecture trained on the Brown corpus. "
    "It writes Brown-style English; it does not answer questions.";

}  // namespace

k3::ServiceOptions service_options(const k3::Options& opt) {
  k3::ServiceOptions s;
  s.model_dir = opt.model_dir;
  s.load = opt.load;
  s.context = opt.runtime.max_tokens;
  s.ckpt_slots = opt.serve.ckpt_slots;
  s.ckpt_dir = opt.serve.ckpt_dir;
  s.ckpt_keep = opt.serve.ckpt_keep;
  s.cache_dir = opt.serve.cache_dir;
  s.cache_gb = opt.serve.cache_gb;
  s.max_queue = static_cast<size_t>(opt.serve.max_queue);
  s.token_delay_ms = opt.serve.token_delay_ms;
  s.prefix_log = opt.serve.prefix_log;
  s.threads = opt.runtime.threads;
  s.scripted_tokens = opt.serve.script_ids;
  return s;
}

k3::server::ApiConfig api_config(const k3::Options& opt) {
  k3::server::ApiConfig api;
  api.model_id = opt.serve.model_id;
  api.aliases = opt.serve.aliases;
  api.strict_model = opt.serve.strict_model;
  api.max_tokens_ceiling = opt.serve.max_tokens;
  api.default_thinking = opt.serve.reasoning;
  api.reasoning_field = opt.serve.reasoning_field;
  api.default_temperature = opt.sampling.temperature;
  api.default_top_p = opt.sampling.top_p;
  api.default_top_k = opt.sampling.top_k;
  api.default_min_p = opt.sampling.min_p;
  if (opt.builtin_model) api.model_description = kBuiltinModelDescription;
  return api;
}

// --host as the address to bind: "[::1]" (the URL spelling) is ::1.
std::string bind_address(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

int serve(const k3::Options& opt, bool web) {
  k3::server::ServerOptions so;
  const std::string bind_host = bind_address(opt.serve.host);
  so.security.bind_host = bind_host;
  so.security.api_keys = opt.serve.api_keys;
  if (!opt.serve.api_key_file.empty())
    for (std::string& k : read_key_file(opt.serve.api_key_file))
      so.security.api_keys.push_back(std::move(k));
  for (const std::string& k : so.security.api_keys)
    if (k.size() > k3::server::kMaxApiKeyBytes)
      throw UsageError("an API key is longer than 512 bytes");
  if (opt.source("api-key") == k3::OptionSource::kFlag)
    std::fprintf(stderr,
                 "coli: warning: a key on the command line is visible to other users (ps); prefer "
                 "COLI_API_KEY or --api-key-file\n");
  so.security.allowed_hosts = opt.serve.allowed_hosts;
  so.security.cors_origins = opt.serve.cors_origins;
  const bool loopback = k3::server::is_loopback_host(bind_host);
  if (!loopback && so.security.api_keys.empty() && !opt.serve.insecure_bind)
    throw UsageError(
        "refusing to listen on " + bind_host +
        " without an API key: set --api-key / COLI_API_KEY, or --insecure-bind to accept the risk");
  const bool any_origin =
      std::find(so.security.cors_origins.begin(), so.security.cors_origins.end(), "*") !=
      so.security.cors_origins.end();
  if (any_origin && !loopback && so.security.api_keys.empty())
    throw UsageError("--cors-origin '*' with a non-loopback bind needs an API key");
  so.port = opt.serve.port;
  so.api = api_config(opt);
  so.max_body_bytes = static_cast<size_t>(opt.serve.max_body_mb * 1024 * 1024);
  so.queue_timeout_s = opt.serve.queue_timeout;
  so.sse_ping_s = opt.serve.sse_ping;
  so.drain_timeout_s = opt.serve.drain_timeout;
  so.max_connections = static_cast<int>(opt.serve.max_connections);
  so.read_timeout_s = opt.serve.read_deadline;
  so.max_connections_per_ip =
      opt.serve.max_connections_per_ip < 0 ? 8 : static_cast<int>(opt.serve.max_connections_per_ip);
  so.cap_loopback =
      opt.serve.max_connections_per_ip > 0;  // an explicit cap applies to every address
  so.log_prompts = opt.serve.log_prompts;
  so.web_ui = opt.serve.web_ui;

  // Signals go to one thread that asks the server to drain (blocked before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  k3::ServiceOptions service_opts = service_options(opt);
  service_opts.parallel = static_cast<int>(opt.serve.parallel);  // coli chat stays at one
  k3::EngineService service(std::move(service_opts));
  k3::server::HttpServer server(service, so);
  const int port = server.bind();
  const std::string host =
      bind_host.find(':') != std::string::npos ? "[" + bind_host + "]" : bind_host;
  const std::string url = "http://" + host + ":" + std::to_string(port) + "/";
  if (web)
    std::printf("coli web: open %s in your browser (the page waits while the model loads)\n",
                url.c_str());
  else
    std::printf("coli serve: listening on %s (OpenAI API at %sv1)\n", url.c_str(), url.c_str());
  std::printf("coli %s: model: %s%s\n", web ? "web" : "serve", opt.model_dir.c_str(),
              k3::model_note(opt).c_str());
  std::fflush(stdout);
  if (!loopback)
    std::fprintf(stderr, "coli: listening on %s: reachable from the network%s\n", bind_host.c_str(),
                 so.security.api_keys.empty() ? " WITHOUT an API key (--insecure-bind)"
                                              : " (API key required)");
  if (opt.serve.log_prompts)
    std::fprintf(stderr, "coli: --log-prompts: request bodies are written to this log\n");

  // The first signal drains (server.shutdown() on a thread of its own); a second one cancels the
  // running request, whose stream then ends with its terminator (a final chunk and [DONE], or
  // message_stop), and the process exits as soon as that is written: within 5 s, or at once on a
  // third signal, whatever the client reads. Either way the status is 128 + the first signal.
  std::atomic<bool> stop{false};
  std::atomic<int> exit_code{0};
  std::atomic<int> stopped_by{0};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (stop.load()) return;
    stopped_by.store(sig);
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    std::fprintf(stderr,
                 "coli: %s: draining (up to %.0f s); send it again to end the running request "
                 "and quit at once\n",
                 name, so.drain_timeout_s);
    std::thread drain([&] { server.shutdown(); });
    int again = 0;
    sigwait(&signals, &again);  // a second signal, or the wake-up once the server has stopped
    if (!stop.load()) {
      std::fprintf(stderr, "coli: %s again: cancelling the running request and quitting\n",
                   again == SIGTERM ? "SIGTERM" : "SIGINT");
      service.cancel_active();
      const timespec bound{5, 0};
      sigtimedwait(&signals, nullptr, &bound);  // the wake-up once stopped, a third signal, 5 s
      if (!stop.load()) {
        std::fflush(nullptr);
        std::_Exit(k3::apps::stop_status(sig));
      }
    }
    drain.join();
  });
  std::thread announcer([&] {
    for (;;) {
      const k3::ServiceStats s = service.stats();
      if (s.state == k3::ServiceStats::State::ready) {
        const k3::Engine* engine = service.engine();
        std::fprintf(
            stderr,
            "coli: %s loaded in %.1f s (%s); context %lld tokens; %d session%s of %.1f MiB; "
            "checkpoints: %s; prefix cache: %s\n",
            opt.model_dir.c_str(), s.load_elapsed_s, engine ? engine->describe().c_str() : "",
            static_cast<long long>(s.context_capacity), s.parallel, s.parallel == 1 ? "" : "s",
            static_cast<double>(s.session_bytes) / (1 << 20), s.checkpoints.c_str(),
            s.prefix_cache.c_str());
        return;
      }
      if (s.state == k3::ServiceStats::State::failed) {
        std::fprintf(stderr, "coli: %s: %s\n", s.failed_step.c_str(), s.load_error.c_str());
        exit_code.store(3);
        server.shutdown();
        return;
      }
      if (stop.load() || s.state == k3::ServiceStats::State::stopping) return;
      // Short: /health says ok as soon as the model is ready, and a client that saw it reads
      // this line next (the transport answers /health in well under the old 50 ms poll).
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  server.run();
  stop.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // wakes sigwait if no signal came
  signal_thread.join();
  announcer.join();
  if (const k3::Engine* engine = service.engine()) {
    std::fprintf(stderr, "coli: %s\n", engine->describe_experts().c_str());
    if (const std::string device = engine->describe_device(); !device.empty())
      std::fprintf(stderr, "coli: %s\n", device.c_str());
    // --expert-parallel: every rank's counters, the exchange per token fed (prompt tokens
    // computed, not reused, and generated ones).
    const k3::ServiceStats s = service.stats();
    if (const std::string ep = engine->describe_expert_parallel(s.prompt_tokens - s.cached_tokens +
                                                                s.generated_tokens);
        !ep.empty())
      std::fprintf(stderr, "coli: %s\n", ep.c_str());
    engine->save_history();
  }
  if (exit_code.load() != 0) return exit_code.load();
  return stopped_by.load() != 0 ? k3::apps::stop_status(stopped_by.load()) : 0;
}

}  // namespace coli
