// server/http_types.cpp — field lookups of HttpRequest / HttpResponse (see server/http_types.h).
#include "server/http_types.h"

#include <cctype>

namespace k3::server {
namespace {

std::string first(const Fields& fields, std::string_view name, bool any_case) {
  for (const auto& [k, v] : fields)
    if (any_case ? same_field_name(k, name) : k == name) return v;
  return {};
}

}  // namespace

bool same_field_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string HttpRequest::header(std::string_view name) const {
  return first(headers, name, true);
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (same_field_name(k, name)) return true;
  return false;
}

std::string HttpRequest::query_value(std::string_view name) const {
  return first(query, name, false);
}

void HttpResponse::set_header(std::string name, std::string value) {
  for (auto& [k, v] : headers)
    if (same_field_name(k, name)) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(std::move(name), std::move(value));
}

std::string HttpResponse::header(std::string_view name) const {
  return first(headers, name, true);
}

}  // namespace k3::server
