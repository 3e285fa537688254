// Streamed folds: bit-identical to folding the parsed update, for every codec and window size,
// with clipping and the robust rules; a bad update anywhere in the stream leaves the sum alone.
#include "aggregator/stream_fold.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "aggregator/accumulator.h"
#include "core/util/rng.h"

namespace starling::aggregator {
namespace {

std::vector<float> gaussian(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

const compress::Layout kLayout = {compress::TensorInfo{"w", Shape{50, 40}, 0},
                                  compress::TensorInfo{"b", Shape{43}, 2000}};

compress::EncodedUpdate encode_or_die(const std::string& spec, const std::vector<float>& x) {
  auto codec = compress::make_codec(spec, kLayout, 5);
  REQUIRE(codec.ok());
  auto enc = (*codec)->encode(x);
  REQUIRE(enc.ok());
  return std::move(*enc);
}

TEST_CASE("a streamed fold equals decode_add bit for bit, in any window size and thread count",
          "[aggregator]") {
  const std::string spec = GENERATE(
      as<std::string>{}, "identity", "fp16", "bf16", "int8:block=64", "qsgd:levels=8,bucket=50",
      "topk:ratio=0.1", "randk:ratio=0.1,values=int8,block=8", "powersgd:rank=3", "sign");
  const int64_t window = GENERATE(int64_t{1}, int64_t{7}, int64_t{64}, int64_t{100000});
  const int threads = GENERATE(1, 3);
  // -1: through a ReadAt (windows copied); else in place, the payload `shift` bytes into its
  // buffer, so that its arrays lie at every alignment.
  const int shift = GENERATE(-1, 0, 1, 2, 3);
  INFO(spec << " window " << window << " threads " << threads << " shift " << shift);
  const auto enc = encode_or_die(spec, gaussian(2043, 6));
  const std::string bytes = compress::UpdateStreamWriter(enc).serialize();
  const std::string shifted = std::string(static_cast<size_t>(std::max(shift, 0)), '\0') + bytes;
  const std::string_view in_place =
      std::string_view(shifted).substr(static_cast<size_t>(std::max(shift, 0)));
  const auto base = gaussian(2043, 7);
  auto want = base;
  REQUIRE(compress::decode_add(enc, want, 0.3f).ok());
  auto got = base;
  MemorySum sum(got);
  StreamFoldOptions opt;
  opt.window_elements = window;
  opt.threads = threads;
  auto r = shift < 0
               ? fold_update_stream(compress::read_from_memory(bytes), bytes.size(), sum, 0.3f, opt)
               : fold_update_stream(in_place, sum, 0.3f, opt);
  REQUIRE(r.ok());
  CHECK(r->numel == 2043);
  CHECK(got == want);
}

TEST_CASE("the accumulator folds streams as it folds parsed updates", "[aggregator]") {
  const std::string spec =
      GENERATE(as<std::string>{}, "identity", "int8:block=16", "topk:ratio=0.2");
  AggregationRule rule;
  rule.fold_threads = GENERATE(1, 2);
  SECTION("mean") {}
  SECTION("mean, clipped") { rule.clip_norm = 5.0; }
  SECTION("median") { rule.rule = RobustRule::kMedian; }
  SECTION("multi-krum, clipped") {
    rule.rule = RobustRule::kMultiKrum;
    rule.clip_norm = 20.0;
  }
  INFO(spec);
  UpdateAccumulator parsed(2043, rule), streamed(2043, rule);
  for (uint64_t k = 0; k < 4; ++k) {
    const auto enc = encode_or_die(spec, gaussian(2043, 10 + k));
    const float w = 1.0f + static_cast<float>(k);
    REQUIRE(parsed.fold(enc, w).ok());
    const std::string bytes = compress::UpdateStreamWriter(enc).serialize();
    REQUIRE(streamed.fold_payload(bytes, w).ok());
  }
  CHECK(streamed.count() == 4);
  CHECK(streamed.total_weight() == parsed.total_weight());
  CHECK(streamed.clipped() == parsed.clipped());
  if (rule.clip_norm > 0) CHECK(streamed.clipped() > 0);
  std::vector<float> a(2043), b(2043);
  parsed.mean_into(a);
  streamed.mean_into(b);
  CHECK(a == b);
}

TEST_CASE("a bad update anywhere in a stream leaves the sum unchanged", "[aggregator]") {
  auto enc = encode_or_die("identity", gaussian(2043, 3));
  std::vector<float> sum_values(2043, 1.0f);
  MemorySum sum(sum_values);
  StreamFoldOptions opt;
  opt.window_elements = 16;
  opt.threads =
      GENERATE(1, 4);  // the first bad window in order is the error, whatever the schedule
  const bool in_place = GENERATE(false, true);  // windows copied, or read in place
  opt.clip_norm = GENERATE(0.0, 3.0);
  auto fold = [&](const compress::EncodedUpdate& u, float w) {
    const std::string bytes = compress::UpdateStreamWriter(u).serialize();
    return (in_place
                ? fold_update_stream(bytes, sum, w, opt)
                : fold_update_stream(compress::read_from_memory(bytes), bytes.size(), sum, w, opt))
        .status();
  };
  SECTION("NaN in the last window") {
    enc.segments[1].f32.back() = std::numeric_limits<float>::quiet_NaN();
    const Status st = fold(enc, 1.0f);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("non-finite") && Catch::Contains("segment 1"));
  }
  SECTION("an infinite fp16 value") {
    auto h = encode_or_die("fp16", gaussian(2043, 3));
    h.segments[1].u16[40] = 0x7C00;
    CHECK_FALSE(fold(h, 1.0f).ok());
  }
  SECTION("an int8 scale that is negative, in a late block") {
    auto q = encode_or_die("int8:block=64", gaussian(2043, 3));
    q.segments[0].scales[30] = -1.0f;
    CHECK_THAT(fold(q, 1.0f).message(), Catch::Contains("scale"));
  }
  SECTION("an int8 scale that is NaN") {
    auto q = encode_or_die("int8:block=64", gaussian(2043, 3));
    q.segments[0].scales[2] = std::numeric_limits<float>::quiet_NaN();
    const Status st = fold(q, 1.0f);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK_THAT(st.message(), Catch::Contains("segment 0 (int8)") && Catch::Contains("scale"));
  }
  SECTION("a QSGD code beyond its levels") {
    auto q = encode_or_die("qsgd:levels=8,bucket=50", gaussian(2043, 3));
    q.segments[1].i8[7] = 9;
    CHECK_THAT(fold(q, 1.0f).message(), Catch::Contains("levels"));
  }
  SECTION("an infinite value in the first window") {
    enc.segments[0].f32[3] = std::numeric_limits<float>::infinity();
    CHECK_THAT(fold(enc, 1.0f).message(),
               Catch::Contains("non-finite") && Catch::Contains("segment 0"));
  }
  SECTION("top-k indices out of order") {
    auto t = encode_or_die("topk:ratio=0.1", gaussian(2043, 3));
    std::swap(t.segments[0].indices[3], t.segments[0].indices[4]);
    CHECK_THAT(fold(t, 1.0f).message(), Catch::Contains("indices"));
  }
  SECTION("a weight that is not positive") { CHECK_FALSE(fold(enc, 0.0f).ok()); }
  SECTION("an update of another size") {
    auto other = compress::make_codec("identity", compress::flat_layout(100), 1);
    REQUIRE(other.ok());
    auto small = (*other)->encode(gaussian(100, 1));
    REQUIRE(small.ok());
    CHECK_THAT(fold(*small, 1.0f).message(), Catch::Contains("model of 2043"));
  }
  SECTION("a protobuf update is not a stream") {
    const std::string pb = compress::serialize_update(enc);
    CHECK_FALSE(fold_update_stream(compress::read_from_memory(pb), pb.size(), sum, 1.0f, opt).ok());
    CHECK_FALSE(fold_update_stream(pb, sum, 1.0f, opt).ok());
  }
  CHECK(sum_values == std::vector<float>(2043, 1.0f));
}

TEST_CASE("a sum on disk folds as the sum in memory", "[aggregator]") {
  const auto dir = std::filesystem::temp_directory_path();
  auto file = FileSum::create(dir / "sum.f32", 2043);
  REQUIRE(file.ok());
  std::vector<float> mem(2043, 0.0f);
  MemorySum in_memory(mem);
  StreamFoldOptions opt;
  opt.window_elements = 100;
  for (uint64_t k = 0; k < 3; ++k) {
    const auto enc = encode_or_die(k == 1 ? "int8:block=32" : "fp16", gaussian(2043, 20 + k));
    const std::string bytes = compress::UpdateStreamWriter(enc).serialize();
    REQUIRE(fold_update_stream(compress::read_from_memory(bytes), bytes.size(), **file, 0.5f, opt)
                .ok());
    REQUIRE(
        fold_update_stream(compress::read_from_memory(bytes), bytes.size(), in_memory, 0.5f, opt)
            .ok());
  }
  std::vector<float> back(2043);
  REQUIRE((*file)->read(0, back).ok());
  CHECK(back == mem);
  CHECK(std::filesystem::file_size(dir / "sum.f32") == 2043 * 4);
  CHECK_FALSE(FileSum::create(dir / "missing" / "sum.f32", 10).ok());
}

}  // namespace
}  // namespace starling::aggregator
