#include "tests/testing/emulated_device.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/concat.h"
#include "core/ops/conv.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/layer_norm.h"
#include "core/ops/matmul.h"
#include "core/ops/norm2d.h"
#include "core/ops/pool.h"
#include "core/ops/reduce.h"
#include "core/ops/relu.h"
#include "core/ops/time_embedding.h"
#include "core/optim/optimizer.h"
#include "core/tensor/device_backend.h"

namespace starling::testing {

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "starling: emulated device: %s\n", what.c_str());
  std::abort();
}

Tensor to_host(const Tensor& t) {
  auto h = t.to(Device::cpu());
  if (!h.ok()) fail("to host: " + h.status().to_string());
  return *h;
}

Tensor to_device(const Tensor& t, Device d) {
  auto o = t.to(d);
  if (!o.ok()) fail("to " + device_str(d) + ": " + o.status().to_string());
  return *o;
}

// Host memory behind the DeviceBackend interface.
class HostBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "emulated cuda"; }
  int device_count() const override { return 1; }
  Result<void*> allocate(int, size_t nbytes) override {
    void* p = std::calloc(1, nbytes);
    if (p == nullptr) return resource_exhausted("out of host memory");
    live += nbytes;
    return p;
  }
  void release(int, void* p, size_t nbytes) override {
    live -= nbytes;
    std::free(p);
  }
  Status copy(void* dst, const void* src, size_t nbytes, Direction, int) override {
    std::memmove(dst, src, nbytes);
    return ok_status();
  }
  std::atomic<size_t> live{0};
};

using CpuFn = std::function<Tensor(const std::vector<Tensor>&)>;

// The inputs' host copies run the CPU op (recording on the host when the device graph needs a
// gradient); the result goes to the device, with a backward that walks the host graph.
class HostOps final : public ops::DeviceOps {
 public:
  const char* name() const override { return "emulated cuda"; }

  Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                int64_t padding, const Tensor& residual) override {
    return run("conv2d", {x, w, bias, residual}, [&](const std::vector<Tensor>& h) {
      return ops::conv2d(h[0], h[1], h[2], stride, padding, h[3]);
    });
  }
  Tensor group_norm(const Tensor& x, const Tensor& shift, int64_t groups, const Tensor& weight,
                    const Tensor& bias, double eps, bool silu) override {
    return run("group_norm", {x, shift, weight, bias}, [&](const std::vector<Tensor>& h) {
      if (h[1].defined()) return ops::shifted_group_norm_silu(h[0], h[1], groups, h[2], h[3], eps);
      return silu ? ops::group_norm_silu(h[0], groups, h[2], h[3], eps)
                  : ops::group_norm(h[0], groups, h[2], h[3], eps);
    });
  }
  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) override {
    return run("linear", {x, w, bias},
               [](const std::vector<Tensor>& h) { return ops::linear(h[0], h[1], h[2]); });
  }
  Tensor unary(Unary op, const Tensor& x) override {
    return run("unary", {x}, [op](const std::vector<Tensor>& h) {
      switch (op) {
        case Unary::kSilu:
          return ops::silu(h[0]);
        case Unary::kRelu:
          return ops::relu(h[0]);
        case Unary::kSquare:
          return ops::square(h[0]);
      }
      fail("unknown unary op");
    });
  }
  Tensor binary(Binary op, const Tensor& a, const Tensor& b) override {
    return run("binary", {a, b}, [op](const std::vector<Tensor>& h) {
      switch (op) {
        case Binary::kAdd:
          return ops::add(h[0], h[1]);
        case Binary::kSub:
          return ops::sub(h[0], h[1]);
        case Binary::kMul:
          return ops::mul(h[0], h[1]);
      }
      fail("unknown binary op");
    });
  }
  Tensor mul_scalar(const Tensor& a, double s) override {
    return run("mul_scalar", {a},
               [s](const std::vector<Tensor>& h) { return ops::mul_scalar(h[0], s); });
  }
  Tensor mean(const Tensor& a) override {
    return run("mean", {a}, [](const std::vector<Tensor>& h) { return ops::mean(h[0]); });
  }
  Tensor cat(const std::vector<Tensor>& parts, int64_t dim) override {
    return run("cat", parts, [dim](const std::vector<Tensor>& h) { return ops::cat(h, dim); });
  }
  Tensor upsample_nearest2d(const Tensor& x, int64_t scale) override {
    return run("upsample_nearest2d", {x}, [scale](const std::vector<Tensor>& h) {
      return ops::upsample_nearest2d(h[0], scale);
    });
  }
  Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride) override {
    return run("max_pool2d", {x},
               [=](const std::vector<Tensor>& h) { return ops::max_pool2d(h[0], kernel, stride); });
  }
  Tensor timestep_embedding(const Tensor& t, int64_t dim, double max_period) override {
    return run("timestep_embedding", {t}, [=](const std::vector<Tensor>& h) {
      return ops::timestep_embedding(h[0], dim, max_period);
    });
  }
  Tensor attention_packed(const Tensor& qkv, int64_t heads, bool causal) override {
    return run("attention_packed", {qkv}, [=](const std::vector<Tensor>& h) {
      return ops::attention_packed(h[0], heads, causal);
    });
  }
  Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) override {
    return run("cross_entropy", {logits, targets}, [=](const std::vector<Tensor>& h) {
      return ops::cross_entropy(h[0], h[1], ignore_index);
    });
  }

  void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                  const ops::DeviceAdamW& a) override {
    ++calls;
    Tensor hp = to_host(p), hg = to_host(g), hm = to_host(m), hv = to_host(v);
    optim::internal::adamw_update_f32(hp.data<float>(), hg.data<float>(), hm.data<float>(),
                                      hv.data<float>(), hp.numel(), a);
    put(p, hp);
    put(m, hm);
    put(v, hv);
  }
  void sgd_step(const Tensor& p, const Tensor& g, const Tensor& velocity,
                const ops::DeviceSgd& s) override {
    ++calls;
    Tensor hp = to_host(p), hg = to_host(g), hv = to_host(velocity);
    optim::internal::sgd_update_f32(hp.data<float>(), hg.data<float>(), hv.data<float>(),
                                    hp.numel(), s);
    put(p, hp);
    put(velocity, hv);
  }
  double sum_squares(const std::vector<Tensor>& gs) override {
    ++calls;
    double sq = 0.0;  // clip_grad_norm's order: per tensor, added in order from 0
    for (const Tensor& g : gs) {
      const Tensor h = to_host(g);
      sq += optim::internal::sum_squares_f32(h.data<float>(), h.numel());
    }
    return sq;
  }
  void ema_update(const Tensor& ema, const Tensor& w, float d) override {
    ++calls;
    Tensor he = to_host(ema);
    const Tensor hw = to_host(w);
    float* pe = he.data<float>();
    const float* pw = hw.data<float>();
    for (int64_t j = 0; j < he.numel(); ++j) pe[j] = d * pe[j] + (1.0f - d) * pw[j];
    put(ema, he);
  }
  void scale_(const Tensor& x, double s) override {
    ++calls;
    Tensor h = to_host(x);
    float* p = h.data<float>();
    const auto f = static_cast<float>(s);
    for (int64_t i = 0; i < h.numel(); ++i) p[i] *= f;
    put(x, h);
  }

  std::atomic<size_t> calls{0};

 private:
  // Writes host values back into a device tensor's own storage (in place).
  static void put(const Tensor& dst, const Tensor& host) {
    if (!dst.is_contiguous()) fail("in-place update of a strided device tensor");
    std::memcpy(dst.device_data<float>(), host.data<float>(), host.nbytes());
  }

  Tensor run(const char* name, const std::vector<Tensor>& in, const CpuFn& cpu) {
    ++calls;
    Device dev = Device::cpu();
    bool grad = false;
    for (const Tensor& t : in) {
      if (!t.defined()) continue;
      if (!t.is_cpu()) dev = t.device();
      grad = grad || (autograd::grad_enabled() && t.requires_grad());
    }
    if (dev.is_cpu()) fail(std::string(name) + ": no input on the device");
    std::vector<Tensor> host(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].defined()) continue;
      host[i] = to_host(in[i]);
      if (grad && in[i].requires_grad()) host[i].set_requires_grad(true);
    }
    Tensor out_h = cpu(host);
    Tensor out_d = to_device(out_h.detach(), dev);
    if (!grad) return out_d;
    std::vector<Tensor> kept;  // record() takes the defined inputs only
    std::vector<size_t> index;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].defined()) {
        kept.push_back(in[i]);
        index.push_back(i);
      }
    }
    return autograd::record(out_d, name, kept, [host, out_h, index, dev](const Tensor& g) {
      autograd::backward(out_h, to_host(g));
      std::vector<Tensor> grads;
      for (size_t i : index) {
        const Tensor hg = host[i].requires_grad() ? host[i].grad() : Tensor();
        grads.push_back(hg.defined() ? to_device(hg, dev) : Tensor());
      }
      return grads;
    });
  }
};

DeviceBackend* g_previous_backend = nullptr;
ops::DeviceOps* g_previous_ops = nullptr;
std::mutex g_mu;
bool g_live = false;

}  // namespace

struct EmulatedDevice::State {
  HostBackend backend;
  HostOps ops;
};

EmulatedDevice::EmulatedDevice() : state_(std::make_unique<State>()) {
  std::lock_guard lock(g_mu);
  if (g_live) fail("one EmulatedDevice at a time");
  g_live = true;
  g_previous_backend = install_device_backend(DeviceType::kCUDA, &state_->backend);
  g_previous_ops = ops::device_ops(DeviceType::kCUDA);
  ops::install_device_ops(DeviceType::kCUDA, &state_->ops);
}

EmulatedDevice::~EmulatedDevice() {
  std::lock_guard lock(g_mu);
  install_device_backend(DeviceType::kCUDA, g_previous_backend);
  ops::install_device_ops(DeviceType::kCUDA, g_previous_ops);
  g_live = false;
}

size_t EmulatedDevice::live_bytes() const { return state_->backend.live.load(); }
size_t EmulatedDevice::op_calls() const { return state_->ops.calls.load(); }

}  // namespace starling::testing
