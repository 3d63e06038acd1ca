// server/http_types.h — the server's own request and response values. Handlers are functions
// HttpRequest → HttpResponse (server/routes.h); only the socket adapter (http_server.cpp) knows
// the HTTP library, so every handler, guard and route can be called from a test with no socket.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace k3::server {

// Header or query fields in arrival order; header names compare case-insensitively.
using Fields = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // GET, HEAD, POST, OPTIONS, ...
  std::string path;    // decoded, without the query
  std::string target;  // the request line's target as sent (path and query)
  Fields query;        // decoded query parameters
  Fields headers;
  std::string body;         // empty before the body is read
  std::string remote_addr;  // the peer's IP address
  int remote_port = -1;
  // Who the client is for the auth brake: the address, and for a loopback client the uid owning
  // its socket too ("127.0.0.1 uid 1000"); empty: the address.
  std::string client;
  std::string request_id;  // x-request-id of the response ("req-<16 hex>")
  std::string path_param;  // the {id} of a route such as /v1/models/{id} (set by the router)
  // True once the client has hung up (polled while a generation waits or streams); null: never.
  std::function<bool()> client_gone;

  // The first value of a header (case-insensitive name), or "".
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
  // The first value of a query parameter, or "".
  std::string query_value(std::string_view name) const;
};

// What a streamed body writes to; false once the client can no longer be written to. Used only
// on the thread that runs the stream.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view bytes) = 0;
};

struct HttpResponse {
  int status = 200;
  Fields headers;  // "Connection: close" ends the connection after the response
  std::string content_type;
  std::string body;
  // A streamed body instead of `body`, run once on the connection's thread after the headers
  // are sent: until the stream ends (true) or is abandoned (false).
  std::function<bool(StreamSink&)> stream;
  // Called once the response is finished (true) or broken off (false).
  std::function<void(bool)> on_finish;
  // The request was refused before its body was read (or before it was read in full): the
  // adapter drains what the client still sends before it closes the connection.
  bool unread_body = false;

  // Replaces a header of that name (case-insensitive) or adds it.
  void set_header(std::string name, std::string value);
  std::string header(std::string_view name) const;
  bool closes() const { return header("Connection") == "close"; }
};

bool same_field_name(std::string_view a, std::string_view b);

}  // namespace k3::server
