// A self-contained check of the direct convolution kernels (core/ops/internal/conv_kernels.h)
// on the instruction set this machine runs, for targets the full test suite is not built on:
// scripts/arm64_kernels_check.sh cross-compiles it for arm64 (the portable kernels become NEON
// code) and runs it under qemu. It needs only the kernel sources and the C++ standard library. Each
// case builds the flattened padded layout, runs `correlate` (with a bias) and `weight_grad`, and
// compares them with float64 sums; exit status 0 when every case agrees within 1e-5 relative.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/ops/internal/conv_kernels.h"

namespace {

using starling::ops::internal::kConvOutBlock;
using starling::ops::internal::kConvQuantum;

int64_t round_up(int64_t n) { return (n + kConvQuantum - 1) / kConvQuantum * kConvQuantum; }

struct Case {
  int64_t b, ci, co, h, w, k, pad;
};

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::fmax(err, std::fabs(got[i] - want[i]));
    scale = std::fmax(scale, std::fabs(want[i]));
  }
  return err / scale;
}

bool check(const Case& c, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t hp = c.h + 2 * c.pad, wp = c.w + 2 * c.pad;
  const int64_t ho = hp - c.k + 1, wo = wp - c.k + 1, taps = c.k * c.k;
  const int64_t npos = round_up((ho - 1) * wp + wo);
  const int64_t plane = round_up(std::max(hp * wp, npos + (c.k - 1) * wp + c.k - 1));
  std::vector<int64_t> off;
  for (int64_t i = 0; i < c.k; ++i)
    for (int64_t j = 0; j < c.k; ++j) off.push_back(i * wp + j);
  // Padded inputs, weights (co, ci, k, k) and gradients (b, ho, wo, co).
  std::vector<float> x(static_cast<size_t>(c.b * c.ci * plane), 0.0f);
  for (int64_t n = 0; n < c.b; ++n)
    for (int64_t ch = 0; ch < c.ci; ++ch)
      for (int64_t y = 0; y < c.h; ++y)
        for (int64_t xx = 0; xx < c.w; ++xx)
          x[static_cast<size_t>((n * c.ci + ch) * plane + (y + c.pad) * wp + xx + c.pad)] = u(gen);
  std::vector<float> w(static_cast<size_t>(c.co * c.ci * taps)), bias(static_cast<size_t>(c.co));
  for (float& v : w) v = u(gen);
  for (float& v : bias) v = u(gen);
  const int64_t co_stride = round_up(c.co);
  std::vector<float> gt(static_cast<size_t>(c.b * ho * wo * co_stride), 0.0f);
  for (int64_t q = 0; q < c.b * ho * wo; ++q)
    for (int64_t o = 0; o < c.co; ++o) gt[static_cast<size_t>(q * co_stride + o)] = u(gen);

  // correlate, image by image.
  const int64_t blocks = (c.co + kConvOutBlock - 1) / kConvOutBlock;
  std::vector<float> wpk(static_cast<size_t>(blocks * c.ci * taps * kConvOutBlock), 0.0f);
  for (int64_t o = 0; o < c.co; ++o)
    for (int64_t ch = 0; ch < c.ci; ++ch)
      for (int64_t s = 0; s < taps; ++s)
        wpk[static_cast<size_t>(((o / kConvOutBlock * c.ci + ch) * taps + s) * kConvOutBlock +
                                o % kConvOutBlock)] =
            w[static_cast<size_t>((o * c.ci + ch) * taps + s)];
  std::vector<float> out(static_cast<size_t>(c.co * npos));
  std::vector<float> got, gotw(static_cast<size_t>(c.ci * taps * co_stride));
  std::vector<double> want, wantw(static_cast<size_t>(c.ci * taps * co_stride), 0.0);
  for (int64_t n = 0; n < c.b; ++n) {
    const float* xn = x.data() + n * c.ci * plane;
    starling::ops::internal::correlate(
        {xn, plane, c.ci, off.data(), taps, wpk.data(), c.co, out.data(), npos, npos, bias.data()});
    for (int64_t o = 0; o < c.co; ++o)
      for (int64_t y = 0; y < ho; ++y)
        for (int64_t xx = 0; xx < wo; ++xx) {
          double s = bias[static_cast<size_t>(o)];
          for (int64_t ch = 0; ch < c.ci; ++ch)
            for (int64_t t = 0; t < taps; ++t)
              s += static_cast<double>(w[static_cast<size_t>((o * c.ci + ch) * taps + t)]) *
                   xn[ch * plane + y * wp + xx + off[static_cast<size_t>(t)]];
          want.push_back(s);
          got.push_back(out[static_cast<size_t>(o * npos + y * wp + xx)]);
        }
  }
  // weight_grad over every input channel at once (the transposed layout).
  for (int64_t o0 = 0; o0 < co_stride; o0 += kConvQuantum)
    starling::ops::internal::weight_grad({gt.data(), co_stride, x.data(), plane, c.ci * plane, wp,
                                          c.b, ho, wo, c.k, c.k, 1, plane, o0, 0, c.ci,
                                          gotw.data()});
  for (int64_t n = 0; n < c.b; ++n)
    for (int64_t y = 0; y < ho; ++y)
      for (int64_t xx = 0; xx < wo; ++xx)
        for (int64_t ch = 0; ch < c.ci; ++ch)
          for (int64_t t = 0; t < taps; ++t)
            for (int64_t o = 0; o < c.co; ++o)
              wantw[static_cast<size_t>((ch * taps + t) * co_stride + o)] +=
                  static_cast<double>(
                      gt[static_cast<size_t>(((n * ho + y) * wo + xx) * co_stride + o)]) *
                  x[static_cast<size_t>((n * c.ci + ch) * plane + y * wp + xx +
                                        off[static_cast<size_t>(t)])];
  const double e1 = rel(got, want), e2 = rel(gotw, wantw);
  const bool ok = e1 < 1e-5 && e2 < 1e-5;
  std::printf(
      "%s b=%lld ci=%lld co=%lld %lldx%lld k=%lld pad=%lld: correlate %.2e, weight_grad %.2e\n",
      ok ? "ok  " : "FAIL", static_cast<long long>(c.b), static_cast<long long>(c.ci),
      static_cast<long long>(c.co), static_cast<long long>(c.h), static_cast<long long>(c.w),
      static_cast<long long>(c.k), static_cast<long long>(c.pad), e1, e2);
  return ok;
}

}  // namespace

int main() {
  using starling::ops::internal::ConvIsa;
  bool ok = true;
  for (ConvIsa isa : {ConvIsa::kGeneric, ConvIsa::kAvx2, ConvIsa::kAvx512}) {
    if (!starling::ops::internal::conv_isa_supported(isa)) continue;
    starling::ops::internal::force_conv_isa(isa);
    std::printf("conv kernels: %s\n", starling::ops::internal::conv_isa_name(isa));
    std::mt19937 gen(7);
    for (const Case& c :
         {Case{2, 3, 6, 9, 11, 3, 1}, Case{2, 5, 7, 14, 14, 5, 2}, Case{1, 6, 4, 7, 7, 1, 0},
          Case{3, 2, 5, 6, 9, 3, 0}, Case{2, 4, 20, 7, 7, 3, 1}, Case{1, 1, 9, 28, 28, 3, 1}})
      ok = check(c, gen) && ok;
  }
  std::printf("%s\n", ok ? "all cases agree" : "MISMATCH");
  return ok ? 0 : 1;
}
