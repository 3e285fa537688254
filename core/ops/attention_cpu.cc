// CPU attention: per (batch, head) BLAS products over strided rows, probabilities kept for
// the backward pass. Parallel over (batch, head); BLAS runs single-threaded inside.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/attention.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/matmul.h"
#include "core/ops/softmax.h"

namespace starling::ops {

namespace {
using internal::gemm;

// Where head h of batch b starts, and the row stride (in elements), for q, k, v and out.
struct Layout {
  int64_t b_stride, h_stride, row_stride;
  int64_t at(int64_t b, int64_t h) const { return b * b_stride + h * h_stride; }
};

// Softmax of row[0, n) over the keys in mask.key_ranges(i, n); the others get probability 0.
template <typename T>
void masked_softmax_row(T* row, int64_t i, int64_t n, const AttnMask& mask) {
  switch (mask.kind) {
    case AttnMask::Kind::kFull:
      internal::softmax_row(row, n, n);
      return;
    case AttnMask::Kind::kCausal:
      internal::softmax_row(row, n, i + 1);
      return;
    default:
      break;
  }
  const auto r = mask.key_ranges(i, n);
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = r[0]; j < r[1]; ++j) mx = std::max(mx, row[j]);
  for (int64_t j = r[2]; j < r[3]; ++j) mx = std::max(mx, row[j]);
  T s = 0;
  for (int64_t j = 0; j < n; ++j) {
    const bool in = (j >= r[0] && j < r[1]) || (j >= r[2] && j < r[3]);
    row[j] = in ? std::exp(row[j] - mx) : T(0);
    s += row[j];
  }
  const T inv = 1 / s;
  for (int64_t j = 0; j < n; ++j) row[j] *= inv;
}

template <typename T>
void attn_forward(const T* q, const T* k, const T* v, Layout in, T* out, Layout ol, T* probs,
                  int64_t B, int64_t H, int64_t Tn, int64_t D, const AttnMask& mask) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    T* p = probs + bh * Tn * Tn;
    const int64_t io = in.at(b, h);
    gemm<T>(false, true, Tn, Tn, D, scale, q + io, in.row_stride, k + io, in.row_stride, T(0), p,
            Tn);
    for (int64_t t = 0; t < Tn; ++t) masked_softmax_row(p + t * Tn, t, Tn, mask);
    gemm<T>(false, false, Tn, D, Tn, T(1), p, Tn, v + io, in.row_stride, T(0), out + ol.at(b, h),
            ol.row_stride);
  }
}

template <typename T>
void attn_backward(const T* q, const T* k, const T* v, Layout in, const T* gout, Layout ol,
                   const T* probs, T* gq, T* gk, T* gv, Layout gl, int64_t B, int64_t H, int64_t Tn,
                   int64_t D) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
#pragma omp parallel
  {
    std::vector<T> dp(static_cast<size_t>(Tn * Tn));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T* p = probs + bh * Tn * Tn;
      const int64_t io = in.at(b, h), oo = ol.at(b, h), go = gl.at(b, h);
      // dV = P^T dO
      gemm<T>(true, false, Tn, D, Tn, T(1), p, Tn, gout + oo, ol.row_stride, T(0), gv + go,
              gl.row_stride);
      // dP = dO V^T
      gemm<T>(false, true, Tn, Tn, D, T(1), gout + oo, ol.row_stride, v + io, in.row_stride, T(0),
              dp.data(), Tn);
      // dS = P * (dP - rowsum(dP * P)) * scale
      for (int64_t t = 0; t < Tn; ++t) {
        T* row = dp.data() + t * Tn;
        const T* prow = p + t * Tn;
        T dot = 0;
        for (int64_t j = 0; j < Tn; ++j) dot += row[j] * prow[j];
        for (int64_t j = 0; j < Tn; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
      }
      // dQ = dS K ; dK = dS^T Q
      gemm<T>(false, false, Tn, D, Tn, T(1), dp.data(), Tn, k + io, in.row_stride, T(0), gq + go,
              gl.row_stride);
      gemm<T>(true, false, Tn, D, Tn, T(1), dp.data(), Tn, q + io, in.row_stride, T(0), gk + go,
              gl.row_stride);
    }
  }
}

}  // namespace

std::array<int64_t, 4> AttnMask::key_ranges(int64_t i, int64_t n) const {
  switch (kind) {
    case Kind::kFull:
      return {0, n, 0, 0};
    case Kind::kCausal:
      return {0, i + 1, 0, 0};
    case Kind::kBlockCausal:
      return {0, std::min(n, (i / block + 1) * block), 0, 0};
    case Kind::kBlockDiffusion: {
      const int64_t half = n / 2;
      if (i < half) {  // noisy query: clean blocks before its own, then its own noisy block
        const int64_t b0 = (i / block) * block;
        return {half, half + b0, b0, b0 + block};
      }
      return {half, half + ((i - half) / block + 1) * block, 0, 0};
    }
  }
  return {0, n, 0, 0};
}

std::string AttnMask::check(int64_t n) const {
  if (kind == Kind::kFull || kind == Kind::kCausal) return {};
  if (block < 1) return "attention block length " + std::to_string(block) + " must be >= 1";
  if (kind == Kind::kBlockCausal) {
    if (n % block != 0) {
      return "attention block length " + std::to_string(block) +
             " does not divide the sequence length " + std::to_string(n);
    }
    return {};
  }
  if (n % 2 != 0 || (n / 2) % block != 0) {
    return "block-diffusion attention needs a sequence of two halves divisible by the block "
           "length " +
           std::to_string(block) + ", got length " + std::to_string(n);
  }
  return {};
}

Tensor attention_packed(const Tensor& qkv, int64_t n_head, bool causal) {
  if (!qkv.is_cpu()) {
    STARLING_OP_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, "attention",
                      "qkv must be (B, T, 3C), got " + shape_str(qkv.shape()));
    STARLING_OP_CHECK(n_head > 0 && (qkv.shape()[2] / 3) % n_head == 0, "attention",
                      "C not divisible by n_head");
    return internal::device_ops_for("attention", {&qkv}).attention_packed(qkv, n_head, causal);
  }
  return attention_packed(qkv, n_head, causal ? AttnMask::causal() : AttnMask::full());
}

Tensor attention_packed(const Tensor& qkv, int64_t n_head, const AttnMask& mask) {
  STARLING_OP_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, "attention",
                    "qkv must be (B, T, 3C), got " + shape_str(qkv.shape()));
  const int64_t B = qkv.shape()[0], Tn = qkv.shape()[1], C = qkv.shape()[2] / 3;
  STARLING_OP_CHECK(n_head > 0 && C % n_head == 0, "attention", "C not divisible by n_head");
  const int64_t D = C / n_head;
  const std::string bad = mask.check(Tn);
  STARLING_OP_CHECK(bad.empty(), "attention", bad);
  STARLING_OP_CHECK(qkv.is_cpu(), "attention",
                    "on " + device_str(qkv.device()) + " only the full and causal masks run");
  const Tensor x = qkv.contiguous();
  Tensor out = Tensor::uninitialized({B, Tn, C}, qkv.dtype());
  Tensor probs = Tensor::uninitialized({B, n_head, Tn, Tn}, qkv.dtype());
  const Layout in{Tn * 3 * C, D, 3 * C}, ol{Tn * C, D, C};
  internal::dispatch_float(qkv.dtype(), "attention", [&]<typename T>() {
    const T* p = x.data<T>();
    attn_forward<T>(p, p + C, p + 2 * C, in, out.data<T>(), ol, probs.data<T>(), B, n_head, Tn, D,
                    mask);
  });
  if (!autograd::needs_grad({&qkv})) return out;
  return autograd::record(
      out, "attention", {qkv}, [x, probs, B, Tn, C, D, n_head, in, ol](const Tensor& g) {
        const Tensor gc = g.contiguous();
        Tensor gx = Tensor::uninitialized(x.shape(), x.dtype());
        internal::dispatch_float(x.dtype(), "attention", [&]<typename T>() {
          const T* p = x.data<T>();
          T* gp = gx.data<T>();
          attn_backward<T>(p, p + C, p + 2 * C, in, gc.data<T>(), ol, probs.data<T>(), gp, gp + C,
                           gp + 2 * C, in, B, n_head, Tn, D);
        });
        return std::vector<Tensor>{gx};
      });
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  STARLING_OP_CHECK(q.dim() == 4 && q.shape() == k.shape() && q.shape() == v.shape(), "attention",
                    "q, k, v must share one (B, H, T, D) shape");
  const int64_t B = q.shape()[0], H = q.shape()[1], Tn = q.shape()[2], D = q.shape()[3];
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor out = Tensor::uninitialized(q.shape(), q.dtype());
  Tensor probs = Tensor::uninitialized({B, H, Tn, Tn}, q.dtype());
  const Layout l{H * Tn * D, Tn * D, D};
  internal::dispatch_float(q.dtype(), "attention", [&]<typename T>() {
    attn_forward<T>(qc.data<T>(), kc.data<T>(), vc.data<T>(), l, out.data<T>(), l, probs.data<T>(),
                    B, H, Tn, D, causal ? AttnMask::causal() : AttnMask::full());
  });
  if (!autograd::needs_grad({&q, &k, &v})) return out;
  return autograd::record(out, "attention", {q, k, v},
                          [qc, kc, vc, probs, l, B, H, Tn, D](const Tensor& g) {
                            const Tensor gc = g.contiguous();
                            Tensor gq = Tensor::uninitialized(qc.shape(), qc.dtype());
                            Tensor gk = Tensor::uninitialized(qc.shape(), qc.dtype());
                            Tensor gv = Tensor::uninitialized(qc.shape(), qc.dtype());
                            internal::dispatch_float(qc.dtype(), "attention", [&]<typename T>() {
                              attn_backward<T>(qc.data<T>(), kc.data<T>(), vc.data<T>(), l,
                                               gc.data<T>(), l, probs.data<T>(), gq.data<T>(),
                                               gk.data<T>(), gv.data<T>(), l, B, H, Tn, D);
                            });
                            return std::vector<Tensor>{gq, gk, gv};
                          });
}

Tensor attention_kv(const Tensor& qkv_new, Tensor& k_cache, Tensor& v_cache, int64_t past,
                    int64_t n_head, const KvAttnOptions& opt) {
  STARLING_OP_CHECK(qkv_new.dim() == 3 && qkv_new.shape()[2] % 3 == 0, "attention_kv",
                    "qkv_new must be (B, n, 3C), got " + shape_str(qkv_new.shape()));
  const int64_t B = qkv_new.shape()[0], n = qkv_new.shape()[1], C = qkv_new.shape()[2] / 3;
  STARLING_OP_CHECK(n_head > 0 && C % n_head == 0, "attention_kv",
                    "C = " + std::to_string(C) + " not divisible by n_head");
  const int64_t D = C / n_head;
  STARLING_OP_CHECK(k_cache.dim() == 3 && k_cache.shape() == v_cache.shape() &&
                        k_cache.shape()[0] == B && k_cache.shape()[2] == C,
                    "attention_kv",
                    "caches must both be (B, cap, C) = (" + std::to_string(B) + ", cap, " +
                        std::to_string(C) + "), got " + shape_str(k_cache.shape()) + " and " +
                        shape_str(v_cache.shape()));
  STARLING_OP_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "attention_kv",
                    "caches must be contiguous");
  STARLING_OP_CHECK(k_cache.dtype() == qkv_new.dtype() && v_cache.dtype() == qkv_new.dtype(),
                    "attention_kv", "caches must have qkv_new's dtype");
  const int64_t cap = k_cache.shape()[1];
  STARLING_OP_CHECK(past >= 0 && n >= 1 && past + n <= cap, "attention_kv",
                    "rows [" + std::to_string(past) + ", " + std::to_string(past + n) +
                        ") do not fit a cache of " + std::to_string(cap));
  STARLING_OP_CHECK(
      !opt.rope ||
          (D % 2 == 0 && opt.rope_base > 0.0 && std::isfinite(opt.rope_base) && opt.pos0 >= 0),
      "attention_kv", "rope needs an even head size, a finite base > 0 and pos0 >= 0");
  STARLING_OP_CHECK(!autograd::needs_grad({&qkv_new}), "attention_kv",
                    "inference only: run under autograd::NoGradGuard");
  const Tensor x = qkv_new.contiguous();
  Tensor out = Tensor::uninitialized({B, n, C}, qkv_new.dtype());
  Tensor q = Tensor::uninitialized({B, n, C}, qkv_new.dtype());
  const int64_t half = D / 2, m = past + n;
  // cos and sin of (pos0 + i) * base^(-2j/D) in double, as rope_packed's table.
  std::vector<double> cs, sn;
  if (opt.rope) {
    cs.resize(static_cast<size_t>(n * half));
    sn.resize(static_cast<size_t>(n * half));
    for (int64_t j = 0; j < half; ++j) {
      const double inv_freq =
          std::pow(opt.rope_base, -2.0 * static_cast<double>(j) / static_cast<double>(D));
      for (int64_t i = 0; i < n; ++i) {
        const double a = static_cast<double>(opt.pos0 + i) * inv_freq;
        cs[static_cast<size_t>(i * half + j)] = std::cos(a);
        sn[static_cast<size_t>(i * half + j)] = std::sin(a);
      }
    }
  }
  internal::dispatch_float(x.dtype(), "attention_kv", [&]<typename T>() {
    const T* px = x.data<T>();
    T* pq = q.data<T>();
    T* pk = k_cache.data<T>();
    T* pv = v_cache.data<T>();
    // The new rows: q into its own buffer, k and v into the caches, q and k rotated.
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        const T* src = px + (b * n + i) * 3 * C;
        T* dq = pq + (b * n + i) * C;
        T* dk = pk + (b * cap + past + i) * C;
        T* dv = pv + (b * cap + past + i) * C;
        std::copy_n(src + 2 * C, C, dv);
        if (!opt.rope) {
          std::copy_n(src, C, dq);
          std::copy_n(src + C, C, dk);
          continue;
        }
        const double* c = cs.data() + i * half;
        const double* s = sn.data() + i * half;
        for (int64_t h = 0; h < 2 * n_head; ++h) {  // q heads, then k heads
          const T* xh = src + h * D;
          T* yh = (h < n_head ? dq + h * D : dk + (h - n_head) * D);
          for (int64_t j = 0; j < half; ++j) {
            const T cj = static_cast<T>(c[j]), sj = static_cast<T>(s[j]);
            const T a = xh[j], bb = xh[j + half];
            yh[j] = a * cj - bb * sj;
            yh[j + half] = bb * cj + a * sj;
          }
        }
      }
    }
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
    T* po = out.data<T>();
#pragma omp parallel
    {
      std::vector<T> scores(static_cast<size_t>(n * m));
#pragma omp for schedule(static)
      for (int64_t bh = 0; bh < B * n_head; ++bh) {
        const int64_t b = bh / n_head, h = bh % n_head;
        gemm<T>(false, true, n, m, D, scale, pq + b * n * C + h * D, C, pk + b * cap * C + h * D, C,
                T(0), scores.data(), m);
        for (int64_t i = 0; i < n; ++i) {
          internal::softmax_row(scores.data() + i * m, m, past + (opt.causal ? i + 1 : n));
        }
        gemm<T>(false, false, n, D, m, T(1), scores.data(), m, pv + b * cap * C + h * D, C, T(0),
                po + b * n * C + h * D, C);
      }
    }
  });
  return out;
}

}  // namespace starling::ops
