// The direct convolution kernels (core/ops/internal/conv_kernels.h) for AVX2 + FMA: 8 lanes,
// 16 vector registers (a 4 x 2 accumulator tile in `correlate`). Built with -mavx2 -mfma
// (core/CMakeLists.txt) and called only where the CPU reports both.
#if defined(__x86_64__)
#include <immintrin.h>

#include "core/ops/internal/conv_kernels_impl.h"
#include "core/ops/internal/small_gemm_impl.h"

namespace starling::ops::internal {
namespace {

struct Avx2 {
  using T = __m256;
  static constexpr int L = 8;
  static constexpr int kCorrVecs = 2;
  static constexpr int kGradRows3 = 2;
  static constexpr int kGradRows5 = 1;
  static constexpr int kGemmRows = 8;
  static constexpr int kGradTaps = 8;
  static constexpr int kLaneGradOut = 2;
  static constexpr int kLaneGradEntries = 6;
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T pin(T v) {
    asm("" : "+x"(v));
    return v;
  }
  static T zero() { return _mm256_setzero_ps(); }
  static float hsum(T v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 d = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
  }
};

}  // namespace

void correlate_avx2(const CorrelateArgs& a) { correlate_impl<Avx2>(a); }
void weight_grad_avx2(const WeightGradArgs& a) { weight_grad_impl<Avx2>(a); }
void small_gemm_avx2(const SmallGemmArgs& g) { small_gemm_impl<Avx2>(g); }
void lane_weight_grad_avx2(const LaneGradArgs& a) { lane_weight_grad_impl<Avx2>(a); }
void transpose16_avx2(const TransposeArgs& a) { transpose16_impl<Avx2>(a); }

}  // namespace starling::ops::internal
#endif
