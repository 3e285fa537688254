// CPU matrix products: OpenBLAS sgemm/dgemm (float products of a few rows: small_gemm.h), with
// the backward products of each.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/internal/small_gemm.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"

namespace starling::ops {

namespace internal {
namespace {

// Products of a few rows (a decode step: one new token per sequence) as one matrix-vector
// product per row: OpenBLAS's gemm packs all of B first and is 2-10x slower at these shapes.
constexpr int64_t kGemvRows = 4;

bool few_rows(int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvRows && n > 0 && k > 0;
}

// Row r of C (n) = alpha op(A)[r] op(B) + beta C[r], op(B) (k, n): B is stored (n, k) when tb,
// else (k, n); row r of op(A) is A's column r when ta.
template <typename T, typename Gemv>
void gemm_rows(Gemv gemv, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t r = 0; r < m; ++r) {
    T* y = c + r * ldc;
    if (beta == T(0)) std::fill_n(y, n, T(0));  // never read the old contents (maybe NaN)
    gemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, static_cast<blasint>(tb ? n : k),
         static_cast<blasint>(tb ? k : n), alpha, b, static_cast<blasint>(ldb),
         ta ? a + r : a + r * lda, static_cast<blasint>(ta ? lda : 1), beta, y, 1);
  }
}

// Products below this many multiply-adds run on the calling thread: OpenBLAS would split them
// over every thread, and waking the team costs more than the product (the MNIST 2NN's step took
// 2.5x longer on 2 threads than on 1).
constexpr int64_t kSerialMacs = int64_t{1} << 22;

// OpenBLAS's OpenMP build sizes its team by the caller's omp_get_max_threads().
class SerialBlas {
 public:
  explicit SerialBlas(bool on) : before_(on ? omp_get_max_threads() : 0) {
    if (on) omp_set_num_threads(1);
  }
  ~SerialBlas() {
    if (before_ > 0) omp_set_num_threads(before_);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  int before_;
};

bool serial(int64_t m, int64_t n, int64_t k) { return m * n * k < kSerialMacs; }

// Where small_gemm takes over from OpenBLAS: B of at least this many elements, whose packing
// is the cost it saves (a dense layer's weight; not attention's per-head products, whose
// results then stay those of one code path for any number of rows).
constexpr int64_t kSmallGemmMinB = int64_t{1} << 16;

// C = alpha A op(B) + beta C for A of at most kSmallGemmRows rows (small_gemm.h), its columns
// split over threads when the product is large enough to pay for waking them.
void small_float_gemm(bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t parts =
      serial(m, n, k) ? 1
                      : std::clamp<int64_t>(std::min<int64_t>(omp_get_max_threads(), n / 64), 1, n);
  // Column ranges in whole 64s, so each range's vector tiles are the same for any split.
  const int64_t per = (n / 64 + parts - 1) / parts * 64;
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int64_t t = 0; t < parts; ++t) {
    const int64_t n0 = std::min(n, t * per), n1 = t + 1 == parts ? n : std::min(n, n0 + per);
    if (n0 < n1) small_gemm({tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, n0, n1});
  }
}

}  // namespace

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!ta && m >= 1 && m <= kSmallGemmRows && n * k >= kSmallGemmMinB) {
    return small_float_gemm(tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  if (few_rows(m, n, k)) {
    return gemm_rows<float>(cblas_sgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  const SerialBlas one_thread(serial(m, n, k));
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (few_rows(m, n, k)) {
    return gemm_rows<double>(cblas_dgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  const SerialBlas one_thread(serial(m, n, k));
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

}  // namespace internal

namespace {
using internal::dispatch_float;
using internal::gemm;

// A 2-D operand as BLAS sees it: pointer, transposed flag and leading dimension.
struct MatArg {
  Tensor keep;  // holds a contiguous copy when one was needed
  bool trans = false;
  int64_t ld = 0;
};

MatArg as_blas(const Tensor& t) {
  const int64_t r = t.shape()[0], c = t.shape()[1];
  if (t.strides()[1] == 1 && t.strides()[0] >= std::max<int64_t>(c, 1))
    return {t, false, t.strides()[0]};
  if (t.strides()[0] == 1 && t.strides()[1] >= std::max<int64_t>(r, 1))
    return {t, true, t.strides()[1]};
  Tensor cc = t.contiguous();
  return {cc, false, std::max<int64_t>(c, 1)};
}

// out (M,N) = op(a) (M,K) * op(b) (K,N), where a and b are 2-D views; `ta`/`tb` request an
// extra logical transpose on top of the view.
template <typename T>
void mm2d(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& out, T beta, T alpha = T(1)) {
  const MatArg A = as_blas(a), B = as_blas(b);
  const int64_t m = ta ? a.shape()[1] : a.shape()[0];
  const int64_t k = ta ? a.shape()[0] : a.shape()[1];
  const int64_t n = tb ? b.shape()[0] : b.shape()[1];
  gemm<T>(A.trans != ta, B.trans != tb, m, n, k, alpha, A.keep.data<T>(), A.ld, B.keep.data<T>(),
          B.ld, beta, out.data<T>(), n);
}

// Fills every row of out (rows, out_f) with `bias` and returns the beta that accumulates the
// product onto it (1), or returns 0 without a bias.
template <typename T>
T start_with_bias(const Tensor& bias, Tensor& out, const char* op) {
  if (!bias.defined()) return T(0);
  const int64_t rows = out.shape()[0], out_f = out.shape()[1];
  STARLING_OP_CHECK(bias.numel() == out_f && bias.dtype() == out.dtype(), op, "bad bias");
  const Tensor bc = bias.contiguous();
  const T* pb = bc.data<T>();
  T* po = out.data<T>();
  for (int64_t r = 0; r < rows; ++r) std::copy(pb, pb + out_f, po + r * out_f);
  return T(1);
}

Tensor flatten_rows(const Tensor& t) {
  const int64_t k = t.shape().back();
  return t.reshape({t.numel() / std::max<int64_t>(k, 1), k});
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  STARLING_OP_CHECK(a.dtype() == b.dtype(), "matmul", "dtype mismatch");
  STARLING_OP_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul", "operands must be at least 2-D");
  const int64_t k = a.shape().back();
  STARLING_OP_CHECK(
      b.shape()[b.dim() - 2] == k, "matmul",
      "inner dimensions differ: " + shape_str(a.shape()) + " x " + shape_str(b.shape()));
  if (b.dim() == 2) {
    const Tensor a2 = a.dim() == 2 ? a : flatten_rows(a);
    const int64_t n = b.shape()[1];
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(n);
    Tensor out = Tensor::uninitialized({a2.shape()[0], n}, a.dtype());
    dispatch_float(a.dtype(), "matmul",
                   [&]<typename T>() { mm2d<T>(a2, false, b, false, out, T(0)); });
    out = out.view(out_shape);
    if (!autograd::needs_grad({&a, &b})) return out;
    const Tensor da = a2.detach(), db = b.detach();
    const Shape a_shape = a.shape();
    return autograd::record(out, "matmul", {a, b}, [da, db, a_shape](const Tensor& g) {
      const Tensor g2 = flatten_rows(g.contiguous());
      Tensor ga = Tensor::uninitialized(da.shape(), da.dtype());
      Tensor gb = Tensor::uninitialized(db.shape(), db.dtype());
      dispatch_float(da.dtype(), "matmul", [&]<typename T>() {
        mm2d<T>(g2, false, db, true, ga, T(0));  // (M,N) x (N,K)
        mm2d<T>(da, true, g2, false, gb, T(0));  // (K,M) x (M,N)
      });
      return std::vector<Tensor>{ga.view(a_shape), gb};
    });
  }
  // Batched: equal leading dims.
  STARLING_OP_CHECK(a.dim() == b.dim(), "matmul", "batched operands need the same rank");
  for (int64_t i = 0; i + 2 < a.dim(); ++i) {
    STARLING_OP_CHECK(a.shape()[i] == b.shape()[i], "matmul",
                      "batch dims differ: " + shape_str(a.shape()) + " x " + shape_str(b.shape()));
  }
  const int64_t m = a.shape()[a.dim() - 2], n = b.shape().back();
  const Tensor a3 = a.reshape({-1, m, k}), b3 = b.reshape({-1, k, n});
  const int64_t batch = a3.shape()[0];
  Shape out_shape(a.shape().begin(), a.shape().end() - 1);
  out_shape.push_back(n);
  Tensor out = Tensor::uninitialized({batch, m, n}, a.dtype());
  dispatch_float(a.dtype(), "matmul", [&]<typename T>() {
    for (int64_t i = 0; i < batch; ++i) {
      Tensor oi = out.select(0, i);
      mm2d<T>(a3.select(0, i), false, b3.select(0, i), false, oi, T(0));
    }
  });
  out = out.view(out_shape);
  if (!autograd::needs_grad({&a, &b})) return out;
  const Tensor da = a3.detach(), db = b3.detach();
  const Shape a_shape = a.shape(), b_shape = b.shape();
  return autograd::record(out, "bmm", {a, b}, [da, db, a_shape, b_shape](const Tensor& g) {
    const Tensor g3 = g.contiguous().view({da.shape()[0], da.shape()[1], db.shape()[2]});
    Tensor ga = Tensor::uninitialized(da.shape(), da.dtype());
    Tensor gb = Tensor::uninitialized(db.shape(), db.dtype());
    dispatch_float(da.dtype(), "matmul", [&]<typename T>() {
      for (int64_t i = 0; i < da.shape()[0]; ++i) {
        Tensor gai = ga.select(0, i), gbi = gb.select(0, i);
        mm2d<T>(g3.select(0, i), false, db.select(0, i), true, gai, T(0));
        mm2d<T>(da.select(0, i), true, g3.select(0, i), false, gbi, T(0));
      }
    });
    return std::vector<Tensor>{ga.view(a_shape), gb.view(b_shape)};
  });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  STARLING_OP_CHECK(w.dim() == 2, "linear", "weight must be (out, in)");
  STARLING_OP_CHECK(
      x.shape().back() == w.shape()[1], "linear",
      "input " + shape_str(x.shape()) + " does not match weight " + shape_str(w.shape()));
  if (internal::any_on_device({&x, &w, &bias})) {
    return internal::device_ops_for("linear", {&x, &w, &bias}).linear(x, w, bias);
  }
  STARLING_OP_CHECK(x.dtype() == w.dtype(), "linear", "dtype mismatch");
  const Tensor x2 = flatten_rows(x);
  const int64_t rows = x2.shape()[0], out_f = w.shape()[0];
  Tensor out = Tensor::uninitialized({rows, out_f}, x.dtype());
  dispatch_float(x.dtype(), "linear", [&]<typename T>() {
    mm2d<T>(x2, false, w, true, out, start_with_bias<T>(bias, out, "linear"));
  });
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_f);
  out = out.view(out_shape);
  if (!autograd::needs_grad({&x, &w, &bias})) return out;
  const Tensor dx = x2.detach(), dw = w.detach();
  const Shape x_shape = x.shape();
  // A frozen weight or bias (LoRA's base) gets no gradient: its (out, in) product is skipped.
  const bool need_b = bias.defined() && bias.requires_grad();
  const bool need_x = x.requires_grad();
  const bool need_w = w.requires_grad();
  return autograd::record(out, "linear", {x, w, bias},
                          [dx, dw, x_shape, need_b, need_x, need_w](const Tensor& g) {
                            const Tensor g2 = flatten_rows(g.contiguous());
                            std::vector<Tensor> r(3);
                            dispatch_float(dx.dtype(), "linear", [&]<typename T>() {
                              if (need_x) {
                                Tensor gx = Tensor::uninitialized(dx.shape(), dx.dtype());
                                mm2d<T>(g2, false, dw, false, gx, T(0));  // (R,out) x (out,in)
                                r[0] = gx.view(x_shape);
                              }
                              if (need_w) {
                                Tensor gw = Tensor::uninitialized(dw.shape(), dw.dtype());
                                mm2d<T>(g2, true, dx, false, gw, T(0));  // (out,R) x (R,in)
                                r[1] = gw;
                              }
                              if (need_b) r[2] = sum(g2, 0, false);
                            });
                            return r;
                          });
}

Tensor lora_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& a,
                   const Tensor& b, double scale) {
  STARLING_OP_CHECK(w.dim() == 2 && a.dim() == 2 && b.dim() == 2, "lora_linear",
                    "w (out, in), a (rank, in) and b (out, rank) must be 2-D");
  const int64_t in_f = w.shape()[1], out_f = w.shape()[0], rank = a.shape()[0];
  STARLING_OP_CHECK(x.shape().back() == in_f && a.shape()[1] == in_f && b.shape()[0] == out_f &&
                        b.shape()[1] == rank,
                    "lora_linear",
                    "input " + shape_str(x.shape()) + ", weight " + shape_str(w.shape()) + ", A " +
                        shape_str(a.shape()) + ", B " + shape_str(b.shape()) + " do not fit");
  STARLING_OP_CHECK(x.dtype() == w.dtype() && a.dtype() == w.dtype() && b.dtype() == w.dtype(),
                    "lora_linear", "dtype mismatch");
  const Tensor x2 = flatten_rows(x);
  const int64_t rows = x2.shape()[0];
  Tensor out = Tensor::uninitialized({rows, out_f}, x.dtype());
  Tensor u = Tensor::uninitialized({rows, rank}, x.dtype());  // scale * x A^T
  dispatch_float(x.dtype(), "lora_linear", [&]<typename T>() {
    mm2d<T>(x2, false, w, true, out, start_with_bias<T>(bias, out, "lora_linear"));
    mm2d<T>(x2, false, a, true, u, T(0), static_cast<T>(scale));
    mm2d<T>(u, false, b, true, out, T(1));
  });
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_f);
  out = out.view(out_shape);
  if (!autograd::needs_grad({&x, &w, &bias, &a, &b})) return out;
  const Tensor dx = x2.detach(), dw = w.detach(), da = a.detach(), db = b.detach();
  const Shape x_shape = x.shape();
  const bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_a = a.requires_grad(),
             need_b = b.requires_grad(), need_bias = bias.defined() && bias.requires_grad();
  // Saved: the input (alive anyway as the previous op's output), the weights and u (rows x
  // rank). The base output, B A x and its scaled copy of an unfused layer are never kept.
  return autograd::record(
      out, "lora_linear", {x, w, bias, a, b},
      [dx, dw, da, db, u, x_shape, scale, need_x, need_w, need_a, need_b,
       need_bias](const Tensor& g) {
        const Tensor g2 = flatten_rows(g.contiguous());
        const int64_t rows_g = g2.shape()[0], rank_g = da.shape()[0];
        std::vector<Tensor> r(5);
        dispatch_float(dx.dtype(), "lora_linear", [&]<typename T>() {
          // gu = scale * g B: (rows, rank), the gradient reaching x A^T.
          Tensor gu = Tensor::uninitialized({rows_g, rank_g}, dx.dtype());
          if (need_x || need_a) mm2d<T>(g2, false, db, false, gu, T(0), static_cast<T>(scale));
          if (need_x) {
            Tensor gx = Tensor::uninitialized(dx.shape(), dx.dtype());
            mm2d<T>(g2, false, dw, false, gx, T(0));  // g W
            mm2d<T>(gu, false, da, false, gx, T(1));  // + scale g B A
            r[0] = gx.view(x_shape);
          }
          if (need_w) {
            Tensor gw = Tensor::uninitialized(dw.shape(), dw.dtype());
            mm2d<T>(g2, true, dx, false, gw, T(0));
            r[1] = gw;
          }
          if (need_bias) r[2] = sum(g2, 0, false);
          if (need_a) {
            Tensor ga = Tensor::uninitialized(da.shape(), da.dtype());
            mm2d<T>(gu, true, dx, false, ga, T(0));  // (rank, rows) x (rows, in)
            r[3] = ga;
          }
          if (need_b) {
            Tensor gb = Tensor::uninitialized(db.shape(), db.dtype());
            mm2d<T>(g2, true, u, false, gb, T(0));  // (out, rows) x (rows, rank)
            r[4] = gb;
          }
        });
        return r;
      });
}

}  // namespace starling::ops
