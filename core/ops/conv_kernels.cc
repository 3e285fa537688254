// Run-time choice of the vector kernels' instruction set (conv_kernels.h, small_gemm.h).
#include "core/ops/internal/conv_kernels.h"

#include <atomic>

#include "core/ops/internal/small_gemm.h"

namespace starling::ops::internal {

namespace {

ConvIsa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();  // may run before libgcc's own initializer
  if (__builtin_cpu_supports("avx512f")) return ConvIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ConvIsa::kAvx2;
#endif
  return ConvIsa::kGeneric;
}

std::atomic<ConvIsa>& chosen() {
  static std::atomic<ConvIsa> isa{detect()};
  return isa;
}

}  // namespace

ConvIsa conv_isa() { return chosen().load(std::memory_order_relaxed); }

const char* conv_isa_name(ConvIsa isa) {
  switch (isa) {
    case ConvIsa::kAvx512:
      return "avx512";
    case ConvIsa::kAvx2:
      return "avx2";
    case ConvIsa::kGeneric:
      break;
  }
  return "generic";
}

bool conv_isa_supported(ConvIsa isa) {
  const ConvIsa best = detect();
  return static_cast<int>(isa) <= static_cast<int>(best);
}

ConvIsa force_conv_isa(ConvIsa isa) { return chosen().exchange(isa); }

// Each kernel on the chosen instruction set.
#if defined(__x86_64__)
#define STARLING_VECTOR_DISPATCH(name, Args) \
  void name(const Args& a) {                 \
    switch (conv_isa()) {                    \
      case ConvIsa::kAvx512:                 \
        return name##_avx512(a);             \
      case ConvIsa::kAvx2:                   \
        return name##_avx2(a);               \
      default:                               \
        return name##_generic(a);            \
    }                                        \
  }
#else
#define STARLING_VECTOR_DISPATCH(name, Args) \
  void name(const Args& a) { return name##_generic(a); }
#endif

STARLING_VECTOR_DISPATCH(correlate, CorrelateArgs)
STARLING_VECTOR_DISPATCH(weight_grad, WeightGradArgs)
STARLING_VECTOR_DISPATCH(small_gemm, SmallGemmArgs)
STARLING_VECTOR_DISPATCH(lane_weight_grad, LaneGradArgs)
STARLING_VECTOR_DISPATCH(transpose16, TransposeArgs)
#undef STARLING_VECTOR_DISPATCH

}  // namespace starling::ops::internal
