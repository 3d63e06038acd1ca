// server/security.h — the request checks of `coli serve` as pure functions (docs/serving.md):
// bind policy, Host allowlist (DNS rebinding), exact-origin CORS, API keys compared in constant
// time. The route guard (server/routes.h) calls them before any body is read.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace k3::server {

struct SecurityOptions {
  std::string bind_host = "127.0.0.1";
  int port = 0;                            // the bound port (own origin)
  std::vector<std::string> api_keys;       // empty: no key required
  std::vector<std::string> allowed_hosts;  // extra Host names; "*" disables the check
  std::vector<std::string> cors_origins;   // extra exact origins; "*" allows any
};

// localhost, or a numeric loopback address: 127.0.0.0/8 (dotted quad), ::1 (bracketed or not),
// ::ffff:127.x.y.z. Anything else ("127.evil", a host name) is not.
bool is_loopback_host(std::string_view host);
// The host name of a Host header without its port ("[::1]:8000" → "::1", "a.b:80" → "a.b").
std::string host_without_port(std::string_view host_header);
// The Host header is localhost, 127.0.0.1, [::1], the bind address or an allowed host.
bool host_allowed(std::string_view host_header, const SecurityOptions& options);
// The origin is the server's own (any loopback spelling or the bind address, same port) or a
// --cors-origin entry.
bool origin_allowed(std::string_view origin, const SecurityOptions& options);
// The key from `Authorization: Bearer <key>` or `x-api-key` (trimmed); empty when absent or
// another scheme.
std::string presented_key(std::string_view authorization, std::string_view x_api_key);
// Constant time in the key's length and content (both sides padded to a fixed size).
bool key_matches(std::string_view presented, const std::vector<std::string>& keys);
inline constexpr size_t kMaxApiKeyBytes = 512;

}  // namespace k3::server
