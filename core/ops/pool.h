// Spatial resampling of NCHW tensors: max and average pooling, nearest-neighbour upsampling.
// All differentiable, f32 or f64.
#pragma once

#include <cstdint>

#include "core/tensor/tensor.h"

namespace starling::ops {

// x: (B, C, H, W) -> (B, C, (H - kernel) / stride + 1, (W - kernel) / stride + 1), the maximum
// of each kernel x kernel window (no padding; floor, as torch.nn.MaxPool2d). The gradient goes
// to the first maximal element of each window. stride <= 0 means stride = kernel.
// REQUIRES: 1 <= kernel <= H, W.
Tensor max_pool2d(const Tensor& x, int64_t kernel = 2, int64_t stride = 0);

// x: (B, C, H, W) -> (B, C, H / kernel, W / kernel), the mean of non-overlapping windows.
// REQUIRES: kernel >= 1 divides H and W.
Tensor avg_pool2d(const Tensor& x, int64_t kernel = 2);

// x: (B, C, H, W) -> (B, C, H scale, W scale), each pixel repeated scale x scale times.
// REQUIRES: scale >= 1.
Tensor upsample_nearest2d(const Tensor& x, int64_t scale = 2);

}  // namespace starling::ops
