// server/http_server.cpp — the cpp-httplib adapter of `coli serve`, the only file that knows the
// HTTP library (see server/http_server.h): library requests become HttpRequest values, the
// Router's answers become library responses, and the connection-level work (gate, read
// deadline, body reads, closing) happens here.
#include "server/http_server.h"

#include <httplib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "connection_gate.h"
#include "read_deadline.h"
#include "server/routes.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3::server {
namespace {

// A task queue that admits each accepted connection through the gate before a thread reads it.
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

// One request's state across the library's callbacks, which run in order on the connection's
// thread: the pre-routing handler (headers in), the route handler (body), the logger (response
// written). The library gives them no shared per-request slot but the thread.
struct RequestScope {
  double headers_done = 0;   // now_seconds() when the headers were complete (the body's deadline)
  bool unread_body = false;  // refused before its body was read in full: drain before closing
};
thread_local RequestScope t_scope;

PeerAddress address_of(const httplib::Request& req) {
  return {req.remote_addr, req.remote_port, req.local_port};
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
  return r;
}

// The headers already on the library's response (set by the pre-routing step).
HttpResponse current(const httplib::Response& res) {
  HttpResponse out;
  for (const auto& [k, v] : res.headers) out.headers.emplace_back(k, v);
  return out;
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
  if (out.unread_body) t_scope.unread_body = true;
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
  httplib::Server http;
  ConnectionGate gate{static_cast<size_t>(options.max_connections),
                      static_cast<size_t>(options.max_connections_per_ip), options.cap_loopback};
  ReadDeadline deadline{options.read_timeout_s, gate};
  std::once_flag shutdown_once;

  Impl(EngineService& s, ServerOptions o) : options(o), router(s, std::move(o)) {}

  // The library's request with its body, through the route table; `client_gone` probes the
  // connection's socket (found once, when first asked).
  void dispatch(const httplib::Request& req, httplib::Response& res, std::string body) {
    HttpRequest r = to_request(req);
    r.body = std::move(body);
    r.request_id = res.get_header_value("x-request-id");
    auto fd = std::make_shared<int>(-2);
    r.client_gone = [this, fd, a = address_of(req)] {
      if (*fd == -2) *fd = gate.socket_of(a);
      return peer_hung_up(*fd);
    };
    HttpResponse out = current(res);
    router.handle(std::move(r), out);
    answer(std::move(out), res);
  }

  // A POST's body, chunked or not, read up to the route's limit within the read deadline (the
  // library bounds Content-Length bodies but not chunked ones), then dispatched.
  void read_and_dispatch(const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& reader) {
    const Route* route = router.find(req.method, req.path);
    const size_t limit = route ? route->body_limit : options.max_body_bytes;
    std::string body;
    bool too_large = false, too_slow = false;
    const bool complete = reader([&](const char* data, size_t length) {
      if (body.size() + length > limit) {
        too_large = true;
        return false;
      }
      if (deadline.body_overdue(t_scope.headers_done)) {
        too_slow = true;
        return false;
      }
      body.append(data, length);
      return true;
    });
    if (too_slow || too_large || !complete) {
      HttpResponse out = current(res);
      const ApiError error = too_slow    ? body_too_slow(deadline.seconds())
                             : too_large ? body_too_large(limit)
                                         : body_unreadable();
      HttpResponse refusal = error_response(error, error_style_for(req.path));
      for (auto& [k, v] : refusal.headers) out.set_header(k, v);
      out.status = refusal.status;
      out.body = std::move(refusal.body);
      out.content_type = std::move(refusal.content_type);
      out.set_header("Connection", "close");
      out.unread_body = true;
      return answer(std::move(out), res);
    }
    dispatch(req, res, std::move(body));
  }

  void install() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const PeerAddress a = address_of(req);
      gate.mark(a, true);
      t_scope = RequestScope{now_seconds(), false};
      if (gate.poisoned(a)) {  // bytes after a refused request: never served
        res.status = 400;
        res.set_header("Connection", "close");
        return httplib::Server::HandlerResponse::Handled;
      }
      HttpResponse head;
      if (!router.screen(to_request(req), head)) {
        for (const auto& [k, v] : head.headers) res.set_header(k, v);
        return httplib::Server::HandlerResponse::Unhandled;
      }
      answer(std::move(head), res);
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      // Runs once the response is written: a response that said "Connection: close" (an early
      // refusal, an SSE stream) ends the connection here, so bytes the client sent after its
      // headers are never read as a next request; a request the library had already buffered
      // is refused unanswered (poisoned).
      if (res.get_header_value("Connection") == "close") {
        const int fd = gate.socket_of(address_of(req));
        if (fd >= 0) gate.poison(fd);
        end_connection(fd, t_scope.unread_body);
        if (fd >= 0) gate.retire(fd);
      }
      t_scope.unread_body = false;
      gate.mark(address_of(req), false);
      if (router.record(req.method, req.path, res.status))
        std::fprintf(stderr, "[http] %s %s %s %d\n", res.get_header_value("x-request-id").c_str(),
                     req.method.c_str(), router.label(req.method, req.path).c_str(), res.status);
    });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
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
    });
    // Every GET and POST goes through the route table (other methods get the library's 404
    // after screen() has checked them against the same table).
    http.Get(".*", [this](const httplib::Request& q, httplib::Response& r) { dispatch(q, r, {}); });
    http.Post(".*",
              [this](const httplib::Request& q, httplib::Response& r,
                     const httplib::ContentReader& reader) { read_and_dispatch(q, r, reader); });
    http.Post(".*", [this](const httplib::Request& q, httplib::Response& r) {
      dispatch(q, r, q.body);
    });  // no body
  }
};

HttpServer::HttpServer(EngineService& service, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {
  Impl& s = *impl_;
  s.http.new_task_queue = [&s] {
    return new GatedQueue(static_cast<size_t>(std::max(4, s.options.max_connections)) + 2, s.gate);
  };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_read_timeout(static_cast<time_t>(s.options.read_timeout_s), 0);
  s.http.set_write_timeout(60, 0);
  s.http.set_keep_alive_timeout(15);
  s.install();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  const std::string& host = s.options.security.bind_host;
  int port = s.options.port;
  if (port == 0)
    port = s.http.bind_to_any_port(host);
  else if (!s.http.bind_to_port(host, port))
    port = -1;
  if (port <= 0)
    throw Error("cannot listen on " + host + ":" + std::to_string(s.options.port) + ": " +
                std::strerror(errno));
  s.options.security.port = port;
  s.router.set_port(port);
  s.gate.set_port(port);
  return port;
}

void HttpServer::run() {
  Impl& s = *impl_;
  s.deadline.start();
  s.http.listen_after_bind();
  s.deadline.stop();
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  std::call_once(s.shutdown_once, [&] {
    s.router.drain();
    s.http.stop();
  });
}

}  // namespace k3::server
