// Status and Result<T>: the error values every starling layer returns instead of throwing.
// Result<T> has the shape of std::expected<T, Status> so that C++23 can replace it.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace starling {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kDataLoss,  // corrupt file or frame
  kFailedPrecondition,
  kUnimplemented,
  kInternal,
  kUnavailable,  // peer or resource gone; retry may help
  kDeadlineExceeded,
  kPermissionDenied,
  kUnauthenticated,
  kResourceExhausted,
  kCancelled,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "context: message" (the way errors gain context upward).
  Status with_context(std::string_view context) const;
  // "InvalidArgument: message", or "OK".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return {}; }
inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status deadline_exceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status permission_denied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}

// Result<T>: either a value or a non-OK Status. REQUIRES for value(): ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  bool has_value() const { return ok(); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  const Status& error() const { return std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline Status to_status(const Status& s) { return s; }
template <typename T>
Status to_status(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace starling

#define STARLING_CONCAT_INNER(a, b) a##b
#define STARLING_CONCAT(a, b) STARLING_CONCAT_INNER(a, b)

// RETURN_IF_ERROR(expr) or RETURN_IF_ERROR(expr, "context"): returns the error, with context.
#define RETURN_IF_ERROR(...) \
  STARLING_RIE_PICK(__VA_ARGS__, STARLING_RIE2, STARLING_RIE1)(__VA_ARGS__)
#define STARLING_RIE_PICK(_1, _2, NAME, ...) NAME
#define STARLING_RIE1(expr)                                                    \
  do {                                                                         \
    ::starling::Status starling_rie_s = ::starling::internal::to_status(expr); \
    if (!starling_rie_s.ok()) return starling_rie_s;                           \
  } while (0)
#define STARLING_RIE2(expr, ctx)                                               \
  do {                                                                         \
    ::starling::Status starling_rie_s = ::starling::internal::to_status(expr); \
    if (!starling_rie_s.ok()) return starling_rie_s.with_context(ctx);         \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr) or ASSIGN_OR_RETURN(lhs, expr, "context").
#define ASSIGN_OR_RETURN(...) \
  STARLING_AOR_PICK(__VA_ARGS__, STARLING_AOR3, STARLING_AOR2)(__VA_ARGS__)
#define STARLING_AOR_PICK(_1, _2, _3, NAME, ...) NAME
#define STARLING_AOR2(lhs, expr) \
  STARLING_AOR_IMPL(STARLING_CONCAT(starling_aor_, __LINE__), lhs, expr, )
#define STARLING_AOR3(lhs, expr, ctx) \
  STARLING_AOR_IMPL(STARLING_CONCAT(starling_aor_, __LINE__), lhs, expr, .with_context(ctx))
#define STARLING_AOR_IMPL(tmp, lhs, expr, ctx_call) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status() ctx_call;      \
  lhs = std::move(tmp).value()
