// Rotary position embeddings: values against a plain-loop reference, gradients against central
// differences in float64, the packed form against the unpacked one, and the relative-position
// property that makes RoPE useful (q . k depends on positions only through their difference).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/ops/concat.h"
#include "core/ops/ops.h"
#include "tests/testing/gradcheck.h"

using starling::DType;
using starling::Tensor;
using starling::testing::gradcheck;
using starling::testing::rand64;
namespace ops = starling::ops;

namespace {

// Plain-loop "rotate half" RoPE of x (B, T, H*D), all in double.
std::vector<double> rope_reference(const std::vector<double>& x, int64_t B, int64_t T, int64_t H,
                                   int64_t D, double base) {
  std::vector<double> y(x.size());
  const int64_t C = H * D, half = D / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = (b * T + t) * C + h * D;
        for (int64_t i = 0; i < half; ++i) {
          const double theta = static_cast<double>(t) / std::pow(base, 2.0 * i / D);
          const double x1 = x[o + i], x2 = x[o + i + half];
          y[o + i] = x1 * std::cos(theta) - x2 * std::sin(theta);
          y[o + i + half] = x2 * std::cos(theta) + x1 * std::sin(theta);
        }
      }
    }
  }
  return y;
}

}  // namespace

TEST_CASE("rope matches a plain-loop reference in f64 and f32", "[ops][rope]") {
  const auto [B, T, H, D, base] = GENERATE(table<int64_t, int64_t, int64_t, int64_t, double>(
      {{1, 5, 1, 2, 10000.0}, {2, 7, 3, 6, 10000.0}, {3, 4, 2, 8, 100.0}}));
  const Tensor x = rand64({B, T, H * D}, 11);
  const auto ref = rope_reference(x.to_double_vector(), B, T, H, D, base);
  const auto y = ops::rope(x, H, base).to_double_vector();
  REQUIRE(y.size() == ref.size());
  for (size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == Approx(ref[i]).margin(1e-12));
  const auto y32 = ops::rope(x.to(DType::kF32), H, base).to_double_vector();
  for (size_t i = 0; i < y32.size(); ++i) REQUIRE(y32[i] == Approx(ref[i]).margin(1e-5));
  // Position 0 is the identity.
  const auto xv = x.to_double_vector();
  for (int64_t j = 0; j < H * D; ++j) REQUIRE(y[j] == xv[j]);
}

TEST_CASE("rope_packed rotates q and k like rope and copies v", "[ops][rope]") {
  const int64_t B = 2, T = 5, H = 2, D = 4, C = H * D;
  const Tensor qkv = rand64({B, T, 3 * C}, 12);
  const Tensor out = ops::rope_packed(qkv, H, 500.0);
  REQUIRE(out.shape() == qkv.shape());
  const Tensor q = ops::contiguous(qkv.slice(2, 0, C)), k = ops::contiguous(qkv.slice(2, C, 2 * C));
  REQUIRE(starling::max_abs_diff(out.slice(2, 0, C), ops::rope(q, H, 500.0)) == 0.0);
  REQUIRE(starling::max_abs_diff(out.slice(2, C, 2 * C), ops::rope(k, H, 500.0)) == 0.0);
  REQUIRE(starling::max_abs_diff(out.slice(2, 2 * C, 3 * C), qkv.slice(2, 2 * C, 3 * C)) == 0.0);
}

TEST_CASE("rope_packed with a period repeats positions", "[ops][rope]") {
  // [a | a] along T with period T rotates both halves like a alone.
  const int64_t B = 2, T = 5, H = 2, D = 4, C = H * D;
  const Tensor a = rand64({B, T, 3 * C}, 15);
  const Tensor twice = ops::cat({a, a}, 1);
  const Tensor out = ops::rope_packed(twice, H, 500.0, T);
  const Tensor ra = ops::rope_packed(a, H, 500.0);
  REQUIRE(starling::max_abs_diff(out.slice(1, 0, T), ra) == 0.0);
  REQUIRE(starling::max_abs_diff(out.slice(1, T, 2 * T), ra) == 0.0);
  // Without the period the second half is rotated further.
  REQUIRE(starling::max_abs_diff(ops::rope_packed(twice, H, 500.0).slice(1, T, 2 * T), ra) > 1e-3);
}

TEST_CASE("rotated q . k depends only on the distance between positions", "[ops][rope]") {
  // The same q at every position and the same k at every position: <q_s, k_t> after rotation
  // is a function of t - s alone.
  const int64_t T = 9, D = 8;
  const auto one_q = rand64({D}, 13).to_double_vector(), one_k = rand64({D}, 14).to_double_vector();
  std::vector<double> rq, rk;
  for (int64_t t = 0; t < T; ++t) {
    rq.insert(rq.end(), one_q.begin(), one_q.end());
    rk.insert(rk.end(), one_k.begin(), one_k.end());
  }
  const Tensor q = ops::rope(Tensor::from_vector(rq, {1, T, D}), 1);
  const Tensor k = ops::rope(Tensor::from_vector(rk, {1, T, D}), 1);
  const auto qv = q.to_double_vector(), kv = k.to_double_vector();
  auto dot = [&](int64_t s, int64_t t) {
    double d = 0;
    for (int64_t i = 0; i < D; ++i) d += qv[s * D + i] * kv[t * D + i];
    return d;
  };
  for (int64_t s = 0; s + 3 < T; ++s) REQUIRE(dot(s, s + 3) == Approx(dot(0, 3)).margin(1e-12));
  REQUIRE(std::fabs(dot(0, 1) - dot(0, 3)) > 1e-6);
}

TEST_CASE("gradcheck: rope and rope_packed", "[ops][grad][rope]") {
  auto r1 =
      gradcheck([](const auto& x) { return ops::rope(x[0], 2, 10000.0); }, {rand64({2, 3, 8}, 15)});
  INFO(r1.worst);
  REQUIRE(r1.max_rel_error < 1e-6);
  // A non-contiguous input (a transposed view) goes through the same path.
  auto r2 =
      gradcheck([](const auto& x) { return ops::rope_packed(ops::transpose(x[0], 0, 1), 2, 50.0); },
                {rand64({4, 2, 12}, 16)});
  INFO(r2.worst);
  REQUIRE(r2.max_rel_error < 1e-6);
}
