// Status, Result and the error-propagation macros.
#include "core/util/status.h"

#include <catch2/catch.hpp>

#include "core/util/rng.h"

namespace {
starling::Result<int> parse_positive(int v) {
  if (v <= 0) return starling::invalid_argument("value " + std::to_string(v) + " is not positive");
  return v;
}
starling::Result<int> twice(int v) {
  ASSIGN_OR_RETURN(int x, parse_positive(v), "twice");
  return 2 * x;
}
starling::Status check(int v) {
  RETURN_IF_ERROR(twice(v), "check");
  return starling::ok_status();
}
}  // namespace

TEST_CASE("errors gain context on the way up", "[util]") {
  REQUIRE(twice(3).value() == 6);
  auto s = check(-1);
  REQUIRE_FALSE(s.ok());
  REQUIRE(s.code() == starling::StatusCode::kInvalidArgument);
  REQUIRE(s.message() == "check: twice: value -1 is not positive");
  REQUIRE(s.to_string() == "InvalidArgument: check: twice: value -1 is not positive");
}

TEST_CASE("rng is deterministic and roughly normal", "[util]") {
  starling::Rng a(42), b(42), c(43);
  REQUIRE(a.next_u64() == b.next_u64());
  REQUIRE(a.next_u64() != c.next_u64());
  starling::Rng r(1);
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    sum += x;
    sq += x * x;
  }
  REQUIRE(std::abs(sum / n) < 0.05);
  REQUIRE(std::abs(sq / n - 1.0) < 0.05);
  for (int i = 0; i < 1000; ++i) REQUIRE(r.below(7) < 7);
}
