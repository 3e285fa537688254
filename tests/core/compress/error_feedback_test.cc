// Error feedback: the residual is exactly what was not sent. Inputs are multiples of 2^-12 of
// modest size, so sums of them are exact in float (the nccl-tests habit).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/rng.h"

namespace starling::compress {
namespace {

std::vector<float> dyadic(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = std::round(static_cast<float>(rng.normal()) * 4096.0f) / 4096.0f;
  return v;
}

// Codecs whose float subtraction corrected - decoded is exact (the decoded value is within a
// factor of two of the corrected one, or zero): Sterbenz's lemma.
bool subtraction_exact(const std::string& spec) {
  return spec.rfind("identity", 0) == 0 || spec.rfind("fp16", 0) == 0 ||
         spec.rfind("bf16", 0) == 0 || spec.rfind("int8", 0) == 0 || spec.rfind("topk", 0) == 0;
}

}  // namespace

TEST_CASE("error feedback: residual_new == corrected - sent, as floats", "[compress]") {
  const std::string spec =
      GENERATE(as<std::string>{}, "identity", "fp16", "bf16", "int8:block=64", "qsgd:levels=4",
               "topk:ratio=0.05", "topk:ratio=0.05,approx=1", "topk:ratio=0.05,values=int8",
               "randk:ratio=0.05", "powersgd:rank=2", "sign");
  const Layout layout = {TensorInfo{"w", Shape{40, 50}, 0}, TensorInfo{"b", Shape{50}, 2000}};
  auto codec =
      make_codec(spec + (spec.find(':') == std::string::npos ? ":ef=1" : ",ef=1"), layout, 11);
  REQUIRE(codec.ok());
  auto* ef = dynamic_cast<ErrorFeedback*>(codec->get());
  REQUIRE(ef != nullptr);
  std::vector<float> sent(2050);
  for (int round = 0; round < 5; ++round) {
    const auto delta = dyadic(2050, 100 + round);
    const std::vector<float> old(ef->residual().begin(), ef->residual().end());
    auto enc = ef->encode(delta);
    REQUIRE(enc.ok());
    REQUIRE(decode(*enc, sent).ok());
    const auto fresh = ef->residual();
    for (size_t i = 0; i < delta.size(); ++i) {
      INFO(spec << " round " << round << " element " << i);
      const float corrected = delta[i] + old[i];
      // What the wrapper computes, bit for bit.
      REQUIRE(fresh[i] == corrected - sent[i]);
      // As real numbers: sent + residual_new == corrected, exactly when the subtraction is, and
      // otherwise up to the one rounding of residual_new.
      const double gap = static_cast<double>(sent[i]) + fresh[i] - corrected;
      if (subtraction_exact(spec)) {
        REQUIRE(gap == 0.0);
      } else {
        REQUIRE(std::fabs(gap) <= std::fabs(static_cast<double>(fresh[i])) * 0x1.0p-24 +
                                      std::fabs(static_cast<double>(sent[i])) * 0x1.0p-50);
      }
      if (round == 0) {
        // With a zero old residual, corrected == delta: sent + new residual == delta + old.
        REQUIRE(std::fabs(static_cast<double>(sent[i]) + fresh[i] - delta[i]) <=
                (subtraction_exact(spec)
                     ? 0.0
                     : std::fabs(fresh[i]) * 0x1.0p-24 + std::fabs(sent[i]) * 0x1.0p-50));
      }
    }
  }
}

TEST_CASE("error feedback with top-k: everything is sent eventually, exactly", "[compress]") {
  // Top-k sends kept values unchanged and keeps the rest: over any number of rounds,
  // sum(sent) + residual == sum(delta), bit for bit (all sums here are exact in float).
  auto codec = make_codec("topk:ratio=0.02,ef=1", flat_layout(3000), 5);
  REQUIRE(codec.ok());
  auto* ef = dynamic_cast<ErrorFeedback*>(codec->get());
  REQUIRE(ef != nullptr);
  std::vector<double> total_delta(3000, 0.0), total_sent(3000, 0.0);
  std::vector<float> sent(3000);
  for (int round = 0; round < 20; ++round) {
    const auto delta = dyadic(3000, 500 + round);
    auto enc = ef->encode(delta);
    REQUIRE(enc.ok());
    REQUIRE(decode(*enc, sent).ok());
    for (size_t i = 0; i < delta.size(); ++i) {
      total_delta[i] += delta[i];
      total_sent[i] += sent[i];
    }
  }
  const auto r = ef->residual();
  for (size_t i = 0; i < r.size(); ++i) REQUIRE(total_sent[i] + r[i] == total_delta[i]);
}

TEST_CASE("error feedback leaves the residual alone when encoding fails", "[compress]") {
  auto codec = make_codec("int8:ef=1", flat_layout(4), 5);
  REQUIRE(codec.ok());
  auto* ef = dynamic_cast<ErrorFeedback*>(codec->get());
  REQUIRE(ef != nullptr);
  REQUIRE(ef->encode(std::vector<float>{1.0f, 0.3f, 0.001f, -1.0f}).ok());
  const std::vector<float> before(ef->residual().begin(), ef->residual().end());
  CHECK_FALSE(ef->encode(std::vector<float>{1.0f, NAN, 0.0f, 0.0f}).ok());
  CHECK(std::vector<float>(ef->residual().begin(), ef->residual().end()) == before);
}

}  // namespace starling::compress
