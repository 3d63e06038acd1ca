// util/error.h — the one exception type for load, I/O and parse failures.
// Owns: k3::Error and small helpers to build messages. Does not own: request-path statuses
// (those come with the server).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace k3 {

// Thrown by loaders and parsers. The message names the file, the tensor and the expected and
// actual value wherever one of them is known.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Thrown by a forward pass or a weight load whose caller raised its interrupt / cancel flag (a
// cancelled prefill, a load stopped by a signal); not an Error: nothing failed, and the caller
// restores or resets the state it interrupted (a cancelled load leaves nothing behind).
class Interrupted : public std::exception {
 public:
  const char* what() const noexcept override { return "interrupted"; }
};

// "[3, 64]" — used in every shape message.
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace k3
