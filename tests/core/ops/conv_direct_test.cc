// The direct float32 convolution kernels (core/ops/internal/conv_kernels.h) on every instruction
// set this CPU runs, at stride 1, in phases at strides 2-4 and as in-place 1x1 products: the
// output and all three gradients against float64 (the im2col path, whose gradients the float64
// finite-difference checks in conv_test.cc cover), and the same bits for one and two threads.
#include <omp.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/conv.h"
#include "core/ops/internal/conv_kernels.h"
#include "core/ops/ops.h"
#include "tests/testing/gradcheck.h"

namespace starling::ops {
namespace {

using internal::ConvIsa;
using testing::rand64;

struct Grads {
  Tensor y, gx, gw, gb;
};

// y = conv2d(x, w, b) and the gradients of sum(y * r), in x's dtype.
Grads run(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& r, int64_t pad,
          int64_t stride = 1) {
  Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor y = conv2d(x, w, b, stride, pad);
  autograd::backward(sum(mul(y, r.to(y.dtype()))));
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

// Largest |a - b| over the largest |b| (1 at least).
double rel_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_double_vector(), vb = b.to_double_vector();
  REQUIRE(va.size() == vb.size());
  double err = 0, scale = 1;
  for (size_t i = 0; i < va.size(); ++i) {
    err = std::max(err, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return err / scale;
}

struct IsaGuard {
  ConvIsa before;
  explicit IsaGuard(ConvIsa isa) : before(internal::force_conv_isa(isa)) {}
  ~IsaGuard() { internal::force_conv_isa(before); }
};

TEST_CASE("direct conv2d kernels match float64 on every instruction set", "[ops]") {
  struct Case {
    Shape x, w;
    int64_t pad, stride = 1;
    const char* path = nullptr;  // the CPU path these shapes must take, where it matters
  };
  // 3x3 and 5x5 "same" convolutions as the U-Net and the CNN use, no padding, an asymmetric
  // kernel, output channels not a multiple of the 4-channel block, one input channel, widths
  // that leave partial vectors, and images smaller than one vector.
  const auto c = GENERATE(
      Case{{3, 5, 9, 11}, {6, 5, 3, 3}, 1}, Case{{2, 3, 14, 14}, {7, 3, 5, 5}, 2},
      Case{{2, 2, 6, 9}, {5, 2, 3, 3}, 0}, Case{{1, 3, 8, 5}, {3, 3, 2, 3}, 1},
      Case{{4, 1, 28, 28}, {9, 1, 3, 3}, 1}, Case{{3, 8, 3, 2}, {1, 8, 3, 3}, 1},
      Case{{2, 4, 7, 7}, {13, 4, 3, 3}, 2},
      // The weight gradient reads unpadded images (3- and 5-wide kernels at stride 1): padding
      // of 2 on a 3x3 kernel, 1 on a 5x5, a one-column image.
      Case{{2, 3, 7, 6}, {4, 3, 3, 3}, 2}, Case{{2, 3, 9, 8}, {4, 3, 5, 5}, 1},
      Case{{2, 2, 5, 1}, {3, 2, 3, 3}, 1},
      // 32 channels or more on both sides, even and odd sizes, a one-row image.
      Case{{2, 32, 7, 7}, {33, 32, 3, 3}, 1}, Case{{1, 40, 6, 9}, {32, 40, 3, 3}, 1},
      Case{{2, 36, 1, 5}, {32, 36, 3, 3}, 1},
      // 1x1 without padding (products in place): whole vectors and a tail (49 =
      // 48 + 1, 35 = 32 + 3), whole vectors only (32), a tail only (6); with padding.
      Case{{2, 6, 7, 7}, {4, 6, 1, 1}, 0}, Case{{3, 9, 5, 7}, {6, 9, 1, 1}, 0},
      Case{{2, 5, 4, 8}, {7, 5, 1, 1}, 0}, Case{{2, 3, 2, 3}, {5, 3, 1, 1}, 0},
      Case{{2, 5, 4, 3}, {3, 5, 1, 1}, 0, 2},
      // Strides (phases): the U-Net's downsampling on even and odd sizes, no padding,
      // 5x5 at stride 2 and 3, a 2x2 kernel at stride 2, stride above the kernel.
      Case{{2, 6, 8, 8}, {5, 6, 3, 3}, 1, 2}, Case{{3, 4, 9, 11}, {6, 4, 3, 3}, 1, 2},
      Case{{2, 3, 7, 6}, {4, 3, 3, 3}, 0, 2}, Case{{2, 3, 13, 12}, {5, 3, 5, 5}, 2, 2},
      Case{{1, 4, 11, 10}, {3, 4, 5, 5}, 1, 3}, Case{{2, 5, 8, 9}, {6, 5, 2, 2}, 0, 2},
      Case{{2, 3, 10, 10}, {4, 3, 2, 3}, 1, 4}, Case{{2, 36, 14, 14}, {33, 36, 3, 3}, 1, 2},
      // Batches of 16 or more on small images take the lanes (a position holds 16 images):
      // whole groups, part groups (30 = 16 + 14, 33 = 32 + 1), 5x5, no padding, strides 2 and
      // 3, an image smaller than 16 positions, 32+ channels.
      Case{{16, 3, 7, 7}, {5, 3, 3, 3}, 1, 1, "lanes"},
      Case{{30, 4, 7, 7}, {6, 4, 3, 3}, 1, 1, "lanes"},
      Case{{30, 3, 9, 8}, {4, 3, 5, 5}, 2, 1, "lanes"},
      Case{{30, 2, 7, 6}, {3, 2, 3, 3}, 0, 1, "lanes"},
      Case{{30, 5, 14, 14}, {7, 5, 3, 3}, 1, 2, "lanes"},
      Case{{16, 3, 11, 10}, {4, 3, 5, 5}, 1, 3, "lanes"},
      Case{{33, 2, 3, 3}, {3, 2, 3, 3}, 1, 1, "lanes"},
      Case{{16, 36, 7, 7}, {33, 36, 3, 3}, 1, 1, "lanes"},
      // Where the lanes would not waste a fifth less than the padding columns: 28x28 and 14x14
      // at batch 32, a part group at 14x14.
      Case{{32, 2, 14, 14}, {3, 2, 3, 3}, 1, 1, "flat"},
      Case{{32, 2, 28, 28}, {3, 2, 3, 3}, 1, 1, "flat"},
      Case{{20, 4, 14, 14}, {6, 4, 3, 3}, 1, 1, "flat"});
  CAPTURE(shape_str(c.x), shape_str(c.w), c.pad, c.stride);
  if (c.path)
    CHECK(std::string(internal::conv2d_cpu_path(c.x, c.w, c.stride, c.pad, DType::kF32)) == c.path);
  const Tensor x = rand64(c.x, 1), w = rand64(c.w, 2, 0.5), b = rand64({c.w[0]}, 3);
  const int64_t ho = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1,
                wo = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
  const Tensor r = rand64({c.x[0], c.w[0], ho, wo}, 4);
  const Grads ref = run(x, w, b, r, c.pad, c.stride);
  for (ConvIsa isa : {ConvIsa::kGeneric, ConvIsa::kAvx2, ConvIsa::kAvx512}) {
    if (!internal::conv_isa_supported(isa)) continue;
    CAPTURE(internal::conv_isa_name(isa));
    const IsaGuard guard(isa);
    const Grads got = run(x.to(DType::kF32), w.to(DType::kF32), b.to(DType::kF32),
                          r.to(DType::kF32), c.pad, c.stride);
    CHECK(rel_diff(got.y, ref.y) < 1e-5);
    CHECK(rel_diff(got.gx, ref.gx) < 1e-5);
    CHECK(rel_diff(got.gw, ref.gw) < 1e-5);
    CHECK(rel_diff(got.gb, ref.gb) < 1e-5);
  }
}

TEST_CASE("direct conv2d gives the same bits on one and two threads", "[ops]") {
  struct Case {
    int64_t k, pad, stride, batch = 5;
  };
  // Stride 1, a 1x1 product in place, stride 2 (phases); the lanes at stride 1 and 2.
  const auto c =
      GENERATE(Case{3, 1, 1}, Case{1, 0, 1}, Case{3, 1, 2}, Case{3, 1, 1, 16}, Case{3, 1, 2, 16});
  CAPTURE(c.k, c.pad, c.stride, c.batch);
  CHECK(std::string(internal::conv2d_cpu_path({c.batch, 6, 7, 9}, {10, 6, c.k, c.k}, c.stride,
                                              c.pad, DType::kF32)) == (c.batch == 16 ? "lanes"
                                                                       : c.k == 1    ? "pointwise"
                                                                                     : "flat"));
  const Tensor x = rand64({c.batch, 6, 7, 9}, 7).to(DType::kF32);
  const Tensor w = rand64({10, 6, c.k, c.k}, 8).to(DType::kF32);
  const Tensor b = rand64({10}, 9).to(DType::kF32);
  const int64_t ho = (7 + 2 * c.pad - c.k) / c.stride + 1,
                wo = (9 + 2 * c.pad - c.k) / c.stride + 1;
  const Tensor r = rand64({c.batch, 10, ho, wo}, 10).to(DType::kF32);
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Grads one = run(x, w, b, r, c.pad, c.stride);
  omp_set_num_threads(2);
  const Grads two = run(x, w, b, r, c.pad, c.stride);
  omp_set_num_threads(before);
  CHECK(max_abs_diff(one.y, two.y) == 0.0);
  CHECK(max_abs_diff(one.gx, two.gx) == 0.0);
  CHECK(max_abs_diff(one.gw, two.gw) == 0.0);
  CHECK(max_abs_diff(one.gb, two.gb) == 0.0);
}

TEST_CASE("direct conv2d: the input alone, or the weight alone, may need a gradient", "[ops]") {
  // Flat (batch 2) and lanes (batch 16) at stride 1, lanes at stride 2.
  struct Case {
    int64_t batch, stride;
  };
  const auto c = GENERATE(Case{2, 1}, Case{16, 1}, Case{16, 2});
  CAPTURE(c.batch, c.stride);
  CHECK(std::string(internal::conv2d_cpu_path({c.batch, 3, 6, 6}, {4, 3, 3, 3}, c.stride, 1,
                                              DType::kF32)) == (c.batch == 16 ? "lanes" : "flat"));
  const Tensor x = rand64({c.batch, 3, 6, 6}, 11).to(DType::kF32);
  const Tensor w = rand64({4, 3, 3, 3}, 12).to(DType::kF32);
  const int64_t ho = (6 + 2 - 3) / c.stride + 1;
  const Grads both = run(x, w, Tensor::zeros({4}), Tensor::ones({c.batch, 4, ho, ho}), 1, c.stride);
  Tensor xg = x.detach();
  xg.set_requires_grad(true);
  autograd::backward(sum(conv2d(xg, w, Tensor(), c.stride, 1)));
  CHECK(max_abs_diff(xg.grad(), both.gx) == 0.0);
  Tensor wg = w.detach();
  wg.set_requires_grad(true);
  autograd::backward(sum(conv2d(x, wg, Tensor(), c.stride, 1)));
  CHECK(max_abs_diff(wg.grad(), both.gw) == 0.0);
}

TEST_CASE("conv2d adds a residual as it writes its output, on every path", "[ops]") {
  // The same numbers as a separate add, forward and backward, and the residual's gradient is
  // the output's: flat, lanes at stride 1 and 2, a 1x1 product in place, im2col in float64.
  struct Case {
    int64_t batch, k, pad, stride;
    DType dtype;
    const char* path;
  };
  const auto c =
      GENERATE(Case{2, 3, 1, 1, DType::kF32, "flat"}, Case{16, 3, 1, 1, DType::kF32, "lanes"},
               Case{16, 3, 1, 2, DType::kF32, "lanes"}, Case{2, 1, 0, 1, DType::kF32, "pointwise"},
               Case{2, 3, 1, 1, DType::kF64, "im2col"});
  CAPTURE(c.batch, c.k, c.stride, c.path);
  const Shape xs{c.batch, 3, 7, 7}, ws{5, 3, c.k, c.k};
  CHECK(std::string(internal::conv2d_cpu_path(xs, ws, c.stride, c.pad, c.dtype)) == c.path);
  const int64_t ho = (7 + 2 * c.pad - c.k) / c.stride + 1, wo = ho;
  const Tensor x0 = rand64(xs, 41).to(c.dtype), w0 = rand64(ws, 42).to(c.dtype);
  const Tensor b0 = rand64({5}, 43).to(c.dtype),
               res0 = rand64({c.batch, 5, ho, wo}, 44).to(c.dtype);
  const Tensor r = rand64({c.batch, 5, ho, wo}, 45).to(c.dtype);
  std::vector<Tensor> got[2];
  for (const bool fused : {false, true}) {
    Tensor x = x0.detach(), w = w0.detach(), b = b0.detach(), res = res0.detach();
    for (Tensor* v : {&x, &w, &b, &res}) v->set_requires_grad(true);
    const Tensor y =
        fused ? conv2d(x, w, b, c.stride, c.pad, res) : add(conv2d(x, w, b, c.stride, c.pad), res);
    autograd::backward(sum(mul(y, r)));
    got[fused] = {y.detach(), x.grad(), w.grad(), b.grad(), res.grad()};
  }
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(max_abs_diff(got[1][i], got[0][i]) == 0.0);
  }
  CHECK(max_abs_diff(got[1][4], r) == 0.0);
}

}  // namespace
}  // namespace starling::ops
