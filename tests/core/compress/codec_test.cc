// Round trips of every codec within the error bound documented in core/compress/codec.h, the
// statistical checks (QSGD and random-k unbiased), top-k selection, PowerSGD and decode_add.
#include "core/compress/codec.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/compress/internal/kernels.h"
#include "core/tensor/dtype.h"
#include "core/util/rng.h"

namespace starling::compress {
namespace {

std::vector<float> gaussian(size_t n, uint64_t seed, float std = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = std::round(static_cast<float>(rng.normal()) * std * 4096.0f) / 4096.0f;
  return v;
}

EncodedUpdate encode_or_die(std::string_view spec, std::span<const float> x, Layout layout,
                            uint64_t seed = 1) {
  auto codec = make_codec(spec, std::move(layout), seed);
  REQUIRE(codec.ok());
  auto enc = (*codec)->encode(x);
  REQUIRE(enc.ok());
  return std::move(enc).value();
}

std::vector<float> decoded(const EncodedUpdate& u) {
  std::vector<float> y(static_cast<size_t>(u.numel), 123.0f);
  const Status s = decode(u, y);
  REQUIRE(s.ok());
  return y;
}

std::vector<float> round_trip(std::string_view spec, const std::vector<float>& x) {
  return decoded(encode_or_die(spec, x, flat_layout(static_cast<int64_t>(x.size()))));
}

}  // namespace

TEST_CASE("dense codecs round-trip within their bound", "[compress]") {
  const size_t n = GENERATE(1, 7, 1000, 10007);
  auto x = gaussian(n, 10 + n);
  x[0] = 1e-6f;  // an fp16 subnormal
  SECTION("identity") { CHECK(round_trip("identity", x) == x); }
  SECTION("fp16") {
    const auto y = round_trip("fp16", x);
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(x[i]);
      const float bound = a >= 0x1.0p-14f ? a * 0x1.0p-11f : 0x1.0p-25f;
      REQUIRE(std::fabs(y[i] - x[i]) <= bound);
    }
  }
  SECTION("bf16") {
    const auto y = round_trip("bf16", x);
    for (size_t i = 0; i < n; ++i) REQUIRE(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) * 0x1.0p-8f);
  }
  SECTION("int8") {
    const int block = GENERATE(1, 64, 256);
    const auto y = round_trip("int8:block=" + std::to_string(block), x);
    for (size_t start = 0; start < n; start += static_cast<size_t>(block)) {
      const size_t end = std::min(n, start + static_cast<size_t>(block));
      float amax = 0.0f;
      for (size_t i = start; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = start; i < end; ++i) {
        REQUIRE(std::fabs(y[i] - x[i]) <= amax / 254.0f * (1.0f + 0x1.0p-20f));
      }
    }
  }
  SECTION("qsgd") {
    const int levels = GENERATE(1, 4, 127);
    const auto y = round_trip("qsgd:bucket=100,levels=" + std::to_string(levels), x);
    for (size_t start = 0; start < n; start += 100) {
      const size_t end = std::min(n, start + 100);
      double sq = 0.0;
      for (size_t i = start; i < end; ++i) sq += static_cast<double>(x[i]) * x[i];
      const double bound = std::sqrt(sq) / levels * (1.0 + 0x1.0p-20);
      for (size_t i = start; i < end; ++i) REQUIRE(std::fabs(y[i] - x[i]) <= bound);
    }
  }
  SECTION("sign") {
    const auto y = round_trip("sign", x);
    double sum = 0.0;
    for (float v : x) sum += std::fabs(v);
    const double mean = sum / static_cast<double>(n);
    const float scale = std::fabs(y[0]);
    CHECK(std::fabs(scale - mean) <= 1e-6 * mean);
    for (size_t i = 0; i < n; ++i) REQUIRE(y[i] == (std::signbit(x[i]) ? -scale : scale));
  }
}

TEST_CASE("identity copies large tensors exactly and still checks them", "[compress]") {
  // Above 1 MiB the copy streams past the cache; odd offsets exercise its alignment head.
  const size_t n = 300001;
  auto x = gaussian(n, 8);
  const Layout layout = {TensorInfo{"a", Shape{3}, 0}, TensorInfo{"b", Shape{299998}, 3}};
  CHECK(decoded(encode_or_die("identity", x, layout)) == x);
  x[n - 5] = NAN;
  auto codec = make_codec("identity", layout, 1);
  REQUIRE(codec.ok());
  CHECK((*codec)->encode(x).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("fp16 saturates instead of overflowing", "[compress]") {
  const std::vector<float> x = {1e6f, -1e6f, 65504.0f, 0.0f};
  CHECK(round_trip("fp16", x) == std::vector<float>{65504.0f, -65504.0f, 65504.0f, 0.0f});
}

TEST_CASE("top-k exact keeps the k largest magnitudes", "[compress]") {
  const size_t n = GENERATE(1, 10, 5000);
  const double ratio = GENERATE(0.001, 0.01, 0.3, 1.0);
  auto x = gaussian(n, 77 + n);
  if (n > 4) x[3] = x[4] = 9.0f;  // a tie at the top
  const auto enc =
      encode_or_die("topk:ratio=" + std::to_string(ratio), x, flat_layout(static_cast<int64_t>(n)));
  const auto y = decoded(enc);
  const size_t k = std::clamp<size_t>(static_cast<size_t>(std::ceil(ratio * n)), 1, n);
  // Reference: stable sort of indices by |x| descending.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  std::vector<float> want(n, 0.0f);
  for (size_t j = 0; j < k; ++j) want[order[j]] = x[order[j]];
  CHECK(y == want);
  CHECK(enc.segments[0].k == static_cast<int64_t>(k));
}

TEST_CASE("top-k approx keeps a subset of the exact top-k", "[compress]") {
  const uint64_t seed = GENERATE(1, 2, 3);
  const auto x = gaussian(10000, seed);
  const Layout layout = flat_layout(10000);
  const auto exact = decoded(encode_or_die("topk:ratio=0.01", x, layout));
  const auto enc = encode_or_die("topk:ratio=0.01,approx=1,sample=0.05", x, layout, seed);
  const auto approx = decoded(enc);
  const int64_t kept = enc.segments[0].k;
  CHECK(kept <= 100);
  CHECK(kept >= 90);  // the sampled threshold is set low, so nearly always k pass it
  for (size_t i = 0; i < x.size(); ++i) {
    if (approx[i] != 0.0f) REQUIRE(approx[i] == exact[i]);
  }
}

TEST_CASE("top-k composes with int8 of the kept values", "[compress]") {
  const auto x = gaussian(10000, 5);
  const auto enc = encode_or_die("topk:ratio=0.05,values=int8,block=32", x, flat_layout(10000));
  const auto& s = enc.segments[0];
  REQUIRE(s.values == ValueCoding::kInt8);
  REQUIRE(s.f32.empty());
  const auto y = decoded(enc);
  std::vector<float> kept;
  for (uint32_t i : s.indices) kept.push_back(x[i]);
  for (size_t j = 0; j < kept.size(); ++j) {
    const size_t start = j / 32 * 32, end = std::min(kept.size(), start + 32);
    float amax = 0.0f;
    for (size_t t = start; t < end; ++t) amax = std::max(amax, std::fabs(kept[t]));
    REQUIRE(std::fabs(y[s.indices[j]] - kept[j]) <= amax / 254.0f * (1.0f + 0x1.0p-20f));
  }
  size_t nonzero = 0;
  for (float v : y) nonzero += v != 0.0f ? 1 : 0;
  CHECK(nonzero <= 500);
  // 500 indices (4 B) + 500 codes (1 B) + 16 scales (4 B), against 40000 bytes dense.
  CHECK(enc.payload_bytes() == 500 * 4 + 500 + 16 * 4);
}

TEST_CASE("QSGD and random-k are unbiased", "[compress]") {
  constexpr size_t kN = 1000;
  constexpr int kTrials = 3000;
  const auto x = gaussian(kN, 99);
  const std::string spec = GENERATE(as<std::string>{}, "qsgd:levels=2,bucket=100",
                                    "randk:ratio=0.1", "randk:ratio=0.1,values=fp16");
  auto codec = make_codec(spec, flat_layout(kN), 2024);
  REQUIRE(codec.ok());
  std::vector<double> mean(kN, 0.0);
  std::vector<float> y(kN);
  for (int t = 0; t < kTrials; ++t) {
    auto enc = (*codec)->encode(x);
    REQUIRE(enc.ok());
    REQUIRE(decode(*enc, y).ok());
    for (size_t i = 0; i < kN; ++i) mean[i] += y[i];
  }
  // Per element the decoded value has variance at most v_i: random-k (s - 1) x^2 with s = 10,
  // QSGD (norm / levels)^2 / 4. The mean of kTrials draws is within 5 standard deviations.
  double norm_sq[10] = {};
  for (size_t i = 0; i < kN; ++i) norm_sq[i / 100] += static_cast<double>(x[i]) * x[i];
  for (size_t i = 0; i < kN; ++i) {
    const double m = mean[i] / kTrials;
    const double var =
        spec.rfind("randk", 0) == 0 ? 9.0 * x[i] * x[i] : norm_sq[i / 100] / 4.0 / 4.0;
    const double tol = 5.0 * std::sqrt(var / kTrials) + 1e-3 * std::fabs(x[i]) + 1e-6;
    INFO(spec << " element " << i << " x " << x[i] << " mean " << m);
    REQUIRE(std::fabs(m - x[i]) <= tol);
  }
}

TEST_CASE("random-k sends no indices and regenerates them from the seed", "[compress]") {
  const auto x = gaussian(1000, 3);
  const auto enc = encode_or_die("randk:ratio=0.05", x, flat_layout(1000));
  const auto& s = enc.segments[0];
  CHECK(s.indices.empty());
  CHECK(s.f32.size() == 50);
  CHECK(enc.payload_bytes() == 50 * 4 + 8);
  const auto y = decoded(enc);
  int nonzero = 0;
  for (size_t i = 0; i < 1000; ++i) {
    if (y[i] != 0.0f) {
      ++nonzero;
      REQUIRE(y[i] == x[i] * 20.0f);  // strata of 20 elements
    }
  }
  CHECK(nonzero == 50);
}

TEST_CASE("PowerSGD is exact on low-rank matrices and converges with warm start", "[compress]") {
  constexpr int64_t kRows = 60, kCols = 40;
  const Layout layout = {TensorInfo{"w", Shape{kRows, kCols}, 0}};
  Rng rng(8);
  SECTION("rank <= r is reconstructed") {
    const int true_rank = GENERATE(1, 2);
    std::vector<float> m(kRows * kCols, 0.0f);
    for (int c = 0; c < true_rank; ++c) {
      std::vector<float> a(kRows), b(kCols);
      for (auto& v : a) v = static_cast<float>(rng.normal());
      for (auto& v : b) v = static_cast<float>(rng.normal());
      for (int64_t i = 0; i < kRows; ++i) {
        for (int64_t j = 0; j < kCols; ++j) m[i * kCols + j] += a[i] * b[j];
      }
    }
    const auto y = decoded(encode_or_die("powersgd:rank=2", m, layout));
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < m.size(); ++i) {
      err += (y[i] - m[i]) * (y[i] - m[i]);
      norm += m[i] * m[i];
    }
    CHECK(std::sqrt(err / norm) < 1e-5);
  }
  SECTION("warm start approaches the best rank-r error") {
    // M = sum_c sigma_c u_c v_c^T with orthonormal u, v: the best rank-2 error is
    // sqrt(sum_{c >= 2} sigma_c^2).
    const double sigma[5] = {10, 6, 3, 2, 1};
    std::vector<std::vector<double>> u, v;
    auto orth_random = [&](int64_t len, std::vector<std::vector<double>>& basis) {
      std::vector<double> w(static_cast<size_t>(len));
      for (auto& e : w) e = rng.normal();
      for (const auto& b : basis) {
        double d = 0;
        for (int64_t i = 0; i < len; ++i) d += b[i] * w[i];
        for (int64_t i = 0; i < len; ++i) w[i] -= d * b[i];
      }
      double nrm = 0;
      for (double e : w) nrm += e * e;
      for (auto& e : w) e /= std::sqrt(nrm);
      basis.push_back(w);
    };
    std::vector<float> m(kRows * kCols, 0.0f);
    for (int c = 0; c < 5; ++c) {
      orth_random(kRows, u);
      orth_random(kCols, v);
    }
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) {
        double s = 0;
        for (int c = 0; c < 5; ++c) s += sigma[c] * u[c][i] * v[c][j];
        m[i * kCols + j] = static_cast<float>(s);
      }
    }
    const double best = std::sqrt(9.0 + 4.0 + 1.0);
    auto codec = make_codec("powersgd:rank=2", layout, 3);
    REQUIRE(codec.ok());
    std::vector<float> y(m.size());
    double first = 0.0, last = 0.0;
    for (int round = 0; round < 30; ++round) {
      auto enc = (*codec)->encode(m);
      REQUIRE(enc.ok());
      REQUIRE(decode(*enc, y).ok());
      double err = 0.0;
      for (size_t i = 0; i < m.size(); ++i) err += (y[i] - m[i]) * (y[i] - m[i]);
      (round == 0 ? first : last) = std::sqrt(err);
    }
    CHECK(last <= best * 1.001);
    CHECK(first > last);
  }
  SECTION("vectors and tiny matrices are sent dense") {
    const Layout mixed = {TensorInfo{"b", Shape{10}, 0}, TensorInfo{"s", Shape{2, 2}, 10}};
    const auto x = gaussian(14, 4);
    const auto enc = encode_or_die("powersgd:rank=2", x, mixed);
    CHECK(enc.segments[0].codec == CodecKind::kIdentity);
    CHECK(enc.segments[1].codec == CodecKind::kIdentity);
    CHECK(decoded(enc) == x);
  }
}

TEST_CASE("decode_add adds weight * decoded, bit for bit", "[compress]") {
  const std::string spec = GENERATE(as<std::string>{}, "identity", "fp16", "bf16", "int8:block=64",
                                    "qsgd:levels=8", "topk:ratio=0.1", "topk:ratio=0.1,values=int8",
                                    "randk:ratio=0.1,values=bf16", "powersgd:rank=3", "sign");
  const Layout layout = {TensorInfo{"w", Shape{50, 40}, 0}, TensorInfo{"b", Shape{40}, 2000}};
  const auto x = gaussian(2040, 6);
  const auto enc = encode_or_die(spec, x, layout);
  const auto y = decoded(enc);
  const auto base = gaussian(2040, 7);
  for (float w : {1.0f, -1.0f, 0.3f}) {
    auto dst = base;
    REQUIRE(decode_add(enc, dst, w).ok());
    for (size_t i = 0; i < dst.size(); ++i) {
      INFO(spec << " w " << w << " i " << i);
      REQUIRE(dst[i] == base[i] + w * y[i]);
    }
  }
  SECTION("a size mismatch is an error and leaves dst alone") {
    std::vector<float> small(10, 1.0f);
    CHECK(decode_add(enc, small, 1.0f).code() == StatusCode::kInvalidArgument);
    CHECK(small == std::vector<float>(10, 1.0f));
  }
}

TEST_CASE("per-tensor overrides keep biases and norms dense", "[compress]") {
  CompressionSpec spec;
  auto def = parse_codec_spec("topk:ratio=0.01,ef=1");
  REQUIRE(def.ok());
  spec.default_spec = *def;
  REQUIRE(spec.add_override("*.bias", "identity").ok());
  REQUIRE(spec.add_override("*ln*", "fp16").ok());
  const Layout layout = {TensorInfo{"h.0.attn.weight", Shape{30, 20}, 0},
                         TensorInfo{"h.0.attn.bias", Shape{20}, 600},
                         TensorInfo{"h.0.ln_1.weight", Shape{20}, 620}};
  auto codec = make_codec(spec, layout, 1);
  REQUIRE(codec.ok());
  const auto x = gaussian(640, 1);
  auto enc = (*codec)->encode(x);
  REQUIRE(enc.ok());
  CHECK(enc->segments[0].codec == CodecKind::kTopk);
  CHECK(enc->segments[1].codec == CodecKind::kIdentity);
  CHECK(enc->segments[2].codec == CodecKind::kFp16);
  // Error feedback is on for the top-k tensor only.
  auto* ef = dynamic_cast<ErrorFeedback*>(codec->get());
  REQUIRE(ef != nullptr);
  const auto r = ef->residual();
  CHECK(std::any_of(r.begin(), r.begin() + 600, [](float v) { return v != 0.0f; }));
  CHECK(std::all_of(r.begin() + 600, r.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("encode_into reuses an update and gives what encode gives", "[compress]") {
  const std::string spec =
      GENERATE(as<std::string>{}, "identity", "fp16", "int8:block=16", "qsgd:levels=3",
               "topk:ratio=0.05,values=int8", "topk:ratio=0.05,approx=1", "randk:ratio=0.1",
               "powersgd:rank=2", "sign:ef=1");
  const Layout layout = {TensorInfo{"w", Shape{30, 20}, 0}, TensorInfo{"b", Shape{20}, 600}};
  auto reused = make_codec(spec, layout, 4);
  auto fresh = make_codec(spec, layout, 4);
  REQUIRE(reused.ok());
  REQUIRE(fresh.ok());
  EncodedUpdate out;
  for (uint64_t round = 0; round < 3; ++round) {
    const auto x = gaussian(620, 30 + round);
    REQUIRE((*reused)->encode_into(x, out).ok());
    auto want = (*fresh)->encode(x);
    REQUIRE(want.ok());
    INFO(spec << " round " << round);
    CHECK(serialize_update(out) == serialize_update(*want));
  }
}

TEST_CASE("every codec rejects the non-finite values it reads", "[compress]") {
  const std::string spec =
      GENERATE(as<std::string>{}, "identity", "fp16", "bf16", "int8", "qsgd", "topk:ratio=0.01",
               "topk:ratio=0.01,approx=1", "randk:ratio=1", "powersgd:rank=1", "sign");
  const float bad = GENERATE(NAN, INFINITY, -INFINITY);
  const size_t at = GENERATE(0, 9, 2999);
  auto x = gaussian(3000, 1);
  x[at] = bad;
  auto codec = make_codec(spec, {TensorInfo{"w", Shape{30, 100}, 0}}, 1);
  REQUIRE(codec.ok());
  INFO(spec << " " << bad << " at " << at);
  CHECK((*codec)->encode(x).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("fp16 and bf16 conversions match the scalar reference bit for bit", "[compress]") {
  // The vector paths (F16C / AVX2 where present) against dtype.h's scalar conversions, on
  // subnormals, ties, the saturation edge and random values; 1003 is not a multiple of 8.
  std::vector<float> x = {0.0f,     -0.0f,     1e-8f,         -3e-7f,  6.1e-5f, 65504.0f,
                          65519.0f, -65520.0f, 1.0009765625f, 3.0e38f, 1e-40f,  0x1.002p0f};
  const auto g = gaussian(1003 - x.size(), 3, 100.0f);
  x.insert(x.end(), g.begin(), g.end());
  const auto enc16 = encode_or_die("fp16", x, flat_layout(static_cast<int64_t>(x.size())));
  const auto encb = encode_or_die("bf16", x, flat_layout(static_cast<int64_t>(x.size())));
  for (size_t i = 0; i < x.size(); ++i) {
    INFO(i << " " << x[i]);
    REQUIRE(enc16.segments[0].u16[i] == float_to_f16(std::clamp(x[i], -65504.0f, 65504.0f)));
    REQUIRE(encb.segments[0].u16[i] == float_to_bf16(x[i]));
  }
  const auto y = decoded(enc16);
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == f16_to_float(enc16.segments[0].u16[i]));
}

TEST_CASE("int8 quantization matches its plain-loop reference bit for bit", "[compress]") {
  const int block = GENERATE(1, 7, 64, 256);
  auto x = gaussian(1003, 12, 3.0f);
  x[5] = 0.0f;
  x[6] = -0.0f;
  std::fill(x.begin() + 100, x.begin() + 400, 0.0f);  // all-zero blocks
  // A block of subnormals, whose 127 / absmax overflows: encoded as zeros by both paths.
  for (size_t i = 512; i < 768; ++i) x[i] = (i % 2 ? 1.0f : -1.0f) * 1e-40f;
  const size_t blocks = (x.size() + block - 1) / block;
  std::vector<int8_t> q(x.size()), q_ref(x.size());
  std::vector<float> s(blocks), s_ref(blocks);
  REQUIRE(internal::quantize_int8(x, block, q.data(), s.data()));
  REQUIRE(internal::quantize_int8_scalar(x.data(), x.size(), block, q_ref.data(), s_ref.data()));
  CHECK(q == q_ref);
  CHECK(s == s_ref);
  if (block == 256) {
    for (size_t i = 512; i < 768; ++i) CHECK(q[i] == 0);  // block 2 holds only subnormals
  }
  x[500] = NAN;
  CHECK_FALSE(internal::quantize_int8(x, block, q.data(), s.data()));
  CHECK_FALSE(
      internal::quantize_int8_scalar(x.data(), x.size(), block, q_ref.data(), s_ref.data()));
}

TEST_CASE("PowerSGD products match their plain-loop references bit for bit", "[compress]") {
  const int64_t rows = GENERATE(1, 7, 33);
  const int64_t cols = GENERATE(1, 8, 13, 70);
  const int r = GENERATE(1, 3);
  const auto m = gaussian(static_cast<size_t>(rows * cols), 50);
  const auto qt = gaussian(static_cast<size_t>(r * cols), 51);
  const auto p = gaussian(static_cast<size_t>(rows * r), 52);
  std::vector<float> a(static_cast<size_t>(rows * r)), b(a.size());
  internal::powersgd_project(m.data(), rows, cols, qt.data(), r, a.data());
  internal::powersgd_project_scalar(m.data(), rows, cols, qt.data(), r, b.data());
  CHECK(a == b);
  std::vector<float> qa(qt.size(), 0.5f), qb(qt.size(), 0.5f);
  internal::powersgd_back(m.data(), rows, cols, p.data(), r, qa.data());
  internal::powersgd_back_scalar(m.data(), rows, cols, p.data(), r, qb.data());
  CHECK(qa == qb);
  auto da = gaussian(m.size(), 53), db = da;
  internal::powersgd_decode_add(p.data(), qt.data(), rows, cols, r, da.data(), 0.7f);
  internal::powersgd_decode_add_scalar(p.data(), qt.data(), rows, cols, r, db.data(), 0.7f);
  CHECK(da == db);
}

TEST_CASE("sign packing matches its plain-loop reference bit for bit", "[compress]") {
  const size_t n = GENERATE(1, 8, 13, 1003);
  auto x = gaussian(n, 60);
  x[0] = -0.0f;
  std::vector<uint8_t> a((n + 7) / 8, 0xaa), b((n + 7) / 8, 0x55);
  double sa = 0, sb = 0;
  CHECK(internal::sign_pack(x, a.data(), &sa) == 0);
  CHECK(internal::sign_pack_scalar(x.data(), n, b.data(), &sb) == 0);
  CHECK(a == b);
  CHECK(sa == sb);
  CHECK((a[0] & 1) == 1);
}

TEST_CASE("encode rejects non-finite input and mismatched sizes", "[compress]") {
  auto codec = make_codec("topk:ratio=0.5", flat_layout(4), 1);
  REQUIRE(codec.ok());
  const std::vector<float> nan = {1.0f, NAN, 2.0f, 3.0f};
  CHECK((*codec)->encode(nan).status().code() == StatusCode::kInvalidArgument);
  const std::vector<float> inf = {1.0f, INFINITY, 2.0f, 3.0f};
  CHECK((*codec)->encode(inf).status().code() == StatusCode::kInvalidArgument);
  const std::vector<float> short_delta = {1.0f};
  CHECK((*codec)->encode(short_delta).status().code() == StatusCode::kInvalidArgument);
  const Layout gap = {TensorInfo{"a", Shape{2}, 0}, TensorInfo{"b", Shape{2}, 3}};
  CHECK(make_codec("identity", gap, 1).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace starling::compress
