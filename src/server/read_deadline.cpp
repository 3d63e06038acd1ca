// server/read_deadline.cpp — the body deadline (see server/read_deadline.h).
#include "read_deadline.h"

#include "util/sys.h"

namespace k3::server {

bool ReadDeadline::body_overdue(double headers_done) const {
  return now_seconds() - headers_done > seconds_;
}

}  // namespace k3::server
