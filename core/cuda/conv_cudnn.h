// CudnnConv: ops::conv2d's GPU path, fp32 NCHW 2-D convolutions (forward and backward) through
// cuDNN's legacy convolution API, with descriptors and algorithm choices cached per shape.
// CUDA builds only (cudnn.h stays inside conv_cudnn.cu).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "core/cuda/allocator.h"
#include "core/util/status.h"

namespace starling::cuda {

// The shapes of one convolution: input x: (B, C_in, H, W), weight w: (C_out, C_in, kH, kW)
// (PyTorch's layout), output y: (B, C_out, H_out, W_out). Stride and zero padding are the same
// on both axes; no dilation, no groups.
struct ConvShape {
  int b = 0, c_in = 0, h = 0, w = 0;  // input (B, C_in, H, W)
  int c_out = 0, kh = 0, kw = 0;      // weight (C_out, C_in, kH, kW)
  int stride = 1, pad = 0;            // same on both axes
  int h_out() const { return (h + 2 * pad - kh) / stride + 1; }
  int w_out() const { return (w + 2 * pad - kw) / stride + 1; }
  // Spelled out, not "= default": the CUDA build compiles .cu files as C++17 (the
  // CUDA_STANDARD 17 flag comes after the hand-passed -std=c++20 and wins).
  bool operator==(const ConvShape& o) const {
    return b == o.b && c_in == o.c_in && h == o.h && w == o.w && c_out == o.c_out && kh == o.kh &&
           kw == o.kw && stride == o.stride && pad == o.pad;
  }
  bool operator!=(const ConvShape& o) const { return !(*this == o); }
};

// cuDNN convolutions on one GPU: a cudnnHandle_t, the tensor/filter/convolution descriptors and
// the chosen algorithms cached per ConvShape, workspace from `workspace`. Results are plain fp32
// (FMA math, never TF32), cross-correlation as ops::conv2d and torch.nn.Conv2d compute it.
// Algorithms: the first of cuDNN's heuristics (no benchmarking) that is supported, uses FMA or
// default math and needs at most 256 MiB of workspace, preferring direct (GEMM-like) algorithms
// over FFT and Winograd (whose fp32 rounding drifts past 1e-5) and deterministic ones over the
// rest; algorithms() says when a choice is non-deterministic.
// Every call enqueues on `stream` and synchronizes nothing; pointers are fp32 device memory,
// contiguous NCHW, on the device the object was created on.
// Not thread-safe: one object per device, used from one thread at a time.
class CudnnConv {
 public:
  // Creates the cuDNN handle on the current device. `workspace` is not owned and must outlive the
  // object; its blocks are reused in stream order, so all users of that allocator must work on
  // the stream passed here (or synchronize). Errors (null allocator, no cuDNN library or GPU, a
  // cuDNN runtime of another major version) as a Status carrying cuDNN's error string.
  // tf32: let cuDNN run the fp32 convolutions on tensor cores as TF32 (CUDNN_DEFAULT_MATH, what
  // PyTorch's allow_tf32 does; about 1e-3 relative), FFT and Winograd as welcome as direct
  // algorithms; off (the default), FMA math only, as described above.
  static Result<std::unique_ptr<CudnnConv>> create(DeviceAllocator* workspace, bool tf32 = false);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // y: (B, C_out, H_out, W_out) = conv(x, w) + bias[c] + residual, overwritten. bias: (C_out) or
  // null; residual: y's shape or null, and must not alias y. x, w, y must not be null.
  // InvalidArgument for a bad shape (any size < 1, pad < 0, H_out or W_out < 1) or pointers;
  // cuDNN's failures, and a shape with no usable algorithm, as a Status naming the shape.
  Status forward(float* y, const float* x, const float* w, const float* bias, const float* residual,
                 const ConvShape& s, cudaStream_t stream);
  // dy: (B, C_out, H_out, W_out) -> dx: (B, C_in, H, W), dw: (C_out, C_in, kH, kW), db: (C_out).
  // Any of the three may be null (not computed); the others are overwritten (no accumulation).
  // dx needs w, dw needs x (either may be null when its gradient is not asked for); dy must not
  // be null unless all three are. Errors as forward's.
  Status backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  const ConvShape& s, cudaStream_t stream);

  // The algorithms chosen for the shape, for logs and benchmarks, e.g.
  // "fwd=IMPLICIT_PRECOMP_GEMM bwd_data=ALGO_1 bwd_filter=ALGO_1"; a direction not run yet for
  // the shape reads "-", a non-deterministic choice ends in "(nondeterministic)".
  std::string algorithms(const ConvShape& s) const;

 private:
  struct Impl;
  explicit CudnnConv(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::cuda
