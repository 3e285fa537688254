// Wire format: every message round-trips, unknown fields are ignored, framing rejects bad input.
#include <algorithm>
#include <catch2/catch.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/wire/chunk_frame.h"
#include "core/wire/crc32c.h"
#include "core/wire/envelope.h"
#include "core/wire/frame.h"

namespace starling::wire {
namespace {

v1::TransferHeader sample_transfer() {
  v1::TransferHeader t;
  t.set_transfer_id(7);
  t.set_total_bytes(5'000'000'000ull);  // beyond 2 GB
  t.set_chunk_bytes(1 << 20);
  t.set_num_chunks(4769);
  t.set_sha256(std::string(32, '\xab'));
  t.set_content_type("safetensors");
  return t;
}

// One envelope of each body type, every field set to a non-default value.
std::vector<v1::Envelope> every_message() {
  std::vector<v1::Envelope> out;
  auto add = [&](auto fill) {
    v1::Envelope e;
    e.set_seq(out.size() + 1);
    fill(e);
    out.push_back(e);
  };
  add([](v1::Envelope& e) {
    auto* h = e.mutable_hello();
    h->set_protocol_version(kProtocolVersion);
    h->set_role(v1::ROLE_CLIENT);
    h->set_node_id("client-3");
    h->add_supported_codecs("int8_block");
    h->add_supported_codecs("topk");
    h->set_software_version("0.1.0");
    h->set_max_frame_bytes(kDefaultMaxFrameBytes);
  });
  add([](v1::Envelope& e) {
    auto* p = e.mutable_round_plan();
    p->set_round(12);
    p->set_model_version(11);
    p->set_local_steps(50);
    p->set_batch_size(32);
    p->set_learning_rate(0.25f);
    p->set_codec("qsgd");
    p->set_deadline_unix_ms(1'700'000'000'000ull);
    p->set_seed(42);
  });
  add([](v1::Envelope& e) {
    auto* m = e.mutable_model_download();
    m->set_round(3);
    m->set_model_version(3);
    m->set_is_delta(true);
    m->set_base_version(2);
    *m->mutable_transfer() = sample_transfer();
  });
  add([](v1::Envelope& e) {
    auto* u = e.mutable_update_upload();
    u->set_round(3);
    u->set_base_version(3);
    u->set_num_samples(600);
    u->set_codec("topk");
    u->set_train_loss(1.5f);
    *u->mutable_transfer() = sample_transfer();
  });
  add([](v1::Envelope& e) {
    auto* c = e.mutable_chunk();
    c->set_transfer_id(7);
    c->set_index(3);
    c->set_data(std::string("\0\1\2\xff", 4));
    c->set_crc32c(crc32c(c->data()));
  });
  add([](v1::Envelope& e) {
    auto* a = e.mutable_chunk_ack();
    a->set_transfer_id(7);
    a->set_next_index(4);
    a->set_complete(true);
  });
  add([](v1::Envelope& e) { e.mutable_ack()->set_seq(9); });
  add([](v1::Envelope& e) {
    auto* r = e.mutable_error();
    r->set_code(v1::ERROR_CODE_CHECKSUM_MISMATCH);
    r->set_message("chunk 3 corrupt");
    r->set_retryable(true);
    r->set_in_reply_to(5);
  });
  add([](v1::Envelope& e) {
    e.mutable_heartbeat()->set_sent_unix_ms(100);
    e.mutable_heartbeat()->set_echo_unix_ms(90);
  });
  add([](v1::Envelope& e) {
    auto* g = e.mutable_gossip_exchange();
    g->set_round(4);
    g->set_model_version(4);
    g->set_mixing_weight(0.5);
    g->set_is_reply(true);
    g->set_codec("sign");
    *g->mutable_transfer() = sample_transfer();
  });
  add([](v1::Envelope& e) {
    auto* m = e.mutable_gossip_membership()->add_members();
    m->set_node_id("peer-1");
    m->set_address("10.0.0.1:7000");
    m->set_incarnation(2);
    m->set_suspected(true);
  });
  return out;
}

TEST_CASE("every message round-trips through a frame", "[wire]") {
  const auto messages = every_message();
  REQUIRE(messages.size() == 11);  // one per oneof case: extend every_message() with the schema
  for (const auto& original : messages) {
    INFO(body_name(original));
    auto payload = encode_envelope(original, kDefaultMaxFrameBytes);
    REQUIRE(payload.ok());
    std::string stream;
    REQUIRE(append_frame(stream, *payload).ok());
    auto framed = encode_framed_envelope(original, kDefaultMaxFrameBytes);
    REQUIRE(framed.ok());
    CHECK(*framed == stream);
    FrameDecoder decoder;
    REQUIRE(decoder.feed(stream).ok());
    auto frame = decoder.next();
    REQUIRE(frame.ok());
    REQUIRE(frame->has_value());
    auto decoded = decode_envelope(**frame);
    REQUIRE(decoded.ok());
    CHECK(decoded->SerializeAsString() == original.SerializeAsString());
    CHECK(decoded->body_case() == original.body_case());
    CHECK_FALSE(decoder.mid_frame());
  }
}

// Appends a varint-encoded field that no version of the schema defines.
void append_unknown_field(std::string& bytes, uint32_t field_number) {
  auto varint = [&](uint64_t v) {
    while (v >= 0x80) {
      bytes.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    bytes.push_back(static_cast<char>(v));
  };
  varint(uint64_t{field_number} << 3 | 2);  // length-delimited
  varint(5);
  bytes += "later";
}

TEST_CASE("unknown fields from a newer peer are ignored", "[wire]") {
  for (const auto& original : every_message()) {
    INFO(body_name(original));
    std::string bytes = original.SerializeAsString();
    append_unknown_field(bytes, 999);  // an unknown Envelope field
    auto decoded = decode_envelope(bytes);
    REQUIRE(decoded.ok());
    CHECK(decoded->body_case() == original.body_case());
    CHECK(decoded->seq() == original.seq());
  }
  SECTION("inside a nested message") {
    v1::Hello hello;
    hello.set_node_id("n1");
    std::string inner = hello.SerializeAsString();
    append_unknown_field(inner, 77);
    std::string bytes;
    bytes.push_back(static_cast<char>(10 << 3 | 2));  // Envelope.hello
    bytes.push_back(static_cast<char>(inner.size()));
    bytes += inner;
    auto decoded = decode_envelope(bytes);
    REQUIRE(decoded.ok());
    CHECK(decoded->hello().node_id() == "n1");
  }
  SECTION("a message type this build does not know") {
    std::string bytes;
    append_unknown_field(bytes, 60);
    auto decoded = decode_envelope(bytes);
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.status().code() == StatusCode::kUnimplemented);
  }
}

TEST_CASE("malformed envelopes are errors", "[wire]") {
  CHECK(decode_envelope(std::string("\xff\xff\xff\xff\xff", 5)).status().code() ==
        StatusCode::kDataLoss);
  CHECK(decode_envelope(std::string("\x52\x10", 2)).status().code() ==  // truncated Hello
        StatusCode::kDataLoss);
  CHECK_FALSE(decode_envelope("").ok());
}

TEST_CASE("frame decoder consumes bytes incrementally", "[wire]") {
  std::string stream;
  REQUIRE(append_frame(stream, "first").ok());
  REQUIRE(append_frame(stream, "").ok());
  REQUIRE(append_frame(stream, std::string(1000, 'x')).ok());
  const size_t step = GENERATE(1, 3, 7, 4096);
  FrameDecoder decoder(2000);
  std::vector<std::string> frames;
  for (size_t i = 0; i < stream.size(); i += step) {
    REQUIRE(decoder.feed(std::string_view(stream).substr(i, step)).ok());
    for (;;) {
      auto f = decoder.next();
      REQUIRE(f.ok());
      if (!f->has_value()) break;
      frames.emplace_back(**f);
    }
  }
  REQUIRE(frames.size() == 3);
  CHECK(frames[0] == "first");
  CHECK(frames[1].empty());
  CHECK(frames[2] == std::string(1000, 'x'));
  CHECK_FALSE(decoder.mid_frame());
}

TEST_CASE("frame decoder rejects oversized lengths and garbage", "[wire]") {
  SECTION("encoder refuses a frame above the limit") {
    std::string out;
    CHECK(append_frame(out, std::string(101, 'a'), 100).code() == StatusCode::kInvalidArgument);
    CHECK(out.empty());
    v1::Envelope big;
    big.mutable_chunk()->set_data(std::string(200, 'a'));
    CHECK(encode_framed_envelope(big, 100).status().code() == StatusCode::kInvalidArgument);
    CHECK(encode_envelope(big, 100).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("oversized length is rejected from the header alone, and the error sticks") {
    FrameDecoder decoder(100);
    CHECK(decoder.feed(std::string("\x00\x00", 2)).ok());
    auto s = decoder.feed(std::string("\x00\x65", 2));  // 101
    REQUIRE(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("exceeds the limit"));
    CHECK_FALSE(decoder.next().ok());
    CHECK_FALSE(decoder.feed("more").ok());
  }
  SECTION("garbage bytes") {
    FrameDecoder decoder;
    CHECK(decoder.feed("GET / HTTP/1.1\r\n\r\n").code() == StatusCode::kDataLoss);
  }
  SECTION("a truncated frame is reported as mid-frame") {
    FrameDecoder decoder;
    std::string stream;
    REQUIRE(append_frame(stream, "complete message").ok());
    REQUIRE(decoder.feed(stream.substr(0, stream.size() - 1)).ok());
    auto f = decoder.next();
    REQUIRE(f.ok());
    CHECK_FALSE(f->has_value());
    CHECK(decoder.mid_frame());
  }
}

TEST_CASE("crc32c matches the published check values", "[wire]") {
  CHECK(crc32c("") == 0u);
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t split = 0; split <= text.size(); ++split) {
    const std::string_view v(text);
    CHECK(crc32c_extend(crc32c(v.substr(0, split)), v.substr(split)) == crc32c(text));
  }
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4097}) {
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 131 + n);
    CHECK(crc32c(data) == crc32c_extend_portable(0, data));
    CHECK(crc32c_extend(0x12345678u, data) == crc32c_extend_portable(0x12345678u, data));
  }
}

TEST_CASE("crc32c: the three-stream hardware path agrees with the tables", "[wire]") {
  // Lengths around the 3 x 8192 and 3 x 256 block boundaries, from unaligned starts.
  std::string data(3 * 8192 * 3 + 100, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& c : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  for (size_t offset : {0, 1, 5, 7}) {
    for (size_t n : {767, 768, 769, 1000, 24575, 24576, 24577, 24576 + 768 + 9, 3 * 24576 + 3}) {
      const std::string_view v(data.data() + offset, n);
      INFO("offset " << offset << " length " << n);
      CHECK(crc32c_extend(0xDEADBEEFu, v) == crc32c_extend_portable(0xDEADBEEFu, v));
      CHECK(crc32c_extend(crc32c(v.substr(0, n / 3)), v.substr(n / 3)) == crc32c(v));
    }
  }
}

v1::Chunk make_chunk(uint64_t transfer_id, uint64_t index, std::string data, uint32_t crc) {
  v1::Chunk c;
  c.set_transfer_id(transfer_id);
  c.set_index(index);
  c.set_data(std::move(data));
  c.set_crc32c(crc);
  return c;
}

TEST_CASE("chunk frames without protobuf are byte-identical and parse back", "[wire]") {
  const v1::Chunk chunk = GENERATE(make_chunk(0, 0, "", 0), make_chunk(1, 0, "x", 0),
                                   make_chunk(7, 3, std::string(300, 'a'), 0x80000000u),
                                   make_chunk(~0ull, ~0ull - 1, std::string(70'000, 'z'), ~0u),
                                   make_chunk(42, 100'000, std::string(1 << 20, '\x80'), 12345));
  v1::Envelope e;
  *e.mutable_chunk() = chunk;
  auto expected = encode_framed_envelope(e, kDefaultMaxFrameBytes);
  REQUIRE(expected.ok());

  std::string out = "prefix";
  REQUIRE(append_chunk_frame(out, view_of(chunk), kDefaultMaxFrameBytes).ok());
  CHECK(out.substr(6) == *expected);
  CHECK(chunk_envelope_size(view_of(chunk)) == expected->size() - kFrameHeaderBytes);

  const std::string_view payload = std::string_view(*expected).substr(kFrameHeaderBytes);
  auto parsed = parse_chunk_envelope(payload);
  REQUIRE(parsed.has_value());
  CHECK(parsed->transfer_id == chunk.transfer_id());
  CHECK(parsed->index == chunk.index());
  CHECK(parsed->data == chunk.data());
  CHECK(parsed->crc32c == chunk.crc32c());
  if (!chunk.data().empty()) {  // a view into the frame, not a copy
    CHECK(parsed->data.data() >= payload.data());
    CHECK(parsed->data.data() < payload.data() + payload.size());
  }

  SECTION("with a sequence number") {
    e.set_seq(99);
    auto framed = encode_envelope(e, kDefaultMaxFrameBytes);
    REQUIRE(framed.ok());
    auto p = parse_chunk_envelope(*framed);
    REQUIRE(p.has_value());
    CHECK(p->data == chunk.data());
  }
  SECTION("too large for the frame limit: an error, the buffer untouched") {
    std::string small = "keep";
    const auto limit = static_cast<uint32_t>(expected->size() - kFrameHeaderBytes - 1);
    CHECK(append_chunk_frame(small, view_of(chunk), limit).code() == StatusCode::kInvalidArgument);
    CHECK(small == "keep");
  }
}

TEST_CASE("the chunk parser leaves everything unusual to protobuf", "[wire]") {
  v1::Envelope e;
  *e.mutable_chunk() = make_chunk(5, 6, "payload", 77);
  auto bytes = encode_envelope(e, kDefaultMaxFrameBytes);
  REQUIRE(bytes.ok());
  REQUIRE(parse_chunk_envelope(*bytes).has_value());

  SECTION("other message types") {
    v1::Envelope hb;
    hb.mutable_heartbeat()->set_sent_unix_ms(1);
    auto other = encode_envelope(hb, kDefaultMaxFrameBytes);
    REQUIRE(other.ok());
    CHECK_FALSE(parse_chunk_envelope(*other).has_value());
    CHECK_FALSE(parse_chunk_envelope("").has_value());
  }
  SECTION("unknown fields (protobuf ignores them, the fast path declines)") {
    v1::Envelope u = e;
    u.mutable_chunk()->GetReflection()->MutableUnknownFields(u.mutable_chunk())->AddVarint(9, 1);
    auto with_unknown = encode_envelope(u, kDefaultMaxFrameBytes);
    REQUIRE(with_unknown.ok());
    CHECK_FALSE(parse_chunk_envelope(*with_unknown).has_value());
    auto back = decode_envelope(*with_unknown);
    REQUIRE(back.ok());
    CHECK(back->chunk().data() == "payload");
  }
  SECTION("a repeated field") { CHECK_FALSE(parse_chunk_envelope(*bytes + *bytes).has_value()); }
  SECTION("every truncation") {
    for (size_t n = 0; n < bytes->size(); ++n) {
      CHECK_FALSE(parse_chunk_envelope(std::string_view(*bytes).substr(0, n)).has_value());
    }
  }
  SECTION("a length beyond the end") {
    std::string bad = *bytes;
    bad[1] = static_cast<char>(0x7F);
    CHECK_FALSE(parse_chunk_envelope(bad).has_value());
  }
}

TEST_CASE("frame decoder receives in place through prepare and commit", "[wire]") {
  std::string stream;
  REQUIRE(append_frame(stream, "first").ok());
  REQUIRE(append_frame(stream, std::string(5000, 'b')).ok());
  REQUIRE(append_frame(stream, "").ok());
  REQUIRE(append_frame(stream, "last").ok());
  const size_t piece = GENERATE(1, 3, 4, 7, 1000, 100000);
  FrameDecoder decoder(8192);
  std::vector<std::string> frames;
  for (size_t at = 0; at < stream.size(); at += piece) {
    const size_t n = std::min(piece, stream.size() - at);
    const std::span<char> room = decoder.prepare(piece);
    REQUIRE(room.size() == piece);
    std::copy_n(stream.data() + at, n, room.data());
    REQUIRE(decoder.commit(n).ok());
    for (;;) {
      auto f = decoder.next();
      REQUIRE(f.ok());
      if (!f->has_value()) break;
      frames.emplace_back(**f);
    }
  }
  REQUIRE(frames.size() == 4);
  CHECK(frames[0] == "first");
  CHECK(frames[1] == std::string(5000, 'b'));
  CHECK(frames[2].empty());
  CHECK(frames[3] == "last");
  CHECK_FALSE(decoder.mid_frame());

  SECTION("an oversized length arriving in place is rejected") {
    FrameDecoder small(16);
    const std::span<char> room = small.prepare(4);
    std::copy_n("\x00\x00\x01\x00", 4, room.data());
    CHECK(small.commit(4).code() == StatusCode::kDataLoss);
  }
  SECTION("committing more than was prepared is an error") {
    FrameDecoder d;
    (void)d.prepare(8);
    CHECK_FALSE(d.commit(1 << 20).ok());
  }
  SECTION("frame_missing counts what the frame in progress still lacks") {
    FrameDecoder d;
    CHECK(d.frame_missing() == 0);
    const auto feed = [&](std::string_view bytes) {
      const std::span<char> room = d.prepare(bytes.size());
      std::copy_n(bytes.data(), bytes.size(), room.data());
      REQUIRE(d.commit(bytes.size()).ok());
    };
    feed(std::string_view(stream.data(), 2));  // half a header: not known yet
    CHECK(d.frame_missing() == 0);
    feed(std::string_view(stream.data() + 2, 4));  // header and 2 of "first"'s 5 bytes
    CHECK(d.frame_missing() == 3);
    feed(std::string_view(stream.data() + 6, 3 + 4 + 10));  // the rest, 10 bytes of the next
    auto f = d.next();
    REQUIRE(f.ok());
    REQUIRE(f->has_value());
    CHECK(d.frame_missing() == 5000 - 10);
  }
}

TEST_CASE("frame decoder sizes its buffer by the announced frame and releases it when empty",
          "[wire]") {
  std::string stream;
  const std::string big(100000, 'x');
  REQUIRE(append_frame(stream, big).ok());
  FrameDecoder decoder;
  constexpr size_t kRead = 16384;
  size_t at = 0;
  size_t most = 0;
  std::optional<std::string> got;
  while (at < stream.size()) {
    const std::span<char> room = decoder.prepare(kRead);
    const size_t n = std::min(kRead, stream.size() - at);
    std::copy_n(stream.data() + at, n, room.data());
    at += n;
    REQUIRE(decoder.commit(n).ok());
    most = std::max(most, decoder.capacity());
    auto f = decoder.next();
    REQUIRE(f.ok());
    if (f->has_value()) got = std::string(**f);
    if (decoder.mid_frame()) {
      // Mid-frame nothing may be released: the bytes so far would be lost.
      decoder.release();
      CHECK(decoder.capacity() > 0);
    }
  }
  REQUIRE(got == big);
  // One frame plus one read, not the doubling that would end at 2x (or more).
  CHECK(most <= kFrameHeaderBytes + big.size() + 2 * kRead);
  CHECK(most >= kFrameHeaderBytes + big.size());
  decoder.release();
  CHECK(decoder.capacity() == 0);
  // And it works again afterwards.
  REQUIRE(decoder.feed(stream.substr(0, 10)).ok());
  REQUIRE(decoder.feed(stream.substr(10)).ok());
  auto f = decoder.next();
  REQUIRE(f.ok());
  REQUIRE(f->has_value());
  CHECK(**f == big);
}

}  // namespace
}  // namespace starling::wire
