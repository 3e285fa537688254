// CudnnConv (conv_cudnn.h): fp32 NCHW convolutions through cuDNN's legacy API, one Plan of
// descriptors and algorithm choices per shape. Host code only; it lives in a .cu file so that
// only CUDA builds compile it.
#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/conv_cudnn.h"

// cuDNN 9 marks the whole legacy convolution API deprecated (in favour of the graph API). The
// attribute is inert unless CUDNN_WARN_DEPRECATED is defined; should a build define it, these
// calls are still what we mean to make, so the warning is silenced for this file only. (The
// host compiler is the one that warns; nvcc's front end passes the attribute on silently.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// Returns a Status from the enclosing function when a cuDNN call fails (used in this file only,
// inside namespace starling::cuda, where cudnn_error lives).
#define STARLING_CUDNN_RETURN_IF_ERROR(expr)        \
  do {                                              \
    const cudnnStatus_t starling_cudnn_s = (expr);  \
    if (starling_cudnn_s != CUDNN_STATUS_SUCCESS) { \
      return cudnn_error(starling_cudnn_s, #expr);  \
    }                                               \
  } while (0)

namespace starling::cuda {
namespace {

// Algorithms that would need more workspace than this are passed over.
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

// A cuDNN status as a Status naming the call (the text of `expr` up to its '(').
Status cudnn_error(cudnnStatus_t s, std::string_view expr) {
  std::string msg = "cudnn: ";
  msg += expr.substr(0, expr.find('('));
  msg += ": ";
  msg += cudnnGetErrorString(s);
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') {
    msg += " (";
    msg += detail;
    msg += ")";
  }
  if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return resource_exhausted(std::move(msg));
  }
  switch (CUDNN_STATUS_CATEGORY(static_cast<int>(s))) {
    case CUDNN_STATUS_BAD_PARAM:
      return invalid_argument(std::move(msg));
    case CUDNN_STATUS_NOT_SUPPORTED:
      return unimplemented(std::move(msg));
    case CUDNN_STATUS_CATEGORY(CUDNN_STATUS_NOT_INITIALIZED):  // no GPU, sublibrary missing...
      return failed_precondition(std::move(msg));
    default:
      return internal_error(std::move(msg));
  }
}

struct CudnnDeleter {
  void operator()(cudnnContext* h) const { cudnnDestroy(h); }
  void operator()(cudnnTensorStruct* d) const { cudnnDestroyTensorDescriptor(d); }
  void operator()(cudnnFilterStruct* d) const { cudnnDestroyFilterDescriptor(d); }
  void operator()(cudnnConvolutionStruct* d) const { cudnnDestroyConvolutionDescriptor(d); }
};
using Handle = std::unique_ptr<cudnnContext, CudnnDeleter>;
using TensorDesc = std::unique_ptr<cudnnTensorStruct, CudnnDeleter>;
using FilterDesc = std::unique_ptr<cudnnFilterStruct, CudnnDeleter>;
using ConvDesc = std::unique_ptr<cudnnConvolutionStruct, CudnnDeleter>;

// Returns a workspace block to its allocator when the call that enqueued work on it returns.
struct WorkspaceReturn {
  DeviceAllocator* allocator;
  void operator()(void* p) const { allocator->deallocate(p); }
};
using WorkspaceBlock = std::unique_ptr<void, WorkspaceReturn>;

Result<TensorDesc> tensor_desc(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t d = nullptr;
  STARLING_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&d));
  TensorDesc owned(d);
  STARLING_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  return Result<TensorDesc>(std::move(owned));
}

Result<FilterDesc> filter_desc(int k, int c, int h, int w) {
  cudnnFilterDescriptor_t d = nullptr;
  STARLING_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&d));
  FilterDesc owned(d);
  STARLING_CUDNN_RETURN_IF_ERROR(
      cudnnSetFilter4dDescriptor(d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, h, w));
  return Result<FilterDesc>(std::move(owned));
}

Result<ConvDesc> conv_desc(int stride, int pad, bool tf32) {
  cudnnConvolutionDescriptor_t d = nullptr;
  STARLING_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&d));
  ConvDesc owned(d);
  STARLING_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(
      d, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FMA only by default: CUDNN_DEFAULT_MATH lets fp32 run as TF32 on Ampere and later, which
  // breaks the 1e-5 parity with the CPU reference; the TF32 mode asks for exactly that (as
  // PyTorch's allow_tf32). The heuristics below honour this setting.
  STARLING_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolutionMathType(d, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  return Result<ConvDesc>(std::move(owned));
}

template <typename Algo>
struct Choice {
  bool chosen = false;
  Algo algo{};
  size_t workspace_bytes = 0;
  bool deterministic = true;
};

// Everything cuDNN needs for one ConvShape, built once.
struct Plan {
  ConvShape shape;
  TensorDesc x, y, bias;  // bias: (1, C_out, 1, 1), broadcast over y by cudnnAddTensor
  FilterDesc w;
  ConvDesc conv;
  Choice<cudnnConvolutionFwdAlgo_t> fwd;
  Choice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
};

std::string describe(const ConvShape& s) {
  return "conv2d x=(" + std::to_string(s.b) + "," + std::to_string(s.c_in) + "," +
         std::to_string(s.h) + "," + std::to_string(s.w) + ") w=(" + std::to_string(s.c_out) + "," +
         std::to_string(s.c_in) + "," + std::to_string(s.kh) + "," + std::to_string(s.kw) +
         ") stride=" + std::to_string(s.stride) + " pad=" + std::to_string(s.pad);
}

Status validate(const ConvShape& s) {
  const bool sizes_ok = s.b >= 1 && s.c_in >= 1 && s.h >= 1 && s.w >= 1 && s.c_out >= 1 &&
                        s.kh >= 1 && s.kw >= 1 && s.stride >= 1 && s.pad >= 0;
  // Checked in 64 bits before h_out() runs: C++ division truncates toward zero, so a kernel
  // larger than the padded input by less than a stride would otherwise give H_out = 1.
  if (!sizes_ok || int64_t{s.h} + 2 * int64_t{s.pad} < s.kh ||
      int64_t{s.w} + 2 * int64_t{s.pad} < s.kw || int64_t{s.h} + 2 * int64_t{s.pad} > INT32_MAX ||
      int64_t{s.w} + 2 * int64_t{s.pad} > INT32_MAX) {
    return invalid_argument("cudnn: bad shape " + describe(s));
  }
  return ok_status();
}

// FFT and Winograd transform the operands and round in the transformed domain: their fp32
// results drift from a direct sum by more than the 1e-5 our parity tests hold the GPU to.
bool transform_algo(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_algo(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_algo(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The first of cuDNN's heuristic results, in their order, that is supported, in FMA or default
// math (the descriptor's FMA setting rules out tensor cores either way) and fits the workspace
// limit, taken in four passes: deterministic direct (GEMM-like) algorithms, then any direct
// one, then deterministic transform algorithms (FFT, Winograd), then any. `workspace(algo,
// &bytes)` asks cuDNN for the algorithm's exact workspace.
template <typename Perf, typename Algo, typename WorkspaceFn>
bool pick(const std::vector<Perf>& perfs, int count, WorkspaceFn&& workspace, Choice<Algo>* out,
          bool tf32) {
  for (const bool allow_transform : {tf32, true}) {
    for (const bool need_deterministic : {true, false}) {
      for (int i = 0; i < count; ++i) {
        const Perf& p = perfs[i];
        if (p.status != CUDNN_STATUS_SUCCESS) continue;
        const bool math_ok = p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH ||
                             (tf32 && p.mathType == CUDNN_TENSOR_OP_MATH);
        if (!math_ok) continue;
        if (!allow_transform && transform_algo(p.algo)) continue;
        const bool deterministic = p.determinism == CUDNN_DETERMINISTIC;
        if (need_deterministic && !deterministic) continue;
        size_t bytes = 0;
        if (workspace(p.algo, &bytes) != CUDNN_STATUS_SUCCESS) {
          // Drained so that this expected failure's message is not reported with a later one.
          char ignored[512];
          cudnnGetLastErrorString(ignored, sizeof(ignored));
          continue;
        }
        bytes = std::max(bytes, p.memory);
        if (bytes > kMaxWorkspaceBytes) continue;
        *out = Choice<Algo>{true, p.algo, bytes, deterministic};
        return true;
      }
    }
  }
  return false;
}

// The caller adds the shape as context.
Status no_algorithm(const char* direction) {
  return unimplemented(std::string("cudnn: no supported fp32 (FMA math) ") + direction +
                       " algorithm needing at most 256 MiB of workspace");
}

const char* fwd_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
      return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
      return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
      return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT:
      return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "UNKNOWN";
  }
}

const char* bwd_data_name(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0:
      return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "UNKNOWN";
  }
}

const char* bwd_filter_name(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
      return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
      return "ALGO_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING:
      return "FFT_TILING";
    default:
      return "UNKNOWN";
  }
}

template <typename Algo, typename NameFn>
std::string choice_text(const Choice<Algo>& c, NameFn name) {
  if (!c.chosen) return "-";
  std::string t = name(c.algo);
  if (!c.deterministic) t += "(nondeterministic)";
  return t;
}

}  // namespace

struct CudnnConv::Impl {
  Handle handle;  // declared first: the plans' descriptors go before it
  DeviceAllocator* workspace = nullptr;
  bool tf32 = false;  // create(..., tf32)
  // A model has a handful of distinct convolution shapes; a linear scan beats hashing them.
  std::vector<std::unique_ptr<Plan>> plans;

  const Plan* find(const ConvShape& s) const {
    for (const auto& p : plans) {
      if (p->shape == s) return p.get();
    }
    return nullptr;
  }

  Result<Plan*> plan(const ConvShape& s) {
    for (const auto& p : plans) {
      if (p->shape == s) return p.get();
    }
    auto p = std::make_unique<Plan>();
    p->shape = s;
    ASSIGN_OR_RETURN(p->x, tensor_desc(s.b, s.c_in, s.h, s.w));
    ASSIGN_OR_RETURN(p->y, tensor_desc(s.b, s.c_out, s.h_out(), s.w_out()));
    ASSIGN_OR_RETURN(p->bias, tensor_desc(1, s.c_out, 1, 1));
    ASSIGN_OR_RETURN(p->w, filter_desc(s.c_out, s.c_in, s.kh, s.kw));
    ASSIGN_OR_RETURN(p->conv, conv_desc(s.stride, s.pad, tf32));
    plans.push_back(std::move(p));
    return plans.back().get();
  }

  Status choose_fwd(Plan& p) {
    if (p.fwd.chosen) return ok_status();
    cudnnHandle_t h = handle.get();
    int max_count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(std::max(max_count, 1));
    int count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardAlgorithm_v7(
        h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(), static_cast<int>(perfs.size()), &count,
        perfs.data()));
    auto workspace_fn = [&](cudnnConvolutionFwdAlgo_t a, size_t* bytes) {
      return cudnnGetConvolutionForwardWorkspaceSize(h, p.x.get(), p.w.get(), p.conv.get(),
                                                     p.y.get(), a, bytes);
    };
    if (!pick(perfs, count, workspace_fn, &p.fwd, tf32)) return no_algorithm("forward");
    return ok_status();
  }

  Status choose_bwd_data(Plan& p) {
    if (p.bwd_data.chosen) return ok_status();
    cudnnHandle_t h = handle.get();
    int max_count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(std::max(max_count, 1));
    int count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), static_cast<int>(perfs.size()), &count,
        perfs.data()));
    auto workspace_fn = [&](cudnnConvolutionBwdDataAlgo_t a, size_t* bytes) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w.get(), p.y.get(), p.conv.get(),
                                                          p.x.get(), a, bytes);
    };
    if (!pick(perfs, count, workspace_fn, &p.bwd_data, tf32)) {
      return no_algorithm("backward-data");
    }
    return ok_status();
  }

  Status choose_bwd_filter(Plan& p) {
    if (p.bwd_filter.chosen) return ok_status();
    cudnnHandle_t h = handle.get();
    int max_count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(
        cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(std::max(max_count, 1));
    int count = 0;
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(), static_cast<int>(perfs.size()), &count,
        perfs.data()));
    auto workspace_fn = [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* bytes) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x.get(), p.y.get(), p.conv.get(),
                                                            p.w.get(), a, bytes);
    };
    if (!pick(perfs, count, workspace_fn, &p.bwd_filter, tf32)) {
      return no_algorithm("backward-filter");
    }
    return ok_status();
  }

  // The workspace is handed back to the caching allocator as soon as the work using it is
  // enqueued, before it has run. That is safe because the allocator reuses blocks in stream
  // order and all our work (this call's and whoever gets the block next) is on one stream.
  Result<WorkspaceBlock> take_workspace(size_t bytes) {
    ASSIGN_OR_RETURN(void* p, workspace->allocate(bytes), "cudnn: workspace");
    return WorkspaceBlock(p, WorkspaceReturn{workspace});
  }

  Status forward(float* y, const float* x, const float* w, const float* bias, const float* residual,
                 const ConvShape& s, cudaStream_t stream) {
    ASSIGN_OR_RETURN(Plan * p, plan(s));
    RETURN_IF_ERROR(choose_fwd(*p));
    cudnnHandle_t h = handle.get();
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnSetStream(h, stream));
    ASSIGN_OR_RETURN(WorkspaceBlock ws, take_workspace(p->fwd.workspace_bytes));
    const float one = 1.0f, zero = 0.0f;
    if (residual != nullptr) {
      const size_t bytes =
          sizeof(float) * size_t(s.b) * size_t(s.c_out) * size_t(s.h_out()) * size_t(s.w_out());
      STARLING_CUDA_CHECK(cudaMemcpyAsync(y, residual, bytes, cudaMemcpyDeviceToDevice, stream));
    }
    // beta = 0 means cuDNN never reads y, so stale NaNs in it cannot leak into the result.
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
        h, &one, p->x.get(), x, p->w.get(), w, p->conv.get(), p->fwd.algo, ws.get(),
        p->fwd.workspace_bytes, residual != nullptr ? &one : &zero, p->y.get(), y));
    if (bias != nullptr) {
      STARLING_CUDNN_RETURN_IF_ERROR(
          cudnnAddTensor(h, &one, p->bias.get(), bias, &one, p->y.get(), y));
    }
    return ok_status();
  }

  Status backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  const ConvShape& s, cudaStream_t stream) {
    ASSIGN_OR_RETURN(Plan * p, plan(s));
    if (dx != nullptr) RETURN_IF_ERROR(choose_bwd_data(*p));
    if (dw != nullptr) RETURN_IF_ERROR(choose_bwd_filter(*p));
    cudnnHandle_t h = handle.get();
    STARLING_CUDNN_RETURN_IF_ERROR(cudnnSetStream(h, stream));
    // One block serves both products: they run one after the other on the stream.
    const size_t data_bytes = dx != nullptr ? p->bwd_data.workspace_bytes : 0;
    const size_t filter_bytes = dw != nullptr ? p->bwd_filter.workspace_bytes : 0;
    ASSIGN_OR_RETURN(WorkspaceBlock ws, take_workspace(std::max(data_bytes, filter_bytes)));
    const float one = 1.0f, zero = 0.0f;
    if (dx != nullptr) {
      STARLING_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
          h, &one, p->w.get(), w, p->y.get(), dy, p->conv.get(), p->bwd_data.algo, ws.get(),
          data_bytes, &zero, p->x.get(), dx));
    }
    if (dw != nullptr) {
      STARLING_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
          h, &one, p->x.get(), x, p->y.get(), dy, p->conv.get(), p->bwd_filter.algo, ws.get(),
          filter_bytes, &zero, p->w.get(), dw));
    }
    if (db != nullptr) {
      STARLING_CUDNN_RETURN_IF_ERROR(
          cudnnConvolutionBackwardBias(h, &one, p->y.get(), dy, &zero, p->bias.get(), db));
    }
    return ok_status();
  }
};

CudnnConv::CudnnConv(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnConv::~CudnnConv() = default;

Result<std::unique_ptr<CudnnConv>> CudnnConv::create(DeviceAllocator* workspace, bool tf32) {
  if (workspace == nullptr) return invalid_argument("cudnn: null workspace allocator");
  // cudnnCreate checks its sublibraries against each other, not against the headers we were
  // compiled with: a cuDNN 8 or 10 runtime found first on the library path is caught here.
  const size_t version = cudnnGetVersion();
  if (version / 10000 != CUDNN_MAJOR) {
    return failed_precondition("cudnn: built against cuDNN " + std::to_string(CUDNN_VERSION) +
                               " but loaded " + std::to_string(version) +
                               " (another major version)");
  }
  cudnnHandle_t h = nullptr;
  STARLING_CUDNN_RETURN_IF_ERROR(cudnnCreate(&h));
  auto impl = std::make_unique<Impl>();
  impl->handle.reset(h);
  impl->workspace = workspace;
  impl->tf32 = tf32;
  return std::unique_ptr<CudnnConv>(new CudnnConv(std::move(impl)));
}

Status CudnnConv::forward(float* y, const float* x, const float* w, const float* bias,
                          const float* residual, const ConvShape& s, cudaStream_t stream) {
  RETURN_IF_ERROR(validate(s));
  if (y == nullptr || x == nullptr || w == nullptr) {
    return invalid_argument("cudnn: null y, x or w for " + describe(s));
  }
  if (residual == y) return invalid_argument("cudnn: residual aliases y for " + describe(s));
  RETURN_IF_ERROR(impl_->forward(y, x, w, bias, residual, s, stream), describe(s));
  return ok_status();
}

Status CudnnConv::backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                           const float* w, const ConvShape& s, cudaStream_t stream) {
  RETURN_IF_ERROR(validate(s));
  if (dx == nullptr && dw == nullptr && db == nullptr) return ok_status();
  if (dy == nullptr || (dx != nullptr && w == nullptr) || (dw != nullptr && x == nullptr)) {
    return invalid_argument("cudnn: null dy, or w for dx, or x for dw, for " + describe(s));
  }
  RETURN_IF_ERROR(impl_->backward(dx, dw, db, dy, x, w, s, stream), describe(s));
  return ok_status();
}

std::string CudnnConv::algorithms(const ConvShape& s) const {
  const Plan* p = impl_->find(s);
  if (p == nullptr) return "fwd=- bwd_data=- bwd_filter=-";
  return "fwd=" + choice_text(p->fwd, fwd_name) +
         " bwd_data=" + choice_text(p->bwd_data, bwd_data_name) +
         " bwd_filter=" + choice_text(p->bwd_filter, bwd_filter_name);
}

}  // namespace starling::cuda

#pragma GCC diagnostic pop
