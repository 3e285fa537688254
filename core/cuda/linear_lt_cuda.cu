// linear_forward_lt: y = x weight^T + bias as one cuBLASLt matmul with the BIAS epilogue, in
// plain fp32 compute (no TF32). Column-major view: y^T (OUT, N) = weight (OUT, IN) x^T, with the
// bias broadcast along y^T's columns.
#include <memory>

#include "core/cuda/check.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

Layout layout(int rows, int cols, int ld) {
  cublasLtMatrixLayout_t l = nullptr;
  STARLING_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld));
  return Layout(l);
}

}  // namespace

void linear_forward_lt(float* y, const float* x, const float* weight, const float* bias, int n,
                       int in, int out, cublasLtHandle_t lt, void* workspace,
                       size_t workspace_bytes, cublasHandle_t handle, cudaStream_t stream) {
  if (n == 0 || out == 0) return;
  cublasLtMatmulDesc_t d = nullptr;
  STARLING_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MatmulDesc desc(d);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  STARLING_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STARLING_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    STARLING_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    STARLING_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // weight memory is (IN, OUT) column-major, transposed to (OUT, IN); x is (IN, N); y (OUT, N).
  Layout a = layout(in, out, in), b = layout(in, n, in), c = layout(out, n, out);
  cublasLtMatmulPreference_t p = nullptr;
  STARLING_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p));
  Preference pref(p);
  STARLING_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, d, a.get(), b.get(), c.get(),
                                                           c.get(), p, 1, &heur, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    linear_forward(y, x, weight, bias, n, in, out, handle, stream);
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  STARLING_CUBLAS_CHECK(cublasLtMatmul(lt, d, &alpha, weight, a.get(), x, b.get(), &beta, y,
                                       c.get(), y, c.get(), &heur.algo, workspace, workspace_bytes,
                                       stream));
}

}  // namespace starling::cuda
