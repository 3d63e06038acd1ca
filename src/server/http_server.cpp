// server/http_server.cpp — the cpp-httplib adapter of `coli serve`, the only file that knows the
// HTTP library (see server/http_server.h): library requests become HttpRequest values, the
// Router's answers become library responses, and the connection-level work (the keep-alive
// loop, gate, read deadline, body reads, closing) happens here. The library parses each request
// line and head (Server::process_request) over our per-connection stream; we own the socket, check
// the raw head strictly and read every body ourselves (server/http_framing.h), so the library's
// lenient parsing never decides where one request ends and the next begins (docs/serving.md
// §4.5, §4.10).
#include "server/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "connection_gate.h"
#include "http_framing.h"
#include "read_deadline.h"
#include "server/routes.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3::server {
namespace {

// The listen backlog (the library's is 5: SYN-flood warnings and connect stalls at 50 clients);
// the kernel caps it at net.core.somaxconn.
constexpr int kListenBacklog = 1024;
// Connection threads beyond --max-connections, so a new connection always finds a thread to be
// admitted (or evicted for) while the table is full.
constexpr size_t kSpareThreads = 8;
// How long the accept thread waits for room in the connection queue before refusing.
constexpr int kQueueWaitSeconds = 2;
// Requests per keep-alive connection, how long one waits idle for the next, and the send timeout.
constexpr int kKeepAliveRequests = 100, kKeepAliveSeconds = 15;
constexpr double kWriteTimeoutSeconds = 60;
// The request line's allowance on top of --max-header-bytes (the library answers 414 past 8 KiB).
constexpr size_t kRequestLineBytes = 8192 + 64;

// One connection's byte stream for the library's request parser, kept for the whole connection
// (the library's own is per request and drops bytes a client pipelined). Every read is bounded
// by a deadline — the request line and headers must arrive within the read deadline of the
// request's start, a body within the read deadline of its headers — so a client dripping a byte
// at a time is cut off without a reaper thread; the head is cut off past its byte cap. The head's
// bytes are kept for the strict check (the library reads a head a byte at a time, so they are
// exactly the head), and a body is read through available() / consume(), which never take a
// byte past the body. What ended a read is kept, so a refusal the library writes can say why
// (408, 431).
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, const Peer& peer, double write_timeout_s)
      : fd_(fd), peer_(peer), write_ms_(static_cast<int>(write_timeout_s * 1000)) {
    sockaddr_storage local{};
    socklen_t ll = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) == 0) {
      char ip[INET6_ADDRSTRLEN] = {};
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(local).sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr);
      ::inet_ntop(local.ss_family, addr, ip, sizeof ip);
      local_ip_ = ip;
    }
  }

  // A request starts: its head must be in by `deadline` (now_seconds()) and within `head_limit`
  // bytes.
  void begin_request(double deadline, size_t head_limit) {
    deadline_ = deadline;
    head_limit_ = head_limit;
    head_.clear();
    in_head_ = true;
    timed_out_ = ended_ = head_too_large_ = false;
  }
  // The head is in: the body (if any) must be in by `deadline`.
  void end_head(double deadline) {
    in_head_ = false;
    deadline_ = deadline;
  }
  // The request line and header lines read so far, with their CRLFs.
  const std::string& head() const { return head_; }
  // The bytes buffered after the head, reading more (within the deadline) when there are none;
  // empty once the peer ended the stream or the deadline passed (timed_out()).
  std::string_view available() {
    if (fill() <= 0) return {};
    return {buffer_ + off_, len_ - off_};
  }
  void consume(size_t n) { off_ += std::min(n, len_ - off_); }
  bool buffered() const { return off_ < len_; }
  bool timed_out() const { return timed_out_; }
  bool ended() const { return ended_; }
  bool head_too_large() const { return head_too_large_; }

  bool is_readable() const override { return buffered() || wait(POLLIN, read_ms()); }
  bool is_writable() const override { return wait(POLLOUT, write_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (const ssize_t n = fill(); n <= 0) return n;
    const size_t k = std::min(size, len_ - off_);
    if (in_head_) {
      if (head_.size() + k > head_limit_) {
        head_too_large_ = true;
        return -1;
      }
      head_.append(buffer_ + off_, k);
    }
    std::memcpy(ptr, buffer_ + off_, k);
    off_ += k;
    return static_cast<ssize_t>(k);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait(POLLOUT, write_ms_)) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = peer_.ip;
    port = peer_.port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_ip_;
    port = peer_.local_port;
  }
  socket_t socket() const override { return fd_; }

 private:
  // The bytes buffered, after waiting (up to the deadline) for more when there are none: -1 when
  // the deadline passed or the read failed, 0 at the end of the stream.
  ssize_t fill() {
    if (buffered()) return static_cast<ssize_t>(len_ - off_);
    const int ms = read_ms();
    if (ms <= 0 || !wait(POLLIN, ms)) {
      timed_out_ = true;
      return -1;
    }
    ssize_t n;
    do n = ::recv(fd_, buffer_, sizeof buffer_, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
      ended_ = true;
      return n;
    }
    off_ = 0;
    len_ = static_cast<size_t>(n);
    return n;
  }
  int read_ms() const {
    return static_cast<int>(std::clamp((deadline_ - now_seconds()) * 1000, 0.0, 3.6e6));
  }
  bool wait(short events, int ms) const {
    pollfd p{fd_, events, 0};
    int rc;
    do rc = ::poll(&p, 1, ms);
    while (rc < 0 && errno == EINTR);
    return rc > 0;
  }

  int fd_;
  const Peer& peer_;
  int write_ms_;
  std::string local_ip_;
  char buffer_[16384];
  size_t off_ = 0, len_ = 0;
  double deadline_ = 0;
  size_t head_limit_ = 0;
  std::string head_;
  bool in_head_ = false, timed_out_ = false, ended_ = false, head_too_large_ = false;
};

// The connection a library callback runs for: set by Transport::process_and_close_socket on the
// connection's own thread, for the whole connection, so no state is found by address.
struct Connection {
  int fd = -1;
  uint64_t id = 0;
  Peer peer;
  ConnectionStream* stream = nullptr;
  bool closing = false;  // a response said "Connection: close": nothing more is served
};
thread_local Connection* t_conn = nullptr;

// One request's state across the library's callbacks, which run in order on the connection's
// thread: the pre-routing handler (headers in: the whole request is served there), the
// post-routing handler (response head about to be written), the logger (response written). Null
// while the library answers a request on its own (a head it could not parse).
struct RequestState {
  double headers_done = 0;   // now_seconds() when the headers were complete (the body's deadline)
  bool unread_body = false;  // refused before its body was read in full: drain before closing
  bool started = false;      // the response's head is being written
  bool probed = false;       // an interim 102 was written to tell a half-close from a close
};
thread_local std::shared_ptr<RequestState> t_request;

// Set while the accept thread runs a connection inline because no connection thread is free.
thread_local bool t_no_thread = false;

// A pool of connection threads. A new connection waits in a queue as long as the pool for a
// thread; when that queue is full the accept thread waits (the kernel's backlog holds the next
// ones) up to kQueueWaitSeconds for room, then refuses the connection at once itself. Threads
// come free quickly: at most max-connections hold live connections (the gate evicts an idle one
// for each newcomer over the cap, or refuses the newcomer when every one is serving), and the
// rest are admitting, refusing or closing (a drain takes at most 2 s, end_connection). Refusing
// whenever no thread was idle at that instant refused a /health probe right after a burst of
// 100 slow clients: 49 threads had been woken for the burst but not yet scheduled on 2 busy
// cores (Serve.Transport: 3 of 10 rounds of a repro; a queue of the pool's size alone: 1 of 10).
class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ConnectionPool() override { shutdown(); }
  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (room_.wait_for(lock, std::chrono::seconds(kQueueWaitSeconds),
                         [this] { return stopping_ || jobs_.size() < workers_.size(); }) &&
          !stopping_) {
        jobs_.push_back(std::move(fn));
        ready_.notify_one();
        return;
      }
    }
    t_no_thread = true;
    fn();
    t_no_thread = false;
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    room_.notify_all();
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      room_.notify_one();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable room_;  // a job was taken: the queue has room
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  bool stopping_ = false;
};

// cpp-httplib's server with its per-connection entry point taken over (a virtual the library's
// accept loop calls on the connection's thread): the connection is admitted through the gate
// with its socket in hand, then its requests are parsed and served by the library's
// process_request over our ConnectionStream, in our keep-alive loop.
class Transport : public httplib::Server {
 public:
  Transport(ConnectionGate& gate, const ServerOptions& options) : gate_(gate), options_(options) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    std::optional<Peer> peer;
    uint64_t id = 0;
    if (t_no_thread) {
      gate_.refused_outright();
    } else if ((peer = socket_peer(sock))) {
      id = gate_.admit(*peer);
    }
    if (id == 0) {
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
    }
    // The library writes a response's head and body separately: without TCP_NODELAY the body of
    // every second request on a keep-alive connection waits ~40 ms for the delayed ACK.
    const int yes = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    ConnectionStream stream(sock, *peer, kWriteTimeoutSeconds);
    Connection c{sock, id, std::move(*peer), &stream};
    t_conn = &c;
    bool ok = true;
    const size_t head_limit = options_.max_header_bytes + kRequestLineBytes;
    for (int served = 0; served < kKeepAliveRequests && svr_sock_ != INVALID_SOCKET; ++served) {
      if (!stream.buffered()) {
        pollfd p{sock, POLLIN, 0};
        if (::poll(&p, 1, kKeepAliveSeconds * 1000) <= 0) break;  // idle, or shut down
      }
      stream.begin_request(now_seconds() + options_.read_timeout_s, head_limit);
      t_request.reset();
      bool closed = false;
      ok = process_request(stream, served + 1 == kKeepAliveRequests, closed, nullptr);
      if (!ok || closed || c.closing) break;
    }
    t_conn = nullptr;
    t_request.reset();
    gate_.release(id);  // before the descriptor can be reused
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  ConnectionGate& gate_;
  const ServerOptions& options_;
};

// Whether the library parsed the request line (it answers 400 without one, and for a header
// line over its limit, before any handler runs).
bool request_line_parsed(const httplib::Request& req) {
  static const char* const kMethods[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                         "CONNECT", "OPTIONS", "TRACE", "PATCH"};
  bool known = false;
  for (const char* m : kMethods) known = known || req.method == m;
  return known && (req.version == "HTTP/1.1" || req.version == "HTTP/1.0") && !req.path.empty();
}

// The client has hung up. Before the response's head is written, a peer that sent FIN may only
// have half-closed its side and still be reading: an interim `102 Processing` is written once
// (HTTP/1.1) and the peer counts as gone only when that draws a reset.
bool client_gone(int fd, RequestState& request, bool http11) {
  const PeerState s = peer_state(fd);
  if (s.closed) return true;
  if (!s.sent_fin) return false;
  if (request.started || !http11) return true;
  if (!request.probed) {
    request.probed = true;
    static constexpr char kProbe[] = "HTTP/1.1 102 Processing\r\n\r\n";
    if (::send(fd, kProbe, sizeof kProbe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) return true;
  }
  return false;
}

HttpRequest to_request(const httplib::Request& req) {
  HttpRequest r;
  r.method = req.method;
  r.path = req.path;
  r.target = req.target;
  for (const auto& [k, v] : req.params) r.query.emplace_back(k, v);
  for (const auto& [k, v] : req.headers) r.headers.emplace_back(k, v);
  r.remote_addr = req.remote_addr;
  r.remote_port = req.remote_port;
  r.client = t_conn ? t_conn->peer.client : req.remote_addr;
  return r;
}

struct SinkAdapter : StreamSink {
  explicit SinkAdapter(httplib::DataSink& s) : sink(s) {}
  bool write(std::string_view bytes) override { return sink.write(bytes.data(), bytes.size()); }
  httplib::DataSink& sink;
};

// Writes `out` into the library's response (its headers replace those set before).
void answer(HttpResponse out, httplib::Response& res) {
  res.headers.clear();
  for (auto& [k, v] : out.headers) res.set_header(k, v);
  res.status = out.status;
  if (out.unread_body && t_request) t_request->unread_body = true;
  if (out.stream) {
    auto producer = std::make_shared<std::function<bool(StreamSink&)>>(std::move(out.stream));
    auto on_finish = std::move(out.on_finish);
    res.set_chunked_content_provider(
        out.content_type,
        [producer](size_t, httplib::DataSink& sink) {
          SinkAdapter adapter(sink);
          if (!(*producer)(adapter)) return false;
          sink.done();
          return true;
        },
        [on_finish = std::move(on_finish)](bool success) {
          if (on_finish) on_finish(success);
        });
    return;
  }
  if (!out.body.empty() || !out.content_type.empty())
    res.set_content(out.body, out.content_type.c_str());
  if (out.on_finish) out.on_finish(true);
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  Router router;
  ConnectionGate gate{static_cast<size_t>(options.max_connections),
                      static_cast<size_t>(options.max_connections_per_ip), options.cap_loopback};
  Transport http{gate, options};
  ReadDeadline deadline{options.read_timeout_s};
  int listen_fd = -1;
  // run() and shutdown() may race (a load that fails at once stops the server before it
  // listens): shutdown() before run() makes run() return at once; after, it stops the listener.
  std::mutex lifecycle;
  bool stopped = false, listening = false;
  std::atomic<bool> finished{false};
  std::once_flag shutdown_once;

  Impl(EngineService& s, ServerOptions o) : options(o), router(s, std::move(o)) {}

  // Reads the body `head` declares into `body`: all of it, up to `limit` bytes, within the read
  // deadline of the headers, and not a byte past it. The refusal when it cannot be read.
  std::optional<ApiError> read_body(const RequestHead& head, size_t limit, std::string& body) {
    ConnectionStream& stream = *t_conn->stream;
    if (head.framing == BodyFraming::length) {
      if (head.length > limit) return body_too_large(limit, static_cast<size_t>(head.length));
      body.reserve(static_cast<size_t>(head.length));
    }
    ChunkedDecoder chunked;
    for (;;) {
      if (head.framing == BodyFraming::chunked ? chunked.done() : body.size() == head.length)
        return std::nullopt;
      if (deadline.body_overdue(t_request->headers_done)) return body_too_slow(deadline.seconds());
      const std::string_view in = stream.available();
      if (in.empty())
        return stream.timed_out() ? body_too_slow(deadline.seconds()) : body_unreadable();
      if (head.framing == BodyFraming::chunked) {
        stream.consume(chunked.feed(in, body));
        if (chunked.failed())
          return api_error(400, "invalid_request_error", "invalid_framing", chunked.error());
      } else {
        const size_t take =
            static_cast<size_t>(std::min<uint64_t>(in.size(), head.length - body.size()));
        body.append(in.data(), take);
        stream.consume(take);
      }
      if (body.size() > limit) return body_too_large(limit, body.size(), true);
    }
  }

  // `error` as the answer, over the headers already in `out`: the connection closes after it, and
  // what the client still sends is drained, never parsed as a request.
  static void refuse(HttpResponse& out, const ApiError& error, const std::string& path) {
    HttpResponse refusal = error_response(error, error_style_for(path));
    for (auto& [k, v] : refusal.headers) out.set_header(k, v);
    out.status = refusal.status;
    out.body = std::move(refusal.body);
    out.content_type = std::move(refusal.content_type);
    out.set_header("Connection", "close");
    out.unread_body = true;
  }

  // One request, once the library has parsed its head: the strict head check, the route table's
  // guards (screen), the body — read in full whatever the method or path, so it is never taken for
  // the next request — and the route's answer.
  void serve(const httplib::Request& req, httplib::Response& res) {
    HttpRequest r = to_request(req);
    HttpResponse out;
    const RequestHead head = check_request_head(t_conn->stream->head());
    if (!head.error.empty()) {
      refuse(out,
             api_error(400, "invalid_request_error",
                       head.framing_error ? "invalid_framing" : "bad_request", head.error),
             r.path);
      return answer(std::move(out), res);
    }
    const bool answered = router.screen(r, out);
    if (answered && out.closes()) return answer(std::move(out), res);  // a refusal
    const Route* route = router.find(r.method, r.path);
    std::string body;
    if (const auto error =
            read_body(head, route ? route->body_limit : options.max_body_bytes, body)) {
      refuse(out, *error, r.path);
      return answer(std::move(out), res);
    }
    if (answered) return answer(std::move(out), res);  // the OPTIONS preflight, its body dropped
    r.body = std::move(body);
    r.request_id = out.header("x-request-id");
    r.client_gone = [fd = t_conn->fd, request = t_request, http11 = req.version == "HTTP/1.1"] {
      return client_gone(fd, *request, http11);
    };
    router.handle(std::move(r), out);
    answer(std::move(out), res);
  }

  // A response the library wrote before any handler ran (no request line, a head over its
  // limits or not in time): in our error shape, saying why, and the connection ends after it
  // (never waits for a next request on a stream already out of step).
  void library_refusal(const httplib::Request& req, httplib::Response& res) {
    ApiError error = http_status_error(res.status);
    const ConnectionStream* stream = t_conn ? t_conn->stream : nullptr;
    if (res.status == 400 && stream && stream->timed_out()) {
      error = api_error(408, "invalid_request_error", "request_timeout",
                        "the request headers were not received within " +
                            std::to_string(static_cast<int>(options.read_timeout_s)) +
                            " s (--read-deadline / COLI_READ_DEADLINE)");
    } else if (res.status == 400 && stream && stream->head_too_large()) {
      error = api_error(
          431, "invalid_request_error", "headers_too_large",
          "the request headers exceed " + std::to_string(options.max_header_bytes) + " bytes");
    } else if (res.status == 400 && !request_line_parsed(req)) {
      error = api_error(400, "invalid_request_error", "bad_request",
                        "the request line is not an HTTP/1.x request line");
    } else if (res.status == 400 && stream && !stream->ended()) {
      // The request line parsed and the stream did not fail: the library refuses a header line
      // over its 8 KiB limit.
      error = api_error(431, "invalid_request_error", "headers_too_large",
                        "a request header line exceeds 8 KiB");
    }
    const HttpResponse e = error_response(error);
    res.status = e.status;
    for (const auto& [k, v] : e.headers) res.set_header(k, v);
    res.set_header("Connection", "close");
    res.set_content(e.body, e.content_type.c_str());
  }

  void install() {
    // The whole request is served here: the library's routing (and its body reading) never runs.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_request = std::make_shared<RequestState>();
      t_request->headers_done = now_seconds();
      gate.mark(t_conn->id, true);
      t_conn->stream->end_head(t_request->headers_done + options.read_timeout_s);
      if (t_conn->closing) {  // bytes after a closing response: never served
        answer(error_response(http_status_error(400)), res);
        res.set_header("Connection", "close");
      } else {
        serve(req, res);
      }
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_post_routing_handler([](const httplib::Request&, httplib::Response&) {
      if (t_request) t_request->started = true;
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      // Runs once the response is written: a response that said "Connection: close" (an early
      // refusal, an SSE stream) ends the connection here, so bytes the client sent after its
      // headers are never read as a next request.
      if (t_conn && res.get_header_value("Connection") == "close") {
        t_conn->closing = true;
        end_connection(t_conn->fd, t_request && t_request->unread_body);
        gate.retire(t_conn->id);
      }
      if (t_conn) gate.mark(t_conn->id, false);
      t_request.reset();
      if (req.method.empty() || !req.has_header("REMOTE_ADDR")) return;  // the library refused
      if (router.record(req.method, req.path, res.status))
        std::fputs(
            router.log_line(req.method, req.path, res.status, res.get_header_value("x-request-id"))
                .c_str(),
            stderr);
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      // The library answered before the pre-routing step (a head it could not parse, a Range it
      // refused): the connection ends after it, whatever the request's body was.
      if (!t_request) return library_refusal(req, res);
      const HttpResponse e =
          error_response(http_status_error(res.status), error_style_for(req.path));
      res.set_content(e.body, e.content_type.c_str());
    });
    http.set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                                  std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "[http] %s: internal error: %s\n",
                   res.get_header_value("x-request-id").c_str(), what.c_str());
      const HttpResponse e =
          error_response(api_error(500, "server_error", "internal_error", "internal server error"),
                         error_style_for(req.path));
      res.status = e.status;
      res.set_content(e.body, e.content_type.c_str());
      // The request's body may be unread: nothing more is parsed from this connection.
      res.set_header("Connection", "close");
    });
  }
};

HttpServer::HttpServer(EngineService& service, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {
  Impl& s = *impl_;
  s.http.new_task_queue = [&s] {
    return new ConnectionPool(static_cast<size_t>(std::max(1, s.options.max_connections)) +
                              kSpareThreads);
  };
  // The library's default also sets SO_REUSEPORT, which lets a second server bind the same port
  // and take half its connections: SO_REUSEADDR only (rebinding over TIME_WAIT after a restart).
  s.http.set_socket_options([&s](socket_t fd) {
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.listen_fd = fd;
  });
  const double t = s.options.read_timeout_s;
  s.http.set_read_timeout(
      static_cast<time_t>(t),
      static_cast<time_t>((t - static_cast<double>(static_cast<time_t>(t))) * 1e6));
  s.http.set_write_timeout(60, 0);
  s.http.set_keep_alive_timeout(15);
  s.install();
}

HttpServer::~HttpServer() = default;

namespace {

// Why `host` cannot be listened on when the library's bind failed: the system's reason (the
// port in use, no such address here) or the resolver's.
std::string bind_failure(const std::string& host, int saved_errno) {
  if (saved_errno != 0) return std::strerror(saved_errno);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  return rc != 0 ? std::string("not an address of this machine (") + ::gai_strerror(rc) + ")"
                 : "cannot bind";
}

}  // namespace

int HttpServer::bind() {
  Impl& s = *impl_;
  const std::string& host = s.options.security.bind_host;
  int port = s.options.port;
  errno = 0;
  if (port == 0)
    port = s.http.bind_to_any_port(host);
  else if (!s.http.bind_to_port(host, port))
    port = -1;
  const int saved = errno;
  if (port <= 0)
    throw Error("cannot listen on " + host + ":" + std::to_string(s.options.port) + ": " +
                bind_failure(host, saved));
  if (s.listen_fd >= 0) ::listen(s.listen_fd, kListenBacklog);
  s.options.security.port = port;
  s.router.set_port(port);
  return port;
}

void HttpServer::run() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.lifecycle);
    if (s.stopped) return;
    s.listening = true;
  }
  s.http.listen_after_bind();
  s.finished.store(true);
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  std::call_once(s.shutdown_once, [&] {
    s.router.drain();
    {
      std::lock_guard<std::mutex> lock(s.lifecycle);
      s.stopped = true;
      if (!s.listening) return;  // run() has not started listening: it will not
    }
    // run() is entering or in the library's accept loop, which marks itself running first.
    while (!s.http.is_running() && !s.finished.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s.http.stop();
    // Idle keep-alive connections would hold the accept loop's exit for the keep-alive timeout.
    s.gate.visit_idle(0, [](const Peer& p) { ::shutdown(p.fd, SHUT_RDWR); });
  });
}

}  // namespace k3::server
