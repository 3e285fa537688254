// The wire form of encoded updates: round trip, unknown fields, and corrupted or truncated bytes
// (every one returns an error or a well-formed result; none crashes or writes out of bounds).
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/rng.h"

namespace starling::compress {
namespace {

const Layout& small_layout() {
  static const Layout layout = {TensorInfo{"w", Shape{16, 12}, 0}, TensorInfo{"b", Shape{12}, 192}};
  return layout;
}

std::vector<float> input(size_t n) {
  Rng rng(42);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

EncodedUpdate encode_small(const std::string& spec) {
  auto codec = make_codec(spec, small_layout(), 9);
  REQUIRE(codec.ok());
  auto enc = (*codec)->encode(input(204));
  REQUIRE(enc.ok());
  return std::move(enc).value();
}

// Parses and decodes; true when both succeed. Never writes outside dst (checked by the guards).
bool parse_and_decode(std::string_view bytes) {
  auto u = parse_update(bytes);
  if (!u.ok()) {
    REQUIRE(u.status().code() == StatusCode::kDataLoss);
    return false;
  }
  std::vector<float> buf(204 + 2, 7.0f);
  std::span<float> dst(buf.data() + 1, 204);
  const std::vector<float> before = buf;
  const Status s = decode_add(*u, dst, 0.5f);
  REQUIRE(buf.front() == 7.0f);
  REQUIRE(buf.back() == 7.0f);
  if (!s.ok()) {
    REQUIRE(buf == before);  // an invalid update leaves the destination untouched
    return false;
  }
  return true;
}

const char* const kSpecs[] = {"identity",
                              "fp16",
                              "bf16",
                              "int8:block=16",
                              "qsgd:levels=4,bucket=32",
                              "topk:ratio=0.1",
                              "topk:ratio=0.1,values=int8,block=8",
                              "topk:ratio=0.2,values=fp16",
                              "randk:ratio=0.1",
                              "randk:ratio=0.1,values=int8",
                              "powersgd:rank=2",
                              "sign"};

}  // namespace

TEST_CASE("encoded updates round-trip through the wire form", "[compress]") {
  for (const char* spec : kSpecs) {
    INFO(spec);
    const auto enc = encode_small(spec);
    const std::string bytes = serialize_update(enc);
    auto back = parse_update(bytes);
    REQUIRE(back.ok());
    CHECK(serialize_update(*back) == bytes);
    std::vector<float> a(204), b(204);
    REQUIRE(decode(enc, a).ok());
    REQUIRE(decode(*back, b).ok());
    CHECK(a == b);
    // An unknown field (number 100, varint 1) is skipped by older readers.
    const std::string extended = bytes + std::string("\xa0\x06\x01", 3);
    auto ext = parse_update(extended);
    REQUIRE(ext.ok());
    REQUIRE(decode(*ext, b).ok());
    CHECK(a == b);
  }
}

TEST_CASE("truncated and corrupted encodings never crash", "[compress]") {
  for (const char* spec : kSpecs) {
    INFO(spec);
    const std::string bytes = serialize_update(encode_small(spec));
    REQUIRE(parse_and_decode(bytes));
    for (size_t len = 0; len < bytes.size(); ++len) {
      INFO("truncated to " << len << " of " << bytes.size());
      REQUIRE_FALSE(parse_and_decode(std::string_view(bytes).substr(0, len)));
    }
    Rng rng(1);
    for (size_t pos = 0; pos < bytes.size(); ++pos) {
      for (uint8_t mask :
           {uint8_t{0xff}, uint8_t{0x80}, static_cast<uint8_t>(rng.below(255) + 1)}) {
        std::string bad = bytes;
        bad[pos] = static_cast<char>(static_cast<uint8_t>(bad[pos]) ^ mask);
        parse_and_decode(bad);
      }
    }
  }
}

TEST_CASE("semantic corruptions are DataLoss errors", "[compress]") {
  std::vector<float> dst(204, 1.0f);
  auto expect_loss = [&](EncodedUpdate u) {
    const Status s = decode_add(u, dst, 1.0f);
    REQUIRE(s.code() == StatusCode::kDataLoss);
    REQUIRE(dst == std::vector<float>(204, 1.0f));
  };
  SECTION("top-k index out of range") {
    auto u = encode_small("topk:ratio=0.1");
    u.segments[0].indices.back() = 192;
    expect_loss(u);
  }
  SECTION("top-k indices not increasing") {
    auto u = encode_small("topk:ratio=0.1");
    std::swap(u.segments[0].indices[0], u.segments[0].indices[1]);
    expect_loss(u);
  }
  SECTION("top-k k disagrees with the payload") {
    auto u = encode_small("topk:ratio=0.1");
    u.segments[0].k += 1;
    expect_loss(u);
  }
  SECTION("int8 NaN scale") {
    auto u = encode_small("int8:block=16");
    u.segments[0].scales[3] = NAN;
    expect_loss(u);
  }
  SECTION("int8 wrong block count") {
    auto u = encode_small("int8:block=16");
    u.segments[0].block = 8;
    expect_loss(u);
  }
  SECTION("int8 zero block") {
    auto u = encode_small("int8:block=16");
    u.segments[0].block = 0;
    expect_loss(u);
  }
  SECTION("QSGD code beyond its levels") {
    auto u = encode_small("qsgd:levels=4");
    u.segments[0].i8[5] = 5;
    expect_loss(u);
  }
  SECTION("random-k k beyond numel") {
    auto u = encode_small("randk:ratio=0.1");
    u.segments[1].k = 13;
    expect_loss(u);
  }
  SECTION("PowerSGD shape disagrees with numel") {
    auto u = encode_small("powersgd:rank=2");
    REQUIRE(u.segments[0].codec == CodecKind::kPowerSgd);
    u.segments[0].shape = {1 << 20, 1 << 20};
    expect_loss(u);
  }
  SECTION("PowerSGD absurd rank") {
    auto u = encode_small("powersgd:rank=2");
    u.segments[0].rank = 1 << 30;
    expect_loss(u);
  }
  SECTION("sign infinite scale") {
    auto u = encode_small("sign");
    u.segments[0].scales[0] = INFINITY;
    expect_loss(u);
  }
  SECTION("segments overlap or leave a gap") {
    auto u = encode_small("identity");
    u.segments[1].offset = 191;
    expect_loss(u);
    u = encode_small("identity");
    u.segments.pop_back();
    expect_loss(u);
  }
  SECTION("numel disagrees with the destination") {
    auto u = encode_small("identity");
    u.numel = 1000;
    CHECK(decode_add(u, dst, 1.0f).code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("parse_update rejects unknown codec ids and partial elements", "[compress]") {
  const std::string bytes = serialize_update(encode_small("identity"));
  // EncodedUpdate{segments: [{codec: 77}]}: field 2 (len 2) holding field 1 varint 77.
  CHECK(parse_update(std::string("\x12\x02\x08\x4d", 4)).status().code() == StatusCode::kDataLoss);
  // EncodedUpdate{segments: [{codec: 1, f32: 3 bytes}]}.
  CHECK(parse_update(std::string("\x12\x07\x08\x01\x5a\x03\x00\x00\x00", 9)).status().code() ==
        StatusCode::kDataLoss);
  CHECK(parse_update(bytes).ok());
}

}  // namespace starling::compress
