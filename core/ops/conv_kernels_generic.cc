// The direct convolution kernels (core/ops/internal/conv_kernels.h) on GCC's portable vectors of
// 4 floats: NEON on arm64, SSE2 on x86 without AVX2, scalar code elsewhere. Built with the
// project's default flags; the fallback every CPU can run. On arm64 the multiply-add is NEON's
// fused one (vfmaq_f32).
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "core/ops/internal/conv_kernels_impl.h"
#include "core/ops/internal/small_gemm_impl.h"

namespace starling::ops::internal {
namespace {

struct Generic {
#if defined(__ARM_NEON)
  using T = float32x4_t;
#else
  typedef float T __attribute__((vector_size(16)));
#endif
  static constexpr int L = 4;
  static constexpr int kCorrVecs = 2;
  static constexpr int kGradRows3 = 2;
  static constexpr int kGradRows5 = 1;
  static constexpr int kGemmRows = 8;
  static constexpr int kGradTaps = 8;
  static constexpr int kLaneGradOut = 2;
  static constexpr int kLaneGradEntries = 4;
  static T load(const float* p) {
    T v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, T v) { __builtin_memcpy(p, &v, sizeof v); }
  static T bcast(const float* p) { return T{} + *p; }
#if defined(__ARM_NEON)
  static T fma(T a, T b, T c) { return vfmaq_f32(c, a, b); }
#else
  static T fma(T a, T b, T c) { return a * b + c; }
#endif
  static T pin(T v) {
#if defined(__aarch64__)
    asm("" : "+w"(v));
#elif defined(__x86_64__)
    asm("" : "+x"(v));
#endif
    return v;
  }
  static T zero() { return T{}; }
  static float hsum(T v) { return (v[0] + v[1]) + (v[2] + v[3]); }
};

}  // namespace

void correlate_generic(const CorrelateArgs& a) { correlate_impl<Generic>(a); }
void weight_grad_generic(const WeightGradArgs& a) { weight_grad_impl<Generic>(a); }
void small_gemm_generic(const SmallGemmArgs& g) { small_gemm_impl<Generic>(g); }
void lane_weight_grad_generic(const LaneGradArgs& a) { lane_weight_grad_impl<Generic>(a); }
void transpose16_generic(const TransposeArgs& a) { transpose16_impl<Generic>(a); }

}  // namespace starling::ops::internal
