// CPU pooling and upsampling: one (image, channel) plane per loop iteration, in parallel.
#include <algorithm>
#include <string>

#include "core/autograd/autograd.h"
#include "core/ops/device_ops.h"
#include "core/ops/internal/op_util.h"
#include "core/ops/pool.h"

namespace starling::ops {

namespace {

using internal::dispatch_float;

void check_nchw(const Tensor& x, const char* op) {
  STARLING_OP_CHECK(x.dim() == 4, op, "input must be (B, C, H, W), got " + shape_str(x.shape()));
}

}  // namespace

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) {
  const char* op = "max_pool2d";
  check_nchw(x, op);
  if (stride <= 0) stride = kernel;
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  STARLING_OP_CHECK(
      kernel >= 1 && kernel <= h && kernel <= w, op,
      "kernel " + std::to_string(kernel) + " does not fit input " + shape_str(x.shape()));
  const int64_t ho = (h - kernel) / stride + 1, wo = (w - kernel) / stride + 1;
  if (!x.is_cpu()) return internal::device_ops_for(op, {&x}).max_pool2d(x, kernel, stride);
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized({x.shape()[0], x.shape()[1], ho, wo}, x.dtype());
  // Flat index (within the plane) of each output's maximum, for the backward pass.
  Tensor arg = Tensor::uninitialized({planes * ho * wo}, DType::kI32);
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    const T* px = xc.data<T>();
    T* po = out.data<T>();
    int32_t* pa = arg.data<int32_t>();
#pragma omp parallel for if (planes * ho * wo > (1 << 14))
    for (int64_t p = 0; p < planes; ++p) {
      const T* plane = px + p * h * w;
      for (int64_t oy = 0; oy < ho; ++oy) {
        for (int64_t ox = 0; ox < wo; ++ox) {
          int64_t best = oy * stride * w + ox * stride;
          for (int64_t i = 0; i < kernel; ++i) {
            for (int64_t j = 0; j < kernel; ++j) {
              const int64_t idx = (oy * stride + i) * w + ox * stride + j;
              if (plane[idx] > plane[best]) best = idx;
            }
          }
          const int64_t o = (p * ho + oy) * wo + ox;
          po[o] = plane[best];
          pa[o] = static_cast<int32_t>(best);
        }
      }
    }
  });
  if (!autograd::needs_grad({&x})) return out;
  const Shape xs = x.shape();
  return autograd::record(out, op, {x}, [arg, xs, planes, h, w, ho, wo](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::zeros(xs, gc.dtype());
    dispatch_float(gc.dtype(), "max_pool2d", [&]<typename T>() {
      const T* pg = gc.data<T>();
      const int32_t* pa = arg.data<int32_t>();
      T* pgx = gx.data<T>();
#pragma omp parallel for if (planes * ho * wo > (1 << 14))
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t o = p * ho * wo; o < (p + 1) * ho * wo; ++o) pgx[p * h * w + pa[o]] += pg[o];
      }
    });
    return std::vector<Tensor>{gx};
  });
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel) {
  const char* op = "avg_pool2d";
  check_nchw(x, op);
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  STARLING_OP_CHECK(
      kernel >= 1 && h % kernel == 0 && w % kernel == 0, op,
      "kernel " + std::to_string(kernel) + " must divide H and W of " + shape_str(x.shape()));
  const int64_t ho = h / kernel, wo = w / kernel;
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized({x.shape()[0], x.shape()[1], ho, wo}, x.dtype());
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    const T* px = xc.data<T>();
    T* po = out.data<T>();
    const T scale = T(1) / static_cast<T>(kernel * kernel);
#pragma omp parallel for if (planes * h * w > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t oy = 0; oy < ho; ++oy) {
        for (int64_t ox = 0; ox < wo; ++ox) {
          T s = 0;
          for (int64_t i = 0; i < kernel; ++i) {
            const T* row = px + p * h * w + (oy * kernel + i) * w + ox * kernel;
            for (int64_t j = 0; j < kernel; ++j) s += row[j];
          }
          po[(p * ho + oy) * wo + ox] = s * scale;
        }
      }
    }
  });
  if (!autograd::needs_grad({&x})) return out;
  const Shape xs = x.shape();
  return autograd::record(out, op, {x}, [xs, planes, h, w, ho, wo, kernel](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(xs, gc.dtype());
    dispatch_float(gc.dtype(), "avg_pool2d", [&]<typename T>() {
      const T* pg = gc.data<T>();
      T* pgx = gx.data<T>();
      const T scale = T(1) / static_cast<T>(kernel * kernel);
#pragma omp parallel for if (planes * h * w > (1 << 15))
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t y = 0; y < h; ++y) {
          for (int64_t xx = 0; xx < w; ++xx) {
            pgx[(p * h + y) * w + xx] = pg[(p * ho + y / kernel) * wo + xx / kernel] * scale;
          }
        }
      }
    });
    return std::vector<Tensor>{gx};
  });
}

Tensor upsample_nearest2d(const Tensor& x, int64_t scale) {
  const char* op = "upsample_nearest2d";
  check_nchw(x, op);
  STARLING_OP_CHECK(scale >= 1, op, "scale must be >= 1, got " + std::to_string(scale));
  if (!x.is_cpu()) return internal::device_ops_for(op, {&x}).upsample_nearest2d(x, scale);
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t ho = h * scale, wo = w * scale;
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::uninitialized({x.shape()[0], x.shape()[1], ho, wo}, x.dtype());
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    const T* px = xc.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (planes * ho * wo > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t y = 0; y < h; ++y) {
        // The first copy of each input row, then the rest as copies of it.
        const T* src = px + (p * h + y) * w;
        T* dst = po + (p * ho + y * scale) * wo;
        if (scale == 2) {
#pragma omp simd
          for (int64_t xx = 0; xx < w; ++xx) dst[2 * xx] = dst[2 * xx + 1] = src[xx];
        } else {
          for (int64_t xx = 0; xx < w; ++xx)
            for (int64_t k = 0; k < scale; ++k) dst[xx * scale + k] = src[xx];
        }
        for (int64_t k = 1; k < scale; ++k) std::copy(dst, dst + wo, dst + k * wo);
      }
    }
  });
  if (!autograd::needs_grad({&x})) return out;
  const Shape xs = x.shape();
  return autograd::record(out, op, {x}, [xs, planes, h, w, ho, wo, scale](const Tensor& g) {
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::uninitialized(xs, gc.dtype());
    dispatch_float(gc.dtype(), "upsample_nearest2d", [&]<typename T>() {
      const T* pg = gc.data<T>();
      T* pgx = gx.data<T>();
      // Each input's scale x scale block summed row by row, left to right.
#pragma omp parallel for if (planes * ho * wo > (1 << 15))
      for (int64_t p = 0; p < planes; ++p) {
        for (int64_t y = 0; y < h; ++y) {
          const T* src = pg + (p * ho + y * scale) * wo;
          T* dst = pgx + (p * h + y) * w;
          if (scale == 2) {
            const T* src1 = src + wo;
#pragma omp simd
            for (int64_t xx = 0; xx < w; ++xx)
              dst[xx] = ((src[2 * xx] + src[2 * xx + 1]) + src1[2 * xx]) + src1[2 * xx + 1];
          } else {
            for (int64_t xx = 0; xx < w; ++xx) {
              T s = 0;
              for (int64_t r = 0; r < scale; ++r)
                for (int64_t k = 0; k < scale; ++k) s += src[r * wo + xx * scale + k];
              dst[xx] = s;
            }
          }
        }
      }
    });
    return std::vector<Tensor>{gx};
  });
}

}  // namespace starling::ops
