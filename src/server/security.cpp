// server/security.cpp — Host, Origin and API-key checks (see server/security.h).
#include "server/security.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "http_framing.h"

namespace k3::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool is_loopback_host(std::string_view host) {
  std::string h = lower(trim_ows(host));
  if (h == "localhost") return true;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) != 1) return false;
  return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
}

std::string host_without_port(std::string_view host_header) {
  std::string_view h = trim_ows(host_header);
  if (!h.empty() && h.front() == '[') {
    const size_t close = h.find(']');
    return lower(close == std::string_view::npos ? h.substr(1) : h.substr(1, close - 1));
  }
  const size_t colon = h.find(':');
  if (colon != std::string_view::npos && h.find(':', colon + 1) == std::string_view::npos)
    h = h.substr(0, colon);
  return lower(h);
}

bool host_allowed(std::string_view host_header, const SecurityOptions& options) {
  if (std::find(options.allowed_hosts.begin(), options.allowed_hosts.end(), "*") !=
      options.allowed_hosts.end())
    return true;
  const std::string host = host_without_port(host_header);
  if (host.empty()) return false;
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  if (host == lower(options.bind_host) && options.bind_host != "0.0.0.0" &&
      options.bind_host != "::")
    return true;
  for (const std::string& allowed : options.allowed_hosts)
    if (host == host_without_port(allowed)) return true;
  return false;
}

bool origin_allowed(std::string_view origin, const SecurityOptions& options) {
  const std::string o = lower(trim_ows(origin));
  for (const std::string& allowed : options.cors_origins)
    if (allowed == "*" || lower(allowed) == o) return true;
  const std::string port = std::to_string(options.port);
  for (const char* own : {"http://127.0.0.1:", "http://localhost:", "http://[::1]:"})
    if (o == own + port) return true;
  return !options.bind_host.empty() && o == "http://" + lower(options.bind_host) + ":" + port;
}

std::string presented_key(std::string_view authorization, std::string_view x_api_key) {
  std::string_view auth = trim_ows(authorization);
  if (auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ")
    return std::string(trim_ows(auth.substr(7)));
  if (!auth.empty()) return {};  // another scheme counts as missing
  return std::string(trim_ows(x_api_key));
}

bool key_matches(std::string_view presented, const std::vector<std::string>& keys) {
  std::array<unsigned char, kMaxApiKeyBytes> a{};
  const size_t n = std::min(presented.size(), a.size());
  std::copy_n(presented.begin(), n, a.begin());
  bool any = false;
  for (const std::string& key : keys) {
    std::array<unsigned char, kMaxApiKeyBytes> b{};
    std::copy_n(key.begin(), std::min(key.size(), b.size()), b.begin());
    unsigned diff = static_cast<unsigned>(presented.size() ^ key.size()) |
                    (presented.size() > a.size() ? 1u : 0u);
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
    any |= diff == 0;
  }
  return any && !presented.empty();
}

}  // namespace k3::server
