// conv2d, max/avg pooling and nearest upsampling: values against plain loops, and float64
// gradients against central differences.
#include "core/ops/conv.h"

#include <catch2/catch.hpp>
#include <vector>

#include "core/ops/pool.h"
#include "tests/testing/gradcheck.h"

namespace starling::ops {
namespace {

using testing::gradcheck;
using testing::rand64;

// Direct convolution: the oracle.
std::vector<double> conv_ref(const Tensor& x, const Tensor& w, const Tensor& b, int64_t stride,
                             int64_t pad) {
  const auto vx = x.to_double_vector(), vw = w.to_double_vector();
  const auto vb = b.defined() ? b.to_double_vector() : std::vector<double>();
  const int64_t bn = x.size(0), ci = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t co = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t ho = (h + 2 * pad - kh) / stride + 1, wo = (wd + 2 * pad - kw) / stride + 1;
  std::vector<double> out(static_cast<size_t>(bn * co * ho * wo));
  for (int64_t n = 0; n < bn; ++n)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t oy = 0; oy < ho; ++oy)
        for (int64_t ox = 0; ox < wo; ++ox) {
          double s = vb.empty() ? 0.0 : vb[o];
          for (int64_t c = 0; c < ci; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t y = oy * stride - pad + i, xx = ox * stride - pad + j;
                if (y < 0 || y >= h || xx < 0 || xx >= wd) continue;
                s += vx[((n * ci + c) * h + y) * wd + xx] * vw[((o * ci + c) * kh + i) * kw + j];
              }
          out[((n * co + o) * ho + oy) * wo + ox] = s;
        }
  return out;
}

TEST_CASE("conv2d matches direct convolution", "[ops]") {
  struct Case {
    Shape x, w;
    int64_t stride, pad;
    bool bias;
  };
  const auto c = GENERATE(
      Case{{2, 3, 7, 6}, {4, 3, 3, 3}, 1, 1, true}, Case{{1, 2, 9, 9}, {3, 2, 3, 3}, 2, 1, false},
      Case{{2, 1, 5, 8}, {2, 1, 2, 3}, 1, 0, true}, Case{{3, 4, 6, 6}, {5, 4, 1, 1}, 1, 0, true},
      Case{{1, 2, 28, 28}, {3, 2, 5, 5}, 1, 2, true},
      // 9 images of 36 x 4096 columns: more than one im2col chunk.
      Case{{9, 4, 64, 64}, {2, 4, 3, 3}, 1, 1, true});
  const Tensor x = rand64(c.x, 1), w = rand64(c.w, 2);
  const Tensor b = c.bias ? rand64({c.w[0]}, 3) : Tensor();
  const Tensor y = conv2d(x, w, b, c.stride, c.pad);
  const auto ref = conv_ref(x, w, b, c.stride, c.pad);
  const auto got = y.to_double_vector();
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(1e-10));
  // f32 agrees with f64.
  const Tensor y32 = conv2d(x.to(DType::kF32), w.to(DType::kF32),
                            c.bias ? b.to(DType::kF32) : Tensor(), c.stride, c.pad);
  REQUIRE(max_abs_diff(y32, y) < 1e-4);
}

TEST_CASE("conv2d gradients match central differences", "[ops][grad]") {
  struct Case {
    Shape x, w;
    int64_t stride, pad;
  };
  const auto c =
      GENERATE(Case{{2, 2, 5, 4}, {3, 2, 3, 3}, 1, 1}, Case{{1, 3, 6, 7}, {2, 3, 3, 2}, 2, 1},
               Case{{2, 2, 4, 4}, {2, 2, 1, 1}, 1, 0});
  const auto r = gradcheck(
      [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.stride, c.pad); },
      {rand64(c.x, 1), rand64(c.w, 2), rand64({c.w[0]}, 3)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
  // Without a bias, and with only the input requiring a gradient.
  const Tensor w = rand64(c.w, 4);
  const auto r2 = gradcheck(
      [&](const std::vector<Tensor>& in) { return conv2d(in[0], w, Tensor(), c.stride, c.pad); },
      {rand64(c.x, 5)});
  INFO(r2.worst);
  REQUIRE(r2.max_rel_error < 1e-6);
}

TEST_CASE("max_pool2d takes window maxima and routes the gradient to them", "[ops]") {
  const Tensor x = Tensor::from_vector(
      std::vector<float>{1, 5, 2, 0, 3, 4, 8, 1, 0, 0, 7, 9, 6, 1, 2, 2}, {1, 1, 4, 4});
  REQUIRE(max_pool2d(x).to_float_vector() == std::vector<float>{5, 8, 6, 9});
  REQUIRE(max_pool2d(x, 3, 1).to_float_vector() == std::vector<float>{8, 9, 8, 9});
  // Odd sizes floor, as PyTorch.
  REQUIRE(max_pool2d(rand64({2, 3, 5, 7}, 1)).shape() == Shape{2, 3, 2, 3});
  const auto r = gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0]); },
                           {rand64({2, 3, 6, 4}, 2)});
  INFO(r.worst);
  REQUIRE(r.max_rel_error < 1e-6);
  const auto r2 = gradcheck([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2); },
                            {rand64({1, 2, 7, 5}, 3)});
  INFO(r2.worst);
  REQUIRE(r2.max_rel_error < 1e-6);
}

TEST_CASE("avg_pool2d and upsample_nearest2d: values and gradients", "[ops][grad]") {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 2, 2});
  REQUIRE(avg_pool2d(x).to_float_vector() == std::vector<float>{2.5f, 6.5f});
  const Tensor u = upsample_nearest2d(x);
  REQUIRE(u.shape() == Shape{1, 2, 4, 4});
  REQUIRE(u.to_float_vector() == std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4,
                                                    4, 3, 3, 4, 4, 5, 5, 6, 6, 5, 5,
                                                    6, 6, 7, 7, 8, 8, 7, 7, 8, 8});
  // Average pooling undoes nearest upsampling.
  REQUIRE(max_abs_diff(avg_pool2d(upsample_nearest2d(x, 3), 3), x) < 1e-6);
  for (int64_t k : {2, 3}) {
    const auto ra = gradcheck([k](const std::vector<Tensor>& in) { return avg_pool2d(in[0], k); },
                              {rand64({2, 2, 6, 6}, 4)});
    INFO(ra.worst);
    REQUIRE(ra.max_rel_error < 1e-6);
    const auto ru =
        gradcheck([k](const std::vector<Tensor>& in) { return upsample_nearest2d(in[0], k); },
                  {rand64({2, 3, 3, 2}, 5)});
    INFO(ru.worst);
    REQUIRE(ru.max_rel_error < 1e-6);
  }
}

}  // namespace
}  // namespace starling::ops
