// Arguments of the public calls, converted from Python objects.
//
// Public calls take their arguments as Python objects and convert them here, so
// that a bad one raises a ferry error naming it instead of nanobind's TypeError
// listing a private signature (InvalidArgument, OutOfRange; a wrong type raises
// InvalidArgumentType, both an InvalidArgument and a TypeError). Integers are
// Python ints or anything with __index__ (NumPy integers), never bool.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/ferry.h"

namespace nb = nanobind;

namespace ferry::py {

using Clock = std::chrono::steady_clock;

// Device names as every binding takes and gives them: "cpu" (or "host"),
// "cuda" (device 0) or "cuda:N"; anything else throws kInvalidArgument.
Device parse_device(std::string_view s);
std::string device_str(const Device& d);

// A contiguous read-only view of a bytes-like object.
class ByteView {
 public:
  ByteView(nb::handle obj, const char* what);
  ~ByteView() { PyBuffer_Release(&view_); }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  std::span<const uint8_t> span() const {
    return {static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// An argument of the wrong type: ferry.InvalidArgumentType (an InvalidArgument
// that is also a TypeError).
class ArgTypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// ferry._errors.InvalidArgumentType (leaked, as the error classes of py_runtime.h).
extern PyObject* g_type_error_class;

// The type's __name__ (as Python's own messages say it: "str", "ndarray", "MrDesc").
std::string type_of(nb::handle v);

std::string py_str(nb::handle v);

[[noreturn]] void wrong_type(const std::string& name, const char* expected, nb::handle got);

// The value of an integer argument; overflow is -1 / +1 when it does not fit a long long.
long long int_value(nb::handle v, const std::string& name, int& overflow);

// An offset, length or stride in bytes: [0, 2**63). Negative: InvalidArgument;
// 2**63 or more: OutOfRange (no registered region reaches that far).
uint64_t byte_arg(nb::handle v, const std::string& name);

// Any other integer: [lo, hi], else InvalidArgument ("must not be negative" below 0).
int64_t int_arg(nb::handle v, const std::string& name, int64_t lo, int64_t hi, const char* range);

uint64_t count_arg(nb::handle v, const std::string& name);
uint32_t u32_arg(nb::handle v, const std::string& name);
std::optional<uint32_t> opt_u32_arg(nb::handle v, const std::string& name);

// A memory address: [0, 2**64).
uint64_t addr_arg(nb::handle v, const std::string& name);

// Seconds to wait: None (no deadline) or a non-negative real number. More than
// 10**9 s (31 years; also +inf) is no deadline, which keeps the clock arithmetic
// from overflowing.
std::optional<double> timeout_arg(nb::handle v, const std::string& name = "timeout");

Clock::time_point deadline_after(std::optional<double> timeout);

// An instance of a bound class, else InvalidArgumentType naming the argument.
template <typename T>
T& obj_arg(nb::handle v, const std::string& name, const char* expected) {
  if (!v.is_valid() || !nb::isinstance<T>(v)) wrong_type(name, expected, v);
  return *nb::inst_ptr<T>(v);
}

std::string str_arg(nb::handle v, const std::string& name, const char* expected = "a str");

// A callable (or, with allow_none, None: returns an invalid handle).
nb::handle callable_arg(nb::handle v, const std::string& name, bool allow_none = false);

// Item k of a list (borrowed).
nb::handle list_item(nb::handle list, size_t k);

inline constexpr const char* kHandleType = "a ferry.MrHandle (from register())";
inline constexpr const char* kDescType = "a ferry.MrDesc (the peer's descriptor)";
inline constexpr const char* kPreparedType = "a ferry.PreparedTransfer (from prepare_*())";

// Page indices: a 1-D int32, uint32, int64 or uint64 array in host memory
// (NumPy, torch, anything exposing DLPack or the buffer protocol) converted with
// one copy; lists, tuples and ranges of ints are accepted too (slower). A
// negative index raises InvalidArgument, one of 2**32 or more OutOfRange (the
// engine's page indices are 32-bit), both naming the side and the position.
std::vector<uint32_t> page_indices(nb::handle obj, const char* side);

}  // namespace ferry::py
