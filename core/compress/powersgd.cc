// PowerSGD (Vogels et al. 2019): one power-iteration step per round with the previous round's Q
// as the start, P = orth(M Q), Q = M^T P, sent as P and Q^T; the receiver adds P Q^T.
#include <algorithm>
#include <cmath>

#include "core/compress/internal/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define STARLING_COMPRESS_X86 1
#endif

namespace starling::compress::internal {
namespace {

// Orthonormalizes the columns of p (rows x rank, row-major) by modified Gram-Schmidt in double;
// a column that is (numerically) in the span of the previous ones becomes zero.
void orthonormalize(float* p, int64_t rows, int rank) {
  std::vector<double> col(static_cast<size_t>(rows));
  std::vector<double> basis(static_cast<size_t>(rows * rank), 0.0);
  for (int c = 0; c < rank; ++c) {
    double before = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      col[static_cast<size_t>(i)] = p[i * rank + c];
      before += col[static_cast<size_t>(i)] * col[static_cast<size_t>(i)];
    }
    for (int b = 0; b < c; ++b) {
      const double* q = &basis[static_cast<size_t>(b * rows)];
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i) dot += q[i] * col[static_cast<size_t>(i)];
      for (int64_t i = 0; i < rows; ++i) col[static_cast<size_t>(i)] -= dot * q[i];
    }
    double norm = 0.0;
    for (int64_t i = 0; i < rows; ++i)
      norm += col[static_cast<size_t>(i)] * col[static_cast<size_t>(i)];
    norm = std::sqrt(norm);
    const bool keep = norm > 1e-6 * std::sqrt(before) && norm > 1e-30;
    double* q = &basis[static_cast<size_t>(c * rows)];
    for (int64_t i = 0; i < rows; ++i) {
      q[i] = keep ? col[static_cast<size_t>(i)] / norm : 0.0;
      p[i * rank + c] = static_cast<float>(q[i]);
    }
  }
}

}  // namespace

// The plain loops; the AVX2 versions below do the same operations in the same order per element.
void powersgd_project_scalar(const float* m, int64_t rows, int64_t cols, const float* qt, int r,
                             float* p) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int c = 0; c < r; ++c) {
      const float* qc = qt + c * cols;
      float acc[8] = {};
      int64_t j = 0;
      for (; j + 8 <= cols; j += 8) {
        for (int u = 0; u < 8; ++u) acc[u] += mi[j + u] * qc[j + u];
      }
      for (; j < cols; ++j) acc[0] += mi[j] * qc[j];
      p[i * r + c] =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
}

void powersgd_back_scalar(const float* m, int64_t rows, int64_t cols, const float* p, int r,
                          float* qt) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int c = 0; c < r; ++c) {
      const float pc = p[i * r + c];
      float* qc = qt + c * cols;
      for (int64_t j = 0; j < cols; ++j) qc[j] += pc * mi[j];
    }
  }
}

void powersgd_decode_add_scalar(const float* p, const float* q, int64_t rows, int64_t cols,
                                int rank, float* dst, float weight) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * rank;
    const float p0 = pi[0];
    for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] = p0 * q[j];
    for (int c = 1; c < rank; ++c) {
      const float pc = pi[c];
      const float* qc = q + c * cols;
      for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] += pc * qc[j];
    }
    float* d = dst + i * cols;
    for (int64_t j = 0; j < cols; ++j) d[j] += weight * row[static_cast<size_t>(j)];
  }
}

namespace {
#ifdef STARLING_COMPRESS_X86
bool has_avx2() {
  static const bool kHas = __builtin_cpu_supports("avx2");
  return kHas;
}

__attribute__((target("avx2"))) void project_avx2(const float* m, int64_t rows, int64_t cols,
                                                  const float* qt, int r, float* p) {
  // Up to four columns of Q per pass over a row of M: independent accumulator chains.
  for (int64_t i = 0; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int c0 = 0; c0 < r; c0 += 4) {
      const int cnt = std::min(4, r - c0);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      int64_t j = 0;
      for (; j + 8 <= cols; j += 8) {
        const __m256 mv = _mm256_loadu_ps(mi + j);
        for (int u = 0; u < cnt; ++u) {
          const float* qc = qt + (c0 + u) * cols;
          acc[u] = _mm256_add_ps(acc[u], _mm256_mul_ps(mv, _mm256_loadu_ps(qc + j)));
        }
      }
      for (int u = 0; u < cnt; ++u) {
        const float* qc = qt + (c0 + u) * cols;
        alignas(32) float a[8];
        _mm256_store_ps(a, acc[u]);
        for (int64_t t = j; t < cols; ++t) a[0] += mi[t] * qc[t];
        p[i * r + c0 + u] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      }
    }
  }
}

__attribute__((target("avx2"))) void back_avx2(const float* m, int64_t rows, int64_t cols,
                                               const float* p, int r, float* qt) {
  // Four rows of M per pass over Q^T: each element still adds its rows' products in row order,
  // with a quarter of the loads and stores of Q^T.
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float* m0 = m + i * cols;
    for (int c = 0; c < r; ++c) {
      const __m256 p0 = _mm256_set1_ps(p[i * r + c]), p1 = _mm256_set1_ps(p[(i + 1) * r + c]);
      const __m256 p2 = _mm256_set1_ps(p[(i + 2) * r + c]), p3 = _mm256_set1_ps(p[(i + 3) * r + c]);
      float* qc = qt + c * cols;
      int64_t j = 0;
      for (; j + 8 <= cols; j += 8) {
        __m256 v = _mm256_loadu_ps(qc + j);
        v = _mm256_add_ps(v, _mm256_mul_ps(p0, _mm256_loadu_ps(m0 + j)));
        v = _mm256_add_ps(v, _mm256_mul_ps(p1, _mm256_loadu_ps(m0 + cols + j)));
        v = _mm256_add_ps(v, _mm256_mul_ps(p2, _mm256_loadu_ps(m0 + 2 * cols + j)));
        v = _mm256_add_ps(v, _mm256_mul_ps(p3, _mm256_loadu_ps(m0 + 3 * cols + j)));
        _mm256_storeu_ps(qc + j, v);
      }
      for (; j < cols; ++j) {
        for (int u = 0; u < 4; ++u) qc[j] += p[(i + u) * r + c] * m0[u * cols + j];
      }
    }
  }
  for (; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int c = 0; c < r; ++c) {
      const float pc = p[i * r + c];
      float* qc = qt + c * cols;
      const __m256 vp = _mm256_set1_ps(pc);
      int64_t j = 0;
      for (; j + 8 <= cols; j += 8) {
        const __m256 prod = _mm256_mul_ps(vp, _mm256_loadu_ps(mi + j));
        _mm256_storeu_ps(qc + j, _mm256_add_ps(_mm256_loadu_ps(qc + j), prod));
      }
      for (; j < cols; ++j) qc[j] += pc * mi[j];
    }
  }
}

__attribute__((target("avx2"))) void decode_add_avx2(const float* p, const float* q, int64_t rows,
                                                     int64_t cols, int rank, float* dst,
                                                     float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * rank;
    float* d = dst + i * cols;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      __m256 v = _mm256_mul_ps(_mm256_set1_ps(pi[0]), _mm256_loadu_ps(q + j));
      for (int c = 1; c < rank; ++c) {
        v = _mm256_add_ps(v,
                          _mm256_mul_ps(_mm256_set1_ps(pi[c]), _mm256_loadu_ps(q + c * cols + j)));
      }
      _mm256_storeu_ps(d + j, _mm256_add_ps(_mm256_loadu_ps(d + j), _mm256_mul_ps(w, v)));
    }
    for (; j < cols; ++j) {
      float v = pi[0] * q[j];
      for (int c = 1; c < rank; ++c) v += pi[c] * q[c * cols + j];
      d[j] += weight * v;
    }
  }
}
#endif

}  // namespace

void powersgd_project(const float* m, int64_t rows, int64_t cols, const float* qt, int r,
                      float* p) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2()) return project_avx2(m, rows, cols, qt, r, p);
#endif
  powersgd_project_scalar(m, rows, cols, qt, r, p);
}

void powersgd_back(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* qt) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2()) return back_avx2(m, rows, cols, p, r, qt);
#endif
  powersgd_back_scalar(m, rows, cols, p, r, qt);
}

void powersgd_decode_add(const float* p, const float* q, int64_t rows, int64_t cols, int rank,
                         float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2()) return decode_add_avx2(p, q, rows, cols, rank, dst, weight);
#endif
  powersgd_decode_add_scalar(p, q, rows, cols, rank, dst, weight);
}

bool powersgd_applies(const Shape& shape, int rank, int64_t* rows, int64_t* cols) {
  if (shape.size() < 2 || shape[0] <= 0) return false;
  const int64_t n = shape_numel(shape);
  if (n <= 0) return false;
  *rows = shape[0];
  *cols = n / shape[0];
  return static_cast<int64_t>(rank) * (*rows + *cols) < n;
}

Status TensorEncoder::encode_powersgd(std::span<const float> x, Segment& seg) {
  int64_t rows = 0, cols = 0;
  const int r = spec_.rank;
  if (!powersgd_applies(info_.shape, r, &rows, &cols)) {
    seg.codec = CodecKind::kIdentity;
    seg.f32.resize(x.size());
    if (copy_floats(x, seg.f32.data())) return invalid_argument("non-finite value in the update");
    return ok_status();
  }
  const size_t qn = static_cast<size_t>(r * cols);
  if (q_.size() != qn) {
    q_.resize(qn);
    for (auto& v : q_) v = static_cast<float>(rng_.normal());
  }
  seg.rank = r;
  seg.f32.assign(static_cast<size_t>(r * (rows + cols)), 0.0f);
  float* p = seg.f32.data();
  float* qt = p + rows * r;
  const float* m = x.data();
  // Every P[i][c] sums M[i][j] * Q[j][c] over the whole row, so an inf or NaN anywhere in M
  // leaves one in P: checking the small P replaces a pass over M. (A finite M whose products
  // overflow is refused the same way.)
  powersgd_project(m, rows, cols, q_.data(), r, p);
  if (has_nonfinite(std::span<const float>(p, static_cast<size_t>(rows * r)))) {
    return invalid_argument("non-finite value in the update (or PowerSGD overflow)");
  }
  orthonormalize(p, rows, r);
  powersgd_back(m, rows, cols, p, r, qt);
  if (has_nonfinite(std::span<const float>(qt, qn))) {
    return invalid_argument("PowerSGD overflow in Q = M^T P");
  }
  // Warm start; a factor that vanished (e.g. a zero update) restarts from a random direction.
  std::copy(qt, qt + qn, q_.begin());
  for (int c = 0; c < r; ++c) {
    float* qc = q_.data() + c * cols;
    if (std::all_of(qc, qc + cols, [](float v) { return v == 0.0f; })) {
      for (int64_t j = 0; j < cols; ++j) qc[j] = static_cast<float>(rng_.normal());
    }
  }
  return ok_status();
}

}  // namespace starling::compress::internal
