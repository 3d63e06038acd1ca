// The strict HTTP/1.1 framing of `coli serve` as plain functions (server/http_framing.h): the
// request head check (RFC 9112 sections 2-6: field line syntax, Host, Content-Length and
// Transfer-Encoding) and the chunked decoder (RFC 9112 section 7.1), which must stop at the end of
// its body whatever the size of the pieces it is fed, leaving pipelined bytes unread.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../src/server/http_framing.h"

namespace k3::server {
namespace {

using namespace std::string_literals;

std::string head(const std::string& fields, const std::string& line = "GET /health HTTP/1.1") {
  return line + "\r\n" + fields + "\r\n";
}

TEST(HttpFraming, WellFormedHeads) {
  RequestHead h = check_request_head(head("Host: 127.0.0.1\r\n"));
  EXPECT_EQ(h.error, "");
  EXPECT_EQ(h.framing, BodyFraming::none);
  h = check_request_head(head("Host: a\r\nContent-Length:  82 \r\nX-Tab: a\tb\r\nX-Empty:\r\n"));
  EXPECT_EQ(h.error, "");
  EXPECT_EQ(h.framing, BodyFraming::length);
  EXPECT_EQ(h.length, 82u);
  h = check_request_head(head("host: a\r\ntransfer-encoding: Chunked\r\nX-Pct: 100%25 a%2Fb\r\n"));
  EXPECT_EQ(h.error, "");
  EXPECT_EQ(h.framing, BodyFraming::chunked);
  // HTTP/1.0 needs no Host; bytes above 0x7f (obs-text) are allowed in values.
  h = check_request_head(head("X-Name: caf\xc3\xa9\r\n", "GET / HTTP/1.0"));
  EXPECT_EQ(h.error, "");
}

TEST(HttpFraming, MalformedHeadsAreRefused) {
  struct HeadCase {
    std::string head;
    bool framing;
  };
  const std::vector<HeadCase> cases = {
      {head("Host: a\r\nContent-Length: +82\r\n"), true},
      {head("Host: a\r\nContent-Length: -1\r\n"), true},
      {head("Host: a\r\nContent-Length: 5, 5\r\n"), true},
      {head("Host: a\r\nContent-Length: 0x10\r\n"), true},
      {head("Host: a\r\nContent-Length:\r\n"), true},
      {head("Host: a\r\nContent-Length: 99999999999999999999\r\n"), true},
      {head("Host: a\r\nContent-Length : 5\r\n"), false},  // whitespace before the colon
      {head("Host: a\r\nContent-Length\t: 5\r\n"), false},
      {head("Host: a\r\nX-No-Colon\r\n"), false},
      {head("Host: a\r\n: empty name\r\n"), false},
      {head("Host: a\r\nX(Bad): 1\r\n"), false},
      {head("Host: a\r\nX-A: a"s + '\0' + "b\r\n"), false},  // a NUL in a value
      {head("Host: a\r\nX-A: a\x01z\r\n"), false},
      {head("Host: a\r\nX-A: a\x7fz\r\n"), false},
      {head("Host: a\r\nX-A: a%00b\r\n"), false},  // the library would decode it to a NUL
      {head("Host: a\r\nX-A: a%0d%0aSet-Cookie: b\r\n"), false},
      {head("Host: a\r\nX-A: a\rb\r\n"), false},          // a bare CR
      {head("Host: a\r\nX-A: b\nX-B: c\r\n"), false},     // a bare LF
      {head("Host: a\r\nX-A: b\r\n folded\r\n"), false},  // obsolete line folding
      {head("Host: a\r\nHost: evil.example\r\n"), false},
      {head("X-A: b\r\n"), false},  // HTTP/1.1 without Host
      {head("Host: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n"), true},
      {head("Host: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"), true},
      {head("Host: a\r\nTransfer-Encoding: gzip, chunked\r\n"), true},
      {head("Host: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"), true},
      {head("Transfer-Encoding: chunked\r\n", "POST / HTTP/1.0"), true},
      {"GET / HTTP/1.1\nHost: a\r\n\r\n", false},  // the request line ends with a bare LF
      {"GET / HTTP/1.1\r\nHost: a\r\n", false},    // no empty line
  };
  for (const HeadCase& c : cases) {
    const RequestHead h = check_request_head(c.head);
    EXPECT_NE(h.error, "") << ::testing::PrintToString(c.head);
    EXPECT_EQ(h.framing_error, c.framing) << ::testing::PrintToString(c.head) << " " << h.error;
    for (char ch : h.error)  // the message goes into a JSON error: printable, quoted
      EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << h.error;
  }
}

// Feeds `bytes` in pieces of `step` bytes, as a socket might deliver them.
struct Decoded {
  std::string data;
  size_t used = 0;
  bool done = false;
  std::string error;
};
Decoded decode(const std::string& bytes, size_t step) {
  ChunkedDecoder d;
  Decoded out;
  while (out.used < bytes.size() && !d.done() && !d.failed()) {
    const std::string_view piece = std::string_view(bytes).substr(out.used, step);
    const size_t used = d.feed(piece, out.data);
    EXPECT_TRUE(used == piece.size() || d.done() || d.failed());
    out.used += used;
  }
  out.done = d.done();
  out.error = d.error();
  return out;
}

TEST(HttpFraming, ChunkedBodyEndsWhereItEnds) {
  const std::string body =
      "5\r\nhello\r\n"
      "1a;name=value;x\r\n"
      "abcdefghijklmnopqrstuvwxyz\r\n"
      "000A ; e\r\n0123456789\r\n"
      "0\r\nX-Trailer: 1\r\nX-Other: two\r\n\r\n";
  const std::string next = "GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
  for (size_t step : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{4096}}) {
    const Decoded d = decode(body + next, step);
    EXPECT_TRUE(d.done) << step << " " << d.error;
    EXPECT_EQ(d.data, "helloabcdefghijklmnopqrstuvwxyz0123456789") << step;
    EXPECT_EQ(d.used, body.size()) << step;  // the pipelined request is left unread
  }
  const Decoded empty = decode("0\r\n\r\nGET", 4096);
  EXPECT_TRUE(empty.done);
  EXPECT_EQ(empty.used, 5u);
}

TEST(HttpFraming, MalformedChunkedBodiesAreRefused) {
  const std::vector<std::string> bad = {
      "5\r\nhelloXX0\r\n\r\n",                                       // data not followed by CRLF
      "5\r\nhello\n0\r\n\r\n",                                       // data followed by a bare LF
      "5\nhello\r\n0\r\n\r\n",                                       // a size line ending in LF
      "+5\r\nhello\r\n0\r\n\r\n",                                    // a sign
      "0x5\r\nhello\r\n0\r\n\r\n",                                   // a 0x prefix
      " 5\r\nhello\r\n0\r\n\r\n",                                    // leading whitespace
      "\r\nhello\r\n0\r\n\r\n",                                      // no digits
      "5 junk\r\nhello\r\n0\r\n\r\n",                                // not an extension
      "5 \r\nhello\r\n0\r\n\r\n",                                    // whitespace, no extension
      "11111111111111111\r\n",                                       // 17 hex digits
      "5;\x01\r\nhello\r\n0\r\n\r\n",                                // a control character
      "0\r\nno colon here\r\n\r\n",                                  // a bad trailer line
      "0\r\nX-T: a\nb\r\n\r\n",                                      // a bare LF in a trailer
      std::string(ChunkedDecoder::kMaxLineBytes + 8, '0') + "\r\n",  // a line over the cap
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    for (size_t step : {size_t{1}, size_t{4096}}) {
      const Decoded d = decode(bad[i], step);
      EXPECT_FALSE(d.done) << i << " " << ::testing::PrintToString(bad[i]);
      EXPECT_NE(d.error, "") << i << " " << ::testing::PrintToString(bad[i]);
    }
  }
  const Decoded cr = decode("5\r\nhe\rlo\r\n0\r\n\r\n", 1);  // a CR inside chunk data is data
  EXPECT_TRUE(cr.done) << cr.error;
  EXPECT_EQ(cr.data, "he\rlo");
  std::string trailers = "0\r\n";
  for (int i = 0; i < 1000; ++i) trailers += "X-T: " + std::string(20, 'a') + "\r\n";
  EXPECT_NE(decode(trailers + "\r\n", 4096).error, "");  // the trailer section over its cap
}

}  // namespace
}  // namespace k3::server
