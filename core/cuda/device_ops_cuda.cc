// The CUDA device forms of the ops. Each forward runs its kernels on the tensors' GPU and records
// a backward that runs the matching backward kernels there; what a backward needs (inputs made
// contiguous, group norm statistics, pooling argmax, attention's log-sum-exp) is kept by its
// closure. Work goes to the legacy default stream (nullptr), where the tensor backend's blocking
// copies and memsets also run, so a tensor's bytes are ready for whatever reads them next and a
// block the caching allocator hands out again is no longer in use.
#include "core/cuda/device_ops_cuda.h"

#if defined(STARLING_WITH_CUDA)

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/cuda/allocator.h"
#include "core/cuda/conv_cudnn.h"
#include "core/cuda/handles.h"
#include "core/cuda/image_kernels.h"
#include "core/cuda/kernels.h"

namespace starling::cuda {
namespace {

constexpr cudaStream_t kStream = nullptr;  // the legacy default stream

[[noreturn]] void fail(const char* op, const std::string& msg) {
  std::fprintf(stderr, "starling: %s on cuda: %s\n", op, msg.c_str());
  std::abort();
}

void check(const char* op, bool ok, const std::string& msg) {
  if (!ok) fail(op, msg);
}

void check_status(const char* op, const Status& st) {
  if (!st.ok()) fail(op, st.to_string());
}

// Fresh f32 (or other dtype) memory on `d`, not zeroed: every kernel here overwrites its
// outputs and scratch.
Tensor alloc(const char* op, const Shape& shape, Device d, DType dtype = DType::kF32) {
  auto t = Tensor::uninitialized_on(shape, dtype, d);
  if (!t.ok()) fail(op, "allocating " + shape_str(shape) + ": " + t.status().to_string());
  return *t;
}

Tensor dense(const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); }
const float* cptr(const Tensor& t) { return t.defined() ? t.device_data<float>() : nullptr; }
float* ptr(const Tensor& t) { return t.defined() ? t.device_data<float>() : nullptr; }
int as_int(int64_t v) { return static_cast<int>(v); }
bool wants(const Tensor& t) { return t.defined() && t.requires_grad(); }

// Per thread and GPU: cuBLAS and cuDNN handles (made on first use there).
struct Context {
  CublasHandle cublas;
  std::unique_ptr<DeviceAllocator> workspace;
  std::unique_ptr<CudnnConv> conv;
};

class CudaOps final : public ops::DeviceOps {
 public:
  // STARLING_CUDA_TF32=1: convolutions and linears on tensor cores as TF32 (PyTorch's default
  // for cuDNN convolutions; about 1e-3 relative), for speed; off by default (fp32 FMA math, the
  // CPU's results within 1e-5).
  CudaOps() {
    const char* e = std::getenv("STARLING_CUDA_TF32");
    tf32_ = e != nullptr && std::string(e) == "1";
  }
  const char* name() const override { return tf32_ ? "cuda (TF32)" : "cuda"; }

  Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                int64_t padding, const Tensor& residual) override {
    const char* op = "conv2d";
    Context& c = context(op, x.device());
    ConvShape s;
    s.b = as_int(x.size(0));
    s.c_in = as_int(x.size(1));
    s.h = as_int(x.size(2));
    s.w = as_int(x.size(3));
    s.c_out = as_int(w.size(0));
    s.kh = as_int(w.size(2));
    s.kw = as_int(w.size(3));
    s.stride = as_int(stride);
    s.pad = as_int(padding);
    const Tensor xc = dense(x), wc = dense(w), bc = dense(bias), rc = dense(residual);
    Tensor y = alloc(op, {s.b, s.c_out, s.h_out(), s.w_out()}, x.device());
    check_status(op, c.conv->forward(ptr(y), cptr(xc), cptr(wc), cptr(bc), cptr(rc), s, kStream));
    if (!autograd::needs_grad({&x, &w, &bias, &residual})) return y;
    const bool gx = wants(x), gw = wants(w), gb = wants(bias), gr = wants(residual);
    Context* ctx = &c;
    return autograd::record(y, op, {x, w, bias, residual}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      const Device d = gc.device();
      Tensor dx = gx ? alloc(op, xc.shape(), d) : Tensor();
      Tensor dw = gw ? alloc(op, wc.shape(), d) : Tensor();
      Tensor db = gb ? alloc(op, bc.shape(), d) : Tensor();
      set_device(d);
      check_status(op, ctx->conv->backward(ptr(dx), ptr(dw), ptr(db), cptr(gc), cptr(xc), cptr(wc),
                                           s, kStream));
      return std::vector<Tensor>{dx, dw, db, gr ? gc : Tensor()};
    });
  }

  Tensor group_norm(const Tensor& x, const Tensor& shift, int64_t groups, const Tensor& weight,
                    const Tensor& bias, double eps, bool silu) override {
    const char* op = "group_norm";
    set_device(x.device());
    const int b = as_int(x.size(0)), c = as_int(x.size(1));
    const int s = as_int(x.numel() / (x.size(0) * x.size(1)));
    const int gr = as_int(groups);
    const Tensor xc = dense(x), sc = dense(shift), wc = dense(weight), bc = dense(bias);
    Tensor y = alloc(op, x.shape(), x.device());
    Tensor mean = alloc(op, {b * gr}, x.device(), DType::kF64);
    Tensor rstd = alloc(op, {b * gr}, x.device(), DType::kF64);
    const bool act = silu || shift.defined();
    group_norm_forward(ptr(y), mean.device_data<double>(), rstd.device_data<double>(), cptr(xc),
                       cptr(sc), cptr(wc), cptr(bc), b, c, s, gr, static_cast<float>(eps), act,
                       kStream);
    if (!autograd::needs_grad({&x, &shift, &weight, &bias})) return y;
    return autograd::record(y, op, {x, shift, weight, bias}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      const Device d = gc.device();
      set_device(d);
      Tensor dx = alloc(op, xc.shape(), d);
      Tensor dw = alloc(op, wc.shape(), d);
      Tensor db = bc.defined() ? alloc(op, bc.shape(), d) : Tensor();
      Tensor ds = sc.defined() ? alloc(op, sc.shape(), d) : Tensor();
      Tensor scratch =
          alloc(op, {static_cast<int64_t>(group_norm_scratch_floats(b, c))}, d, DType::kF32);
      group_norm_backward(ptr(dx), ptr(dw), ptr(db), ptr(ds), cptr(gc), cptr(xc), cptr(sc),
                          cptr(wc), cptr(bc), mean.device_data<double>(),
                          rstd.device_data<double>(), b, c, s, gr, act, ptr(scratch), kStream);
      return std::vector<Tensor>{dx, ds, dw, db};
    });
  }

  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    const char* op = "linear";
    Context& c = context(op, x.device());
    const int64_t in = w.size(1), out = w.size(0);
    const int64_t rows = x.numel() / in;
    Shape ys = x.shape();
    ys.back() = out;
    const Tensor xc = dense(x), wc = dense(w), bc = dense(bias);
    Tensor y = alloc(op, ys, x.device());
    linear_forward(ptr(y), cptr(xc), cptr(wc), cptr(bc), as_int(rows), as_int(in), as_int(out),
                   c.cublas.get(), kStream);
    if (!autograd::needs_grad({&x, &w, &bias})) return y;
    Context* ctx = &c;
    return autograd::record(y, op, {x, w, bias}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      const Device d = gc.device();
      set_device(d);
      Tensor dx = alloc(op, xc.shape(), d);
      Tensor dw = alloc(op, wc.shape(), d);
      Tensor db = bc.defined() ? alloc(op, bc.shape(), d) : Tensor();
      linear_backward(ptr(dx), ptr(dw), ptr(db), cptr(gc), cptr(xc), cptr(wc), as_int(rows),
                      as_int(in), as_int(out), ctx->cublas.get(), kStream);
      return std::vector<Tensor>{dx, dw, db};
    });
  }

  Tensor unary(Unary kind, const Tensor& x) override {
    const char* op = kind == Unary::kSilu ? "silu" : kind == Unary::kRelu ? "relu" : "square";
    set_device(x.device());
    const Tensor xc = dense(x);
    const size_t n = static_cast<size_t>(x.numel());
    Tensor y = alloc(op, x.shape(), x.device());
    switch (kind) {
      case Unary::kSilu:
        silu_forward(ptr(y), cptr(xc), n, kStream);
        break;
      case Unary::kRelu:
        relu_forward(ptr(y), cptr(xc), n, kStream);
        break;
      case Unary::kSquare:
        mul(ptr(y), cptr(xc), cptr(xc), n, kStream);
        break;
    }
    if (!autograd::needs_grad({&x})) return y;
    return autograd::record(y, op, {x}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor dx = alloc(op, xc.shape(), gc.device());
      switch (kind) {
        case Unary::kSilu:
          silu_backward(ptr(dx), cptr(gc), cptr(xc), n, kStream);
          break;
        case Unary::kRelu:
          relu_backward(ptr(dx), cptr(gc), cptr(xc), n, kStream);
          break;
        case Unary::kSquare:  // g * (2 x): 2 x is exact, so (2 x) g = 2 (x g) bit for bit
          mul(ptr(dx), cptr(xc), cptr(gc), n, kStream);
          scale(ptr(dx), ptr(dx), 2.0f, n, kStream);
          break;
      }
      return std::vector<Tensor>{dx};
    });
  }

  Tensor binary(Binary kind, const Tensor& a, const Tensor& b) override {
    const char* op = kind == Binary::kAdd ? "add" : kind == Binary::kSub ? "sub" : "mul";
    set_device(a.device());
    const Tensor ac = dense(a), bc = dense(b);
    const size_t n = static_cast<size_t>(a.numel());
    Tensor y = alloc(op, a.shape(), a.device());
    switch (kind) {
      case Binary::kAdd:
        add(ptr(y), cptr(ac), cptr(bc), n, kStream);
        break;
      case Binary::kSub:
        sub(ptr(y), cptr(ac), cptr(bc), n, kStream);
        break;
      case Binary::kMul:
        mul(ptr(y), cptr(ac), cptr(bc), n, kStream);
        break;
    }
    if (!autograd::needs_grad({&a, &b})) return y;
    const bool ga = wants(a), gb = wants(b);
    return autograd::record(y, op, {a, b}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      const Device d = gc.device();
      set_device(d);
      Tensor da, db;
      switch (kind) {
        case Binary::kAdd:
          da = ga ? gc : Tensor();
          db = gb ? gc : Tensor();
          break;
        case Binary::kSub:
          da = ga ? gc : Tensor();
          if (gb) {
            db = alloc(op, gc.shape(), d);
            scale(ptr(db), cptr(gc), -1.0f, n, kStream);
          }
          break;
        case Binary::kMul:
          if (ga) {
            da = alloc(op, gc.shape(), d);
            mul(ptr(da), cptr(gc), cptr(bc), n, kStream);
          }
          if (gb) {
            db = alloc(op, gc.shape(), d);
            mul(ptr(db), cptr(gc), cptr(ac), n, kStream);
          }
          break;
      }
      return std::vector<Tensor>{da, db};
    });
  }

  Tensor mul_scalar(const Tensor& a, double s) override {
    const char* op = "mul_scalar";
    set_device(a.device());
    const Tensor ac = dense(a);
    const size_t n = static_cast<size_t>(a.numel());
    const auto f = static_cast<float>(s);
    Tensor y = alloc(op, a.shape(), a.device());
    scale(ptr(y), cptr(ac), f, n, kStream);
    if (!autograd::needs_grad({&a})) return y;
    return autograd::record(y, op, {a}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor da = alloc(op, gc.shape(), gc.device());
      scale(ptr(da), cptr(gc), f, n, kStream);
      return std::vector<Tensor>{da};
    });
  }

  Tensor mean(const Tensor& a) override {
    const char* op = "mean";
    set_device(a.device());
    const Tensor ac = dense(a);
    const size_t n = static_cast<size_t>(a.numel());
    // The CPU's mean: the f32 sum times the f32 1/n.
    const double inv = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
    Tensor y = alloc(op, {}, a.device());
    Tensor scratch = alloc(op, {kSumBlocks}, a.device(), DType::kF64);
    sum(ptr(y), scratch.device_data<double>(), cptr(ac), n, inv, kStream);
    if (!autograd::needs_grad({&a})) return y;
    const Shape shape = a.shape();
    return autograd::record(y, op, {a}, [=](const Tensor& g) {
      // Each element's gradient is float(g) * float(1 / n), read once on the host.
      const float v = static_cast<float>(g.item()) * static_cast<float>(inv);
      Tensor da = alloc(op, shape, g.device());
      set_device(g.device());
      fill(ptr(da), v, n, kStream);
      return std::vector<Tensor>{da};
    });
  }

  Tensor cat(const std::vector<Tensor>& parts, int64_t dim) override {
    const char* op = "cat";
    const Device d = parts[0].device();
    set_device(d);
    const int64_t rank = parts[0].dim();
    if (dim < 0) dim += rank;
    Shape out_shape = parts[0].shape();
    out_shape[static_cast<size_t>(dim)] = 0;
    for (const Tensor& p : parts) out_shape[static_cast<size_t>(dim)] += p.size(dim);
    check(op, rank <= 8, "at most 8 dimensions on a device");
    Tensor y = alloc(op, out_shape, d);
    const Strides ys = y.strides();
    std::vector<Tensor> dense_parts;
    int64_t at = 0;
    std::vector<int64_t> starts;
    for (const Tensor& p : parts) {
      const Tensor pc = dense(p);
      starts.push_back(at);
      if (pc.numel() > 0) {
        strided_copy_to(ptr(y) + at * ys[static_cast<size_t>(dim)], ys.data(), cptr(pc),
                        pc.strides().data(), as_int(rank), pc.shape().data(), sizeof(float),
                        kStream);
      }
      at += p.size(dim);
      dense_parts.push_back(pc);
    }
    bool any = false;
    for (const Tensor& p : parts) any = any || (autograd::grad_enabled() && p.requires_grad());
    if (!any) return y;
    std::vector<bool> need;
    std::vector<Shape> shapes;
    for (const Tensor& p : parts) {
      need.push_back(wants(p));
      shapes.push_back(p.shape());
    }
    return autograd::record(y, op, parts, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      std::vector<Tensor> grads;
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (!need[i]) {
          grads.emplace_back();
          continue;
        }
        Tensor gp = alloc(op, shapes[i], gc.device());
        if (gp.numel() > 0) {
          strided_copy(ptr(gp), cptr(gc) + starts[i] * gc.strides()[static_cast<size_t>(dim)],
                       as_int(rank), shapes[i].data(), gc.strides().data(), sizeof(float), kStream);
        }
        grads.push_back(gp);
      }
      return grads;
    });
  }

  Tensor upsample_nearest2d(const Tensor& x, int64_t factor) override {
    const char* op = "upsample_nearest2d";
    set_device(x.device());
    const Tensor xc = dense(x);
    const int planes = as_int(x.size(0) * x.size(1)), h = as_int(x.size(2)), w = as_int(x.size(3));
    const int f = as_int(factor);
    Tensor y = alloc(op, {x.size(0), x.size(1), h * factor, w * factor}, x.device());
    upsample_nearest2d_forward(ptr(y), cptr(xc), planes, h, w, f, kStream);
    if (!autograd::needs_grad({&x})) return y;
    const Shape shape = x.shape();
    return autograd::record(y, op, {x}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor dx = alloc(op, shape, gc.device());
      upsample_nearest2d_backward(ptr(dx), cptr(gc), planes, h, w, f, kStream);
      return std::vector<Tensor>{dx};
    });
  }

  Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) override {
    const char* op = "max_pool2d";
    set_device(x.device());
    if (stride <= 0) stride = kernel;
    const Tensor xc = dense(x);
    const int planes = as_int(x.size(0) * x.size(1)), h = as_int(x.size(2)), w = as_int(x.size(3));
    const int k = as_int(kernel), st = as_int(stride);
    const int64_t ho = (h - kernel) / stride + 1, wo = (w - kernel) / stride + 1;
    Tensor y = alloc(op, {x.size(0), x.size(1), ho, wo}, x.device());
    Tensor arg = alloc(op, {planes * ho * wo}, x.device(), DType::kI32);
    max_pool2d_forward(ptr(y), arg.device_data<int32_t>(), cptr(xc), planes, h, w, k, st, kStream);
    if (!autograd::needs_grad({&x})) return y;
    const Shape shape = x.shape();
    return autograd::record(y, op, {x}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor dx = alloc(op, shape, gc.device());
      max_pool2d_backward(ptr(dx), cptr(gc), arg.device_data<int32_t>(), planes, h, w, k, st,
                          kStream);
      return std::vector<Tensor>{dx};
    });
  }

  Tensor timestep_embedding(const Tensor& t, int64_t dim, double max_period) override {
    const char* op = "timestep_embedding";
    set_device(t.device());
    const Tensor tc = dense(t);
    Tensor y = alloc(op, {t.size(0), dim}, t.device());
    cuda::timestep_embedding(ptr(y), cptr(tc), as_int(t.size(0)), as_int(dim),
                             static_cast<float>(max_period), kStream);
    return y;  // steps carry no gradient (as on the CPU)
  }

  Tensor attention_packed(const Tensor& qkv, int64_t heads, bool causal) override {
    const char* op = "attention";
    set_device(qkv.device());
    const int b = as_int(qkv.size(0)), t = as_int(qkv.size(1)), c = as_int(qkv.size(2) / 3);
    const int h = as_int(heads);
    check(op, flash_attention_supported(c / h),
          "head size " + std::to_string(c / h) + " is above the kernels' 128");
    const AttnMaskKind mask = causal ? AttnMaskKind::kCausal : AttnMaskKind::kFull;
    const Tensor xc = dense(qkv);
    Tensor out = alloc(op, {b, t, c}, qkv.device());
    Tensor lse = alloc(op, {b, h, t}, qkv.device());
    flash_attention_forward(ptr(out), ptr(lse), cptr(xc), b, t, c, h, mask, 0, kStream);
    if (!autograd::needs_grad({&qkv})) return out;
    const Tensor saved = out.detach();
    return autograd::record(out, op, {qkv}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor dqkv = alloc(op, xc.shape(), gc.device());
      Tensor delta = alloc(op, {b, h, t}, gc.device());
      flash_attention_backward(ptr(dqkv), ptr(delta), cptr(gc), cptr(xc), cptr(saved), cptr(lse), b,
                               t, c, h, mask, 0, kStream);
      return std::vector<Tensor>{dqkv};
    });
  }

  Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) override {
    const char* op = "cross_entropy";
    set_device(logits.device());
    const int n = as_int(logits.size(0)), v = as_int(logits.size(1));
    const Tensor lc = dense(logits), tc = dense(targets);
    // Targets are checked on the host (N values), as the CPU op checks them.
    const Tensor th = *tc.to(Device::cpu());
    const int32_t* pt = th.data<int32_t>();
    for (int i = 0; i < n; ++i) {
      check(op, pt[i] == ignore_index || (pt[i] >= 0 && pt[i] < v),
            "target " + std::to_string(pt[i]) + " out of range [0, " + std::to_string(v) + ")");
    }
    Tensor loss = alloc(op, {}, logits.device());
    Tensor losses = alloc(op, {n}, logits.device());
    Tensor count = alloc(op, {1}, logits.device(), DType::kI32);
    cross_entropy_forward(ptr(losses), ptr(loss), count.device_data<int32_t>(), cptr(lc),
                          tc.device_data<int32_t>(), n, v, ignore_index, kStream);
    if (!autograd::needs_grad({&logits})) return loss;
    return autograd::record(loss, op, {logits, targets}, [=](const Tensor& g) {
      const Tensor gc = dense(g);
      set_device(gc.device());
      Tensor dl = alloc(op, lc.shape(), gc.device());
      cross_entropy_backward(ptr(dl), cptr(lc), tc.device_data<int32_t>(), cptr(gc),
                             count.device_data<int32_t>(), n, v, ignore_index, kStream);
      return std::vector<Tensor>{dl, Tensor()};
    });
  }

  void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                  const ops::DeviceAdamW& a) override {
    set_device(p.device());
    check("AdamW", p.is_contiguous() && m.is_contiguous() && v.is_contiguous(),
          "parameters and state must be contiguous");
    const Tensor gc = dense(g);
    AdamWStep s;
    s.lr = a.lr;
    s.beta1 = a.beta1;
    s.beta2 = a.beta2;
    s.eps = a.eps;
    s.weight_decay = a.weight_decay;
    s.step = static_cast<long>(a.step);
    cuda::adamw_step(ptr(p), nullptr, cptr(gc), ptr(m), ptr(v), static_cast<size_t>(p.numel()), s,
                     kStream);
  }

  void sgd_step(const Tensor& p, const Tensor& g, const Tensor& velocity,
                const ops::DeviceSgd& s) override {
    set_device(p.device());
    check("Sgd", p.is_contiguous() && velocity.is_contiguous(),
          "parameters and state must be contiguous");
    const Tensor gc = dense(g);
    cuda::sgd_step(ptr(p), cptr(gc), ptr(velocity), static_cast<size_t>(p.numel()),
                   static_cast<float>(s.lr), static_cast<float>(s.momentum),
                   static_cast<float>(s.weight_decay), s.nesterov, s.first_step, kStream);
  }

  double sum_squares(const std::vector<Tensor>& gs) override {
    const Device d = gs.front().device();
    set_device(d);
    const auto k = static_cast<int64_t>(gs.size());
    Tensor out = alloc("clip_grad_norm", {k}, d, DType::kF64);
    Tensor scratch = alloc("clip_grad_norm", {kSumSquaresBlocks}, d, DType::kF64);
    std::vector<Tensor> keep;  // contiguous copies live until the sums are read
    for (int64_t i = 0; i < k; ++i) {
      const Tensor gc = dense(gs[static_cast<size_t>(i)]);
      keep.push_back(gc);
      cuda::sum_squares(out.device_data<double>() + i, scratch.device_data<double>(), cptr(gc),
                        static_cast<size_t>(gc.numel()), kStream);
    }
    const std::vector<double> sums = out.to_double_vector();  // the one wait
    double sq = 0.0;
    for (double v : sums) sq += v;
    return sq;
  }

  void ema_update(const Tensor& ema, const Tensor& w, float d) override {
    set_device(ema.device());
    check("ema", ema.is_contiguous(), "in-place update of a strided tensor");
    const Tensor wc = dense(w);
    ema_lerp(ptr(ema), cptr(wc), d, static_cast<size_t>(ema.numel()), kStream);
  }

  void scale_(const Tensor& x, double s) override {
    set_device(x.device());
    check("scale", x.is_contiguous(), "in-place scale of a strided tensor");
    scale(ptr(x), cptr(x), static_cast<float>(s), static_cast<size_t>(x.numel()), kStream);
  }

 private:
  static void set_device(Device d) {
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != d.index) cudaSetDevice(d.index);
  }

  // One context per thread and GPU: cuBLAS and cuDNN handles are not for concurrent use, and a
  // simulation trains several virtual clients at once (their work meets on the legacy stream).
  bool tf32_ = false;

  Context& context(const char* op, Device d) {
    set_device(d);
    thread_local std::map<int, std::unique_ptr<Context>> contexts;
    auto& slot = contexts[d.index];
    if (!slot) {
      auto c = std::make_unique<Context>();
      c->cublas = make_cublas();
      if (tf32_)
        STARLING_CUBLAS_CHECK(cublasSetMathMode(c->cublas.get(), CUBLAS_TF32_TENSOR_OP_MATH));
      c->workspace = std::make_unique<DeviceAllocator>(d.index);
      auto conv = CudnnConv::create(c->workspace.get(), tf32_);
      if (!conv.ok()) fail(op, "cuDNN on " + device_str(d) + ": " + conv.status().to_string());
      c->conv = std::move(*conv);
      slot = std::move(c);
    }
    return *slot;
  }
};

}  // namespace

ops::DeviceOps* cuda_device_ops() {
  static CudaOps* ops = new CudaOps();  // never destroyed: tensors may outlive main
  return ops;
}

}  // namespace starling::cuda

#endif  // STARLING_WITH_CUDA
