// The direct convolution kernels (core/ops/internal/conv_kernels.h) for AVX-512: 16 lanes,
// 32 vector registers (4 x 6 accumulators in `correlate`; 5 rows of 3 sums and a window of 2
// inputs, or 3 rows of 5 and 4, in `weight_grad`). Built with
// -mavx512f -mfma (core/CMakeLists.txt) and called only where the CPU reports AVX-512F.
#if defined(__x86_64__)
#include <immintrin.h>

#include "core/ops/internal/conv_kernels_impl.h"
#include "core/ops/internal/small_gemm_impl.h"

namespace starling::ops::internal {
namespace {

struct Avx512 {
  using T = __m512;
  static constexpr int L = 16;
  static constexpr int kCorrVecs = 6;
  static constexpr int kGradRows3 = 5;
  static constexpr int kGradRows5 = 3;
  static constexpr int kGemmRows = 16;
  static constexpr int kGradTaps = 9;
  static constexpr int kLaneGradOut = 4;
  static constexpr int kLaneGradEntries = 6;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  // Keeps a loaded vector in a register: GCC otherwise folds the load into each FMA that uses
  // it, four loads where one does.
  static T pin(T v) {
    asm("" : "+v"(v));
    return v;
  }
  static T zero() { return _mm512_setzero_ps(); }
  // Through memory: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its own header.
  static float hsum(T v) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) t[i] += t[i + w];
    return t[0];
  }
};

}  // namespace

void correlate_avx512(const CorrelateArgs& a) { correlate_impl<Avx512>(a); }
void weight_grad_avx512(const WeightGradArgs& a) { weight_grad_impl<Avx512>(a); }
void small_gemm_avx512(const SmallGemmArgs& g) { small_gemm_impl<Avx512>(g); }
void lane_weight_grad_avx512(const LaneGradArgs& a) { lane_weight_grad_impl<Avx512>(a); }
void transpose16_avx512(const TransposeArgs& a) { transpose16_impl<Avx512>(a); }

}  // namespace starling::ops::internal
#endif
