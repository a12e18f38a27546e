// Error values for the whole library: a Status says what went wrong in words a
// user can act on; Expected<T> is a value or the Status that explains its absence.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace flashjit {

class [[nodiscard]] Status {
public:
  Status() = default;
  static Status ok() { return Status(); }
  template <typename... Args> static Status error(fmt::format_string<Args...> f, Args &&...args) {
    Status s;
    s.message_ = fmt::format(f, std::forward<Args>(args)...);
    s.failed_ = true;
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string &message() const { return message_; }
  /// Prefixes the message with context ("while compiling X: ...").
  Status with_context(const std::string &context) const {
    if (!failed_)
      return *this;
    Status s = *this;
    s.message_ = context + ": " + message_;
    return s;
  }

private:
  bool failed_ = false;
  std::string message_;
};

template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : storage_(std::move(value)) {}
  Expected(Status status) : storage_(std::move(status)) {
    assert(!std::get<Status>(storage_).is_ok() && "Expected built from an ok Status");
  }
  bool has_value() const { return std::holds_alternative<T>(storage_); }
  explicit operator bool() const { return has_value(); }
  T &operator*() { return std::get<T>(storage_); }
  const T &operator*() const { return std::get<T>(storage_); }
  T *operator->() { return &std::get<T>(storage_); }
  const T *operator->() const { return &std::get<T>(storage_); }
  T &value() { return std::get<T>(storage_); }
  const T &value() const { return std::get<T>(storage_); }
  const Status &status() const { return std::get<Status>(storage_); }
  T take() { return std::move(std::get<T>(storage_)); }

private:
  std::variant<T, Status> storage_;
};

} // namespace flashjit

/// Propagates a failed Status out of the enclosing function.
#define FJ_RETURN_IF_ERROR(expr)                                                                   \
  do {                                                                                             \
    ::flashjit::Status fj_status_ = (expr);                                                        \
    if (!fj_status_.is_ok())                                                                       \
      return fj_status_;                                                                           \
  } while (0)
