// 2-D convolution over NCHW tensors, differentiable in the input, the weight and the bias.
// Weights use PyTorch's layout (C_out, C_in, kH, kW). On the CPU float32 runs direct vector
// kernels and float64 im2col + GEMM (core/ops/conv_cpu.cc).
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: (B, C_in, H, W), w: (C_out, C_in, kH, kW), bias: (C_out) or undefined, f32 or f64 (all
// the same dtype) -> (B, C_out, H_out, W_out) with H_out = (H + 2 padding - kH) / stride + 1
// (floor; likewise W_out). Zero padding on every side; cross-correlation, as torch.nn.Conv2d.
// REQUIRES: stride >= 1, padding >= 0, H_out >= 1 and W_out >= 1 (aborts otherwise).
// residual: undefined, or a tensor of the output's shape and dtype added to the output (a
// ResNet block's skip) as it is written, without an add of its own; its gradient is the output's.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, const Tensor& residual = Tensor());

namespace internal {
// The CPU path conv2d takes for these shapes: "lanes" (float32, images in the vector lanes),
// "flat" (float32, flattened padded planes), "pointwise" (float32 1x1 in place) or "im2col".
// For tests and benchmarks; shapes as conv2d requires them.
const char* conv2d_cpu_path(const Shape& x, const Shape& w, int64_t stride, int64_t padding,
                            DType dtype);
}  // namespace internal

}  // namespace starling::ops
