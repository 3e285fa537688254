// CPU layer norm: one pass per row for the statistics, saved for the backward pass.
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/layer_norm.h"

namespace starling::ops {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t c = x.shape().back();
  STARLING_OP_CHECK(weight.numel() == c, "layer_norm", "weight size mismatch");
  STARLING_OP_CHECK(!bias.defined() || bias.numel() == c, "layer_norm", "bias size mismatch");
  const Tensor xc = x.contiguous(), wc = weight.contiguous();
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  const int64_t rows = x.numel() / c;
  Tensor out = Tensor::uninitialized(x.shape(), x.dtype());
  Tensor mean_t = Tensor::uninitialized({rows}, x.dtype());
  Tensor rstd_t = Tensor::uninitialized({rows}, x.dtype());
  internal::dispatch_float(x.dtype(), "layer_norm", [&]<typename T>() {
    const T* px = xc.data<T>();
    const T* pw = wc.data<T>();
    const T* pb = bc.defined() ? bc.data<T>() : nullptr;
    T* po = out.data<T>();
    T* pm = mean_t.data<T>();
    T* pr = rstd_t.data<T>();
#pragma omp parallel for if (rows * c > (1 << 14))
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = px + r * c;
      T m = 0;
      for (int64_t j = 0; j < c; ++j) m += row[j];
      m /= static_cast<T>(c);
      T v = 0;
      for (int64_t j = 0; j < c; ++j) v += (row[j] - m) * (row[j] - m);
      v /= static_cast<T>(c);
      const T rs = static_cast<T>(1) / std::sqrt(v + static_cast<T>(eps));
      pm[r] = m;
      pr[r] = rs;
      T* orow = po + r * c;
      for (int64_t j = 0; j < c; ++j) {
        orow[j] = (row[j] - m) * rs * pw[j] + (pb ? pb[j] : T(0));
      }
    }
  });
  if (!autograd::needs_grad({&x, &weight, &bias})) return out;
  const bool has_bias = bias.defined();
  return autograd::record(out, "layer_norm", {x, weight, bias},
                          [xc, wc, mean_t, rstd_t, has_bias, rows, c](const Tensor& g) {
                            const Tensor gc = g.contiguous();
                            Tensor gx = Tensor::uninitialized(xc.shape(), xc.dtype());
                            Tensor gw = Tensor::zeros({c}, xc.dtype());
                            Tensor gb = Tensor::zeros({c}, xc.dtype());
                            internal::dispatch_float(xc.dtype(), "layer_norm", [&]<typename T>() {
                              const T* px = xc.data<T>();
                              const T* pw = wc.data<T>();
                              const T* pg = gc.data<T>();
                              const T* pm = mean_t.data<T>();
                              const T* pr = rstd_t.data<T>();
                              T* pgx = gx.data<T>();
                              // dx: per row, parallel. dweight/dbias: per-thread partial sums added
                              // in thread order afterwards, so the result does not depend on
                              // scheduling.
                              const int nt = omp_get_max_threads();
                              std::vector<T> part(static_cast<size_t>(2 * nt * c), T(0));
#pragma omp parallel num_threads(nt)
                              {
                                T* lw =
                                    part.data() + static_cast<size_t>(2 * omp_get_thread_num() * c);
                                T* lb = lw + c;
#pragma omp for schedule(static)
                                for (int64_t r = 0; r < rows; ++r) {
                                  const T* row = px + r * c;
                                  const T* grow = pg + r * c;
                                  const T m = pm[r], rs = pr[r];
                                  T dnorm_mean = 0, dnorm_norm_mean = 0;
                                  for (int64_t j = 0; j < c; ++j) {
                                    const T norm = (row[j] - m) * rs;
                                    const T dnorm = grow[j] * pw[j];
                                    dnorm_mean += dnorm;
                                    dnorm_norm_mean += dnorm * norm;
                                    lw[j] += grow[j] * norm;
                                    lb[j] += grow[j];
                                  }
                                  dnorm_mean /= static_cast<T>(c);
                                  dnorm_norm_mean /= static_cast<T>(c);
                                  T* gxrow = pgx + r * c;
                                  for (int64_t j = 0; j < c; ++j) {
                                    const T norm = (row[j] - m) * rs;
                                    const T dnorm = grow[j] * pw[j];
                                    gxrow[j] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
                                  }
                                }
                              }
                              T* pgw = gw.data<T>();
                              T* pgb = gb.data<T>();
                              for (int t = 0; t < nt; ++t) {
                                const T* lw = part.data() + static_cast<size_t>(2 * t * c);
                                for (int64_t j = 0; j < c; ++j) {
                                  pgw[j] += lw[j];
                                  pgb[j] += lw[c + j];
                                }
                              }
                            });
                            return std::vector<Tensor>{gx, gw, has_bias ? gb : Tensor()};
                          });
}

}  // namespace starling::ops
