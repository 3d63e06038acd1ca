// server/read_deadline.h — the cumulative read deadline of `coli serve` (slowloris,
// docs/serving.md §4.6): a request's line and headers must be complete within `seconds` of its
// start, its body within `seconds` of its headers; a per-read timeout alone does not stop a
// client dripping a byte at a time. The connection's stream (server/http_server.cpp) bounds every
// read by it; this is the body's check and the figure the refusals quote.
#pragma once

namespace k3::server {

class ReadDeadline {
 public:
  explicit ReadDeadline(double seconds) : seconds_(seconds) {}
  // The body of a request whose headers were complete at `headers_done` (now_seconds()) is late.
  bool body_overdue(double headers_done) const;
  double seconds() const { return seconds_; }

 private:
  double seconds_;
};

}  // namespace k3::server
