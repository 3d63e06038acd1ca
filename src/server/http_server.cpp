#include "server/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/random.h>

#include <httplib.h>

#include <cinttypes>
#include <cmath>
#include <deque>
#include <cstdio>
#include <map>
#include <optional>
#include <mutex>
#include <sstream>
#include <thread>

#include "web_assets.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3::server {
namespace {

using Clock = std::chrono::steady_clock;

void set_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void set_error(httplib::Response& res, const ApiError& error) {
  if (error.retry_after > 0) res.set_header("Retry-After", std::to_string(error.retry_after));
  if (error.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  set_json(res, error.status, error_body(error));
}

ApiError simple_error(int status, const char* type, const char* code, std::string message, int retry_after = 0) {
  ApiError e;
  e.status = status;
  e.type = type;
  e.code = code;
  e.message = std::move(message);
  e.retry_after = retry_after;
  return e;
}

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> b(bytes);
  if (getrandom(b.data(), b.size(), 0) != static_cast<ssize_t>(b.size()))
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(Clock::now().time_since_epoch().count() >> (i % 8));
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

// cpp-httplib 0.11 hands neither the accepted socket to its task queue nor the connection's
// socket to handlers. Both are needed: the accept path enforces connection caps (SERVING.md
// §4.6), and a waiting handler must notice a client that hung up (§3.9: within 100 ms) or close
// a connection it refused early (§4.5). So sockets are found by their addresses among this
// process's descriptors (the fd stays valid while its connection is being served).
struct Peer {
  int fd = -1;
  std::string ip;
  int port = -1, local_port = -1;
  bool retired = false;  // ConnectionGate: answered its last request, no longer counted
  bool busy = false;     // ConnectionGate: a request's headers are in, its response not yet out
  double since = 0;      // ConnectionGate: now_seconds() of the accept or the last response
  bool operator==(const Peer& o) const { return fd == o.fd && ip == o.ip && port == o.port && local_port == o.local_port; }
};

std::optional<Peer> socket_peer(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return std::nullopt;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return std::nullopt;
  char ip[INET6_ADDRSTRLEN] = {};
  Peer p;
  p.fd = fd;
  if (peer.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, ip, sizeof ip);
    p.port = ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
    p.local_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, ip, sizeof ip);
    p.port = ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
    p.local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  } else {
    return std::nullopt;
  }
  p.ip = ip;
  return p;
}

template <class Visit>
void for_each_connected_socket(Visit visit) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = ::readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2) continue;
    if (auto p = socket_peer(fd); p && !visit(*p)) break;
  }
  ::closedir(dir);
}

int find_connection_socket(const httplib::Request& req) {
  int found = -1;
  for_each_connected_socket([&](const Peer& p) {
    if (p.port == req.remote_port && p.local_port == req.local_port && p.ip == req.remote_addr) found = p.fd;
    return found < 0;
  });
  return found;
}

// Live connections, admitted on the accept thread: over the global or the per-IP cap a new
// connection is shut down before any thread reads from it.
class ConnectionGate {
 public:
  ConnectionGate(size_t max_total, size_t max_per_ip, bool cap_loopback)
      : max_total_(max_total), max_per_ip_(max_per_ip), cap_loopback_(cap_loopback) {}
  void set_port(int port) { port_ = port; }

  // The socket just accepted: registered (returns its id) or refused and shut down (0).
  uint64_t admit() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<Peer> fresh;
    std::vector<uint64_t> seen;
    for_each_connected_socket([&](const Peer& p) {
      if (p.local_port != port_) return true;
      for (const auto& [id, known] : live_)
        if (known == p) {
          seen.push_back(id);
          return true;
        }
      if (!fresh) fresh = p;
      return true;
    });
    // Connections already closed whose thread has not released them yet do not count.
    for (auto it = live_.begin(); it != live_.end();) {
      if (std::find(seen.begin(), seen.end(), it->first) != seen.end()) {
        ++it;
        continue;
      }
      uncount(it->second);
      it = live_.erase(it);
    }
    if (!fresh) return kUntracked;
    const bool capped = cap_loopback_ || !(is_loopback_host(fresh->ip) || fresh->ip.rfind("::ffff:127.", 0) == 0);
    if (live_.size() - retired_ >= max_total_ || (capped && per_ip_[fresh->ip] >= max_per_ip_)) {
      ::shutdown(fresh->fd, SHUT_RDWR);
      ++refused_;
      return 0;
    }
    const uint64_t id = next_id_++;
    fresh->since = now_seconds();
    live_[id] = *fresh;
    ++per_ip_[fresh->ip];
    return id;
  }
  // A request of this connection is being served (busy) or has been answered.
  // The socket of the connection `req` came on: from the live table when the gate admitted it,
  // else by a scan of the process's descriptors.
  int socket_of(const httplib::Request& req) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [id, p] : live_)
        if (p.port == req.remote_port && p.local_port == req.local_port && p.ip == req.remote_addr) return p.fd;
    }
    return find_connection_socket(req);
  }
  void mark(const httplib::Request& req, bool busy) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, p] : live_)
      if (p.port == req.remote_port && p.local_port == req.local_port && p.ip == req.remote_addr) {
        p.busy = busy;
        p.since = now_seconds();
      }
  }
  // Shuts connections that have sent no complete request line and headers within `deadline`
  // seconds of their accept or their last response (slowloris: a per-read timeout alone does
  // not stop a client dripping a byte at a time). A request being served is never touched.
  void reap(double deadline) {
    std::lock_guard<std::mutex> lock(mutex_);
    const double now = now_seconds();
    for (auto& [id, p] : live_) {
      if (p.busy || p.retired || now - p.since < deadline) continue;
      if (const auto current = socket_peer(p.fd); current && *current == p) ::shutdown(p.fd, SHUT_RDWR);
      p.since = now;  // once
    }
  }
  // The connection of `fd` must serve nothing more (see end_connection).
  void poison(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto p = socket_peer(fd)) poisoned_.push_back(*p);
  }
  bool poisoned(const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Peer& p : poisoned_)
      if (p.port == req.remote_port && p.local_port == req.local_port && p.ip == req.remote_addr) return true;
    return false;
  }
  // The connection of `fd` has answered its last request: it stops counting against the caps
  // now, not when its thread gets around to closing it.
  void retire(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto p = socket_peer(fd);
    if (!p) return;
    for (auto& [id, known] : live_)
      if (known == *p && !known.retired) {
        uncount(known);
        known.retired = true;
        ++retired_;
      }
  }
  void release(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    poisoned_.erase(std::remove(poisoned_.begin(), poisoned_.end(), it->second), poisoned_.end());
    uncount(it->second);
    live_.erase(it);
  }
  static constexpr uint64_t kUntracked = ~uint64_t{0};

 private:
  void uncount(Peer& p) {  // REQUIRES mutex_
    if (p.retired) {
      --retired_;
    } else if (--per_ip_[p.ip] == 0) {
      per_ip_.erase(p.ip);
    }
    p.retired = false;
  }

  size_t max_total_, max_per_ip_;
  bool cap_loopback_;
  int port_ = -1;
  std::mutex mutex_;
  std::map<uint64_t, Peer> live_;
  std::map<std::string, size_t> per_ip_;
  std::vector<Peer> poisoned_;
  uint64_t next_id_ = 1;
  int64_t refused_ = 0;
  size_t retired_ = 0;
};

class GatedQueue : public httplib::TaskQueue {
 public:
  GatedQueue(size_t threads, ConnectionGate& gate) : pool_(threads), gate_(gate) {}
  void enqueue(std::function<void()> fn) override {
    const uint64_t id = gate_.admit();
    if (id == 0) {  // refused: the socket is shut down, so the library reads EOF and closes it
      fn();
      return;
    }
    pool_.enqueue([this, id, fn = std::move(fn)] {
      fn();
      if (id != ConnectionGate::kUntracked) gate_.release(id);
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  ConnectionGate& gate_;
};

// Set on the connection's thread when a request is refused before its body was read (or read
// in full); read by the logger, which runs on the same thread once the response is written.
thread_local bool t_unread_body = false;
// now_seconds() when the current request's headers were complete (the body's read deadline).
thread_local double t_request_start = 0;

// Ends a connection whose response said "Connection: close", once that response is written
// (the library's writes check that the socket still reads, so not before). Bytes the client
// sent after its headers must never be parsed as a next request (smuggling, SERVING.md §4.5):
// the write side is shut (FIN after the response), a refused body is drained for up to 2 s so
// the client reads its 413/415 instead of a reset, then reading stops; the connection is
// marked so that a request the library had already buffered is refused unanswered.
void end_connection(int fd, bool drain) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_WR);
  if (drain) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    char buf[65536];
    for (uint64_t total = 0; total < (uint64_t{256} << 20);) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      total += static_cast<uint64_t>(n);
    }
  }
  ::shutdown(fd, SHUT_RD);
}

bool peer_hung_up(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// A brute-force brake (SERVING.md §4.2): 20 failed keys from one address within 60 s answer 429
// for the next 60 s, whatever the key.
class AuthBrake {
 public:
  // Seconds the address stays blocked (0 = not blocked).
  int blocked_for(const std::string& ip) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocked_until_.find(ip);
    if (it == blocked_until_.end()) return 0;
    const double left = it->second - now_seconds();
    if (left <= 0) {
      blocked_until_.erase(it);
      return 0;
    }
    return static_cast<int>(std::ceil(left));
  }
  void failed(const std::string& ip) {
    std::lock_guard<std::mutex> lock(mutex_);
    const double now = now_seconds();
    auto& times = failures_[ip];
    times.push_back(now);
    while (!times.empty() && now - times.front() > 60) times.pop_front();
    if (times.size() >= 20) {
      blocked_until_[ip] = now + 60;
      times.clear();
    }
    if (failures_.size() > 4096) failures_.clear();  // bounded memory under a spoofing flood
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::deque<double>> failures_;
  std::map<std::string, double> blocked_until_;
};

struct RequestCounters {
  std::mutex mutex;
  std::map<std::pair<std::string, int>, int64_t> by_route_status;
};

}  // namespace

std::string metrics_text(const ServiceStats& s, const std::vector<std::pair<std::string, int64_t>>& requests) {
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
  };
  o << "# HELP k3_requests_total HTTP requests by endpoint and status\n# TYPE k3_requests_total counter\n";
  for (const auto& [label, count] : requests) o << "k3_requests_total{" << label << "} " << count << '\n';
  metric("k3_requests_active", "gauge", "generations running", static_cast<double>(s.active));
  metric("k3_requests_queued", "gauge", "generations waiting", static_cast<double>(s.queued));
  metric("k3_prompt_tokens_total", "counter", "prompt tokens received", static_cast<double>(s.prompt_tokens));
  metric("k3_prompt_tokens_cached_total", "counter", "prompt tokens reused, not prefilled", static_cast<double>(s.cached_tokens));
  metric("k3_generated_tokens_total", "counter", "tokens generated", static_cast<double>(s.generated_tokens));
  metric("k3_prefill_seconds_total", "counter", "seconds spent in prefill", s.prefill_seconds);
  metric("k3_decode_seconds_total", "counter", "seconds spent in decode", s.decode_seconds);
  const double prefill_rate = s.prefill_seconds > 0 ? static_cast<double>(s.prompt_tokens - s.cached_tokens) / s.prefill_seconds : 0;
  const double decode_rate = s.decode_seconds > 0 ? static_cast<double>(s.generated_tokens) / s.decode_seconds : 0;
  metric("k3_prefill_tokens_per_second", "gauge", "prefilled tokens per second over the server's life", prefill_rate);
  metric("k3_decode_tokens_per_second", "gauge", "generated tokens per second over the server's life", decode_rate);
  o << "# HELP k3_cancelled_total cancelled generations by phase\n# TYPE k3_cancelled_total counter\n"
    << "k3_cancelled_total{phase=\"queue\"} " << s.cancelled_queue << "\nk3_cancelled_total{phase=\"prefill\"} "
    << s.cancelled_prefill << "\nk3_cancelled_total{phase=\"decode\"} " << s.cancelled_decode << '\n';
  o << "# HELP k3_prefix_reuse_total reuse decisions\n# TYPE k3_prefix_reuse_total counter\n"
    << "k3_prefix_reuse_total{kind=\"live\"} " << s.reuse_live << "\nk3_prefix_reuse_total{kind=\"checkpoint\"} "
    << s.reuse_checkpoint << "\nk3_prefix_reuse_total{kind=\"none\"} " << s.reuse_none << '\n';
  metric("k3_checkpoint_saves_total", "counter", "recurrent-state checkpoints saved", static_cast<double>(s.ckpt.saves));
  metric("k3_checkpoint_restores_total", "counter", "recurrent-state checkpoints restored", static_cast<double>(s.ckpt.restores));
  metric("k3_checkpoint_restore_seconds_total", "counter", "seconds spent restoring checkpoints", s.ckpt.restore_seconds);
  metric("k3_checkpoint_rejected_total", "counter", "disk checkpoints that failed their header check", static_cast<double>(s.ckpt.rejected));
  metric("k3_requests_rejected_total", "counter", "generations refused with 429", static_cast<double>(s.rejected));
  metric("k3_expert_cache_hits_total", "counter", "routed experts found in the cache", static_cast<double>(s.experts.hits));
  metric("k3_expert_cache_misses_total", "counter", "routed experts read from disk", static_cast<double>(s.experts.misses));
  metric("k3_expert_bytes_read_total", "counter", "bytes of routed experts read from disk", static_cast<double>(s.experts.bytes_read));
  metric("k3_expert_cache_hit_ratio", "gauge", "hits / (hits + misses) over the server's life", s.experts.hit_ratio());
  metric("k3_expert_drive_bytes_total", "counter", "bytes of expert reads that reached the drive (cancelled read-ahead excluded)", static_cast<double>(s.experts.drive_bytes));
  metric("k3_expert_read_busy_seconds_total", "counter", "seconds with at least one expert read in flight (drive busy)", s.experts.busy_seconds);
  metric("k3_expert_read_wait_seconds_total", "counter", "seconds compute waited for expert reads (un-hidden I/O)", s.experts.wait_seconds);
  metric("k3_expert_transient_total", "counter", "expert reads not kept in a cache slot", static_cast<double>(s.experts.transient));
  metric("k3_expert_prefetch_reads_total", "counter", "experts read ahead on a prediction (K3_PREFETCH)", static_cast<double>(s.experts.prefetch_issued));
  metric("k3_expert_prefetch_used_total", "counter", "read-ahead experts the layer then used", static_cast<double>(s.experts.prefetch_used));
  metric("k3_expert_prefetch_recall", "gauge", "selections the read-ahead predicted / selections of predicted layers", s.experts.recall());
  metric("k3_rss_bytes", "gauge", "resident memory", static_cast<double>(current_rss_bytes()));
  metric("k3_load_progress", "gauge", "model load progress [0, 1]", s.load_progress);
  return o.str();
}

struct HttpServer::Impl {
  EngineService& service;
  ServerOptions options;
  httplib::Server http;
  ConnectionGate gate{static_cast<size_t>(options.max_connections), static_cast<size_t>(options.max_connections_per_ip),
                      options.cap_loopback};
  RequestCounters counters;
  AuthBrake brake;
  std::atomic<bool> draining{false};
  double started = now_seconds();
  std::once_flag shutdown_once;

  Impl(EngineService& s, ServerOptions o) : service(s), options(std::move(o)) {}

  bool authorised(const httplib::Request& req) const {
    if (options.security.api_keys.empty()) return true;
    return key_matches(presented_key(req.get_header_value("Authorization"), req.get_header_value("x-api-key")),
                       options.security.api_keys);
  }

  void add_cors(const httplib::Request& req, httplib::Response& res) const {
    if (!req.has_header("Origin")) return;
    const std::string origin = req.get_header_value("Origin");
    res.set_header("Vary", "Origin");
    if (!origin_allowed(origin, options.security)) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Access-Control-Expose-Headers", "x-request-id, x-queue-wait-ms, x-colibri-queue-wait-ms, Retry-After");
  }

  // Everything that can be refused before the body is read.
  httplib::Server::HandlerResponse guard(const httplib::Request& req, httplib::Response& res) {
    gate.mark(req, true);
    t_request_start = now_seconds();
    res.set_header("x-request-id", "req-" + random_hex(8));
    add_cors(req, res);
    size_t header_bytes = req.method.size() + req.target.size() + 12;
    for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
    if (gate.poisoned(req)) {  // bytes after a refused request: never served
      res.status = 400;
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    auto refuse = [&](const ApiError& e) {
      set_error(res, e);
      res.set_header("Connection", "close");
      t_unread_body = req.method == "POST" || req.has_header("Content-Length") || req.has_header("Transfer-Encoding");
      return httplib::Server::HandlerResponse::Handled;
    };
    if (header_bytes > options.max_header_bytes || req.headers.size() > 100)
      return refuse(simple_error(431, "invalid_request_error", "headers_too_large", "the request headers exceed 16 KiB"));
    if (!host_allowed(req.get_header_value("Host"), options.security))
      return refuse(simple_error(403, "permission_error", "host_not_allowed", "the Host header is not allowed"));
    const bool has_origin = req.has_header("Origin");
    const bool origin_ok = !has_origin || origin_allowed(req.get_header_value("Origin"), options.security);
    if (req.method == "OPTIONS") {
      res.status = 204;
      if (origin_ok && has_origin) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, x-request-id");
        res.set_header("Access-Control-Max-Age", "600");
        if (req.get_header_value("Access-Control-Request-Private-Network") == "true")
          res.set_header("Access-Control-Allow-Private-Network", "true");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool api_route = req.path.rfind("/v1/", 0) == 0 || req.path == "/metrics" || req.path.rfind("/slots", 0) == 0 ||
                           req.path == "/tokenize" || req.path == "/detokenize";
    if (api_route && !options.security.api_keys.empty()) {
      if (const int wait = brake.blocked_for(req.remote_addr))
        return refuse(simple_error(429, "rate_limit_error", "too_many_auth_failures",
                                   "too many failed API keys from this address", wait));
      if (!authorised(req)) {
        brake.failed(req.remote_addr);
        return refuse(simple_error(401, "authentication_error", "invalid_api_key", "a valid API key is required"));
      }
    }
    if (req.method == "POST") {
      if (!origin_ok)
        return refuse(simple_error(403, "permission_error", "origin_not_allowed", "the request's Origin is not allowed"));
      const std::string type = req.get_header_value("Content-Type");
      const std::string media = type.substr(0, type.find(';'));
      std::string lowered;
      for (char c : media) if (c != ' ' && c != '\t') lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lowered != "application/json")
        return refuse(simple_error(415, "invalid_request_error", "unsupported_media_type", "POST bodies must be application/json"));
      if (req.has_header("Content-Length")) {
        const std::string length = req.get_header_value("Content-Length");
        char* end = nullptr;
        errno = 0;
        const unsigned long long n = std::strtoull(length.c_str(), &end, 10);
        if (length.empty() || *end != '\0' || errno != 0 || length[0] == '-')
          return refuse(simple_error(400, "invalid_request_error", "invalid_value", "bad Content-Length"));
        if (n > options.max_body_bytes)
          return refuse(simple_error(413, "invalid_request_error", "request_too_large",
                                     "the body exceeds " + std::to_string(options.max_body_bytes) + " bytes"));
      } else if (req.get_header_value("Transfer-Encoding").find("chunked") == std::string::npos) {
        return refuse(simple_error(411, "invalid_request_error", "length_required", "POST needs a Content-Length"));
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  const text::Tokenizer* tokenizer_or_503(httplib::Response& res) {
    const Engine* engine = service.engine();
    if (engine) return engine->tokenizer();
    const ServiceStats s = service.stats();
    if (s.state == ServiceStats::State::failed)
      set_error(res, simple_error(500, "server_error", "engine_error", "the model failed to load"));
    else
      set_error(res, simple_error(503, "server_error", "model_loading", "the model is still loading", 5));
    return nullptr;
  }

  void health(const httplib::Request& req, httplib::Response& res) {
    const ServiceStats s = service.stats();
    json body = json::object();
    if (s.state == ServiceStats::State::loading) {
      body["status"] = "loading";
      body["phase"] = "weights";
      body["progress"] = s.load_progress;
      body["elapsed_s"] = s.load_elapsed_s;
      res.set_header("Retry-After", "5");
      set_json(res, 503, body);
      return;
    }
    if (s.state == ServiceStats::State::failed) {
      set_json(res, 500, json{{"status", "error"}, {"message", "model load failed"}});
      return;
    }
    body["status"] = s.state == ServiceStats::State::stopping ? "stopping" : "ok";
    if (authorised(req)) {
      body["model"] = options.api.model_id;
      body["uptime_s"] = now_seconds() - started;
      body["load_s"] = s.load_elapsed_s;
      body["context_capacity"] = s.context_capacity;
      body["scheduler"] = json{{"active", s.active}, {"capacity", 1}, {"queued", s.queued}, {"max_queue", s.max_queue},
                               {"queue_timeout_seconds", options.queue_timeout_s}, {"admitted", s.admitted},
                               {"completed", s.completed}, {"rejected", s.rejected},
                               {"cancelled", s.cancelled_queue + s.cancelled_prefill + s.cancelled_decode}};
      body["state"] = json{{"phase", s.phase}, {"fed_tokens", s.fed_tokens},
                           {"checkpoints", json{{"policy", s.checkpoints}, {"slots", s.ckpt_slots}, {"used", s.ckpt_used}}}};
      body["memory"] = json{{"rss_gb", static_cast<double>(current_rss_bytes()) / 1e9}};
      if (!is_loopback_host(options.security.bind_host) && options.security.api_keys.empty())
        body["warning"] = "bound beyond loopback without an API key (--insecure-bind)";
    }
    set_json(res, s.state == ServiceStats::State::stopping ? 503 : 200, body);
  }

  json model_entry(const std::string& id) const {
    return json{{"id", id}, {"object", "model"}, {"created", static_cast<int64_t>(started_unix)}, {"owned_by", "local"},
                {"meta", json{{"context_length", service.context_capacity()}, {"max_output_tokens", options.api.max_tokens_ceiling},
                              {"reasoning", true}, {"tools", true}, {"vision", false}, {"aliases", options.api.aliases}}}};
  }
  int64_t started_unix = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  void tokenize(const httplib::Request&, httplib::Response& res, const std::string& body) {
    auto parsed = parse_json_object(body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return set_error(res, *e);
    const json& b = std::get<json>(parsed);
    auto it = b.find("content");
    if (it == b.end() || !it->is_string()) return set_error(res, invalid_value("content", "'content' must be a string"));
    bool special = false;
    if (auto s = b.find("parse_special"); s != b.end() && s->is_boolean()) special = s->get<bool>();
    const text::Tokenizer* tokenizer = tokenizer_or_503(res);
    if (!tokenizer) return;
    std::vector<int32_t> ids;
    tokenizer->encode(it->get_ref<const std::string&>(), special, ids);
    set_json(res, 200, json{{"tokens", ids}});
  }

  void detokenize(const httplib::Request&, httplib::Response& res, const std::string& body) {
    auto parsed = parse_json_object(body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return set_error(res, *e);
    const json& b = std::get<json>(parsed);
    auto it = b.find("tokens");
    if (it == b.end() || !it->is_array()) return set_error(res, invalid_value("tokens", "'tokens' must be an array of token ids"));
    const text::Tokenizer* tokenizer = tokenizer_or_503(res);
    if (!tokenizer) return;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tokenizer->vocab_size())
        return set_error(res, invalid_value("tokens." + std::to_string(i), "not a token id of this vocabulary"));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    set_json(res, 200, json{{"content", tokenizer->decode(ids)}});
  }

  // Waits for the worker's acceptance; a hung-up client, a queue timeout or an error ends it.
  // Returns true with `accepted` filled, or false with `res` set (or the client gone).
  bool await_acceptance(const std::shared_ptr<RequestHandle>& handle, int fd, httplib::Response& res, ServiceEvent& accepted) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(options.queue_timeout_s);
    for (;;) {
      if (handle->next(accepted, std::chrono::milliseconds(100))) {
        if (accepted.kind == ServiceEvent::Kind::accepted) return true;
        if (accepted.kind == ServiceEvent::Kind::error) {
          if (accepted.error == ServiceError::shutting_down)
            set_error(res, simple_error(503, "server_error", "shutting_down", "the server is shutting down", 5));
          else if (accepted.error != ServiceError::cancelled)
            set_error(res, simple_error(500, "server_error", "engine_error", "the engine failed"));
          return false;
        }
        continue;
      }
      if (peer_hung_up(fd)) {
        service.cancel(handle);
        res.status = 499;  // client closed (logged and counted; nothing is sent)
        return false;
      }
      if (Clock::now() > deadline) {
        service.cancel(handle);
        set_error(res, simple_error(429, "rate_limit_error", "queue_timeout", "waited too long in the queue", retry_after()));
        return false;
      }
    }
  }

  int retry_after() const {
    const ServiceStats s = service.stats();
    const double running = s.active ? now_seconds() - s.active_started : 0;
    return static_cast<int>(std::clamp(running > 0 ? running : 1.0, 1.0, 60.0));
  }

  // The generation settings shared by both endpoints (a random seed unless one was given).
  static void apply_generation(const GenerationParams& g, ServiceRequest& sr) {
    sr.sampling.temperature = g.temperature;
    sr.sampling.top_p = g.top_p;
    sr.sampling.top_k = g.top_k;
    sr.sampling.min_p = g.min_p;
    if (g.seed) {
      sr.sampling.seed = *g.seed;
    } else {
      uint64_t seed = 0;
      if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
      sr.sampling.seed = seed;
    }
    sr.sampling.seed_set = true;
    sr.max_tokens = g.max_tokens;
    sr.stop = g.stop;
    sr.cache_prompt = g.cache_prompt;
  }

  // Context check, submission, and the wait for the worker's acceptance (the 200 is committed
  // only after it). Returns the handle, or nullptr with `res` set (or the client gone).
  std::shared_ptr<RequestHandle> admit(ServiceRequest sr, const char* prompt_param, const httplib::Request& req,
                                       httplib::Response& res, const std::string& body, int& fd, ServiceEvent& accepted) {
    const int64_t capacity = service.context_capacity();
    if (static_cast<int64_t>(sr.prompt.size()) >= capacity) {
      ApiError e = simple_error(400, "invalid_request_error", "context_length_exceeded",
                                "the prompt has " + std::to_string(sr.prompt.size()) + " tokens; the context holds " +
                                    std::to_string(capacity) + " (and one must be left to generate)");
      e.param = prompt_param;
      set_error(res, e);
      return nullptr;
    }
    if (options.log_prompts)
      std::fprintf(stderr, "[prompt] %s %s\n", res.get_header_value("x-request-id").c_str(), body.c_str());
    auto submitted = service.submit(std::move(sr));
    if (!submitted.ok()) {
      const Status st = submitted.status();
      if (st.code() == Status::Code::resource_exhausted)
        set_error(res, simple_error(429, "rate_limit_error", "queue_full", st.message(), retry_after()));
      else if (st.code() == Status::Code::unavailable)
        set_error(res, simple_error(503, "server_error", draining.load() ? "shutting_down" : "model_loading", st.message(), 5));
      else
        set_error(res, invalid_value(prompt_param, st.message()));
      return nullptr;
    }
    std::shared_ptr<RequestHandle> handle = *submitted;
    fd = gate.socket_of(req);
    if (!await_acceptance(handle, fd, res, accepted)) return nullptr;
    const std::string wait_ms = std::to_string(static_cast<int64_t>(accepted.stats.queue_wait_ms));
    res.set_header("x-queue-wait-ms", wait_ms);
    res.set_header("x-colibri-queue-wait-ms", wait_ms);
    return handle;
  }

  // Non-streaming: collects events until done. False (res set, or the client gone) otherwise.
  bool collect(const std::shared_ptr<RequestHandle>& handle, int fd, httplib::Response& res, ChatResult& result) {
    ServiceEvent e;
    for (;;) {
      if (!handle->next(e, std::chrono::milliseconds(100))) {
        if (peer_hung_up(fd)) {
          service.cancel(handle);
          drain_until_done(handle);
          res.status = 499;
          return false;
        }
        continue;
      }
      switch (e.kind) {
        case ServiceEvent::Kind::reasoning: result.reasoning += e.text; break;
        case ServiceEvent::Kind::content: result.content += e.text; break;
        case ServiceEvent::Kind::tool_call: result.tool_calls.push_back(e.call); break;
        case ServiceEvent::Kind::done: result.stats = e.stats; return true;
        case ServiceEvent::Kind::error:
          set_error(res, simple_error(500, "server_error", "engine_error", "the engine failed"));
          return false;
        default: break;
      }
    }
  }

  void chat(const httplib::Request& req, httplib::Response& res, const std::string& body) {
    const ApiConfig& api = options.api;
    auto parsed = parse_chat_request(body, api);
    if (auto* e = std::get_if<ApiError>(&parsed)) return set_error(res, *e);
    auto request = std::make_shared<ChatRequest>(std::move(std::get<ChatRequest>(parsed)));
    if (draining.load())
      return set_error(res, simple_error(503, "server_error", "shutting_down", "the server is shutting down", 5));
    const text::Tokenizer* tokenizer = tokenizer_or_503(res);
    if (!tokenizer) return;
    auto prompt = render_chat_prompt(*request, *tokenizer);
    if (auto* e = std::get_if<ApiError>(&prompt)) return set_error(res, *e);
    ServiceRequest sr;
    sr.prompt = std::move(std::get<RenderedPrompt>(prompt).ids);
    sr.anchor = std::get<RenderedPrompt>(prompt).anchor;
    sr.starts_in_think = request->thinking;
    apply_generation(*request, sr);
    int fd = -1;
    ServiceEvent accepted;
    auto handle = admit(std::move(sr), "messages", req, res, body, fd, accepted);
    if (!handle) return;
    const ResponseIds ids = new_response_ids();
    if (request->stream) return stream(request, handle, fd, ids, accepted, res);
    ChatResult result;
    if (collect(handle, fd, res, result)) set_json(res, 200, chat_completion_json(result, *request, api, ids));
  }

  void completions(const httplib::Request& req, httplib::Response& res, const std::string& body) {
    const ApiConfig& api = options.api;
    auto parsed = parse_completion_request(body, api);
    if (auto* e = std::get_if<ApiError>(&parsed)) return set_error(res, *e);
    auto request = std::make_shared<CompletionRequest>(std::move(std::get<CompletionRequest>(parsed)));
    if (draining.load())
      return set_error(res, simple_error(503, "server_error", "shutting_down", "the server is shutting down", 5));
    const text::Tokenizer* tokenizer = tokenizer_or_503(res);
    if (!tokenizer) return;
    ServiceRequest sr;
    if (request->ids_given) {
      for (size_t i = 0; i < request->prompt_ids.size(); ++i)
        if (request->prompt_ids[i] >= service.engine()->info().vocab_size)
          return set_error(res, invalid_value("prompt." + std::to_string(i), "not a token id of this vocabulary"));
      sr.prompt = request->prompt_ids;
    } else {
      std::vector<int32_t> ids32;
      tokenizer->encode(request->prompt, false, ids32);
      sr.prompt.assign(ids32.begin(), ids32.end());
    }
    sr.raw = true;
    sr.starts_in_think = false;
    apply_generation(*request, sr);
    int fd = -1;
    ServiceEvent accepted;
    auto handle = admit(std::move(sr), "prompt", req, res, body, fd, accepted);
    if (!handle) return;
    const ResponseIds ids = new_response_ids("cmpl-");
    if (!request->stream) {
      ChatResult result;
      if (collect(handle, fd, res, result)) set_json(res, 200, completion_json(result.content, result.stats, request->model, api, ids));
      return;
    }
    serve_sse(res, handle, fd, {}, [this, request, ids](const ServiceEvent& e) {
      const ApiConfig& config = options.api;
      if (e.kind == ServiceEvent::Kind::content) return std::vector<json>{completion_chunk_json(ids, config, e.text, nullptr)};
      if (e.kind != ServiceEvent::Kind::done) return std::vector<json>{};
      std::vector<json> out{completion_chunk_json(ids, config, "", finish_reason_name(e.stats.finish))};
      if (request->include_usage) out.push_back(completion_usage_chunk_json(ids, config, e.stats));
      return out;
    });
  }

  void drain_until_done(const std::shared_ptr<RequestHandle>& handle) {
    ServiceEvent e;
    for (int i = 0; i < 600; ++i)  // the worker acknowledges within one layer or one token
      if (handle->next(e, std::chrono::milliseconds(100)) &&
          (e.kind == ServiceEvent::Kind::done || e.kind == ServiceEvent::Kind::error))
        return;
  }

  // An SSE response fed by the worker's events: `first` is sent at the start, `chunks` turns each
  // event into JSON chunks; the terminal event (done, or an engine error sent as one error event)
  // is followed by `data: [DONE]`. A failed write or a client that hung up cancels the request;
  // silence is filled with `: ping` comments.
  using SseChunks = std::function<std::vector<json>(const ServiceEvent&)>;
  void serve_sse(httplib::Response& res, std::shared_ptr<RequestHandle> handle, int fd, std::vector<json> first,
                 SseChunks chunks) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_header("Connection", "close");
    auto opened = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, handle, fd, first = std::move(first), chunks = std::move(chunks), opened](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& chunk) {
            const std::string line = "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          auto give_up = [&] {
            service.cancel(handle);
            drain_until_done(handle);
            return false;
          };
          if (!*opened) {
            *opened = true;
            for (const json& c : first)
              if (!send(c)) return give_up();
          }
          auto last_write = Clock::now();
          ServiceEvent e;
          for (;;) {
            if (!handle->next(e, std::chrono::milliseconds(100))) {
              if (peer_hung_up(fd)) return give_up();
              if (options.sse_ping_s > 0 && Clock::now() - last_write > std::chrono::duration<double>(options.sse_ping_s)) {
                static const char ping[] = ": ping\n\n";
                if (!sink.write(ping, sizeof ping - 1)) return give_up();
                last_write = Clock::now();
              }
              continue;
            }
            last_write = Clock::now();
            const bool failed = e.kind == ServiceEvent::Kind::error;
            const std::vector<json> out =
                failed ? std::vector<json>{error_body(simple_error(500, "server_error", "engine_error", "engine failure during generation"))}
                       : chunks(e);
            for (const json& c : out)
              if (!send(c) && !failed) return give_up();
            if (failed || e.kind == ServiceEvent::Kind::done) {
              static const char done[] = "data: [DONE]\n\n";
              sink.write(done, sizeof done - 1);
              sink.done();
              return true;
            }
          }
        },
        [this, handle](bool success) {
          if (!success) service.cancel(handle);
        });
  }

  void stream(std::shared_ptr<ChatRequest> request, std::shared_ptr<RequestHandle> handle, int fd, ResponseIds ids,
              ServiceEvent accepted, httplib::Response& res) {
    const ApiConfig& api = options.api;
    struct StreamState {
      bool saw_think_close = false;
      int tool_index = 0;
    };
    auto state = std::make_shared<StreamState>();
    json role = json::object();
    role["role"] = "assistant";
    role["content"] = "";
    std::vector<json> first{chunk_json(ids, api, role, nullptr, request->include_usage)};
    serve_sse(res, handle, fd, std::move(first), [this, request, ids, accepted, state](const ServiceEvent& e) {
      const ApiConfig& config = options.api;
      const bool usage = request->include_usage;
      json delta = json::object();
      switch (e.kind) {
        case ServiceEvent::Kind::progress:
          if (!request->return_progress) return std::vector<json>{};
          return std::vector<json>{progress_chunk_json(ids, config, e.total, accepted.stats.cached_tokens, e.processed, e.elapsed_ms)};
        case ServiceEvent::Kind::reasoning:
          if (request->reasoning_inline) delta["content"] = e.text;
          else put_reasoning(delta, e.text, config);
          break;
        case ServiceEvent::Kind::content:
          delta["content"] = request->reasoning_inline && !std::exchange(state->saw_think_close, true) ? "</think>" + e.text : e.text;
          break;
        case ServiceEvent::Kind::tool_call: {
          json call = tool_call_json(e.call, ids);
          call["index"] = state->tool_index++;
          delta["tool_calls"] = json::array({std::move(call)});
          break;
        }
        case ServiceEvent::Kind::done: {
          std::vector<json> out{chunk_json(ids, config, json::object(), finish_reason_name(e.stats.finish), usage)};
          if (usage) out.push_back(usage_chunk_json(ids, config, e.stats));
          return out;
        }
        default: return std::vector<json>{};
      }
      return std::vector<json>{chunk_json(ids, config, std::move(delta), nullptr, usage)};
    });
  }

  void slots(const httplib::Request&, httplib::Response& res) {
    const ServiceStats s = service.stats();
    json list = json::array();
    for (const auto& c : s.ckpt_list) list.push_back(json{{"slot", c.slot}, {"pos", c.position}, {"pinned", false}, {"age_s", c.age_seconds}});
    set_json(res, 200, json::array({json{{"id", 0}, {"state", s.active ? "busy" : "idle"}, {"n_ctx", s.context_capacity},
                                         {"fed_tokens", s.fed_tokens}, {"checkpoints", list}}}));
  }

  // A POST route whose body is read here, chunked or not, and refused with 413 past the cap
  // (the library bounds Content-Length bodies but not chunked ones).
  void post(const std::string& path, std::function<void(const httplib::Request&, httplib::Response&, const std::string&)> handler) {
    http.Post(path, [this, handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false, too_slow = false;
      const bool complete = reader([&](const char* data, size_t length) {
        if (body.size() + length > options.max_body_bytes) {
          too_large = true;
          return false;
        }
        if (now_seconds() - t_request_start > options.read_timeout_s) {
          too_slow = true;
          return false;
        }
        body.append(data, length);
        return true;
      });
      if (too_slow) {
        res.set_header("Connection", "close");
        t_unread_body = true;
        return set_error(res, simple_error(408, "invalid_request_error", "request_timeout",
                                           "the body was not received within " + std::to_string(static_cast<int>(options.read_timeout_s)) + " s"));
      }
      if (too_large) {
        res.set_header("Connection", "close");
        t_unread_body = true;
        return set_error(res, simple_error(413, "invalid_request_error", "request_too_large",
                                           "the body exceeds " + std::to_string(options.max_body_bytes) + " bytes"));
      }
      if (!complete) {
        res.set_header("Connection", "close");
        t_unread_body = true;
        return set_error(res, simple_error(400, "invalid_request_error", "invalid_json", "the body could not be read"));
      }
      handler(req, res, body);
    });
  }

  void install_routes() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) { return guard(req, res); });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      // Runs once the response is written: a response that said "Connection: close" (an early
      // refusal, an SSE stream) ends the connection here, so bytes the client sent after its
      // headers are never read as a next request.
      if (res.get_header_value("Connection") == "close") {
        const int fd = gate.socket_of(req);
        if (fd >= 0) gate.poison(fd);
        end_connection(fd, t_unread_body);
        if (fd >= 0) gate.retire(fd);
      }
      t_unread_body = false;
      gate.mark(req, false);
      std::string route = req.path;
      if (route.rfind("/v1/models/", 0) == 0) route = "/v1/models/{id}";
      else if (route.rfind("/v1/", 0) != 0 && route != "/health" && route != "/metrics" && route != "/tokenize" &&
               route != "/detokenize" && route.rfind("/slots", 0) != 0)
        route = "static";
      {
        std::lock_guard<std::mutex> lock(counters.mutex);
        ++counters.by_route_status[{route, res.status}];
      }
      if (req.path != "/health" && req.path != "/metrics")
        std::fprintf(stderr, "[http] %s %s %s %d\n", res.get_header_value("x-request-id").c_str(), req.method.c_str(),
                     route.c_str(), res.status);
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const int s = res.status;
      const char* code = s == 404 ? "not_found" : s == 405 ? "method_not_allowed" : s == 413 ? "request_too_large"
                       : s == 408 ? "request_timeout" : s == 414 ? "uri_too_long" : s == 431 ? "headers_too_large" : "bad_request";
      set_json(res, s, error_body(simple_error(s, s >= 500 ? "server_error" : "invalid_request_error", code,
                                               "the request could not be served (HTTP " + std::to_string(s) + ")")));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "[http] %s: internal error: %s\n", res.get_header_value("x-request-id").c_str(), what.c_str());
      set_json(res, 500, error_body(simple_error(500, "server_error", "internal_error", "internal server error")));
    });
    http.Get("/health", [this](const httplib::Request& q, httplib::Response& r) { health(q, r); });
    http.Get("/v1/health", [this](const httplib::Request& q, httplib::Response& r) { health(q, r); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      json data = json::array({model_entry(options.api.model_id)});
      set_json(r, 200, json{{"object", "list"}, {"data", data}});
    });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& q, httplib::Response& r) {
      const std::string id = q.matches[1];
      const auto& aliases = options.api.aliases;
      if (id != options.api.model_id && std::find(aliases.begin(), aliases.end(), id) == aliases.end()) {
        ApiError e = simple_error(404, "invalid_request_error", "model_not_found", "the model '" + id + "' does not exist");
        e.param = "model";
        return set_error(r, e);
      }
      set_json(r, 200, model_entry(id));
    });
    post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r, const std::string& b) { chat(q, r, b); });
    post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r, const std::string& b) { completions(q, r, b); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      std::vector<std::pair<std::string, int64_t>> requests;
      {
        std::lock_guard<std::mutex> lock(counters.mutex);
        for (const auto& [key, n] : counters.by_route_status)
          requests.push_back({"endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"", n});
      }
      r.set_content(metrics_text(service.stats(), requests), "text/plain; version=0.0.4");
    });
    http.Get("/slots", [this](const httplib::Request& q, httplib::Response& r) { slots(q, r); });
    http.Post(R"(/slots/0)", [this](const httplib::Request& q, httplib::Response& r) {
      if (q.get_param_value("action") != "erase")
        return set_error(r, invalid_value("action", "the only action is 'erase'"));
      service.erase_state();
      set_json(r, 200, json{{"id_slot", 0}, {"erased", true}});
    });
    post("/tokenize", [this](const httplib::Request& q, httplib::Response& r, const std::string& b) { tokenize(q, r, b); });
    post("/detokenize", [this](const httplib::Request& q, httplib::Response& r, const std::string& b) { detokenize(q, r, b); });
    // Wrong methods on known routes.
    for (const char* path : {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"})
      http.Get(path, [](const httplib::Request&, httplib::Response& r) {
        r.set_header("Allow", "POST, OPTIONS");
        set_json(r, 405, error_body(simple_error(405, "invalid_request_error", "method_not_allowed", "use POST")));
      });
    // The web page (static, embedded): exact files, SPA fallback for other non-API paths.
    http.Get(R"(/(.*))", [this](const httplib::Request& q, httplib::Response& r) {
      const bool api = q.path.rfind("/v1/", 0) == 0 || q.path.rfind("/slots", 0) == 0;
      const WebAsset* asset = nullptr;
      if (options.web_ui && !api) {
        std::string path = q.path == "/" ? "/index.html" : q.path;
        const bool hidden = path.find("/.") != std::string::npos || path.find("..") != std::string::npos;
        asset = hidden ? nullptr : find_web_asset(path.substr(1));
        if (!asset && !hidden && path.find('.') == std::string::npos) asset = find_web_asset("index.html");
      }
      if (!asset) return set_json(r, 404, error_body(simple_error(404, "invalid_request_error", "not_found", "no such path")));
      r.set_header("Content-Security-Policy",
                   "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                   "object-src 'none'; base-uri 'none'");
      r.set_header("X-Content-Type-Options", "nosniff");
      r.set_header("Referrer-Policy", "no-referrer");
      r.set_header("Cache-Control", "no-cache");
      r.set_content(std::string(asset->bytes), std::string(asset->mime));
    });
  }
};

HttpServer::HttpServer(EngineService& service, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {
  Impl& s = *impl_;
  s.http.new_task_queue = [&s] { return new GatedQueue(static_cast<size_t>(std::max(4, s.options.max_connections)) + 2, s.gate); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_read_timeout(static_cast<time_t>(s.options.read_timeout_s), 0);
  s.http.set_write_timeout(60, 0);
  s.http.set_keep_alive_timeout(15);
  s.install_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  const std::string& host = s.options.security.bind_host;
  int port = s.options.port;
  if (port == 0) port = s.http.bind_to_any_port(host);
  else if (!s.http.bind_to_port(host, port)) port = -1;
  if (port <= 0) throw Error("cannot listen on " + host + ":" + std::to_string(s.options.port) + ": " + std::strerror(errno));
  s.options.security.port = port;
  s.gate.set_port(port);
  return port;
}

void HttpServer::run() {
  Impl& s = *impl_;
  std::atomic<bool> done{false};
  std::thread reaper([&] {  // the cumulative request-read deadline (see ConnectionGate::reap)
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      s.gate.reap(s.options.read_timeout_s);
    }
  });
  s.http.listen_after_bind();
  done.store(true);
  reaper.join();
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  std::call_once(s.shutdown_once, [&] {
    s.draining.store(true);
    s.service.begin_shutdown();
    if (!s.service.wait_idle(s.options.drain_timeout_s)) {
      std::fprintf(stderr, "coli: drain timeout: cancelling the active request\n");
      s.service.cancel_active();
      s.service.wait_idle(5);
    }
    s.http.stop();
  });
}

}  // namespace k3::server
