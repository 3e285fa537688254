// Run-time choice of the direct convolution kernels' instruction set (conv_kernels.h).
#include "core/ops/internal/conv_kernels.h"

#include <atomic>

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

void correlate(const CorrelateArgs& a) {
  switch (conv_isa()) {
#if defined(__x86_64__)
    case ConvIsa::kAvx512:
      return correlate_avx512(a);
    case ConvIsa::kAvx2:
      return correlate_avx2(a);
#endif
    default:
      return correlate_generic(a);
  }
}

void weight_grad(const WeightGradArgs& a) {
  switch (conv_isa()) {
#if defined(__x86_64__)
    case ConvIsa::kAvx512:
      return weight_grad_avx512(a);
    case ConvIsa::kAvx2:
      return weight_grad_avx2(a);
#endif
    default:
      return weight_grad_generic(a);
  }
}

}  // namespace starling::ops::internal
