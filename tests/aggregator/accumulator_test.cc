// Streaming aggregation: exact weighted sums, and every bad update rejected without touching
// the sum.
#include "aggregator/accumulator.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace starling::aggregator {
namespace {

compress::EncodedUpdate dense(std::vector<float> v) {
  auto codec =
      compress::make_codec("identity", compress::flat_layout(static_cast<int64_t>(v.size())), 1);
  REQUIRE(codec.ok());
  auto u = (*codec)->encode(v);
  REQUIRE(u.ok());
  return std::move(*u);
}

TEST_CASE("updates fold into an exact weighted sum", "[aggregator]") {
  UpdateAccumulator acc(3);
  REQUIRE(acc.fold(dense({1, 2, 3}), 1).ok());
  REQUIRE(acc.fold_bytes(compress::serialize_update(dense({-1, 0, 1})), 3).ok());
  CHECK(acc.count() == 2);
  CHECK(acc.total_weight() == 4);
  CHECK(std::vector<float>(acc.sum().begin(), acc.sum().end()) == std::vector<float>{-2, 2, 6});
  std::vector<float> mean(3);
  acc.mean_into(mean);
  CHECK(mean == std::vector<float>{-0.5f, 0.5f, 1.5f});
}

TEST_CASE("malformed and non-finite updates are rejected and not folded", "[aggregator]") {
  UpdateAccumulator acc(3);
  REQUIRE(acc.fold(dense({1, 1, 1}), 2).ok());
  const std::vector<float> before(acc.sum().begin(), acc.sum().end());

  auto nan = dense({1, 1, 1});
  nan.segments[0].f32[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(acc.fold(nan, 1).ok());
  auto inf = dense({1, 1, 1});
  inf.segments[0].f32[2] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(acc.fold_bytes(compress::serialize_update(inf), 1).ok());
  CHECK_FALSE(acc.fold(dense({1, 1}), 1).ok());             // wrong size
  CHECK_FALSE(acc.fold(dense({1, 1, 1}), 0).ok());          // no weight
  CHECK_FALSE(acc.fold(dense({1, 1, 1}), NAN).ok());        // bad weight
  CHECK_FALSE(acc.fold_bytes("\xff\xff garbage", 1).ok());  // not a message
  auto truncated = compress::serialize_update(dense({1, 2, 3}));
  truncated.resize(truncated.size() - 3);
  CHECK_FALSE(acc.fold_bytes(truncated, 1).ok());

  CHECK(acc.count() == 1);
  CHECK(acc.total_weight() == 2);
  CHECK(std::vector<float>(acc.sum().begin(), acc.sum().end()) == before);
}

TEST_CASE("half-precision infinities are caught before decoding", "[aggregator]") {
  auto codec = compress::make_codec("fp16", compress::flat_layout(2), 1);
  REQUIRE(codec.ok());
  auto u = (*codec)->encode(std::vector<float>{1, 2});
  REQUIRE(u.ok());
  CHECK(update_is_finite(*u));
  u->segments[0].u16[0] = 0x7C00;  // +inf in fp16
  CHECK_FALSE(update_is_finite(*u));
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

std::vector<float> combine(AggregationRule rule, const std::vector<std::vector<float>>& updates) {
  UpdateAccumulator acc(static_cast<int64_t>(updates[0].size()), rule);
  for (const auto& u : updates) REQUIRE(acc.fold(dense(u), 1).ok());
  std::vector<float> out(updates[0].size());
  acc.mean_into(out);
  return out;
}

TEST_CASE("robust rules resist an outlier", "[aggregator]") {
  const std::vector<std::vector<float>> updates = {
      {1, 2}, {2, 3}, {3, 4}, {4, 5}, {1000, -1000}};  // the last one is an attacker
  AggregationRule median{RobustRule::kMedian, 0, 0};
  CHECK(combine(median, updates) == std::vector<float>{3, 3});
  AggregationRule trimmed{RobustRule::kTrimmedMean, 0.2, 0};
  CHECK(combine(trimmed, updates) == std::vector<float>{3, 3});  // {2,3,4} and {2,3,4}
  const auto even = combine(median, {{1}, {2}, {4}, {8}});
  CHECK(even[0] == 3.0f);
}

TEST_CASE("norm clipping bounds each update's influence", "[aggregator]") {
  AggregationRule clip{RobustRule::kMean, 0, 5.0};
  UpdateAccumulator acc(2, clip);
  REQUIRE(acc.fold(dense({3, 4}), 1).ok());    // norm 5: kept
  REQUIRE(acc.fold(dense({30, 40}), 1).ok());  // norm 50: scaled to 5
  CHECK(acc.clipped() == 1);
  std::vector<float> out(2);
  acc.mean_into(out);
  CHECK(out[0] == Approx(3));
  CHECK(out[1] == Approx(4));
}

}  // namespace
}  // namespace starling::aggregator
