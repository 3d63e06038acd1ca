// server/http_framing.h — the strict HTTP/1.1 framing of `coli serve` (RFC 9112), as plain
// functions over bytes: the check of a request's raw head (request line, field lines, the empty
// line) and the decoder of a chunked body. cpp-httplib 0.11 parses leniently: it drops a field
// line without a colon or one ending in a bare LF, keeps "Content-Length " (a space before the
// colon) as another field, reads "+82" as a length, percent-decodes field values and ends a
// chunked body at the first chunk not followed by CRLF, leaving the rest to be read as the next
// request. A proxy in front may frame such bytes differently (request smuggling), so the socket
// adapter (server/http_server.cpp) refuses them with 400 before any handler runs, and reads every
// body itself with these rules (docs/serving.md §4.5). What the head check does not own: the
// guards of server/routes.h (header size, Host allowlist, key, media type, length caps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace k3::server {

enum class BodyFraming { none, length, chunked };

// What the head says: a malformed head's reason, or how its body is framed.
struct RequestHead {
  // Why the head is refused (400), naming the offending line or field; empty when it is not.
  std::string error;
  // The refusal concerns the body's framing (code invalid_framing, else bad_request).
  bool framing_error = false;
  BodyFraming framing = BodyFraming::none;
  uint64_t length = 0;  // the Content-Length when framing == length
};

// Checks `head`, the bytes of one request from its request line through the empty line. Refused:
// a line not ended by CRLF (a bare LF or CR), a field line starting with whitespace (obsolete
// folding), without a colon, or whose name is not a token (so no whitespace before the colon); a
// control character other than HTAB in a field value, literal or percent-encoded (the library
// decodes %XX in field values, so "%00" reaches the handlers as a NUL); more than one Host, or none
// in HTTP/1.1; a Content-Length that is not 1*DIGIT ("+82", "5, 5"); two Content-Lengths; a
// Transfer-Encoding other than exactly chunked, two of them, one with a Content-Length or in
// HTTP/1.0.
RequestHead check_request_head(std::string_view head);

// `s` without the spaces and tabs around it (a field value's optional whitespace, OWS in
// RFC 9110).
std::string_view trim_ows(std::string_view s);

// Decodes a chunked body (RFC 9112 section 7.1) pushed to it in pieces of any size, and stops at
// its end, so bytes pipelined behind it stay unread. Strict: a chunk size is 1 to 16 hex digits,
// optionally followed by extensions (";..."); every line ends with CRLF; chunk data is followed by
// exactly CRLF; trailer fields are valid field lines (read and dropped). Lines are capped at
// kMaxLineBytes, the trailer section at kMaxTrailerBytes. Not thread-safe (one per body).
class ChunkedDecoder {
 public:
  static constexpr size_t kMaxLineBytes = 4096, kMaxTrailerBytes = 16384;

  // Decodes from `in`, appending chunk data to `out`. Returns how many bytes of `in` it used: all
  // of them unless the body ended or turned out malformed inside `in`.
  size_t feed(std::string_view in, std::string& out);
  bool done() const { return phase_ == Phase::done; }
  bool failed() const { return !error_.empty(); }
  // Why the body is malformed (empty while it is not).
  const std::string& error() const { return error_; }

 private:
  enum class Phase { size_line, data, data_cr, data_lf, trailer_line, done };
  bool end_line();  // a whole line is in line_: act on it; false when it is malformed
  void fail(std::string why);

  Phase phase_ = Phase::size_line;
  std::string line_;   // the size or trailer line being read, CR included
  uint64_t left_ = 0;  // data bytes of the current chunk still to come
  size_t trailer_bytes_ = 0;
  std::string error_;
};

}  // namespace k3::server
