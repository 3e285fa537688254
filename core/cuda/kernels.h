// Host launchers of the CUDA kernels: plain fp32 device pointers, contiguous row-major, one
// launcher per op and direction, each enqueued on `stream` (nothing synchronizes). Shapes use
// the house letters: N rows (= B*T), C channels, V vocabulary, B batch, T time, H heads.
// Backward launchers overwrite their outputs (no accumulation). CUDA builds only.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace starling::cuda {

// layer_norm_cuda.cu. x: (N, C), weight, bias: (C) (bias may be null) -> y: (N, C), and the
// per-row mean, rstd: (N) for the backward pass (either may be null in inference).
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                        const float* bias, int n, int c, float eps, cudaStream_t stream);
// dy, x: (N, C), weight: (C), mean, rstd: (N) -> dx: (N, C), dweight, dbias: (C) (dbias may be
// null). Column sums run in a fixed order: results are deterministic.
void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                         const float* weight, const float* mean, const float* rstd, int n, int c,
                         cudaStream_t stream);

// gelu_cuda.cu: exact (erf) GELU. x: (n) -> y: (n); backward dx = dy * gelu'(x).
void gelu_forward(float* y, const float* x, size_t n, cudaStream_t stream);
void gelu_backward(float* dx, const float* dy, const float* x, size_t n, cudaStream_t stream);

// cross_entropy_cuda.cu: softmax + cross-entropy fused. logits: (N, V), targets: (N) int32 in
// [0, V) or ignore_index -> losses: (N) (0 on ignored rows), loss: () the mean over the valid
// rows (0 when none), valid_count: () the number of valid rows.
void cross_entropy_forward(float* losses, float* loss, int* valid_count, const float* logits,
                           const int* targets, int n, int v, int ignore_index, cudaStream_t stream);
// dloss: () the upstream gradient of `loss`, valid_count from the forward pass ->
// dlogits: (N, V) = (softmax(logits) - onehot(target)) * dloss / valid_count, 0 on ignored rows.
void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                            const float* dloss, const int* valid_count, int n, int v,
                            int ignore_index, cudaStream_t stream);
// The weighted, padded variant (the MDLM's loss): logits: (N, VP) rows with the softmax over the
// first V columns (VP >= V; columns V.. are never read, as if -inf), targets: (N) in [0, V) or
// negative (ignored), weights: (N) or null -> losses: (N) (0 on ignored rows), loss: () =
// sum_i weights[i] * losses[i] over the kept rows, accumulated in double in a fixed order (null
// weights: the sum over kept rows / N).
void cross_entropy_weighted_forward(float* losses, float* loss, const float* logits,
                                    const int* targets, const float* weights, int n, int v, int vp,
                                    cudaStream_t stream);
// dlogits: (N, VP) = weights[i] * (softmax - onehot(target)) in the first V columns (1/N for null
// weights), 0 in columns V.. and on ignored rows: the gradient of the weighted loss.
void cross_entropy_weighted_backward(float* dlogits, const float* logits, const int* targets,
                                     const float* weights, int n, int v, int vp,
                                     cudaStream_t stream);

// adamw_cuda.cu: one decoupled-weight-decay Adam step on n fp32 master weights, the same
// arithmetic as core/optim's AdamW; `step` counts from 1. When params_bf16 is not null it
// receives the updated weights rounded to bf16 (the copy the bf16 forward pass reads).
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  long step = 1;
};
void adamw_step(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v,
                size_t n, const AdamWStep& s, cudaStream_t stream);

// matmul_cuda.cu: fp32 GEMMs through cuBLAS (in the handle's math mode).
// a: (M, K), b: (K, N) -> c: (M, N).
void matmul_forward(float* c, const float* a, const float* b, int m, int n, int k,
                    cublasHandle_t handle, cudaStream_t stream);
// dc: (M, N) -> da: (M, K) = dc b^T, db: (K, N) = a^T dc (either may be null).
void matmul_backward(float* da, float* db, const float* dc, const float* a, const float* b, int m,
                     int n, int k, cublasHandle_t handle, cudaStream_t stream);
// x: (N, IN), weight: (OUT, IN), bias: (OUT) or null -> y: (N, OUT) = x weight^T + bias.
void linear_forward(float* y, const float* x, const float* weight, const float* bias, int n, int in,
                    int out, cublasHandle_t handle, cudaStream_t stream);
// dy: (N, OUT) -> dx: (N, IN), dweight: (OUT, IN), dbias: (OUT) (dbias may be null).
void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int n, int in, int out, cublasHandle_t handle,
                     cudaStream_t stream);
// bf16 mixed precision (matmul_cuda.cu): the same products with x, weight and dy rounded to bf16
// (__float2bfloat16_rn) into `scratch` and multiplied on tensor cores with fp32 accumulation
// (cublasGemmEx, CUBLAS_COMPUTE_32F); y, dx, dweight stay fp32, dbias sums the fp32 dy.
// scratch: linear_bf16_scratch_elems(n, in, out) bf16 values.
size_t linear_bf16_scratch_elems(int n, int in, int out);
void linear_forward_bf16(float* y, const float* x, const float* weight, const float* bias, int n,
                         int in, int out, __nv_bfloat16* scratch, cublasHandle_t handle,
                         cudaStream_t stream);
void linear_backward_bf16(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                          const float* weight, int n, int in, int out, __nv_bfloat16* scratch,
                          cublasHandle_t handle, cudaStream_t stream);
// linear_lt_cuda.cu: linear_forward through cuBLASLt with the bias added in the GEMM's epilogue
// (one kernel instead of two). workspace: device scratch for cuBLASLt (32 MiB is plenty; may be
// null with workspace_bytes 0). Falls back to linear_forward when cuBLASLt offers no algorithm.
void linear_forward_lt(float* y, const float* x, const float* weight, const float* bias, int n,
                       int in, int out, cublasLtHandle_t lt, void* workspace,
                       size_t workspace_bytes, cublasHandle_t handle, cudaStream_t stream);
// Row-major strided-batched GEMM: c_i = alpha op(a_i) op(b_i) + beta c_i for i < batch, with
// leading dimensions and batch strides in elements (what attention uses on packed heads).
void gemm_strided_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                          const float* a, int lda, long long stride_a, const float* b, int ldb,
                          long long stride_b, float beta, float* c, int ldc, long long stride_c,
                          int batch, cublasHandle_t handle, cudaStream_t stream);

// attention_cuda.cu: causal or full attention over packed heads, like ops::attention_packed.
// qkv: (B, T, 3C) as [q | k | v], H heads of D = C / H -> out: (B, T, C); att: (B, H, T, T)
// receives the attention probabilities for the backward pass.
void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                       bool causal, cublasHandle_t handle, cudaStream_t stream);
// dout: (B, T, C), qkv and att from the forward pass, scratch: (B, H, T, T) -> dqkv: (B, T, 3C).
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int b, int t, int c, int h, cublasHandle_t handle,
                        cudaStream_t stream);

// The masks of ops::AttnMask (core/ops/attention.h), same kinds and meaning: every query reads
// at most two contiguous key ranges (AttnMask::key_ranges), so no mask tensor is stored.
enum class AttnMaskKind : int { kFull = 0, kCausal = 1, kBlockCausal = 2, kBlockDiffusion = 3 };
// attention_forward under any of those masks (`block`: the block length of the block kinds; T
// must be a multiple of it, of 2 * block for kBlockDiffusion). att is 0 at masked keys, so
// attention_backward serves every mask.
void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                       AttnMaskKind mask, int block, cublasHandle_t handle, cudaStream_t stream);

// flash_attention_cuda.cu: the same attention under the same masks without storing the
// (B, H, T, T) probabilities (core/cuda/internal/flash_attention.h): the forward writes out and
// lse: (B, H, T), the log-sum-exp of each query's scores; the backward recomputes the
// probabilities from qkv and lse, with delta: (B, H, T) scratch, and writes all of dqkv (no
// accumulation). Head sizes D = C / H in [1, 128] (flash_attention_supported).
bool flash_attention_supported(int head_dim);
void flash_attention_forward(float* out, float* lse, const float* qkv, int b, int t, int c, int h,
                             AttnMaskKind mask, int block, cudaStream_t stream);
void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                              const float* out, const float* lse, int b, int t, int c, int h,
                              AttnMaskKind mask, int block, cudaStream_t stream);
// The same on tensor cores (core/cuda/internal/flash_attention_tc.h): q, k, v, the
// probabilities, dO and dS rounded to bf16, products accumulated in fp32 (the bf16 precision
// mode; 1e-2 of the fp32 result). Same arguments and layouts.
void flash_attention_forward_bf16(float* out, float* lse, const float* qkv, int b, int t, int c,
                                  int h, AttnMaskKind mask, int block, cudaStream_t stream);
void flash_attention_backward_bf16(float* dqkv, float* delta, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int b, int t, int c, int h,
                                   AttnMaskKind mask, int block, cudaStream_t stream);

// rope_cuda.cu: rotary positions ("rotate half", ops::rope_packed) in place on the q and k heads
// of qkv: (N, 3C) rows, H heads of D = C / H (D even), v untouched. Row r is at position
// r % period; cos, sin: (period, D/2) tables. inverse rotates by the opposite angle (the
// backward on dq, dk).
void rope_packed(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
                 bool inverse, cudaStream_t stream);

// encoder_cuda.cu: GPT's token + position embedding. idx: (B, T) i32, wte: (V, C), wpe: (>=T, C)
// -> out: (B, T, C) = wte[idx] + wpe[t].
void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                     int c, cudaStream_t stream);
// Accumulates (+=) the embedding gradients of dout: (B, T, C). Positions grouped by token:
// bucket u (of num_unique) is token tokens[u] at positions order[starts[u]] ..
// order[starts[u + 1] - 1], summed in that order, so the result is deterministic; dwpe[t] adds
// dout[b, t] over b in order.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* order,
                      const int* starts, const int* tokens, int num_unique, int b, int t, int c,
                      cudaStream_t stream);

// residual_cuda.cu: out = a + b over n values (out may alias a or b).
void residual_add(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
// out[i] = a[i] - b[i] (a federated client's delta: its trained weights minus the global model).
void subtract(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);

// grad_norm_cuda.cu: out: () = sum of x[i]^2 accumulated in double over a fixed grid of
// kSumSquaresBlocks blocks (deterministic); scratch: kSumSquaresBlocks doubles.
constexpr int kSumSquaresBlocks = 1024;
void sum_squares(double* out, double* scratch, const float* x, size_t n, cudaStream_t stream);
// Reads norm_sq on the device: when max_norm > 0 and sqrt(*norm_sq) > max_norm, scales x by
// max_norm / (norm + 1e-6) (core/optim's clip_grad_norm), else leaves it unchanged.
void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm, cudaStream_t stream);

}  // namespace starling::cuda
