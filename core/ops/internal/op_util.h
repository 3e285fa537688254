// Helpers shared by the op implementations: argument checks that abort with a clear message
// (ops are programming-error territory, not peer input), dtype dispatch and broadcasting.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/tensor/tensor.h"

namespace starling::ops::internal {

[[noreturn]] inline void op_fatal(const char* op, const std::string& msg) {
  std::fprintf(stderr, "starling: %s: %s\n", op, msg.c_str());
  std::abort();
}

#define STARLING_OP_CHECK(cond, op, msg)                       \
  do {                                                         \
    if (!(cond)) ::starling::ops::internal::op_fatal(op, msg); \
  } while (0)

// Calls f.template operator()<T>() with T = float or double according to dtype.
template <typename F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  if (t == DType::kF32) return f.template operator()<float>();
  if (t == DType::kF64) return f.template operator()<double>();
  op_fatal(op, "expects f32 or f64, got " + std::string(dtype_name(t)));
}

// Broadcast result shape of a and b (numpy rules); aborts when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Sums g (shape `from`) down to `to` over broadcast dimensions. Contiguous result.
Tensor sum_to_shape(const Tensor& g, const Shape& to);

// Strides of `t` seen with shape `out` (zero stride on broadcast dims).
Strides broadcast_strides(const Tensor& t, const Shape& out);

}  // namespace starling::ops::internal
