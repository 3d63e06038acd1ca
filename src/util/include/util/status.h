// util/status.h — request-path outcomes: a Status (code + message) and Result<T> (a value or a
// Status). Request paths (rendering a chat, parsing a body, serving) return these instead of
// throwing; the server maps codes to HTTP statuses (invalid_argument → 400, ...).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace k3 {

class Status {
 public:
  // resource_exhausted: a full queue or a queue wait that timed out (HTTP 429).
  enum class Code {
    ok,
    invalid_argument,
    not_found,
    too_large,
    unavailable,
    resource_exhausted,
    cancelled,
    internal
  };

  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status invalid(std::string message) {
    return {Code::invalid_argument, std::move(message)};
  }

  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::ok;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <class T>
class Result {
 public:
  Result(T value) : data_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}  // NOLINT: must not be ok()

  bool ok() const { return std::holds_alternative<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T& value() & { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  // The failure; an ok Status when there is a value.
  Status status() const { return ok() ? Status() : std::get<Status>(data_); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace k3
