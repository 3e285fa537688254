// The CPU FusedBackend: plain loops (OpenMP over rows where the work is large), OpenBLAS sgemm
// for the products. It is the oracle of the fused trainer's orchestration and of the CUDA
// backend's new kernels; every reduction runs in a fixed order, so results are reproducible.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

#include "core/ops/internal/fast_math.h"
#include "core/ops/matmul.h"
#include "core/optim/optimizer.h"
#include "models/gpt/fused_backend.h"

namespace starling::models {
namespace {

// The engine's products go through the ops' GEMM: its OpenBLAS kernel choice, one thread for
// small products, matrix-vector products for a few rows.
void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  ops::internal::gemm<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// x rounded to the nearest bf16 (ties to even), kept in a float: what __float2bfloat16_rn gives.
float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf and NaN stay
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

class CpuBackend final : public FusedBackend {
 public:
  ~CpuBackend() override {
    for (auto& [p, n] : live_) std::free(p);
  }
  std::string name() const override { return "cpu"; }

  Result<void*> alloc(size_t nbytes) override {
    if (nbytes == 0) return static_cast<void*>(nullptr);
    void* p = std::calloc(1, nbytes);
    if (p == nullptr) {
      return resource_exhausted("fused cpu backend: cannot allocate " + std::to_string(nbytes) +
                                " bytes");
    }
    live_[p] = nbytes;
    in_use_ += nbytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void free(void* p) override {
    if (p == nullptr) return;
    auto it = live_.find(p);
    if (it == live_.end()) return;
    in_use_ -= it->second;
    live_.erase(it);
    std::free(p);
  }
  void copy_to_backend(void* dst, const void* src, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void copy_to_host(void* dst, const void* src, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void zero(void* p, size_t nbytes) override {
    if (nbytes > 0) std::memset(p, 0, nbytes);
  }
  void synchronize() override {}

  void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                       int c) override {
#pragma omp parallel for if (int64_t{b} * t * c > (1 << 16))
    for (int64_t r = 0; r < int64_t{b} * t; ++r) {
      const float* we = wte + static_cast<int64_t>(idx[r]) * c;
      float* o = out + r * c;
      if (wpe == nullptr) {
        std::copy_n(we, c, o);
        continue;
      }
      const float* pe = wpe + (r % t) * c;
      for (int j = 0; j < c; ++j) o[j] = we[j] + pe[j];
    }
  }

  void encoder_backward(float* dwte, float* dwpe, const float* dout, const EncoderBuckets& bk,
                        int b, int t, int c) override {
    // Each token's row sums its positions in increasing order (the buckets' order), then adds
    // once: the same order as the CUDA kernel.
#pragma omp parallel
    {
      std::vector<float> acc(static_cast<size_t>(c));
#pragma omp for schedule(dynamic, 4)
      for (int u = 0; u < bk.num_unique; ++u) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int i = bk.starts[u]; i < bk.starts[u + 1]; ++i) {
          const float* g = dout + static_cast<int64_t>(bk.order[i]) * c;
          for (int j = 0; j < c; ++j) acc[j] += g[j];
        }
        float* w = dwte + static_cast<int64_t>(bk.tokens[u]) * c;
        for (int j = 0; j < c; ++j) w[j] += acc[j];
      }
#pragma omp for
      for (int tt = 0; tt < (dwpe != nullptr ? t : 0); ++tt) {
        float* w = dwpe + static_cast<int64_t>(tt) * c;
        for (int j = 0; j < c; ++j) {
          float s = 0.0f;
          for (int bb = 0; bb < b; ++bb) s += dout[(static_cast<int64_t>(bb) * t + tt) * c + j];
          w[j] += s;
        }
      }
    }
  }

  void layer_norm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                          const float* bias, int n, int c) override {
#pragma omp parallel for if (int64_t{n} * c > (1 << 14))
    for (int r = 0; r < n; ++r) {
      const float* row = x + static_cast<int64_t>(r) * c;
      float m = 0.0f;
      for (int j = 0; j < c; ++j) m += row[j];
      m /= static_cast<float>(c);
      float v = 0.0f;
      for (int j = 0; j < c; ++j) v += (row[j] - m) * (row[j] - m);
      v /= static_cast<float>(c);
      const float rs = 1.0f / std::sqrt(v + 1e-5f);
      mean[r] = m;
      rstd[r] = rs;
      float* o = out + static_cast<int64_t>(r) * c;
      for (int j = 0; j < c; ++j) o[j] = (row[j] - m) * rs * weight[j] + (bias ? bias[j] : 0.0f);
    }
  }

  void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                           const float* x, const float* weight, const float* mean,
                           const float* rstd, int n, int c) override {
#pragma omp parallel for if (int64_t{n} * c > (1 << 14))
    for (int r = 0; r < n; ++r) {
      const float* row = x + static_cast<int64_t>(r) * c;
      const float* g = dout + static_cast<int64_t>(r) * c;
      const float m = mean[r], rs = rstd[r];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
      for (int j = 0; j < c; ++j) {
        const float dnorm = g[j] * weight[j];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (row[j] - m) * rs;
      }
      dnorm_mean /= static_cast<float>(c);
      dnorm_norm_mean /= static_cast<float>(c);
      float* d = dx + static_cast<int64_t>(r) * c;
      for (int j = 0; j < c; ++j) {
        const float norm = (row[j] - m) * rs;
        d[j] = (g[j] * weight[j] - dnorm_mean - norm * dnorm_norm_mean) * rs;
      }
    }
    // Column sums in row order.
#pragma omp parallel for if (int64_t{n} * c > (1 << 14))
    for (int j = 0; j < c; ++j) {
      float sw = 0.0f, sb = 0.0f;
      for (int r = 0; r < n; ++r) {
        const float g = dout[static_cast<int64_t>(r) * c + j];
        sw += g * (x[static_cast<int64_t>(r) * c + j] - mean[r]) * rstd[r];
        sb += g;
      }
      dweight[j] = sw;
      if (dbias) dbias[j] = sb;
    }
  }

  void linear_forward(float* out, const float* x, const float* weight, const float* bias, int n,
                      int in, int out_features) override {
    if (bf16_matmuls_) {
      x = rounded(x, static_cast<size_t>(n) * in, &xr_);
      weight = rounded(weight, static_cast<size_t>(out_features) * in, &wr_);
    }
    sgemm(false, true, n, out_features, in, 1.0f, x, in, weight, in, 0.0f, out, out_features);
    if (bias == nullptr) return;
#pragma omp parallel for if (int64_t{n} * out_features > (1 << 16))
    for (int r = 0; r < n; ++r) {
      float* o = out + static_cast<int64_t>(r) * out_features;
      for (int j = 0; j < out_features; ++j) o[j] += bias[j];
    }
  }

  void linear_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                       const float* weight, int n, int in, int out_features) override {
    const float* d = dout;
    if (bf16_matmuls_) {
      d = rounded(dout, static_cast<size_t>(n) * out_features, &dr_);
      x = rounded(x, static_cast<size_t>(n) * in, &xr_);
      weight = rounded(weight, static_cast<size_t>(out_features) * in, &wr_);
    }
    sgemm(false, false, n, in, out_features, 1.0f, d, out_features, weight, in, 0.0f, dx, in);
    sgemm(true, false, out_features, in, n, 1.0f, d, out_features, x, in, 0.0f, dweight, in);
    if (dbias == nullptr) return;  // the bias gradient sums dout itself, in fp32
#pragma omp parallel for if (int64_t{n} * out_features > (1 << 16))
    for (int j = 0; j < out_features; ++j) {
      float s = 0.0f;
      for (int r = 0; r < n; ++r) s += dout[static_cast<int64_t>(r) * out_features + j];
      dbias[j] = s;
    }
  }

  void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                         const ops::AttnMask& mask) override {
    const int d = c / h;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < b * h; ++bh) {
      const int bb = bh / h, hh = bh % h;
      const float* q = qkv + static_cast<int64_t>(bb) * t * 3 * c + hh * d;
      float* p = att + static_cast<int64_t>(bh) * t * t;
      sgemm(false, true, t, t, d, scale, q, 3 * c, q + c, 3 * c, 0.0f, p, t);
      for (int i = 0; i < t; ++i) {
        float* row = p + static_cast<int64_t>(i) * t;
        // The query's keys: [r[0], r[1]) and [r[2], r[3]); every other probability is 0.
        const auto r = mask.key_ranges(i, t);
        const auto in = [&r](int j) { return (j >= r[0] && j < r[1]) || (j >= r[2] && j < r[3]); };
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < t; ++j) {
          if (in(j)) mx = std::max(mx, row[j]);
        }
        float s = 0.0f;
        for (int j = 0; j < t; ++j) {
          row[j] = in(j) ? std::exp(row[j] - mx) : 0.0f;
          s += row[j];
        }
        const float inv = 1.0f / s;
        for (int j = 0; j < t; ++j) row[j] *= inv;
      }
      sgemm(false, false, t, d, t, 1.0f, p, t, q + 2 * c, 3 * c, 0.0f,
            out + static_cast<int64_t>(bb) * t * c + hh * d, c);
    }
  }

  // The masked probabilities of att are 0, so they pass no gradient: the mask is not needed.
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* /*out*/, const float* att, int b, int t, int c, int h,
                          const ops::AttnMask& /*mask*/) override {
    const int d = c / h;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < b * h; ++bh) {
      const int bb = bh / h, hh = bh % h;
      const int64_t io = static_cast<int64_t>(bb) * t * 3 * c + hh * d;
      const float* q = qkv + io;
      const float* p = att + static_cast<int64_t>(bh) * t * t;
      const float* go = dout + static_cast<int64_t>(bb) * t * c + hh * d;
      float* dp = scratch + static_cast<int64_t>(bh) * t * t;
      float* gq = dqkv + io;
      sgemm(true, false, t, d, t, 1.0f, p, t, go, c, 0.0f, gq + 2 * c, 3 * c);  // dV = P^T dO
      sgemm(false, true, t, t, d, 1.0f, go, c, q + 2 * c, 3 * c, 0.0f, dp, t);  // dP = dO V^T
      for (int i = 0; i < t; ++i) {  // dS = P * (dP - rowsum(dP * P)) * scale
        float* row = dp + static_cast<int64_t>(i) * t;
        const float* prow = p + static_cast<int64_t>(i) * t;
        float dot = 0.0f;
        for (int j = 0; j < t; ++j) dot += row[j] * prow[j];
        for (int j = 0; j < t; ++j) row[j] = prow[j] * (row[j] - dot) * scale;
      }
      sgemm(false, false, t, d, t, 1.0f, dp, t, q + c, 3 * c, 0.0f, gq, 3 * c);  // dQ = dS K
      sgemm(true, false, t, d, t, 1.0f, dp, t, q, 3 * c, 0.0f, gq + c, 3 * c);   // dK = dS^T Q
    }
  }

  void rope(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
            bool inverse) override {
    const int half = c / h / 2;
    const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for if (int64_t{n} * c > (1 << 16))
    for (int r = 0; r < n; ++r) {
      float* row = qkv + static_cast<int64_t>(r) * 3 * c;
      const float* cs = cos + static_cast<int64_t>(r % period) * half;
      const float* sn = sin + static_cast<int64_t>(r % period) * half;
      for (int hh = 0; hh < 2 * h; ++hh) {  // the H heads of q, then the H heads of k
        float* x = row + static_cast<int64_t>(hh) * 2 * half;
        for (int i = 0; i < half; ++i) {
          const float ci = cs[i], si = sign * sn[i];
          const float a = x[i], bb = x[i + half];
          x[i] = a * ci - bb * si;
          x[i + half] = bb * ci + a * si;
        }
      }
    }
  }

  void gelu_forward(float* out, const float* x, size_t n) override {
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) {
      out[i] = 0.5f * x[i] * (1.0f + ops::internal::fast_erff(x[i] * 0.7071067811865476f));
    }
  }
  void gelu_backward(float* dx, const float* dout, const float* x, size_t n) override {
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) {
      const float cdf = 0.5f * (1.0f + ops::internal::fast_erff(x[i] * 0.7071067811865476f));
      const float pdf = ops::internal::fast_expf(-0.5f * x[i] * x[i]) * 0.3989422804014327f;
      dx[i] = dout[i] * (cdf + x[i] * pdf);
    }
  }
  void residual_add(float* out, const float* a, const float* b, size_t n) override {
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void cross_entropy_forward(float* losses, float* loss, const float* logits, const int* targets,
                             const float* weights, int n, int v, int vp) override {
#pragma omp parallel for if (int64_t{n} * v > (1 << 14))
    for (int r = 0; r < n; ++r) {
      if (targets[r] < 0) {
        losses[r] = 0.0f;
        continue;
      }
      const float* row = logits + static_cast<int64_t>(r) * vp;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < v; ++j) mx = std::max(mx, row[j]);
      float s = 0.0f;
      for (int j = 0; j < v; ++j) s += std::exp(row[j] - mx);
      losses[r] = mx + std::log(s) - row[targets[r]];
    }
    double sum = 0.0;
    if (weights == nullptr) {
      for (int r = 0; r < n; ++r) sum += losses[r];
      *loss = n > 0 ? static_cast<float>(sum / n) : 0.0f;
      return;
    }
    for (int r = 0; r < n; ++r) {
      if (targets[r] >= 0) sum += static_cast<double>(weights[r]) * losses[r];
    }
    *loss = static_cast<float>(sum);
  }

  void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                              const float* weights, int n, int v, int vp) override {
    const float inv_n = 1.0f / static_cast<float>(std::max(n, 1));
#pragma omp parallel for if (int64_t{n} * v > (1 << 14))
    for (int r = 0; r < n; ++r) {
      float* d = dlogits + static_cast<int64_t>(r) * vp;
      if (targets[r] < 0) {
        std::fill(d, d + vp, 0.0f);
        continue;
      }
      const float w = weights != nullptr ? weights[r] : inv_n;
      const float* row = logits + static_cast<int64_t>(r) * vp;
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < v; ++j) mx = std::max(mx, row[j]);
      float s = 0.0f;
      for (int j = 0; j < v; ++j) s += std::exp(row[j] - mx);
      const float inv_s = 1.0f / s;
      for (int j = 0; j < v; ++j) d[j] = std::exp(row[j] - mx) * inv_s * w;
      d[targets[r]] -= w;
      std::fill(d + v, d + vp, 0.0f);
    }
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, const FusedAdamW& s) override {
    // core/optim's AdamW loop: the fused engine and the autograd one step alike.
    optim::internal::adamw_update_f32(
        p, g, m, v, static_cast<int64_t>(n),
        ops::DeviceAdamW{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step});
  }

  void sum_squares(double* out, const float* x, size_t n) override {
    // Fixed chunks summed in order: the result does not depend on the thread count.
    constexpr size_t kChunk = 1 << 16;
    const size_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(chunks, 0.0);
#pragma omp parallel for if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ++ch) {
      double s = 0.0;
      const size_t end = std::min(n, (ch + 1) * kChunk);
      for (size_t i = ch * kChunk; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
      part[ch] = s;
    }
    double total = 0.0;
    for (double p : part) total += p;
    *out = total;
  }

  void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm) override {
    const double norm = std::sqrt(*norm_sq);
    if (!(max_norm > 0.0 && norm > max_norm)) return;
    const float s = static_cast<float>(max_norm / (norm + 1e-6));
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }
  void subtract(float* out, const float* a, const float* b, size_t n) override {
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
  }

  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes() const override { return peak_; }

 private:
  // src rounded to bf16 into *buf (resized as needed); returns buf's data.
  static const float* rounded(const float* src, size_t n, std::vector<float>* buf) {
    if (buf->size() < n) buf->resize(n);
    float* dst = buf->data();
#pragma omp parallel for simd if (n > (1 << 16))
    for (size_t i = 0; i < n; ++i) dst[i] = round_to_bf16(src[i]);
    return dst;
  }
  std::vector<float> xr_, wr_, dr_;  // bf16-rounded GEMM inputs (bf16_matmuls_ only)

  std::unordered_map<void*, size_t> live_;
  size_t in_use_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<FusedBackend> make_fused_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace starling::models
