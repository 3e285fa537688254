// Forward values of the ops against plain-loop references and known numbers.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/ops/ops.h"
#include "tests/testing/gradcheck.h"

using starling::DType;
using starling::Tensor;
using starling::testing::rand64;
namespace ops = starling::ops;

TEST_CASE("matmul matches a triple loop in f32 and f64", "[ops]") {
  const int64_t m = 7, k = 13, n = 5;  // not multiples of any block size
  Tensor a = rand64({m, k}, 1), b = rand64({k, n}, 2);
  Tensor c = ops::matmul(a, b);
  auto va = a.to_double_vector(), vb = b.to_double_vector(), vc = c.to_double_vector();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += va[i * k + p] * vb[p * n + j];
      REQUIRE(vc[i * n + j] == Approx(s).epsilon(1e-12));
    }
  }
  Tensor c32 = ops::matmul(a.to(DType::kF32), b.to(DType::kF32));
  REQUIRE(starling::max_abs_diff(c32, c) < 1e-4);
}

TEST_CASE("softmax rows sum to one, cross entropy equals -log softmax", "[ops]") {
  Tensor x = rand64({3, 4}, 3, 3.0);
  auto p = ops::softmax(x).to_double_vector();
  for (int r = 0; r < 3; ++r)
    REQUIRE(p[r * 4] + p[r * 4 + 1] + p[r * 4 + 2] + p[r * 4 + 3] == Approx(1.0));
  Tensor t = Tensor::from_vector(std::vector<int32_t>{1, 3, 0}, {3});
  auto ls = ops::log_softmax(x).to_double_vector();
  const double expected = -(ls[1] + ls[7] + ls[8]) / 3.0;
  REQUIRE(ops::cross_entropy(x, t).item() == Approx(expected).epsilon(1e-12));
  // Uniform logits over V classes give log(V).
  REQUIRE(ops::cross_entropy(Tensor::zeros({2, 65}),
                             Tensor::from_vector(std::vector<int32_t>{0, 64}, {2}))
              .item() == Approx(std::log(65.0)).epsilon(1e-6));
}

TEST_CASE("causal attention ignores the future", "[ops]") {
  Tensor qkv = rand64({1, 4, 6}, 4);  // C = 2, H = 1
  Tensor out = ops::attention_packed(qkv, 1, true);
  // Changing the last position's k and v must not change outputs at earlier positions.
  Tensor qkv2 = qkv.clone();
  double* p = qkv2.data<double>();
  for (int j = 2; j < 6; ++j) p[3 * 6 + j] += 10.0;
  Tensor out2 = ops::attention_packed(qkv2, 1, true);
  auto a = out.to_double_vector(), b = out2.to_double_vector();
  for (int i = 0; i < 3 * 2; ++i) REQUIRE(a[i] == b[i]);
  REQUIRE(a[6] != b[6]);
  // The packed and the (B, H, T, D) forms agree.
  Tensor q = qkv.slice(2, 0, 2).unsqueeze(1), k = qkv.slice(2, 2, 4).unsqueeze(1),
         v = qkv.slice(2, 4, 6).unsqueeze(1);
  REQUIRE(starling::max_abs_diff(ops::attention(q, k, v, true).squeeze(1), out) < 1e-12);
}

TEST_CASE("layer norm output has zero mean and unit variance", "[ops]") {
  Tensor x = rand64({4, 32}, 5, 3.0);
  auto y = ops::layer_norm(x, Tensor::ones({32}, DType::kF64), Tensor()).to_double_vector();
  for (int r = 0; r < 4; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 32; ++j) m += y[r * 32 + j];
    m /= 32;
    for (int j = 0; j < 32; ++j) v += (y[r * 32 + j] - m) * (y[r * 32 + j] - m);
    REQUIRE(std::fabs(m) < 1e-12);
    REQUIRE(v / 32 == Approx(1.0).epsilon(1e-4));
  }
}

TEST_CASE("gelu known values", "[ops]") {
  Tensor x = Tensor::from_vector(std::vector<double>{-1.0, 0.0, 1.0, 3.0}, {4});
  auto y = ops::gelu(x).to_double_vector();
  REQUIRE(y[0] == Approx(-0.15865525393145707));
  REQUIRE(y[1] == 0.0);
  REQUIRE(y[2] == Approx(0.8413447460685429));
  REQUIRE(y[3] == Approx(2.9959502709));
}

TEST_CASE("dropout zeroes about p and keeps the expectation", "[ops]") {
  starling::Rng rng(11);
  Tensor x = Tensor::ones({10000});
  auto y = ops::dropout(x, 0.25, true, rng).to_double_vector();
  double zeros = 0, sum = 0;
  for (double v : y) {
    zeros += v == 0.0;
    sum += v;
  }
  REQUIRE(zeros / 10000 == Approx(0.25).margin(0.02));
  REQUIRE(sum / 10000 == Approx(1.0).margin(0.03));
  Tensor same = ops::dropout(x, 0.25, false, rng);
  REQUIRE(same.shares_storage(x));
}

TEST_CASE("autograd sums gradients over shared uses", "[autograd]") {
  Tensor a = Tensor::from_vector(std::vector<double>{2.0}, {1});
  a.set_requires_grad(true);
  Tensor y = ops::sum(ops::add(ops::mul(a, a), a));  // y = a^2 + a
  starling::autograd::backward(y);
  REQUIRE(a.grad().item() == Approx(5.0));
  // A second backward accumulates.
  Tensor y2 = ops::sum(ops::mul_scalar(a, 3.0));
  starling::autograd::backward(y2);
  REQUIRE(a.grad().item() == Approx(8.0));
  {
    starling::autograd::NoGradGuard ng;
    REQUIRE_FALSE(ops::mul(a, a).requires_grad());
  }
}

#include "core/ops/internal/fast_math.h"

TEST_CASE("fast float exp and erf stay within their documented error", "[ops]") {
  double max_exp_rel = 0, max_erf_abs = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double ref = std::exp(static_cast<double>(x));
    max_exp_rel =
        std::max(max_exp_rel, std::fabs(starling::ops::internal::fast_expf(x) - ref) / ref);
  }
  for (float x = -6.0f; x < 6.0f; x += 0.001f) {
    max_erf_abs = std::max(max_erf_abs, std::fabs(starling::ops::internal::fast_erff(x) -
                                                  std::erf(static_cast<double>(x))));
  }
  REQUIRE(max_exp_rel < 3e-7);
  REQUIRE(max_erf_abs < 5e-7);
  // f32 GELU and SiLU (fast paths) agree with the f64 references.
  Tensor x = rand64({1000}, 12, 3.0);
  REQUIRE(starling::max_abs_diff(ops::gelu(x.to(DType::kF32)), ops::gelu(x)) < 1e-6);
  REQUIRE(starling::max_abs_diff(ops::gelu(x.to(DType::kF32), ops::GeluApprox::kTanh),
                                 ops::gelu(x, ops::GeluApprox::kTanh)) < 1e-6);
  REQUIRE(starling::max_abs_diff(ops::silu(x.to(DType::kF32)), ops::silu(x)) < 1e-6);
}

namespace {
// Whether query i of n may read key j, written out from each mask's definition.
bool allowed(const ops::AttnMask& m, int64_t i, int64_t j, int64_t n) {
  using K = ops::AttnMask::Kind;
  switch (m.kind) {
    case K::kFull:
      return true;
    case K::kCausal:
      return j <= i;
    case K::kBlockCausal:
      return j / m.block <= i / m.block;
    case K::kBlockDiffusion: {
      const int64_t h = n / 2;
      const bool qn = i < h, kn = j < h;  // noisy (x_t) half?
      const int64_t qb = (qn ? i : i - h) / m.block, kb = (kn ? j : j - h) / m.block;
      if (qn) return kn ? kb == qb : kb < qb;
      return !kn && kb <= qb;
    }
  }
  return false;
}
}  // namespace

TEST_CASE("masked attention equals a float64 softmax over the allowed keys", "[ops]") {
  const ops::AttnMask mask =
      GENERATE(ops::AttnMask::full(), ops::AttnMask::causal(), ops::AttnMask::block_causal(3),
               ops::AttnMask::block_diffusion(2), ops::AttnMask::block_diffusion(1));
  const int64_t B = 2, T = 12, H = 2, D = 3, C = H * D;
  const Tensor qkv = rand64({B, T, 3 * C}, 21);
  const auto x = qkv.to_double_vector();
  const auto out = ops::attention_packed(qkv, H, mask).to_double_vector();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        auto at = [&](int64_t t, int64_t part, int64_t d) {
          return x[static_cast<size_t>((b * T + t) * 3 * C + part * C + h * D + d)];
        };
        std::vector<double> w(static_cast<size_t>(T), 0.0);
        double mx = -1e300, sum = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          if (!allowed(mask, i, j, T)) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += at(i, 0, d) * at(j, 1, d);
          w[j] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, w[j]);
        }
        for (int64_t j = 0; j < T; ++j) {
          w[j] = allowed(mask, i, j, T) ? std::exp(w[j] - mx) : 0.0;
          sum += w[j];
        }
        for (int64_t d = 0; d < D; ++d) {
          double y = 0;
          for (int64_t j = 0; j < T; ++j) y += w[j] / sum * at(j, 2, d);
          REQUIRE(out[static_cast<size_t>((b * T + i) * C + h * D + d)] ==
                  Approx(y).epsilon(1e-12).margin(1e-13));
        }
      }
    }
  }
}

TEST_CASE("attention masks name lengths they cannot apply to", "[ops]") {
  REQUIRE(ops::AttnMask::full().check(7).empty());
  REQUIRE(ops::AttnMask::block_causal(3).check(12).empty());
  REQUIRE_THAT(ops::AttnMask::block_causal(5).check(12), Catch::Contains("block length 5"));
  REQUIRE(ops::AttnMask::block_diffusion(2).check(12).empty());
  REQUIRE_THAT(ops::AttnMask::block_diffusion(4).check(12), Catch::Contains("length 12"));
  REQUIRE_FALSE(ops::AttnMask::block_diffusion(1).check(7).empty());
  REQUIRE(ops::AttnMask::block_diffusion(2).position_period(12) == 6);
  REQUIRE(ops::AttnMask::causal().position_period(12) == 0);
}

TEST_CASE("weighted cross entropy is the weighted sum of per-row losses", "[ops]") {
  Tensor x = rand64({4, 5}, 22, 3.0);
  Tensor t = Tensor::from_vector(std::vector<int32_t>{1, -100, 4, 0}, {4});
  const std::vector<double> w{0.25, 9.0, 2.0, 1.5};
  const auto ls = ops::log_softmax(x).to_double_vector();
  const double expected = -(0.25 * ls[1] + 2.0 * ls[2 * 5 + 4] + 1.5 * ls[3 * 5]);
  REQUIRE(ops::weighted_cross_entropy(x, t, w).item() == Approx(expected).epsilon(1e-12));
  // Weights 1/count give the mean.
  const std::vector<double> mean_w(4, 1.0 / 3.0);
  REQUIRE(ops::weighted_cross_entropy(x, t, mean_w).item() ==
          Approx(ops::cross_entropy(x, t).item()).epsilon(1e-12));
}
