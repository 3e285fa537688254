// Streaming aggregation: exact weighted sums, and every bad update rejected without touching
// the sum.
#include "aggregator/accumulator.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/util/rng.h"
#include "core/wire/codec.pb.h"

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

namespace starling::aggregator {
namespace {

std::vector<float> combine_krum(RobustRule rule, int f, int m,
                                const std::vector<std::vector<float>>& updates, int* excluded) {
  AggregationRule r;
  r.rule = rule;
  r.byzantine_f = f;
  r.krum_m = m;
  UpdateAccumulator acc(static_cast<int64_t>(updates[0].size()), r);
  for (const auto& u : updates) REQUIRE(acc.fold(dense(u), 1).ok());
  std::vector<float> out(updates[0].size());
  acc.mean_into(out);
  *excluded = acc.excluded();
  return out;
}

TEST_CASE("Krum picks an honest update and excludes planted outliers", "[aggregator][krum]") {
  // Five honest updates close to (1, 1, 1), two Byzantine ones far away (f = 2, n = 7 >= 2f + 3).
  const std::vector<std::vector<float>> updates = {{1, 1, 1},     {100, -100, 100}, {1.25f, 1, 1},
                                                   {1, 0.75f, 1}, {1, 1, 1.5f},     {-50, 80, 30},
                                                   {0.75f, 1, 1}};
  int excluded = 0;
  const auto krum = combine_krum(RobustRule::kKrum, 2, 0, updates, &excluded);
  CHECK(excluded == 6);
  // Krum returns one of the honest updates: the one nearest its n - f - 2 = 3 neighbours.
  CHECK(krum == std::vector<float>{1, 1, 1});

  // Multi-Krum with m = n - f = 5: exactly the honest updates, averaged.
  const auto multi = combine_krum(RobustRule::kMultiKrum, 2, 0, updates, &excluded);
  CHECK(excluded == 2);
  CHECK(multi == std::vector<float>{1, 0.95f, 1.1f});
  // The plain mean is dragged far away by the outliers.
  const auto mean = combine(AggregationRule{}, updates);
  CHECK(std::abs(mean[0] - 1.0f) > 5);
}

TEST_CASE("krum_select orders by score and clamps m", "[aggregator][krum]") {
  const std::vector<std::vector<float>> updates = {{0}, {1}, {2}, {3}, {100}};
  // f = 1: each update is scored on its n - f - 2 = 2 nearest: {1, 2} and {2, 3} in the
  // middle score lowest; 100 is last.
  const auto order = krum_select(updates, 1, 5);
  REQUIRE(order.size() == 5);
  CHECK(order.back() == 4);
  CHECK((order[0] == 1 || order[0] == 2));
  CHECK(krum_select(updates, 1, 0).size() == 1);
  CHECK(krum_select(updates, 1, 99).size() == 5);
  // Too few updates for the guarantee still gives an answer (nearest clamped to 1).
  CHECK(krum_select({{0}, {5}}, 3, 1).size() == 1);
}

}  // namespace
}  // namespace starling::aggregator

namespace starling::aggregator {
namespace {

TEST_CASE("fold_bytes reuses its buffers and folds exactly as decode_add", "[aggregator]") {
  // Updates of several codecs and sizes through one accumulator (so each parse reuses the last
  // one's arrays), against decode_add of a freshly parsed copy.
  const compress::Layout layout = {{"w", {37, 3}, 0}, {"b", {5}, 111}};
  const int64_t n = 116;
  UpdateAccumulator acc(n);
  std::vector<float> expected(n, 0.0f);
  Rng rng(11);
  int k = 0;
  for (const char* spec : {"identity", "fp16", "int8:block=16", "topk:ratio=0.1", "identity",
                           "bf16", "sign", "int8:block=7;b=identity", "identity"}) {
    INFO(spec);
    std::vector<float> delta(n);
    for (auto& v : delta) v = static_cast<float>(rng.normal());
    auto codec = compress::make_codec(spec, layout, 5);
    REQUIRE(codec.ok());
    auto u = (*codec)->encode(delta);
    REQUIRE(u.ok());
    const std::string bytes = compress::serialize_update(*u);
    const float w = static_cast<float>(1 + k++ % 3);
    auto parsed = compress::parse_update(bytes);
    REQUIRE(parsed.ok());
    REQUIRE(compress::decode_add(*parsed, expected, w).ok());
    REQUIRE(acc.fold_bytes(bytes, w).ok());
    CHECK(std::memcmp(acc.sum().data(), expected.data(), n * sizeof(float)) == 0);
  }
  // A codec id the build does not know is refused, and the sum stays.
  v1::EncodedUpdate bad;
  bad.set_numel(n);
  bad.add_segments()->set_codec(static_cast<v1::CodecId>(42));
  const Status st = acc.fold_bytes(bad.SerializeAsString(), 1);
  CHECK_THAT(st.message(), Catch::Contains("unknown codec id 42"));
  CHECK(std::memcmp(acc.sum().data(), expected.data(), n * sizeof(float)) == 0);
  // A short array (not whole floats) is refused.
  v1::EncodedUpdate odd;
  odd.set_numel(n);
  auto* seg = odd.add_segments();
  seg->set_codec(v1::CODEC_IDENTITY);
  seg->set_numel(n);
  seg->set_f32(std::string(7, '\0'));
  CHECK_THAT(acc.fold_bytes(odd.SerializeAsString(), 1).message(),
             Catch::Contains("not a whole number of elements"));
}

}  // namespace
}  // namespace starling::aggregator
