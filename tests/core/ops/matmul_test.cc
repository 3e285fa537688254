// internal::gemm against a float64 loop: every transpose combination, padded leading
// dimensions, beta 0 over garbage and beta 1, for a few rows (small_gemm for float, the
// matrix-vector path of decode steps for double) and for more (BLAS gemm), on every instruction
// set this CPU runs; and small_gemm's same bits on one and two threads.
#include "core/ops/matmul.h"

#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/ops/internal/conv_kernels.h"
#include "core/util/rng.h"

namespace starling::ops {
namespace {

template <typename T>
void check_gemm(bool ta, bool tb, int64_t m, double beta, double tol, int64_t n = 7,
                int64_t k = 5) {
  const int64_t pad = 3;
  // A is op(A) (m, k) stored (k, m) when ta; B is op(B) (k, n) stored (n, k) when tb.
  const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
  Rng rng(static_cast<uint64_t>(m * 8 + ta * 2 + tb));
  std::vector<T> a(static_cast<size_t>(a_rows * lda)), b(static_cast<size_t>(b_rows * ldb));
  for (auto& e : a) e = static_cast<T>(rng.normal());
  for (auto& e : b) e = static_cast<T>(rng.normal());
  std::vector<T> c(static_cast<size_t>(m * ldc));
  for (auto& e : c) e = beta == 0.0 ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(1.5);
  const auto at = [&](int64_t i, int64_t j) { return ta ? a[j * lda + i] : a[i * lda + j]; };
  const auto bt = [&](int64_t i, int64_t j) { return tb ? b[j * ldb + i] : b[i * ldb + j]; };
  internal::gemm<T>(ta, tb, m, n, k, T(0.5), a.data(), lda, b.data(), ldb, static_cast<T>(beta),
                    c.data(), ldc);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = beta * 1.5;
      for (int64_t p = 0; p < k; ++p) {
        want += 0.5 * static_cast<double>(at(i, p)) * static_cast<double>(bt(p, j));
      }
      INFO("ta " << ta << " tb " << tb << " m " << m << " beta " << beta << " at " << i << ","
                 << j);
      CHECK(std::abs(static_cast<double>(c[i * ldc + j]) - want) < tol * (1.0 + std::sqrt(k)));
    }
    // The padding between rows is not written.
    for (int64_t j = n; j < ldc; ++j) {
      const double v = static_cast<double>(c[i * ldc + j]);
      CHECK((beta == 0.0 ? std::isnan(v) : v == 1.5));
    }
  }
}

TEST_CASE("gemm matches float64 for few and many rows, all transposes", "[ops]") {
  const int64_t m = GENERATE(1, 3, 4, 5, 9);  // 1-4: one matrix-vector product per row
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const double beta = GENERATE(0.0, 1.0);
  check_gemm<float>(ta, tb, m, beta, 1e-5);
  check_gemm<double>(ta, tb, m, beta, 1e-12);
}

struct IsaGuard {
  internal::ConvIsa before;
  explicit IsaGuard(internal::ConvIsa isa) : before(internal::force_conv_isa(isa)) {}
  ~IsaGuard() { internal::force_conv_isa(before); }
};

TEST_CASE("small_gemm: few float rows against float64 on every instruction set", "[ops]") {
  // Rows up to 16 (17: BLAS).
  const int64_t m = GENERATE(1, 2, 7, 8, 10, 16, 17);
  const bool tb = GENERATE(false, true);
  // B of 64K elements or more (below that, BLAS keeps the product): vector tails in k and n.
  const auto nk =
      GENERATE(std::pair<int64_t, int64_t>{300, 257}, std::pair<int64_t, int64_t>{1000, 70},
               std::pair<int64_t, int64_t>{96, 700});
  for (internal::ConvIsa isa :
       {internal::ConvIsa::kGeneric, internal::ConvIsa::kAvx2, internal::ConvIsa::kAvx512}) {
    if (!internal::conv_isa_supported(isa)) continue;
    CAPTURE(internal::conv_isa_name(isa), m, tb, nk.first, nk.second);
    const IsaGuard guard(isa);
    for (const double beta : {0.0, 1.0})
      check_gemm<float>(false, tb, m, beta, 1e-5, nk.first, nk.second);
  }
}

TEST_CASE("small_gemm gives the same bits on one and two threads", "[ops]") {
  // The CNN's first dense layer at batch 10, forward (A B^T) and input gradient (A B).
  const int64_t m = 10, n = 515, k = 3136;
  Rng rng(9);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(n * k));
  for (auto& e : a) e = static_cast<float>(rng.normal());
  for (auto& e : b) e = static_cast<float>(rng.normal());
  const int before = omp_get_max_threads();
  for (const bool tb : {true, false}) {
    const int64_t cols = tb ? n : k, depth = tb ? k : n;
    std::vector<float> one(static_cast<size_t>(m * cols)), two(one.size());
    omp_set_num_threads(1);
    internal::gemm<float>(false, tb, m, cols, depth, 1.0f, a.data(), depth, b.data(),
                          tb ? depth : cols, 0.0f, one.data(), cols);
    omp_set_num_threads(2);
    internal::gemm<float>(false, tb, m, cols, depth, 1.0f, a.data(), depth, b.data(),
                          tb ? depth : cols, 0.0f, two.data(), cols);
    CHECK(one == two);
  }
  omp_set_num_threads(before);
}

}  // namespace
}  // namespace starling::ops
