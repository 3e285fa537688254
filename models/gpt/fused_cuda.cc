// The CUDA FusedBackend: core/cuda launchers on one non-blocking stream, cuBLAS in plain fp32,
// memory from a DeviceAllocator. Nothing waits for the device except copy_to_host and
// synchronize. In builds without CUDA, make_fused_cuda_backend says so.
#include "models/gpt/fused_backend.h"

#if defined(STARLING_WITH_CUDA)
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/codec_gpu.h"
#include "core/cuda/handles.h"
#include "core/cuda/kernels.h"

namespace starling::models {
namespace {

constexpr int kIgnoreIndex = -100;  // never a token: every target is in [0, V)

cuda::AttnMaskKind mask_kind(const ops::AttnMask& mask) {
  switch (mask.kind) {
    case ops::AttnMask::Kind::kFull:
      return cuda::AttnMaskKind::kFull;
    case ops::AttnMask::Kind::kCausal:
      return cuda::AttnMaskKind::kCausal;
    case ops::AttnMask::Kind::kBlockCausal:
      return cuda::AttnMaskKind::kBlockCausal;
    case ops::AttnMask::Kind::kBlockDiffusion:
      return cuda::AttnMaskKind::kBlockDiffusion;
  }
  return cuda::AttnMaskKind::kFull;
}

// STARLING_CUDA_ATTENTION: "flash", "materialized" or "bf16" (the tensor-core flash kernels);
// nothing when unset, empty or a typo (which says so).
std::optional<FusedBackend::Attention> attention_from_env() {
  const char* v = std::getenv("STARLING_CUDA_ATTENTION");
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::string_view s(v);
  if (s == "flash") return FusedBackend::Attention::kFlash;
  if (s == "materialized") return FusedBackend::Attention::kMaterialized;
  if (s == "bf16") return FusedBackend::Attention::kFlashBf16;
  spdlog::warn("STARLING_CUDA_ATTENTION={}: not flash, materialized or bf16; ignored", s);
  return std::nullopt;
}

// FusedUpdateCodec over cuda::GpuCodec.
class GpuUpdateCodec final : public FusedUpdateCodec {
 public:
  explicit GpuUpdateCodec(std::unique_ptr<cuda::GpuCodec> codec) : codec_(std::move(codec)) {}
  Status encode_into(const float* delta, compress::EncodedUpdate& out) override {
    return codec_->encode_into(delta, out);
  }
  std::vector<float> persistent_state() override { return codec_->persistent_state(); }
  Status restore_state(std::span<const float> state) override {
    return codec_->restore_state(state);
  }

 private:
  std::unique_ptr<cuda::GpuCodec> codec_;
};

class CudaBackend final : public FusedBackend {
 public:
  explicit CudaBackend(int device)
      : device_(device),
        alloc_(device),
        stream_(cuda::make_stream()),
        cublas_(cuda::make_cublas()),
        env_attention_(attention_from_env()),
        attention_(env_attention_.value_or(Attention::kFlash)) {}

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_.get());
    alloc_.deallocate(scratch_);
    alloc_.deallocate(bf16_);
    alloc_.deallocate(zeros_);
    alloc_.deallocate(cublas_workspace_);
  }

  Status init() {
    // [valid_count: int][dloss = 1: float] then the sum-of-squares partials (doubles).
    ASSIGN_OR_RETURN(scratch_, alloc_.allocate(16 + cuda::kSumSquaresBlocks * sizeof(double)));
    const float one = 1.0f;
    STARLING_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, 16, stream_.get()));
    STARLING_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(scratch_) + 4, &one, sizeof one,
                                        cudaMemcpyHostToDevice, stream_.get()));
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    // A workspace of cuBLAS's own, so that a captured step (CUDA graphs) allocates nothing: 32
    // MiB, cuBLAS's default size on Hopper.
    ASSIGN_OR_RETURN(cublas_workspace_, alloc_.allocate(kCublasWorkspace));
    STARLING_CUBLAS_CHECK(cublasSetWorkspace(cublas_.get(), cublas_workspace_, kCublasWorkspace));
    return ok_status();
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }

  Result<void*> alloc(size_t nbytes) override {
    ASSIGN_OR_RETURN(void* p, alloc_.allocate(nbytes));
    if (p != nullptr) STARLING_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, stream_.get()));
    return p;
  }
  void free(void* p) override {
    // The allocator hands blocks out again in stream order; wait so no queued kernel reads it.
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    alloc_.deallocate(p);
  }
  void copy_to_backend(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    STARLING_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream_.get()));
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes > 0) {
      STARLING_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream_.get()));
    }
    STARLING_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  }
  void zero(void* p, size_t nbytes) override {
    if (nbytes > 0) STARLING_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, stream_.get()));
  }
  void synchronize() override { STARLING_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

  void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                       int c) override {
    // encoder_cuda.cu always adds a position row: without wpe (rotary positions) it adds zeros.
    if (wpe == nullptr) wpe = zero_rows(static_cast<size_t>(t) * c);
    cuda::encoder_forward(out, idx, wte, wpe, b, t, c, stream_.get());
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const EncoderBuckets& bk,
                        int b, int t, int c) override {
    // Without wpe its gradient goes to a scratch block that nothing reads.
    if (dwpe == nullptr) dwpe = zero_rows(static_cast<size_t>(t) * c) + static_cast<size_t>(t) * c;
    cuda::encoder_backward(dwte, dwpe, dout, bk.order, bk.starts, bk.tokens, bk.num_unique, b, t, c,
                           stream_.get());
  }
  void layer_norm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                          const float* bias, int n, int c) override {
    cuda::layer_norm_forward(out, mean, rstd, x, weight, bias, n, c, 1e-5f, stream_.get());
  }
  void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                           const float* x, const float* weight, const float* mean,
                           const float* rstd, int n, int c) override {
    cuda::layer_norm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, n, c, stream_.get());
  }
  void linear_forward(float* out, const float* x, const float* weight, const float* bias, int n,
                      int in, int out_features) override {
    if (bf16_matmuls_) {
      cuda::linear_forward_bf16(out, x, weight, bias, n, in, out_features,
                                bf16_scratch(n, in, out_features), cublas_.get(), stream_.get());
      return;
    }
    cuda::linear_forward(out, x, weight, bias, n, in, out_features, cublas_.get(), stream_.get());
  }
  void linear_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                       const float* weight, int n, int in, int out_features) override {
    if (bf16_matmuls_) {
      cuda::linear_backward_bf16(dx, dweight, dbias, dout, x, weight, n, in, out_features,
                                 bf16_scratch(n, in, out_features), cublas_.get(), stream_.get());
      return;
    }
    cuda::linear_backward(dx, dweight, dbias, dout, x, weight, n, in, out_features, cublas_.get(),
                          stream_.get());
  }
  // Attention: the fp32 flash kernels (no (B, H, T, T) probabilities) for head sizes up to 128,
  // cuBLAS with the probabilities materialized beyond. STARLING_CUDA_ATTENTION=materialized takes
  // cuBLAS everywhere (on the H200 faster at GPT-2's T = 1024 but 10 GB more), =bf16 the
  // tensor-core flash kernels (bf16 operands; measured slower than the fp32 ones so far). See
  // docs/cuda.md, "Flash attention".
  // In the bf16 precision mode the materialized attention's fp32 GEMMs (scores, probabilities
  // times values, and their gradients) run on tensor cores as TF32: 10 mantissa bits, finer than
  // the bf16 operands of the linear layers, so the mode's 1e-2 parity holds, at several times
  // the fp32 FMA rate. fp32 mode keeps IEEE fp32 (the handle's default).
  class Tf32Scope {
   public:
    Tf32Scope(cublasHandle_t h, bool on) : h_(on ? h : nullptr) {
      if (h_) STARLING_CUBLAS_CHECK(cublasSetMathMode(h_, CUBLAS_TF32_TENSOR_OP_MATH));
    }
    ~Tf32Scope() {
      if (h_) cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH);
    }
    Tf32Scope(const Tf32Scope&) = delete;
    Tf32Scope& operator=(const Tf32Scope&) = delete;

   private:
    cublasHandle_t h_;
  };
  void set_attention(Attention a) override {
    if (!env_attention_) attention_ = a;  // STARLING_CUDA_ATTENTION takes precedence
  }
  bool flash(int c, int h) const {
    return attention_ != Attention::kMaterialized && cuda::flash_attention_supported(c / h);
  }
  bool flash_bf16() const { return attention_ == Attention::kFlashBf16; }
  size_t attention_state_floats(int b, int t, int c, int h) const override {
    return flash(c, h) ? static_cast<size_t>(b) * h * t
                       : FusedBackend::attention_state_floats(b, t, c, h);
  }
  size_t attention_scratch_floats(int b, int t, int c, int h) const override {
    return flash(c, h) ? static_cast<size_t>(b) * h * t
                       : FusedBackend::attention_scratch_floats(b, t, c, h);
  }
  void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                         const ops::AttnMask& mask) override {
    const auto kind = mask_kind(mask);
    const int block = static_cast<int>(mask.block);
    if (!flash(c, h)) {
      const Tf32Scope tf32(cublas_.get(), bf16_matmuls_);
      cuda::attention_forward(out, att, qkv, b, t, c, h, kind, block, cublas_.get(), stream_.get());
    } else if (flash_bf16()) {
      cuda::flash_attention_forward_bf16(out, att, qkv, b, t, c, h, kind, block, stream_.get());
    } else {
      cuda::flash_attention_forward(out, att, qkv, b, t, c, h, kind, block, stream_.get());
    }
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int b, int t, int c, int h,
                          const ops::AttnMask& mask) override {
    const auto kind = mask_kind(mask);
    const int block = static_cast<int>(mask.block);
    if (!flash(c, h)) {
      const Tf32Scope tf32(cublas_.get(), bf16_matmuls_);
      cuda::attention_backward(dqkv, scratch, dout, qkv, att, b, t, c, h, cublas_.get(),
                               stream_.get());
    } else if (flash_bf16()) {
      cuda::flash_attention_backward_bf16(dqkv, scratch, dout, qkv, out, att, b, t, c, h, kind,
                                          block, stream_.get());
    } else {
      cuda::flash_attention_backward(dqkv, scratch, dout, qkv, out, att, b, t, c, h, kind, block,
                                     stream_.get());
    }
  }
  void rope(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
            bool inverse) override {
    cuda::rope_packed(qkv, cos, sin, n, c, h, period, inverse, stream_.get());
  }
  void gelu_forward(float* out, const float* x, size_t n) override {
    cuda::gelu_forward(out, x, n, stream_.get());
  }
  void gelu_backward(float* dx, const float* dout, const float* x, size_t n) override {
    cuda::gelu_backward(dx, dout, x, n, stream_.get());
  }
  void residual_add(float* out, const float* a, const float* b, size_t n) override {
    cuda::residual_add(out, a, b, n, stream_.get());
  }
  // The GPT's mean over unpadded rows keeps its kernels (and its results); weights or a padded
  // vocabulary (the MDLM) take the weighted ones.
  void cross_entropy_forward(float* losses, float* loss, const float* logits, const int* targets,
                             const float* weights, int n, int v, int vp) override {
    if (weights == nullptr && v == vp) {
      cuda::cross_entropy_forward(losses, loss, valid_count(), logits, targets, n, v, kIgnoreIndex,
                                  stream_.get());
      return;
    }
    cuda::cross_entropy_weighted_forward(losses, loss, logits, targets, weights, n, v, vp,
                                         stream_.get());
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                              const float* weights, int n, int v, int vp) override {
    if (weights == nullptr && v == vp) {
      cuda::cross_entropy_backward(dlogits, logits, targets, dloss_one(), valid_count(), n, v,
                                   kIgnoreIndex, stream_.get());
      return;
    }
    cuda::cross_entropy_weighted_backward(dlogits, logits, targets, weights, n, v, vp,
                                          stream_.get());
  }
  void adamw(float* params, const float* grads, float* m, float* v, size_t n,
             const FusedAdamW& s) override {
    const cuda::AdamWStep st{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step};
    cuda::adamw_step(params, nullptr, grads, m, v, n, st, stream_.get());
  }
  void sum_squares(double* out, const float* x, size_t n) override {
    cuda::sum_squares(out, partials(), x, n, stream_.get());
  }
  void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm) override {
    cuda::clip_scale(x, n, norm_sq, max_norm, stream_.get());
  }
  void subtract(float* out, const float* a, const float* b, size_t n) override {
    cuda::subtract(out, a, b, n, stream_.get());
  }
  // The GPU codecs on this backend's stream and cuBLAS handle: only the encoded update reaches
  // the host; the error-feedback residual stays on the device.
  Result<std::unique_ptr<FusedUpdateCodec>> make_update_codec(std::string_view spec,
                                                              const compress::Layout& layout,
                                                              uint64_t seed) override {
    bind_thread();
    ASSIGN_OR_RETURN(auto codec,
                     cuda::GpuCodec::make(spec, layout, seed, stream_.get(), cublas_.get()));
    return std::unique_ptr<FusedUpdateCodec>(std::make_unique<GpuUpdateCodec>(std::move(codec)));
  }

  void bind_thread() override { STARLING_CUDA_CHECK(cudaSetDevice(device_)); }
  std::shared_ptr<void> mark() override {
    cudaEvent_t e = nullptr;
    STARLING_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STARLING_CUDA_CHECK(cudaEventRecord(e, stream_.get()));
    return std::shared_ptr<void>(e,
                                 [](void* ev) { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); });
  }
  void wait_marked(const std::shared_ptr<void>& mark) override {
    if (mark) STARLING_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(mark.get())));
  }
  Status begin_capture() override {
    // Thread-local: only this thread's calls are checked, other threads' work (a client's codec
    // thread) goes on.
    const cudaError_t e = cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return unimplemented(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e));
    }
    return ok_status();
  }
  Result<std::shared_ptr<void>> end_capture() override {
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_.get(), &graph);
    if (e != cudaSuccess || graph == nullptr) {
      cudaGetLastError();  // clears the error the failed capture left
      if (graph != nullptr) cudaGraphDestroy(graph);
      return failed_precondition(std::string("the step could not be captured as a CUDA graph (") +
                                 cudaGetErrorString(e) + ")");
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return failed_precondition(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e));
    }
    return std::shared_ptr<void>(
        exec, [](void* p) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(p)); });
  }
  void replay(const std::shared_ptr<void>& graph) override {
    STARLING_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), stream_.get()));
  }

  size_t bytes_in_use() const override { return alloc_.stats().in_use; }
  size_t peak_bytes() const override { return alloc_.stats().peak_in_use; }

  Status set_bf16_matmuls(bool on, size_t scratch_elems) override {
    bf16_matmuls_ = on;
    if (!on || scratch_elems * sizeof(__nv_bfloat16) <= bf16_bytes_) return ok_status();
    synchronize();
    alloc_.deallocate(bf16_);
    bf16_ = nullptr;
    bf16_bytes_ = 0;
    ASSIGN_OR_RETURN(bf16_, alloc_.allocate(scratch_elems * sizeof(__nv_bfloat16)),
                     "bf16 scratch for the linear layers");
    bf16_bytes_ = scratch_elems * sizeof(__nv_bfloat16);
    return ok_status();
  }

 protected:
  // Profiling: timed events on the stream; take_profile synchronizes before reading them.
  std::shared_ptr<void> time_mark() override {
    cudaEvent_t e = nullptr;
    STARLING_CUDA_CHECK(cudaEventCreate(&e));
    STARLING_CUDA_CHECK(cudaEventRecord(e, stream_.get()));
    return std::shared_ptr<void>(e,
                                 [](void* ev) { cudaEventDestroy(static_cast<cudaEvent_t>(ev)); });
  }
  double elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) override {
    float ms = 0.0f;
    STARLING_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.get()),
                                             static_cast<cudaEvent_t>(to.get())));
    return static_cast<double>(ms);
  }

 private:
  int* valid_count() const { return static_cast<int*>(scratch_); }
  const float* dloss_one() const {
    return reinterpret_cast<const float*>(static_cast<char*>(scratch_) + 4);
  }
  double* partials() const { return reinterpret_cast<double*>(static_cast<char*>(scratch_) + 16); }

  // 2 * elems floats, the first elems of them zero (the absent wpe's rows, then the scratch of
  // its discarded gradient); grown when a call needs more.
  float* zero_rows(size_t elems) {
    if (2 * elems > zero_elems_) {
      synchronize();  // queued kernels may still read the old block
      alloc_.deallocate(zeros_);
      zeros_ = nullptr;
      zero_elems_ = 0;
      auto p = alloc_.allocate(2 * elems * sizeof(float));
      if (!p.ok()) {
        spdlog::critical("cuda:{}: {} bytes for the rotary trunk's zero positions: {}", device_,
                         2 * elems * sizeof(float), p.status().to_string());
        std::abort();
      }
      zeros_ = *p;
      zero_elems_ = 2 * elems;
      STARLING_CUDA_CHECK(cudaMemsetAsync(zeros_, 0, 2 * elems * sizeof(float), stream_.get()));
    }
    return static_cast<float*>(zeros_);
  }

  // The bf16 copies of a linear layer's inputs (reserved by set_bf16_matmuls for the largest
  // layer; grown here only for a call larger than that).
  __nv_bfloat16* bf16_scratch(int n, int in, int out) {
    const size_t need = cuda::linear_bf16_scratch_elems(n, in, out) * sizeof(__nv_bfloat16);
    if (need > bf16_bytes_) {
      synchronize();  // queued GEMMs may still read the old block
      alloc_.deallocate(bf16_);
      bf16_ = nullptr;
      bf16_bytes_ = 0;
      auto p = alloc_.allocate(need);
      if (!p.ok()) {
        spdlog::critical("cuda:{}: bf16 scratch of {} bytes: {}", device_, need,
                         p.status().to_string());
        std::abort();
      }
      bf16_ = *p;
      bf16_bytes_ = need;
    }
    return static_cast<__nv_bfloat16*>(bf16_);
  }

  int device_;
  cuda::DeviceAllocator alloc_;
  void* bf16_ = nullptr;
  size_t bf16_bytes_ = 0;
  cuda::Stream stream_;
  cuda::CublasHandle cublas_;
  static constexpr size_t kCublasWorkspace = size_t{32} << 20;
  void* cublas_workspace_ = nullptr;
  std::optional<Attention> env_attention_;  // set: it wins over set_attention
  Attention attention_ = Attention::kFlash;
  void* scratch_ = nullptr;
  void* zeros_ = nullptr;  // zero_rows()
  size_t zero_elems_ = 0;
};

}  // namespace

Result<std::unique_ptr<FusedBackend>> make_fused_cuda_backend(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();  // clear the error state of a failed query
    return not_found("--gpus " + std::to_string(device) + ": no such CUDA device (" +
                     std::to_string(count) + " visible)");
  }
  STARLING_CUDA_CHECK(cudaSetDevice(device));
  auto b = std::make_unique<CudaBackend>(device);
  RETURN_IF_ERROR(b->init(), "cuda:" + std::to_string(device));
  return std::unique_ptr<FusedBackend>(std::move(b));
}

}  // namespace starling::models

#else

namespace starling::models {

Result<std::unique_ptr<FusedBackend>> make_fused_cuda_backend(int device) {
  return unimplemented("cuda:" + std::to_string(device) +
                       ": this starling build has no CUDA backend (configure with the cuda "
                       "preset on a machine with the CUDA toolkit)");
}

}  // namespace starling::models

#endif
