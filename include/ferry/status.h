// Error vocabulary shared by the control plane (thrown as ferry::Error) and
// the data plane (delivered to a transfer's OnDone as ferry::Status).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ferry {

// Canonical codes (abseil's vocabulary): callers decide whether to retry from
// the code alone; the message carries peer, NIC and library call.
enum class Code : uint8_t {
  kOk = 0,
  kCancelled,           // engine stopped before the operation finished
  kInvalidArgument,     // malformed input: bad bytes, zero count, bad routing
  kDeadlineExceeded,    // an operation or wait ran past its deadline
  kNotFound,            // unknown handle, counter, peer group
  kAlreadyExists,       // duplicate registration
  kResourceExhausted,   // pools, queues, slots full
  kFailedPrecondition,  // state forbids it: stopped engine, NIC-count mismatch
  kOutOfRange,          // offset + length past a registered region
  kUnimplemented,       // feature not available in this build or on this NIC
  kInternal,            // a bug or an unexpected provider return
  kUnavailable,         // transport failure: peer unreachable, provider error
  kAborted,             // peer restarted (stale incarnation), transfer dropped
};

std::string_view code_name(Code c) noexcept;

// An OK status holds an empty string and allocates nothing.
class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const noexcept { return code_ == Code::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  Code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Thrown by control-plane calls and by submit_* when a request is rejected
// before anything is posted.
class Error : public std::runtime_error {
 public:
  explicit Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}
  Error(Code code, std::string message) : Error(Status(code, std::move(message))) {}
  Code code() const noexcept { return status_.code(); }
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace ferry
