// [cuda] Every CUDA kernel against its CPU reference (core/ops in float64, through autograd for
// the backward passes), on shapes that are not multiples of the block sizes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "core/cuda/kernels.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

using testing::f64;
using testing::random_floats;
using testing::require_close;
using testing::values;

// Forward with an upstream gradient dy: returns the reference grads of `inputs`.
std::vector<std::vector<double>> ref_grads(const Tensor& y, const Tensor& dy,
                                           const std::vector<Tensor>& inputs) {
  autograd::backward(y, dy);
  std::vector<std::vector<double>> out;
  for (const auto& t : inputs) out.push_back(values(t.grad()));
  return out;
}

TEST_CASE("layer_norm forward and backward match the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [n, c] = GENERATE(
      table<int, int>({{1, 1}, {3, 7}, {5, 130}, {17, 385}, {4, 1000}, {700, 33}, {1031, 97}}));
  // The last two split their rows into slices for the weight and bias sums (row_slices).
  INFO("N " << n << " C " << c);
  const auto hx = random_floats(size_t(n) * c, 1, 2.0), hw = random_floats(c, 2),
             hb = random_floats(c, 3), hdy = random_floats(size_t(n) * c, 4);
  Tensor x = f64(hx, {n, c}, true), w = f64(hw, {c}, true), b = f64(hb, {c}, true);
  Tensor y = ops::layer_norm(x, w, b, 1e-5);
  auto grads = ref_grads(y, f64(hdy, {n, c}), {x, w, b});

  auto dx = DeviceArray<float>::from_host(hx), dw = DeviceArray<float>::from_host(hw),
       db = DeviceArray<float>::from_host(hb), ddy = DeviceArray<float>::from_host(hdy);
  DeviceArray<float> dyo(hx.size()), mean(n), rstd(n), gx(hx.size()), gw(c), gb(c);
  layer_norm_forward(dyo.get(), mean.get(), rstd.get(), dx.get(), dw.get(), db.get(), n, c, 1e-5f,
                     nullptr);
  layer_norm_backward(gx.get(), gw.get(), gb.get(), ddy.get(), dx.get(), dw.get(), mean.get(),
                      rstd.get(), n, c, nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(dyo.to_host(), values(y));
  // With C = 1 every normalized value is 0 and dx is exactly 0 on both sides.
  if (c > 1) require_close(gx.to_host(), grads[0]);
  require_close(gw.to_host(), grads[1]);
  require_close(gb.to_host(), grads[2]);
}

TEST_CASE("gelu forward and backward match the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const size_t n = GENERATE(size_t{1}, size_t{1000}, size_t{4099});
  const auto hx = random_floats(n, 5, 3.0), hdy = random_floats(n, 6);
  Tensor x = f64(hx, {static_cast<int64_t>(n)}, true);
  Tensor y = ops::gelu(x);
  auto grads = ref_grads(y, f64(hdy, {static_cast<int64_t>(n)}), {x});
  auto dx = DeviceArray<float>::from_host(hx), ddy = DeviceArray<float>::from_host(hdy);
  DeviceArray<float> yo(n), gx(n);
  gelu_forward(yo.get(), dx.get(), n, nullptr);
  gelu_backward(gx.get(), ddy.get(), dx.get(), n, nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(yo.to_host(), values(y));
  require_close(gx.to_host(), grads[0]);
}

TEST_CASE("softmax + cross-entropy forward and backward match the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [n, v] = GENERATE(table<int, int>({{1, 2}, {3, 5}, {7, 65}, {13, 1001}, {9, 2051}}));
  INFO("N " << n << " V " << v);
  const auto hl = random_floats(size_t(n) * v, 7, 3.0);
  Rng rng(8);
  std::vector<int32_t> ht(n);
  for (auto& t : ht) t = static_cast<int32_t>(rng.uniform() * v) % v;
  if (n > 1) ht[1] = -100;  // an ignored row
  Tensor logits = f64(hl, {n, v}, true);
  Tensor loss = ops::cross_entropy(logits, Tensor::from_vector(ht, {n}));
  auto grads = ref_grads(loss, Tensor::scalar(0.5, DType::kF64), {logits});

  auto dl = DeviceArray<float>::from_host(hl);
  auto dt = DeviceArray<int>::from_host(std::vector<int>(ht.begin(), ht.end()));
  auto dloss_up = DeviceArray<float>::from_host({0.5f});
  DeviceArray<float> losses(n), lo(1), gl(hl.size());
  DeviceArray<int> count(1);
  cross_entropy_forward(losses.get(), lo.get(), count.get(), dl.get(), dt.get(), n, v, -100,
                        nullptr);
  cross_entropy_backward(gl.get(), dl.get(), dt.get(), dloss_up.get(), count.get(), n, v, -100,
                         nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(lo.to_host(), values(loss));
  REQUIRE(count.to_host()[0] == (n > 1 ? n - 1 : n));
  require_close(gl.to_host(), grads[0]);
}

TEST_CASE("attention over packed heads matches the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [b, t, c, h] = GENERATE(
      table<int, int, int, int>({{1, 1, 4, 1}, {2, 5, 12, 3}, {1, 33, 16, 2}, {3, 70, 48, 6}}));
  const bool causal = GENERATE(true, false);
  INFO("B " << b << " T " << t << " C " << c << " H " << h << " causal " << causal);
  const auto hqkv = random_floats(size_t(b) * t * 3 * c, 9),
             hdy = random_floats(size_t(b) * t * c, 10);
  Tensor qkv = f64(hqkv, {b, t, 3 * c}, true);
  Tensor y = ops::attention_packed(qkv, h, causal);
  auto grads = ref_grads(y, f64(hdy, {b, t, c}), {qkv});

  auto handle = make_cublas();
  auto dq = DeviceArray<float>::from_host(hqkv), ddy = DeviceArray<float>::from_host(hdy);
  DeviceArray<float> out(size_t(b) * t * c), att(size_t(b) * h * t * t),
      scratch(size_t(b) * h * t * t), gq(hqkv.size());
  attention_forward(out.get(), att.get(), dq.get(), b, t, c, h, causal, handle.get(), nullptr);
  attention_backward(gq.get(), scratch.get(), ddy.get(), dq.get(), att.get(), b, t, c, h,
                     handle.get(), nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(out.to_host(), values(y));
  require_close(gq.to_host(), grads[0]);

  // The flash kernels: no probabilities, (B, H, T) log-sum-exps; outputs poisoned first.
  REQUIRE(flash_attention_supported(c / h));
  const auto mask = causal ? AttnMaskKind::kCausal : AttnMaskKind::kFull;
  auto fo = DeviceArray<float>::from_host(std::vector<float>(size_t(b) * t * c, std::nanf("")));
  auto fq = DeviceArray<float>::from_host(std::vector<float>(hqkv.size(), std::nanf("")));
  DeviceArray<float> lse(size_t(b) * h * t), delta(size_t(b) * h * t);
  flash_attention_forward(fo.get(), lse.get(), dq.get(), b, t, c, h, mask, 1, nullptr);
  flash_attention_backward(fq.get(), delta.get(), ddy.get(), dq.get(), fo.get(), lse.get(), b, t, c,
                           h, mask, 1, nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(fo.to_host(), values(y));
  require_close(fq.to_host(), grads[0]);

  // On tensor cores: bf16 operands, fp32 accumulation, 1e-2 of the float64 result.
  fo = DeviceArray<float>::from_host(std::vector<float>(size_t(b) * t * c, std::nanf("")));
  fq = DeviceArray<float>::from_host(std::vector<float>(hqkv.size(), std::nanf("")));
  flash_attention_forward_bf16(fo.get(), lse.get(), dq.get(), b, t, c, h, mask, 1, nullptr);
  flash_attention_backward_bf16(fq.get(), delta.get(), ddy.get(), dq.get(), fo.get(), lse.get(), b,
                                t, c, h, mask, 1, nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  require_close(fo.to_host(), values(y), 1e-2);
  require_close(fq.to_host(), grads[0], 1e-2);
}

TEST_CASE("linear and matmul through cuBLAS match the CPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  auto handle = make_cublas();
  SECTION("linear with bias") {
    const auto [n, in, out] =
        GENERATE(table<int, int, int>({{1, 1, 1}, {5, 7, 3}, {33, 129, 65}, {517, 24, 40}}));
    INFO("N " << n << " in " << in << " out " << out);
    const auto hx = random_floats(size_t(n) * in, 11), hw = random_floats(size_t(out) * in, 12),
               hb = random_floats(out, 13), hdy = random_floats(size_t(n) * out, 14);
    Tensor x = f64(hx, {n, in}, true), w = f64(hw, {out, in}, true), bias = f64(hb, {out}, true);
    Tensor y = ops::linear(x, w, bias);
    auto grads = ref_grads(y, f64(hdy, {n, out}), {x, w, bias});
    auto dx = DeviceArray<float>::from_host(hx), dw = DeviceArray<float>::from_host(hw),
         db = DeviceArray<float>::from_host(hb), ddy = DeviceArray<float>::from_host(hdy);
    DeviceArray<float> yo(size_t(n) * out), gx(hx.size()), gw(hw.size()), gb(out);
    linear_forward(yo.get(), dx.get(), dw.get(), db.get(), n, in, out, handle.get(), nullptr);
    linear_backward(gx.get(), gw.get(), gb.get(), ddy.get(), dx.get(), dw.get(), n, in, out,
                    handle.get(), nullptr);
    // The cuBLASLt path with the bias in the epilogue.
    auto lt = make_cublas_lt();
    DeviceArray<char> workspace(size_t{32} << 20);
    DeviceArray<float> ylt(size_t(n) * out);
    linear_forward_lt(ylt.get(), dx.get(), dw.get(), db.get(), n, in, out, lt.get(),
                      workspace.get(), workspace.size(), handle.get(), nullptr);
    STARLING_CUDA_CHECK(cudaDeviceSynchronize());
    require_close(yo.to_host(), values(y));
    require_close(ylt.to_host(), values(y));
    require_close(gx.to_host(), grads[0]);
    require_close(gw.to_host(), grads[1]);
    require_close(gb.to_host(), grads[2]);
  }
  SECTION("matmul") {
    const int m = 17, n = 9, k = 130;
    const auto ha = random_floats(size_t(m) * k, 15), hb = random_floats(size_t(k) * n, 16),
               hdc = random_floats(size_t(m) * n, 17);
    Tensor a = f64(ha, {m, k}, true), bm = f64(hb, {k, n}, true);
    Tensor cm = ops::matmul(a, bm);
    auto grads = ref_grads(cm, f64(hdc, {m, n}), {a, bm});
    auto da = DeviceArray<float>::from_host(ha), db = DeviceArray<float>::from_host(hb),
         ddc = DeviceArray<float>::from_host(hdc);
    DeviceArray<float> co(size_t(m) * n), ga(ha.size()), gb(hb.size());
    matmul_forward(co.get(), da.get(), db.get(), m, n, k, handle.get(), nullptr);
    matmul_backward(ga.get(), gb.get(), ddc.get(), da.get(), db.get(), m, n, k, handle.get(),
                    nullptr);
    STARLING_CUDA_CHECK(cudaDeviceSynchronize());
    require_close(co.to_host(), values(cm));
    require_close(ga.to_host(), grads[0]);
    require_close(gb.to_host(), grads[1]);
  }
}

TEST_CASE("AdamW step matches core/optim, with the bf16 copy rounded to nearest", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const size_t n = GENERATE(size_t{1}, size_t{1025});
  const bool decay = GENERATE(false, true);
  optim::AdamWOptions opt;
  opt.weight_decay = decay ? 0.1 : 0.0;
  const auto hp = random_floats(n, 18);
  Tensor p = Tensor::from_vector(hp, {static_cast<int64_t>(n)});
  optim::AdamW cpu({{p, true}}, opt);

  auto dp = DeviceArray<float>::from_host(hp);
  DeviceArray<float> m(n), v(n);
  STARLING_CUDA_CHECK(cudaMemset(m.get(), 0, n * sizeof(float)));
  STARLING_CUDA_CHECK(cudaMemset(v.get(), 0, n * sizeof(float)));
  DeviceArray<__nv_bfloat16> p16(n);
  for (int step = 1; step <= 3; ++step) {
    const auto hg = random_floats(n, 100 + step);
    p.set_grad(Tensor::from_vector(hg, {static_cast<int64_t>(n)}));
    cpu.step(1e-2);
    auto dg = DeviceArray<float>::from_host(hg);
    AdamWStep s;
    s.lr = 1e-2;
    s.beta1 = opt.beta1;
    s.beta2 = opt.beta2;
    s.eps = opt.eps;
    s.weight_decay = opt.weight_decay;
    s.step = step;
    adamw_step(dp.get(), p16.get(), dg.get(), m.get(), v.get(), n, s, nullptr);
  }
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = dp.to_host();
  require_close(got, values(p));
  const auto got16 = p16.to_host();
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, &got16[i], sizeof(bits));
    REQUIRE(bits == float_to_bf16(got[i]));
  }
}

}  // namespace
}  // namespace starling::cuda
