// FusedBackend: the arithmetic of the fused GPT trainer (models/gpt/fused_gpt.h) as a small
// table of operations over flat buffers in the backend's memory. Two implementations: the CPU
// one (fused_cpu.cc, plain loops + OpenBLAS, always built) is the oracle; the CUDA one
// (fused_cuda.cc, CUDA builds) calls core/cuda's launchers on one stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/ops/attention.h"
#include "core/util/status.h"

namespace starling::models {

// Positions of a batch grouped by token, for a deterministic embedding backward: bucket u holds
// token tokens[u] at positions order[starts[u]] .. order[starts[u + 1] - 1], in increasing
// position order. All three arrays live in backend memory. Built on the host from the batch
// (make_encoder_buckets in fused_gpt.cc), uploaded with the tokens.
struct EncoderBuckets {
  const int* order = nullptr;   // (B*T) positions sorted by (token, position)
  const int* starts = nullptr;  // (num_unique + 1) offsets into order
  const int* tokens = nullptr;  // (num_unique) the token of each bucket
  int num_unique = 0;
};

// One AdamW step's scalars (core/optim's AdamW arithmetic; `step` counts from 1).
struct FusedAdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  long step = 1;
};

// Every pointer is backend memory from alloc() unless said otherwise. Operations are enqueued
// in call order; only copy_to_host() and synchronize() wait for them. Forward ops overwrite
// their outputs; backward ops overwrite theirs too, except encoder_backward, which accumulates
// (the tied head's gradient is already in dwte). Shapes: B batch, T time, C channels, V
// vocabulary, H heads, N = B*T rows. Not thread-safe: one trainer per backend.
// An update codec (compress::make_codec's) that reads its delta from a backend's memory
// (FusedBackend::make_update_codec): the same bytes as the host codec of the same spec, layout and
// seed, error feedback included, its residual kept where the delta lives.
class FusedUpdateCodec {
 public:
  virtual ~FusedUpdateCodec() = default;
  // delta: the layout's numel floats in the backend's memory, complete (the backend that wrote
  // it synchronized). Non-finite values: InvalidArgument naming the tensor.
  virtual Status encode_into(const float* delta, compress::EncodedUpdate& out) = 0;
  // compress::Codec's persistent_state / restore_state (the error-feedback residual), copied.
  virtual std::vector<float> persistent_state() = 0;
  virtual Status restore_state(std::span<const float> state) = 0;
};

class FusedBackend {
 public:
  virtual ~FusedBackend() = default;
  virtual std::string name() const = 0;

  // Zero-filled bytes (nbytes == 0 gives nullptr). Out of memory: ResourceExhausted.
  virtual Result<void*> alloc(size_t nbytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_backend(void* dst, const void* host_src, size_t nbytes) = 0;
  // Waits for every enqueued operation, then copies.
  virtual void copy_to_host(void* host_dst, const void* src, size_t nbytes) = 0;
  virtual void zero(void* p, size_t nbytes) = 0;
  virtual void synchronize() = 0;

  // idx: (B, T) i32, wte: (V, C), wpe: (>=T, C) or null -> out: (B, T, C) = wte[idx] + wpe[t]
  // (wte[idx] alone without wpe: rotary positions). Row r of the B*T reads wpe[r % T], so a
  // caller whose positions repeat with a period P passes (B*T/P, P).
  virtual void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe,
                               int b, int t, int c) = 0;
  // dout: (B, T, C) -> dwte[token] += sum of dout rows of that token (in position order),
  // dwpe[t] += sum over b of dout[b, t] (in b order); dwpe may be null (no wpe).
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const EncoderBuckets& buckets, int b, int t, int c) = 0;
  // x: (N, C), weight: (C), bias: (C) or null -> out: (N, C), mean, rstd: (N). eps 1e-5.
  virtual void layer_norm_forward(float* out, float* mean, float* rstd, const float* x,
                                  const float* weight, const float* bias, int n, int c) = 0;
  // dout, x: (N, C) -> dx: (N, C), dweight, dbias: (C) (dbias may be null).
  virtual void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                                   const float* x, const float* weight, const float* mean,
                                   const float* rstd, int n, int c) = 0;
  // Mixed precision of the linear layers (bf16 = true): their GEMMs read x, weight and dout
  // rounded to bf16 (round to nearest even) and accumulate in fp32, as tensor cores do; outputs,
  // master weights and everything else stay fp32. The CPU backend emulates it exactly (the
  // products of two bf16 values are exact in fp32, so only the order of the sums differs).
  // `scratch_elems`: the most bf16 values one linear call converts (n*in + out*in + n*out), so
  // a backend can reserve its conversion buffer up front (ResourceExhausted when it cannot).
  virtual Status set_bf16_matmuls(bool on, size_t scratch_elems) {
    (void)scratch_elems;
    bf16_matmuls_ = on;
    return ok_status();
  }
  bool bf16_matmuls() const { return bf16_matmuls_; }

  // x: (N, IN), weight: (OUT, IN), bias: (OUT) or null -> out: (N, OUT) = x weight^T + bias.
  virtual void linear_forward(float* out, const float* x, const float* weight, const float* bias,
                              int n, int in, int out_features) = 0;
  // dout: (N, OUT) -> dx: (N, IN), dweight: (OUT, IN), dbias: (OUT) or null.
  virtual void linear_backward(float* dx, float* dweight, float* dbias, const float* dout,
                               const float* x, const float* weight, int n, int in,
                               int out_features) = 0;
  // Attention over packed heads under `mask` (ops::AttnMask: full, causal, block-causal or the
  // block-diffusion layout; each query reads at most two key ranges, AttnMask::key_ranges).
  // qkv: (B, T, 3C) -> out: (B, T, C) and att, the state the backward needs, of
  // attention_state_floats: the (B, H, T, T) probabilities (0 at masked keys) by default, or what
  // a backend keeps instead (the CUDA backend's flash kernels: (B, H, T) log-sum-exps).
  // REQUIRES: mask.check(T) is empty.
  virtual void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c,
                                 int h, const ops::AttnMask& mask) = 0;
  // dout: (B, T, C), scratch of attention_scratch_floats, qkv, out and att of the forward under
  // the same mask -> dqkv: (B, T, 3C), every element written.
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* out, const float* att, int b, int t, int c, int h,
                                  const ops::AttnMask& mask) = 0;
  virtual size_t attention_state_floats(int b, int t, int c, int h) const {
    (void)c;
    return static_cast<size_t>(b) * h * t * t;
  }
  virtual size_t attention_scratch_floats(int b, int t, int c, int h) const {
    (void)c;
    return static_cast<size_t>(b) * h * t * t;
  }
  // Rotary positions (ops::rope_packed's "rotate half" convention) in place on the q and k of
  // qkv: (N, 3C) rows, H heads of D = C / H channels each (D even); v is untouched. Row r is at
  // position p = r % period; the pair (x[i], x[i + D/2]) of every q and k head is rotated by
  // the angle of p: y[i] = x[i] cos - x[i + D/2] sin, y[i + D/2] = x[i + D/2] cos + x[i] sin,
  // with cos, sin: (period, D/2) tables in backend memory (fp32 values of the double-precision
  // angles, as ops::rope). inverse: the opposite angle (the transpose), which maps the gradient
  // of the rotated q, k to that of the unrotated ones.
  virtual void rope(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
                    bool inverse) = 0;
  // Exact (erf) GELU over n values; backward dx = dout * gelu'(x) (dx may alias dout). The CPU
  // backend evaluates erf and exp as core/ops does (fast_math.h: within 5e-7 of libm).
  virtual void gelu_forward(float* out, const float* x, size_t n) = 0;
  virtual void gelu_backward(float* dx, const float* dout, const float* x, size_t n) = 0;
  // out = a + b over n values (out may alias a or b).
  virtual void residual_add(float* out, const float* a, const float* b, size_t n) = 0;
  // Softmax cross-entropy over the first V columns of logits: (N, VP) rows (VP >= V, llm.c's
  // padded vocabulary: columns V..VP-1 are never read, as if their logits were -inf; the MDLM's
  // [MASK] column). targets: (N) in [0, V), or negative: the row is ignored. weights: (N) or null
  // -> losses: (N) each row's CE (0 on ignored rows), loss: () = sum_i weights[i] * losses[i]
  // over the kept rows (summed in double in row order); with null weights the mean over all N
  // rows. REQUIRES: with null weights every target is in [0, V).
  virtual void cross_entropy_forward(float* losses, float* loss, const float* logits,
                                     const int* targets, const float* weights, int n, int v,
                                     int vp) = 0;
  // dlogits: (N, VP), the gradient of `loss`: weights[i] * (softmax(row) - onehot(target)) over
  // the first V columns (1/N for null weights), 0 in columns V.. and on ignored rows.
  virtual void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                                      const float* weights, int n, int v, int vp) = 0;
  // One AdamW step on n weights with their gradients and moments.
  virtual void adamw(float* params, const float* grads, float* m, float* v, size_t n,
                     const FusedAdamW& s) = 0;
  // out: () = sum of x[i]^2 in double (deterministic order).
  virtual void sum_squares(double* out, const float* x, size_t n) = 0;
  // Global-norm clipping without a host round trip: norm = sqrt(*norm_sq); when max_norm > 0
  // and norm > max_norm, x *= max_norm / (norm + 1e-6) (core/optim's clip_grad_norm).
  virtual void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm) = 0;
  // out = a - b over n floats (a federated client's delta: trained weights minus the global).
  virtual void subtract(float* out, const float* a, const float* b, size_t n) = 0;
  // The update codec of `spec` over this backend's memory: the host codec (compress::make_codec)
  // by default, whose memory is the host's; the GPU codecs on a CUDA backend (core/cuda/
  // codec_gpu.h: the same bytes, only the encoded update crosses to the host).
  virtual Result<std::unique_ptr<FusedUpdateCodec>> make_update_codec(
      std::string_view spec, const compress::Layout& layout, uint64_t seed);

  // Bytes currently allocated and the high-water mark (for benchmarks).
  // The attention path (TrainConfig.attention): a GPU backend's choice between its flash kernels
  // and cuBLAS with the probabilities stored; the CPU backend always stores them. Set before the
  // engine is made: attention_state_floats depends on it.
  enum class Attention { kFlash, kMaterialized, kFlashBf16 };
  virtual void set_attention(Attention a) { (void)a; }

  // Makes this backend's device current on the calling thread (a CUDA device; nothing on the
  // CPU). A thread other than the one that made the backend calls it before its first call.
  virtual void bind_thread() {}
  // A mark of the work enqueued so far; wait_marked blocks the calling thread (any thread) until
  // that work is done. The CPU backend's calls are done when they return: empty marks. For
  // data-parallel training (GradientReducer) to start a collective on gradients backward has
  // finished while backward goes on.
  virtual std::shared_ptr<void> mark() { return nullptr; }
  virtual void wait_marked(const std::shared_ptr<void>& mark) { (void)mark; }

  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes() const = 0;

  // Graphs (CUDA graphs): between begin_capture and end_capture the work this thread enqueues is
  // recorded instead of run; end_capture returns it as a graph that replay enqueues again, with
  // the same arguments and memory. Unimplemented where the backend cannot capture (the CPU's
  // calls run when made). A capture that meets an operation it cannot record fails at
  // end_capture with the reason; the recorded work did not run either way.
  virtual Status begin_capture() { return unimplemented(name() + " cannot capture graphs"); }
  virtual Result<std::shared_ptr<void>> end_capture() {
    return unimplemented(name() + " cannot capture graphs");
  }
  virtual void replay(const std::shared_ptr<void>& graph) { (void)graph; }

  // Per-operation timing for benchmarks (`gpt_train_bench --profile`). While on, the engine
  // brackets each operation it enqueues with profile_begin / profile_end and the backend times
  // the work between them where it runs: CUDA events on the stream (device time, no host
  // waits until take_profile), the host clock on the CPU (operations finish when they return).
  // Off (the default) it costs one branch per operation.
  struct ProfileEntry {
    std::string label;
    double ms = 0.0;  // summed
    int64_t calls = 0;
  };
  void set_profiling(bool on);
  bool profiling() const { return profiling_; }
  void profile_begin(const char* label);
  void profile_end();
  // Waits for the work, then returns the time per label since the last take, in the order the
  // labels first appeared, and starts afresh.
  std::vector<ProfileEntry> take_profile();

 protected:
  // A point in the enqueued work, and the milliseconds between two once both are done. The
  // default is the host clock (right for a backend whose operations finish when they return).
  virtual std::shared_ptr<void> time_mark();
  virtual double elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to);

  bool bf16_matmuls_ = false;

 private:
  struct Span {
    const char* label;
    std::shared_ptr<void> from, to;
  };
  bool profiling_ = false;
  std::vector<Span> spans_;
};

// A markdown table of `entries` (one take_profile over `steps` training steps): per label its
// calls and milliseconds per step and its share of `step_ms` (the measured wall time of one
// step), then the sum and the rest of the step (host work, launch gaps, what no label covers).
std::string fused_profile_table(const std::vector<FusedBackend::ProfileEntry>& entries, int steps,
                                double step_ms);

// Times the operations of its scope (FusedBackend::profile_begin / profile_end) when the
// backend is profiling.
class ProfileScope {
 public:
  ProfileScope(FusedBackend& backend, const char* label)
      : backend_(backend), on_(backend.profiling()) {
    if (on_) backend_.profile_begin(label);
  }
  ~ProfileScope() {
    if (on_) backend_.profile_end();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  FusedBackend& backend_;
  bool on_;
};

// The CPU backend: plain loops, OpenMP over rows, OpenBLAS sgemm for the products.
std::unique_ptr<FusedBackend> make_fused_cpu_backend();

// The CUDA backend on GPU `device`: core/cuda launchers on one non-blocking stream, cuBLAS in
// plain fp32 (no TF32). Unimplemented in builds without CUDA; NotFound without that GPU.
Result<std::unique_ptr<FusedBackend>> make_fused_cuda_backend(int device);

}  // namespace starling::models
