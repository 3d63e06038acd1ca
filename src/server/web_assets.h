// server/web_assets.h — the web page's static files, embedded in the binary at build time
// (cmake/embed_web.cmake turns every file of web/ except README.md into a byte array), so
// `coli web` serves the page with no files beside it and no network.
#pragma once

#include <string_view>

namespace k3::server {

struct WebAsset {
  std::string_view path;  // "index.html", "app.js" (relative to web/)
  std::string_view mime;  // from a fixed map by extension
  std::string_view bytes;
};

// The asset at `path` (no leading slash), or nullptr.
const WebAsset* find_web_asset(std::string_view path);

}  // namespace k3::server
