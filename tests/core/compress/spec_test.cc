// Codec spec strings, their errors, and the glob matcher of per-tensor overrides.
#include "core/compress/spec.h"

#include <catch2/catch.hpp>

namespace starling::compress {

TEST_CASE("codec specs parse and print canonically", "[compress]") {
  auto s = parse_codec_spec(" topk : ratio=0.01, ef=1 ,values=int8,block=64");
  REQUIRE(s.ok());
  CHECK(s->kind == CodecKind::kTopk);
  CHECK(s->ratio == 0.01);
  CHECK(s->error_feedback);
  CHECK(s->values == ValueCoding::kInt8);
  CHECK(s->block == 64);
  CHECK(s->to_string() == "topk:ratio=0.01,values=int8,block=64,ef=1");
  for (const char* text : {"identity", "fp16", "bf16", "int8:block=128", "qsgd:levels=4,bucket=256",
                           "topk:ratio=0.001,approx=1,sample=0.02,values=f32",
                           "randk:ratio=0.1,values=bf16", "powersgd:rank=8", "sign:ef=1"}) {
    INFO(text);
    auto spec = parse_codec_spec(text);
    REQUIRE(spec.ok());
    auto again = parse_codec_spec(spec->to_string());
    REQUIRE(again.ok());
    CHECK(again->to_string() == spec->to_string());
  }
}

TEST_CASE("bad codec specs are clear errors", "[compress]") {
  auto err = [](const char* text) {
    auto s = parse_codec_spec(text);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    return s.status().message();
  };
  CHECK_THAT(err("zstd"), Catch::Contains("unknown codec 'zstd'"));
  CHECK_THAT(err("topk:rank=3"), Catch::Contains("unknown parameter 'rank'"));
  CHECK_THAT(err("topk:rank=3"), Catch::Contains("known: ratio"));
  CHECK_THAT(err("fp16:block=3"), Catch::Contains("unknown parameter 'block'"));
  CHECK_THAT(err("topk:ratio=0"), Catch::Contains("ratio must be in (0, 1]"));
  CHECK_THAT(err("topk:ratio=abc"), Catch::Contains("not a number"));
  CHECK_THAT(err("topk:ratio=0.1,ratio=0.2"), Catch::Contains("given twice"));
  CHECK_THAT(err("topk:ratio"), Catch::Contains("expected key=value"));
  CHECK_THAT(err("qsgd:levels=300"), Catch::Contains("levels must be in [1, 127]"));
  CHECK_THAT(err("int8:block=0"), Catch::Contains("block must be"));
  CHECK_THAT(err("topk:values=int4"), Catch::Contains("not one of"));
  CHECK_THAT(err("sign:ef=2"), Catch::Contains("not 0/1"));
  CHECK_THAT(err("powersgd:rank=0"), Catch::Contains("rank must be"));
}

TEST_CASE("overrides: first matching glob wins", "[compress]") {
  CompressionSpec spec;
  REQUIRE(spec.add_override("*.bias", "identity").ok());
  REQUIRE(spec.add_override("*ln_?.*", "fp16").ok());
  CHECK(spec.spec_for("h.3.attn.c_attn.bias").kind == CodecKind::kIdentity);
  CHECK(spec.spec_for("h.3.ln_1.weight").kind == CodecKind::kFp16);
  CHECK(spec.spec_for("h.3.ln_1.bias").kind == CodecKind::kIdentity);
  CHECK(spec.spec_for("wte.weight").kind == spec.default_spec.kind);
  const Status bad = spec.add_override("*.weight", "topk:ratio=2");
  CHECK_THAT(bad.message(), Catch::Contains("override '*.weight'"));
  CHECK(spec.add_override("", "identity").code() == StatusCode::kInvalidArgument);
}

TEST_CASE("glob_match", "[compress]") {
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*.bias", "a.b.bias"));
  CHECK_FALSE(glob_match("*.bias", "a.bias.x"));
  CHECK(glob_match("h.?.mlp*", "h.1.mlp.c_fc.weight"));
  CHECK_FALSE(glob_match("h.?.mlp*", "h.11.mlp.c_fc.weight"));
  CHECK(glob_match("*ln*", "transformer.ln_f.weight"));
  CHECK(glob_match("a*b*c", "aXXbYYbZc"));
  CHECK_FALSE(glob_match("a*b*c", "aXXbYYbZ"));
}

}  // namespace starling::compress

TEST_CASE("compression spec text: default plus per-tensor overrides", "[compress]") {
  using starling::compress::parse_compression_spec;
  auto cs = parse_compression_spec("topk:ratio=0.01,ef=1; *.bias=identity ;ln_*=bf16");
  REQUIRE(cs.ok());
  REQUIRE(cs->overrides.size() == 2);
  REQUIRE(cs->overrides[0].glob == "*.bias");
  REQUIRE(cs->spec_for("fc1.bias").kind == starling::compress::CodecKind::kIdentity);
  REQUIRE(cs->spec_for("ln_f.weight").kind == starling::compress::CodecKind::kBf16);
  REQUIRE(cs->spec_for("fc1.weight").kind == starling::compress::CodecKind::kTopk);
  REQUIRE(parse_compression_spec("identity").ok());
  REQUIRE_FALSE(parse_compression_spec("identity;*.bias").ok());
  REQUIRE_FALSE(parse_compression_spec("identity;=fp16").ok());
  auto bad = parse_compression_spec("identity;*.bias=zip");
  REQUIRE_FALSE(bad.ok());
  REQUIRE_THAT(bad.status().message(), Catch::Contains("*.bias"));
}
