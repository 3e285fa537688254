// Update streams: every codec's arrays survive the stream exactly, windows decode as the whole
// segment does, and malformed headers are refused before any array is read.
#include "core/compress/update_stream.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "core/util/rng.h"
#include "core/wire/codec.pb.h"

namespace starling::compress {
namespace {

std::vector<float> gaussian(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

EncodedUpdate encode_or_die(const std::string& spec, const std::vector<float>& x,
                            const Layout& layout) {
  auto codec = make_codec(spec, layout, 5);
  REQUIRE(codec.ok());
  auto enc = (*codec)->encode(x);
  REQUIRE(enc.ok());
  return std::move(*enc);
}

const Layout kLayout = {TensorInfo{"w", Shape{50, 40}, 0}, TensorInfo{"b", Shape{43}, 2000}};

TEST_CASE("an update stream carries every codec's arrays exactly", "[compress]") {
  const std::string spec =
      GENERATE(as<std::string>{}, "identity", "fp16", "bf16", "int8:block=64",
               "qsgd:levels=8,bucket=50", "topk:ratio=0.1", "topk:ratio=0.1,values=int8,block=16",
               "randk:ratio=0.1,values=bf16", "powersgd:rank=3", "sign");
  INFO(spec);
  const auto x = gaussian(2043, 6);
  const EncodedUpdate enc = encode_or_die(spec, x, kLayout);
  const UpdateStreamWriter writer(enc);
  const std::string bytes = writer.serialize();
  CHECK(writer.size() == bytes.size());
  CHECK(is_update_stream(bytes));

  auto layout = read_update_stream_header(read_from_memory(bytes), bytes.size());
  REQUIRE(layout.ok());
  CHECK(layout->numel == enc.numel);
  REQUIRE(layout->segments.size() == enc.segments.size());
  for (size_t i = 0; i < enc.segments.size(); ++i) {
    const Segment& want = enc.segments[i];
    Segment got;
    REQUIRE(
        load_stream_window(read_from_memory(bytes), layout->segments[i], 0, want.numel, got).ok());
    CHECK(got.codec == want.codec);
    CHECK(got.offset == want.offset);
    CHECK(got.shape == want.shape);
    CHECK(got.f32 == want.f32);
    CHECK(got.u16 == want.u16);
    CHECK(got.i8 == want.i8);
    CHECK(got.scales == want.scales);
    CHECK(got.indices == want.indices);
    CHECK(got.bits == want.bits);
    CHECK(got.seed == want.seed);
    CHECK(got.k == want.k);

    // Windows, where the codec allows them, decode to the same values as the whole segment.
    const int64_t step = stream_window_elements(want, 24);
    if (step == 0) continue;
    std::vector<float> whole(static_cast<size_t>(want.numel), 0.5f);
    std::vector<float> parts = whole;
    REQUIRE(decode_add_segment(want, i, whole, 0.75f).ok());
    for (int64_t b = 0; b < want.numel; b += step) {
      const int64_t n = std::min(step, want.numel - b);
      Segment win;
      REQUIRE(load_stream_window(read_from_memory(bytes), layout->segments[i], b, n, win).ok());
      REQUIRE(decode_add_segment(win, i, std::span<float>(parts).subspan(b, n), 0.75f).ok());
    }
    CHECK(parts == whole);
  }

  // Any range read equals the same range of the serialized whole.
  Rng rng(3);
  for (int t = 0; t < 200; ++t) {
    const uint64_t a = rng.next_u64() % bytes.size();
    const uint64_t n = rng.next_u64() % (bytes.size() - a + 1);
    std::string part(n, '\0');
    writer.read(a, part);
    REQUIRE(part == bytes.substr(a, n));
  }
}

TEST_CASE("windows of segments that cannot be split are refused", "[compress]") {
  const EncodedUpdate enc = encode_or_die("topk:ratio=0.1", gaussian(2043, 1), kLayout);
  const std::string bytes = UpdateStreamWriter(enc).serialize();
  auto layout = read_update_stream_header(read_from_memory(bytes), bytes.size());
  REQUIRE(layout.ok());
  Segment win;
  CHECK(load_stream_window(read_from_memory(bytes), layout->segments[0], 0, 10, win).code() ==
        StatusCode::kInvalidArgument);
  const EncodedUpdate q = encode_or_die("int8:block=64", gaussian(2043, 1), kLayout);
  const std::string qb = UpdateStreamWriter(q).serialize();
  auto ql = read_update_stream_header(read_from_memory(qb), qb.size());
  REQUIRE(ql.ok());
  CHECK(load_stream_window(read_from_memory(qb), ql->segments[0], 10, 64, win).code() ==
        StatusCode::kInvalidArgument);  // not on a block boundary
  CHECK(load_stream_window(read_from_memory(qb), ql->segments[0], 64, 128, win).ok());
}

// The header of `enc` re-serialized after `edit`, followed by the original arrays.
std::string with_header(const EncodedUpdate& enc,
                        const std::function<void(v1::EncodedUpdate&)>& edit) {
  const std::string bytes = UpdateStreamWriter(enc).serialize();
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  v1::EncodedUpdate msg;
  REQUIRE(msg.ParseFromString(bytes.substr(16, len)));
  edit(msg);
  const std::string body = msg.SerializeAsString();
  std::string out = bytes.substr(0, 8);
  const uint64_t n = body.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  return out + body + bytes.substr(16 + len);
}

TEST_CASE("malformed update streams are refused with the reason", "[compress]") {
  const EncodedUpdate enc = encode_or_die("int8:block=64", gaussian(2043, 2), kLayout);
  const std::string good = UpdateStreamWriter(enc).serialize();
  auto refuse = [](const std::string& bytes, const std::string& why) {
    auto r = read_update_stream_header(read_from_memory(bytes), bytes.size());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains(why));
  };
  REQUIRE(read_update_stream_header(read_from_memory(good), good.size()).ok());
  refuse("STRL", "shorter than");
  std::string magic = good;
  magic[3] = 'X';
  refuse(magic, "bad magic");
  std::string huge = good;
  const uint64_t big = 1ull << 40;
  std::memcpy(huge.data() + 8, &big, 8);
  refuse(huge, "does not fit");
  refuse(good.substr(0, good.size() - 1), "arrays");
  refuse(good + "x", "payload has");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.mutable_segments(0)->set_i8("x"); }),
         "inside the header");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.mutable_segments(1)->add_array_bytes(0); }),
         "not 6");
  refuse(with_header(enc,
                     [](v1::EncodedUpdate& m) {
                       m.mutable_segments(0)->set_array_bytes(kArrI8, 1999);
                       m.mutable_segments(0)->set_array_bytes(kArrF32, 1);
                     }),
         "its codec needs");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.mutable_segments(1)->set_offset(1999); }),
         "tile");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.set_numel(2044); }), "cover");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.mutable_segments(0)->set_block(0); }),
         "block");
  refuse(with_header(enc,
                     [](v1::EncodedUpdate& m) {
                       m.mutable_segments(0)->set_codec(static_cast<v1::CodecId>(99));
                     }),
         "unknown codec");
  refuse(with_header(enc, [](v1::EncodedUpdate& m) { m.mutable_segments(0)->set_numel(-5); }), "");
}

}  // namespace
}  // namespace starling::compress
