// A self-contained check of the direct convolution kernels (core/ops/internal/conv_kernels.h)
// on the instruction set this machine runs, for targets the full test suite is not built on:
// scripts/arm64_kernels_check.sh cross-compiles it for arm64 (the portable kernels become NEON
// code) and runs it under qemu. It needs only the kernel sources and the C++ standard library. Each
// case builds the flattened padded layout, runs `correlate` (with a bias) and `weight_grad`, and
// compares them with float64 sums; each lanes case builds the batch-in-lanes layout (16 images
// per position), runs `correlate` over unit offsets and `lane_weight_grad`, and compares them
// likewise, and `transpose16` is checked exactly; exit status 0 when every case agrees within
// 1e-5 relative.
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

// w (co, ci, taps) in correlate's blocks of kConvOutBlock output channels.
std::vector<float> pack(const std::vector<float>& w, const Case& c, int64_t taps) {
  const int64_t blocks = (c.co + kConvOutBlock - 1) / kConvOutBlock;
  std::vector<float> wpk(static_cast<size_t>(blocks * c.ci * taps * kConvOutBlock), 0.0f);
  for (int64_t o = 0; o < c.co; ++o)
    for (int64_t ch = 0; ch < c.ci; ++ch)
      for (int64_t s = 0; s < taps; ++s)
        wpk[static_cast<size_t>(((o / kConvOutBlock * c.ci + ch) * taps + s) * kConvOutBlock +
                                o % kConvOutBlock)] =
            w[static_cast<size_t>((o * c.ci + ch) * taps + s)];
  return wpk;
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
  const std::vector<float> wpk = pack(w, c, taps);
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

// The batch-in-lanes layout: x[c][q][l] for l < 16 images (one group), plane hp x wp with pad
// zeros each side; outputs (y, x) as units in order.
bool check_lanes(const Case& c, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1, 1);
  constexpr int64_t L = kConvQuantum;
  const int64_t hp = c.h + 2 * c.pad, wp = c.w + 2 * c.pad, plane = hp * wp;
  const int64_t ho = hp - c.k + 1, wo = wp - c.k + 1, taps = c.k * c.k;
  std::vector<float> x(static_cast<size_t>(c.ci * plane * L), 0.0f);
  for (int64_t ch = 0; ch < c.ci; ++ch)
    for (int64_t y = 0; y < c.h; ++y)
      for (int64_t xx = 0; xx < c.w; ++xx)
        for (int64_t l = 0; l < L; ++l)
          x[static_cast<size_t>((ch * plane + (y + c.pad) * wp + xx + c.pad) * L + l)] = u(gen);
  std::vector<int64_t> off, units;
  for (int64_t i = 0; i < c.k; ++i)
    for (int64_t j = 0; j < c.k; ++j) off.push_back((i * wp + j) * L);
  for (int64_t y = 0; y < ho; ++y)
    for (int64_t xx = 0; xx < wo; ++xx) units.push_back((y * wp + xx) * L);
  const auto nu = static_cast<int64_t>(units.size());
  std::vector<float> w(static_cast<size_t>(c.co * c.ci * taps));
  for (float& v : w) v = u(gen);
  const std::vector<float> wpk = pack(w, c, taps);
  std::vector<float> out(static_cast<size_t>(c.co * nu * L));
  starling::ops::internal::correlate({x.data(), plane * L, c.ci, off.data(), taps, wpk.data(), c.co,
                                      out.data(), nu * L, nu * L, nullptr, units.data()});
  std::vector<double> want(out.size(), 0.0);
  for (int64_t o = 0; o < c.co; ++o)
    for (int64_t q = 0; q < nu; ++q)
      for (int64_t l = 0; l < L; ++l) {
        double s = 0;
        for (int64_t ch = 0; ch < c.ci; ++ch)
          for (int64_t t = 0; t < taps; ++t)
            s += static_cast<double>(w[static_cast<size_t>((o * c.ci + ch) * taps + t)]) *
                 x[static_cast<size_t>(ch * plane * L + units[static_cast<size_t>(q)] +
                                       off[static_cast<size_t>(t)] + l)];
        want[static_cast<size_t>((o * nu + q) * L + l)] = s;
      }
  // lane_weight_grad: gy dense (co, units, 16), entries every (channel, tap).
  std::vector<float> gy(static_cast<size_t>(c.co * nu * L));
  for (float& v : gy) v = u(gen);
  std::vector<int64_t> gy_off, roff, dst;
  for (int64_t q = 0; q < nu; ++q) gy_off.push_back(q * L);
  for (int64_t ch = 0; ch < c.ci; ++ch)
    for (int64_t t = 0; t < taps; ++t) {
      roff.push_back(ch * plane * L + off[static_cast<size_t>(t)]);
      dst.push_back(ch * taps + t);
    }
  const int64_t entries = c.ci * taps;
  std::vector<float> gotw(static_cast<size_t>(c.co * entries));
  starling::ops::internal::lane_weight_grad({gy.data(), gy_off.data(), x.data(), units.data(), nu,
                                             roff.data(), dst.data(), entries, nu * L, 0, c.co,
                                             gotw.data(), entries});
  std::vector<double> wantw(gotw.size(), 0.0);
  for (int64_t o = 0; o < c.co; ++o)
    for (int64_t e = 0; e < entries; ++e)
      for (int64_t q = 0; q < nu; ++q)
        for (int64_t l = 0; l < L; ++l)
          wantw[static_cast<size_t>(o * entries + e)] +=
              static_cast<double>(gy[static_cast<size_t>((o * nu + q) * L + l)]) *
              x[static_cast<size_t>(roff[static_cast<size_t>(e)] + units[static_cast<size_t>(q)] +
                                    l)];
  // transpose16 on two blocks.
  std::vector<float> ts(2 * L * L), td(2 * L * L);
  for (float& v : ts) v = u(gen);
  std::vector<const float*> sp;
  std::vector<float*> dp;
  for (int64_t i = 0; i < 2 * L; ++i) {
    sp.push_back(ts.data() + i * L);
    dp.push_back(td.data() + i * L);
  }
  starling::ops::internal::transpose16({sp.data(), dp.data(), 2});
  bool t_ok = true;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j)
        t_ok = t_ok && td[static_cast<size_t>((b * L + j) * L + i)] ==
                           ts[static_cast<size_t>((b * L + i) * L + j)];
  const double e1 = rel(out, want), e2 = rel(gotw, wantw);
  const bool ok = e1 < 1e-5 && e2 < 1e-5 && t_ok;
  std::printf(
      "%s lanes ci=%lld co=%lld %lldx%lld k=%lld pad=%lld: correlate %.2e, lane_weight_grad "
      "%.2e, transpose16 %s\n",
      ok ? "ok  " : "FAIL", static_cast<long long>(c.ci), static_cast<long long>(c.co),
      static_cast<long long>(c.h), static_cast<long long>(c.w), static_cast<long long>(c.k),
      static_cast<long long>(c.pad), e1, e2, t_ok ? "exact" : "WRONG");
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
    for (const Case& c : {Case{16, 3, 6, 7, 7, 3, 1}, Case{16, 5, 7, 9, 8, 5, 2},
                          Case{16, 2, 9, 6, 5, 3, 0}, Case{16, 7, 5, 3, 3, 3, 1}})
      ok = check_lanes(c, gen) && ok;
  }
  std::printf("%s\n", ok ? "all cases agree" : "MISMATCH");
  return ok ? 0 : 1;
}
