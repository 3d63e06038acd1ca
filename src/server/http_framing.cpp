// server/http_framing.cpp — the request head check and the chunked decoder (see
// server/http_framing.h).
#include "http_framing.h"

#include <algorithm>

namespace k3::server {
namespace {

// tchar of RFC 9110 section 5.6.2.
bool is_tchar(unsigned char c) {
  static constexpr std::string_view kMarks = "!#$%&'*+-.^_`|~";
  const bool alnum = (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return alnum || kMarks.find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_ctl(unsigned char c) {
  return (c < 0x20 && c != '\t') || c == 0x7f;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool same_name(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if ((a[i] >= 'A' && a[i] <= 'Z' ? a[i] | 0x20 : a[i]) != lower[i]) return false;
  return true;
}

// `s` quoted for an error message: printable ASCII kept, anything else as \xNN, cut at 40 bytes.
std::string quoted(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out + (s.size() > 40 ? "...\"" : "\"");
}

// Why the field line `line` (CRLF removed) is malformed, or empty.
std::string field_line_error(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t')
    return "a header line starts with whitespace (obsolete line folding): " + quoted(line);
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return "a header line has no colon: " + quoted(line);
  const std::string_view name = line.substr(0, colon);
  bool token = !name.empty();
  for (char c : name) token = token && is_tchar(static_cast<unsigned char>(c));
  if (!token)
    return "the header name " + quoted(name) + " is not a token (nothing may precede the colon)";
  const std::string_view value = line.substr(colon + 1);
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (is_ctl(c)) return "the header " + quoted(name) + " has a control character in its value";
    // The library percent-decodes field values: an encoded control character would reach the
    // handlers decoded.
    if (c == '%' && i + 2 < value.size() && hex_value(value[i + 1]) >= 0 &&
        hex_value(value[i + 2]) >= 0 &&
        is_ctl(static_cast<unsigned char>(hex_value(value[i + 1]) * 16 + hex_value(value[i + 2]))))
      return "the header " + quoted(name) + " has a percent-encoded control character (" +
             std::string(value.substr(i, 3)) + ") in its value";
  }
  return {};
}

}  // namespace

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

RequestHead check_request_head(std::string_view head) {
  RequestHead h;
  auto refuse = [&h](std::string why, bool framing = false) {
    h.error = std::move(why);
    h.framing_error = framing;
    return h;
  };
  size_t pos = 0, hosts = 0, lengths = 0, encodings = 0;
  bool http10 = false, chunked = true;
  std::string_view length;
  for (bool first = true;; first = false) {
    const size_t lf = head.find('\n', pos);
    if (lf == std::string_view::npos)
      return refuse("the request head does not end with an empty line");
    if (lf == pos || head[lf - 1] != '\r')
      return refuse(first ? "the request line does not end with CRLF"
                          : "a header line ends with a bare LF, not CRLF");
    const std::string_view line = head.substr(pos, lf - 1 - pos);
    pos = lf + 1;
    if (line.find('\r') != std::string_view::npos)
      return refuse("a bare CR inside a line of the request head");
    if (first) {
      for (char c : line)
        if (is_ctl(static_cast<unsigned char>(c)) || c == '\t')
          return refuse("the request line has a control character");
      http10 = line.size() >= 9 && line.substr(line.size() - 9) == " HTTP/1.0";
      continue;
    }
    if (line.empty()) break;
    if (std::string error = field_line_error(line); !error.empty()) return refuse(std::move(error));
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon), value = trim_ows(line.substr(colon + 1));
    if (same_name(name, "host")) {
      ++hosts;
    } else if (same_name(name, "content-length")) {
      ++lengths;
      length = value;
    } else if (same_name(name, "transfer-encoding")) {
      ++encodings;
      chunked = chunked && value.size() == 7 && same_name(value, "chunked");
    }
  }
  if (hosts > 1) return refuse("more than one Host header");
  if (hosts == 0 && !http10) return refuse("an HTTP/1.1 request needs a Host header");
  if (lengths > 1) return refuse("more than one Content-Length header", true);
  if (encodings > 1 || (encodings && !chunked))
    return refuse("Transfer-Encoding must be exactly chunked", true);
  if (lengths && encodings) return refuse("Content-Length together with Transfer-Encoding", true);
  if (encodings && http10) return refuse("Transfer-Encoding in an HTTP/1.0 request", true);
  if (encodings) {
    h.framing = BodyFraming::chunked;
  } else if (lengths) {
    bool digits = !length.empty() && length.size() <= 18;
    for (char c : length) digits = digits && c >= '0' && c <= '9';
    if (!digits)
      return refuse("Content-Length " + quoted(length) + " is not a decimal number of bytes", true);
    for (char c : length) h.length = h.length * 10 + static_cast<uint64_t>(c - '0');
    h.framing = BodyFraming::length;
  }
  return h;
}

void ChunkedDecoder::fail(std::string why) {
  error_ = "chunked body: " + std::move(why);
}

bool ChunkedDecoder::end_line() {
  // line_ ends with LF; it must end with CRLF and hold no other CR.
  if (line_.size() < 2 || line_[line_.size() - 2] != '\r') {
    fail("a line ends with a bare LF, not CRLF");
    return false;
  }
  const std::string_view line = std::string_view(line_).substr(0, line_.size() - 2);
  if (line.find('\r') != std::string_view::npos) {
    fail("a bare CR inside a line");
    return false;
  }
  if (phase_ == Phase::trailer_line) {
    trailer_bytes_ += line_.size();
    if (line.empty()) {
      phase_ = Phase::done;
    } else if (std::string error = field_line_error(line); !error.empty()) {
      fail("trailer: " + error);
      return false;
    } else if (trailer_bytes_ > kMaxTrailerBytes) {
      fail("the trailer section exceeds " + std::to_string(kMaxTrailerBytes) + " bytes");
      return false;
    }
    line_.clear();
    return true;
  }
  size_t digits = 0;
  uint64_t size = 0;
  for (; digits < line.size() && hex_value(line[digits]) >= 0; ++digits) {
    if (digits == 16) {
      fail("a chunk size of more than 16 hex digits");
      return false;
    }
    size = size * 16 + static_cast<uint64_t>(hex_value(line[digits]));
  }
  // Extensions follow the size, whitespace allowed only before their ";" (BWS).
  const std::string_view rest = trim_ows(line.substr(digits));
  if (digits == 0 || (digits < line.size() && (rest.empty() || rest.front() != ';'))) {
    fail("the chunk size line " + quoted(line) + " is not hex digits (and extensions)");
    return false;
  }
  for (char c : rest)
    if (is_ctl(static_cast<unsigned char>(c))) {
      fail("a control character in a chunk extension");
      return false;
    }
  line_.clear();
  left_ = size;
  phase_ = size == 0 ? Phase::trailer_line : Phase::data;
  return true;
}

size_t ChunkedDecoder::feed(std::string_view in, std::string& out) {
  size_t i = 0;
  while (i < in.size() && !failed() && phase_ != Phase::done) {
    switch (phase_) {
      case Phase::size_line:
      case Phase::trailer_line: {
        const char c = in[i++];
        line_ += c;
        if (c == '\n') {
          end_line();
        } else if (line_.size() > kMaxLineBytes) {
          fail("a line of more than " + std::to_string(kMaxLineBytes) + " bytes");
        }
        break;
      }
      case Phase::data: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, in.size() - i));
        out.append(in.data() + i, take);
        i += take;
        left_ -= take;
        if (left_ == 0) phase_ = Phase::data_cr;
        break;
      }
      case Phase::data_cr:
      case Phase::data_lf:
        if (in[i] != (phase_ == Phase::data_cr ? '\r' : '\n')) {
          fail("chunk data is not followed by CRLF");
          break;
        }
        ++i;
        phase_ = phase_ == Phase::data_cr ? Phase::data_lf : Phase::size_line;
        break;
      case Phase::done:
        break;
    }
  }
  return i;
}

}  // namespace k3::server
