// Host launchers of the CUDA kernels the image models (the DDPM U-Net, the MNIST CNN) and their
// training steps need: group norm (+ SiLU, + per-channel shift), SiLU, ReLU, pooling and
// upsampling, the time embedding, strided copies, elementwise ops, a deterministic sum and SGD.
// Same conventions as kernels.h: plain device pointers, contiguous row-major, enqueued on
// `stream`, backward launchers overwrite their outputs, reductions in a fixed order (no float
// atomics), so every result is deterministic. Each mirrors its CPU reference in core/ops or
// core/optim (the parity tests' oracle), including the order of its fp32 operations (no FMA
// contraction where the CPU rounds twice). CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace starling::cuda {

// Group normalization over x: (B, C, S) with S = H*W, `groups` consecutive channel groups,
// statistics per (image, group) accumulated in double (biased variance, eps inside the sqrt), as
// ops::group_norm. shift: (B, C) or null, added to x before normalizing
// (shifted_group_norm_silu); silu: y = silu(normalized * weight + bias) instead of the affine
// value (group_norm_silu). bias may be null. mean, rstd: (B, groups) in double, saved for
// backward (either may be null in inference); mean is that of x + shift. Double, as the CPU
// keeps them: rounded to float, the mean's error times sum(dy) shows in dweight at 1e-5.
// REQUIRES: groups >= 1 divides C.
void group_norm_forward(float* y, double* mean, double* rstd, const float* x, const float* shift,
                        const float* weight, const float* bias, int b, int c, int s, int groups,
                        float eps, bool silu, cudaStream_t stream);
// dy: (B, C, S) -> dx: (B, C, S), dweight: (C), dbias: (C) (null when the forward had no bias),
// dshift: (B, C) (null when no shift); x, shift, weight, bias, silu as given to the forward and
// its mean, rstd. Under silu the pre-activation is recomputed from x. dweight may be null too.
// scratch: group_norm_scratch_floats(b, c) floats of device memory, 8-byte aligned (any
// allocation is), holding per-(image, channel) partial sums in double, reduced over B in image
// order (deterministic).
size_t group_norm_scratch_floats(int b, int c);
void group_norm_backward(float* dx, float* dweight, float* dbias, float* dshift, const float* dy,
                         const float* x, const float* shift, const float* weight, const float* bias,
                         const double* mean, const double* rstd, int b, int c, int s, int groups,
                         bool silu, float* scratch, cudaStream_t stream);

// SiLU, ops::silu: y = x / (1 + exp(-x)); backward dx = dy * s (1 + x (1 - s)), s = sigmoid(x).
// exp is the CPU's fast_expf (same polynomial, same roundings).
void silu_forward(float* y, const float* x, size_t n, cudaStream_t stream);
void silu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream);
// ReLU, ops::relu: y = x > 0 ? x : 0 (NaN and -0 give +0).
void relu_forward(float* y, const float* x, size_t n, cudaStream_t stream);
// dx = dy where x > 0, else 0 (0 at exactly x == 0, as the CPU).
void relu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream);

// x: (P, H, W) planes (P = B*C) -> y: (P, H*f, W*f), each pixel repeated f x f times.
// REQUIRES: factor >= 1.
void upsample_nearest2d_forward(float* y, const float* x, int planes, int h, int w, int factor,
                                cudaStream_t stream);
// dy: (P, H*f, W*f) -> dx: (P, H, W): the sum of each f x f block from 0, row by row, left to
// right (the CPU's order).
void upsample_nearest2d_backward(float* dx, const float* dy, int planes, int h, int w, int factor,
                                 cudaStream_t stream);
// Max pooling over planes x: (P, H, W), window k, stride st (st <= 0 means st = k), no padding,
// floor: H_out = (H - k) / st + 1, W_out = (W - k) / st + 1 -> y: (P, H_out, W_out), argmax:
// (P, H_out, W_out) int32 index within the plane of the chosen input: the first maximal element
// of the window in row-major order (strict >, as ops::max_pool2d; a NaN is never chosen over an
// earlier element). REQUIRES: 1 <= k <= H, W.
void max_pool2d_forward(float* y, int* argmax, const float* x, int planes, int h, int w, int k,
                        int st, cudaStream_t stream);
// dy: (P, H_out, W_out), argmax from the forward -> dx: (P, H, W) overwritten: each input gathers
// the dy of the windows that chose it, from 0 in increasing output order (the CPU's order), so
// overlapping windows (st < k) are deterministic too. Same k, st as the forward.
void max_pool2d_backward(float* dx, const float* dy, const int* argmax, int planes, int h, int w,
                         int k, int st, cudaStream_t stream);

// t: (B) f32 steps -> out: (B, dim) = [sin(t f_0) .. sin(t f_{h-1}), cos(t f_0) .. cos(t f_{h-1})],
// h = dim / 2, f_i = exp(-ln(max_period) i / (h - 1)) (f_0 = 1 when h = 1), in double and rounded
// to float, as ops::timestep_embedding. REQUIRES: dim even, dim >= 2.
void timestep_embedding(float* out, const float* t, int b, int dim, float max_period,
                        cudaStream_t stream);

// Strided gather: dst (contiguous, numel = prod(shape) elements of `elem_bytes` each: 1, 2, 4 or
// 8) <- src_base read at offsets sum_d idx_d * strides[d] (in elements, may be negative) over the
// `dims` (0..8; 0 copies one element) dimensions of shape: transpose + contiguous, or a slice of
// a larger tensor (cat's backward). shape and strides are host arrays, passed to the kernel by
// value. REQUIRES: dst does not overlap what src_base reads; pointers aligned to elem_bytes.
void strided_copy(void* dst, const void* src_base, int dims, const int64_t* shape,
                  const int64_t* strides, size_t elem_bytes, cudaStream_t stream);
// The same with the destination strided too: dst_base at sum_d idx_d * dst_strides[d] <- src_base
// at sum_d idx_d * src_strides[d] (cat: each part copied into its slice of the output, the
// output's strides, the part's own). REQUIRES: distinct indices write distinct dst elements.
void strided_copy_to(void* dst_base, const int64_t* dst_strides, const void* src_base,
                     const int64_t* src_strides, int dims, const int64_t* shape, size_t elem_bytes,
                     cudaStream_t stream);

// Elementwise over n values (out may alias an input): out = a + b, a - b, a * b, a * s; and
// dst += src.
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
void sub(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
void scale(float* out, const float* a, float s, size_t n, cudaStream_t stream);
void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream);
// out[i] = v for n values.
void fill(float* out, float v, size_t n, cudaStream_t stream);
// ema[i] = d ema[i] + (1 - d) w[i] for n values, rounded as the CPU's loop (two products, one
// sum, no fused multiply-add).
void ema_lerp(float* ema, const float* w, float d, size_t n, cudaStream_t stream);

// out: () = float(float(sum of x) * float(factor)), the sum accumulated in double over a fixed
// grid of kSumBlocks blocks and a fixed tree (deterministic): ops::sum (factor 1) and ops::mean
// (factor 1 / n: the CPU's mul_scalar of the float sum). scratch: kSumBlocks doubles. n may be 0.
constexpr int kSumBlocks = 1024;
void sum(float* out, double* scratch, const float* x, size_t n, double factor, cudaStream_t stream);
// The same sum left in double: out: () double.
void sum_double(double* out, double* scratch, const float* x, size_t n, cudaStream_t stream);

// One SGD step on n fp32 values with the CPU Sgd's arithmetic (coupled weight decay):
// d = g + weight_decay p; with momentum != 0, v = first_step ? d : momentum v + d and
// d = nesterov ? d + momentum v : v; then p -= lr d. velocity may be null when momentum == 0.
void sgd_step(float* params, const float* grads, float* velocity, size_t n, float lr,
              float momentum, float weight_decay, bool nesterov, bool first_step,
              cudaStream_t stream);

}  // namespace starling::cuda
