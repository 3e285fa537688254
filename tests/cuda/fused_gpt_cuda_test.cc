// [cuda] The fused GPT trainer's new kernels (encoder, residual add, sum of squares, clipping)
// against their CPU twins in models/gpt/fused_cpu.cc, and the CUDA backend's FusedGpt against
// the CPU backend's: gradients after one step, and the losses of 10 training steps.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>

#include "core/cuda/kernels.h"
#include "core/optim/optimizer.h"
#include "models/gpt/fused_gpt.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing/fused_weights.h"

namespace starling::cuda {
namespace {

using models::EncoderBuckets;
using models::FusedGpt;
using testing::random_floats;

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<int32_t> random_tokens(size_t n, int64_t v, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(v)));
  return out;
}

// Positions grouped by token, in position order (what FusedGpt builds for each batch).
struct HostBuckets {
  std::vector<int32_t> order, starts, tokens;
};
HostBuckets buckets_of(const std::vector<int32_t>& idx) {
  HostBuckets h;
  h.order.resize(idx.size());
  std::iota(h.order.begin(), h.order.end(), 0);
  std::stable_sort(h.order.begin(), h.order.end(),
                   [&](int32_t a, int32_t b) { return idx[a] < idx[b]; });
  for (size_t i = 0; i < h.order.size(); ++i) {
    if (i == 0 || idx[h.order[i]] != idx[h.order[i - 1]]) {
      h.tokens.push_back(idx[h.order[i]]);
      h.starts.push_back(static_cast<int32_t>(i));
    }
  }
  h.starts.push_back(static_cast<int32_t>(idx.size()));
  return h;
}

TEST_CASE("encoder forward and backward match the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [b, t, c, v] =
      GENERATE(table<int, int, int, int>({{1, 1, 1, 2}, {3, 37, 70, 29}, {2, 64, 300, 1000}}));
  INFO("B " << b << " T " << t << " C " << c << " V " << v);
  const size_t n = static_cast<size_t>(b) * t;
  // A skewed token distribution: a few tokens fill long buckets.
  auto idx = random_tokens(n, v, 1);
  for (size_t i = 0; i < n; i += 3) idx[i] = 0;
  const auto wte = random_floats(static_cast<size_t>(v) * c, 2),
             wpe = random_floats(static_cast<size_t>(t) * c, 3), dout = random_floats(n * c, 4),
             dwte0 = random_floats(static_cast<size_t>(v) * c, 5),
             dwpe0 = random_floats(static_cast<size_t>(t) * c, 6);
  const HostBuckets hb = buckets_of(idx);

  auto cpu = models::make_fused_cpu_backend();
  std::vector<float> out_cpu(n * c), dwte_cpu = dwte0, dwpe_cpu = dwpe0;
  cpu->encoder_forward(out_cpu.data(), idx.data(), wte.data(), wpe.data(), b, t, c);
  cpu->encoder_backward(dwte_cpu.data(), dwpe_cpu.data(), dout.data(),
                        EncoderBuckets{hb.order.data(), hb.starts.data(), hb.tokens.data(),
                                       static_cast<int>(hb.tokens.size())},
                        b, t, c);

  auto d_idx = DeviceArray<int>::from_host(idx), d_order = DeviceArray<int>::from_host(hb.order),
       d_starts = DeviceArray<int>::from_host(hb.starts),
       d_tokens = DeviceArray<int>::from_host(hb.tokens);
  auto d_wte = DeviceArray<float>::from_host(wte), d_wpe = DeviceArray<float>::from_host(wpe),
       d_dout = DeviceArray<float>::from_host(dout), d_dwte = DeviceArray<float>::from_host(dwte0),
       d_dwpe = DeviceArray<float>::from_host(dwpe0);
  DeviceArray<float> d_out(n * c);
  encoder_forward(d_out.get(), d_idx.get(), d_wte.get(), d_wpe.get(), b, t, c, nullptr);
  encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_order.get(), d_starts.get(),
                   d_tokens.get(), static_cast<int>(hb.tokens.size()), b, t, c, nullptr);
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  // Additions only, in the same order on both sides: bit for bit.
  CHECK(d_out.to_host() == out_cpu);
  CHECK(d_dwte.to_host() == dwte_cpu);
  CHECK(d_dwpe.to_host() == dwpe_cpu);
}

TEST_CASE("residual add, sum of squares and clipping match the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const size_t n = GENERATE(size_t{1}, size_t{1000}, size_t{300001}, size_t{5000000});
  INFO("n " << n);
  auto cpu = models::make_fused_cpu_backend();
  const auto a = random_floats(n, 7), b = random_floats(n, 8, 3.0);
  std::vector<float> sum_cpu(n);
  cpu->residual_add(sum_cpu.data(), a.data(), b.data(), n);
  auto d_a = DeviceArray<float>::from_host(a), d_b = DeviceArray<float>::from_host(b);
  residual_add(d_a.get(), d_a.get(), d_b.get(), n, nullptr);  // in place, as backward uses it
  STARLING_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(d_a.to_host() == sum_cpu);

  double sq_cpu = 0.0;
  cpu->sum_squares(&sq_cpu, b.data(), n);
  DeviceArray<double> d_sq(1), scratch(kSumSquaresBlocks);
  sum_squares(d_sq.get(), scratch.get(), d_b.get(), n, nullptr);
  const double sq_gpu = d_sq.to_host()[0];
  CHECK(sq_gpu == Approx(sq_cpu).epsilon(1e-10));  // double sums in another order
  // Deterministic: the same bits again.
  sum_squares(d_sq.get(), scratch.get(), d_b.get(), n, nullptr);
  CHECK(d_sq.to_host()[0] == sq_gpu);

  // Clipping reads the norm on the device: the CPU's arithmetic on the same norm, bit for bit;
  // a max_norm above the norm, or 0, leaves the values unchanged.
  const double norm = std::sqrt(sq_gpu);
  for (const double max_norm : {0.5 * norm, 2.0 * norm, 0.0}) {
    INFO("max_norm " << max_norm);
    std::vector<float> x_cpu = b;
    cpu->clip_scale(x_cpu.data(), n, &sq_gpu, max_norm);
    auto d_x = DeviceArray<float>::from_host(b);
    clip_scale(d_x.get(), n, d_sq.get(), max_norm, nullptr);
    STARLING_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(d_x.to_host() == x_cpu);
    if (max_norm != 0.5 * norm) CHECK(x_cpu == b);
  }
}

models::GptConfig shape(int which) {
  models::GptConfig c;
  if (which == 0) {  // tiny, with biases, odd sizes
    c.vocab_size = 29;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 34;
    c.bias = true;
  } else {  // the char GPT of configs/gpt_char_cpu.toml
    c.vocab_size = 65;
    c.block_size = 64;
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 128;
  }
  return c;
}

std::unique_ptr<FusedGpt> make(const models::GptConfig& c, int64_t b, bool gpu) {
  std::unique_ptr<models::FusedBackend> backend;
  if (gpu) {
    auto r = models::make_fused_cuda_backend(0);
    REQUIRE(r.ok());
    backend = std::move(*r);
  } else {
    backend = models::make_fused_cpu_backend();
  }
  auto m = FusedGpt::make(c, b, c.block_size, 1, std::move(backend));
  REQUIRE(m.ok());
  return std::move(*m);
}

TEST_CASE("fused GPT on CUDA: gradients match the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int which = GENERATE(0, 1);
  // Learned positions, and RoPE (no wpe: the CUDA encoder adds zero rows, its wpe gradient goes
  // to scratch).
  const bool rope = GENERATE(false, true);
  auto c = shape(which);
  c.rope = rope;
  if (rope && which == 0) c.n_embd = 36;  // RoPE needs an even head size: 2 heads of 18
  const int64_t b = 4;
  INFO("shape " << which << " rope " << rope);
  const auto sd = starling::testing::random_fused_weights(c, 10, 0.1);
  auto cpu = make(c, b, false);
  auto gpu = make(c, b, true);
  REQUIRE(cpu->load(sd).ok());
  REQUIRE(gpu->load(sd).ok());
  const size_t n = static_cast<size_t>(b * c.block_size);
  const auto x = random_tokens(n, c.vocab_size, 11), y = random_tokens(n, c.vocab_size, 12);
  auto lc = cpu->forward_backward(x.data(), y.data(), n);
  auto lg = gpu->forward_backward(x.data(), y.data(), n);
  REQUIRE(lc.ok());
  REQUIRE(lg.ok());
  CHECK(*lg == Approx(*lc).epsilon(1e-5));
  // Whole-model fp32 on both sides (cuBLAS vs OpenBLAS sums through every layer): 1e-4 of the
  // largest logit; single ops are held to 1e-5 by ops_parity_test.cc and the kernels above.
  testing::require_close(gpu->logits_host(), as_double(cpu->logits_host()), 1e-4);
  const auto gc = cpu->gradients_host(), gg = gpu->gradients_host();
  for (const auto& p : cpu->layout()) {
    INFO(p.name);
    const auto off = static_cast<std::ptrdiff_t>(p.offset);
    const auto len = static_cast<std::ptrdiff_t>(p.numel);
    testing::require_close(std::vector<float>(gg.begin() + off, gg.begin() + off + len),
                           as_double(std::vector<float>(gc.begin() + off, gc.begin() + off + len)),
                           1e-4);
  }
}

TEST_CASE("fused GPT on CUDA: 10 training steps give the CPU backend's losses", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int which = GENERATE(0, 1);
  const auto c = shape(which);
  const int64_t b = 8;
  INFO("shape " << which);
  auto cpu = make(c, b, false);  // both from models::Gpt(c, 1)'s initialization
  auto gpu = make(c, b, true);
  const size_t n = static_cast<size_t>(b * c.block_size);
  const models::FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  const optim::CosineSchedule sched{3e-3, 3e-4, 3, 8};
  for (int it = 0; it < 10; ++it) {
    INFO("step " << it);
    const auto x = random_tokens(n, c.vocab_size, 100 + it);
    const auto y = random_tokens(n, c.vocab_size, 200 + it);
    auto sc = cpu->train_step(x.data(), y.data(), n, sched.at(it), opt, 1.0);
    auto sg = gpu->train_step(x.data(), y.data(), n, sched.at(it), opt, 1.0);
    REQUIRE(sc.ok());
    REQUIRE(sg.ok());
    CHECK(std::abs(sg->loss - sc->loss) <= 1e-3);
    CHECK(sg->grad_norm == Approx(sc->grad_norm).epsilon(1e-3));
  }
}

TEST_CASE("bf16 linear layers on CUDA match the CPU backend's bf16 emulation", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [n, in, out] =
      GENERATE(table<int, int, int>({{1, 1, 1}, {37, 70, 29}, {512, 384, 1152}, {64, 768, 3072}}));
  INFO("N " << n << " IN " << in << " OUT " << out);
  const auto x = random_floats(static_cast<size_t>(n) * in, 31),
             w = random_floats(static_cast<size_t>(out) * in, 32),
             bias = random_floats(static_cast<size_t>(out), 33),
             dy = random_floats(static_cast<size_t>(n) * out, 34);
  std::vector<float> want_y(static_cast<size_t>(n) * out), want_dx(x.size()), want_dw(w.size()),
      want_db(bias.size());
  {
    auto cpu = models::make_fused_cpu_backend();
    REQUIRE(cpu->set_bf16_matmuls(true, 0).ok());
    cpu->linear_forward(want_y.data(), x.data(), w.data(), bias.data(), n, in, out);
    cpu->linear_backward(want_dx.data(), want_dw.data(), want_db.data(), dy.data(), x.data(),
                         w.data(), n, in, out);
  }
  auto handle = make_cublas();
  auto stream = make_stream();
  auto gx = DeviceArray<float>::from_host(x), gw = DeviceArray<float>::from_host(w),
       gb = DeviceArray<float>::from_host(bias), gdy = DeviceArray<float>::from_host(dy);
  DeviceArray<float> gy(want_y.size()), gdx(x.size()), gdw(w.size()), gdb(bias.size());
  DeviceArray<__nv_bfloat16> scratch(linear_bf16_scratch_elems(n, in, out));
  linear_forward_bf16(gy.get(), gx.get(), gw.get(), gb.get(), n, in, out, scratch.get(),
                      handle.get(), stream.get());
  linear_backward_bf16(gdx.get(), gdw.get(), gdb.get(), gdy.get(), gx.get(), gw.get(), n, in, out,
                       scratch.get(), handle.get(), stream.get());
  STARLING_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  // Same bf16 inputs, exact products: only the order of the fp32 sums differs.
  auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    return err / scale;
  };
  CHECK(close(gy.to_host(), want_y) <= 1e-4);
  CHECK(close(gdx.to_host(), want_dx) <= 1e-4);
  CHECK(close(gdw.to_host(), want_dw) <= 1e-4);
  CHECK(close(gdb.to_host(), want_db) <= 1e-5);
}

TEST_CASE("fused GPT on CUDA in bf16: 10 training steps give the CPU emulation's losses",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto c = shape(1);
  const int64_t b = 8;
  auto cpu = make(c, b, false);
  auto gpu = make(c, b, true);
  REQUIRE(cpu->set_bf16_matmuls(true).ok());
  REQUIRE(gpu->set_bf16_matmuls(true).ok());
  const size_t n = static_cast<size_t>(b * c.block_size);
  const models::FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  for (int it = 0; it < 10; ++it) {
    INFO("step " << it);
    const auto x = random_tokens(n, c.vocab_size, 500 + it);
    const auto y = random_tokens(n, c.vocab_size, 600 + it);
    auto sc = cpu->train_step(x.data(), y.data(), n, 3e-3, opt, 1.0);
    auto sg = gpu->train_step(x.data(), y.data(), n, 3e-3, opt, 1.0);
    REQUIRE(sc.ok());
    REQUIRE(sg.ok());
    CHECK(std::abs(sg->loss - sc->loss) <= 1e-2 * sc->loss);  // the bf16 bound
  }
}

TEST_CASE("fused GPT with RoPE on CUDA: 10 steps match the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int which = GENERATE(0, 1);
  auto c = shape(which);
  c.rope = true;
  if (which == 0) c.n_embd = 36;  // RoPE needs an even head size: 2 heads of 18
  const int64_t b = 4;
  INFO("shape " << which);
  const auto sd = starling::testing::random_fused_weights(c, 20, 0.1);
  auto cpu = make(c, b, false);
  auto gpu = make(c, b, true);
  REQUIRE(cpu->load(sd).ok());
  REQUIRE(gpu->load(sd).ok());
  const size_t n = static_cast<size_t>(b * c.block_size);
  const models::FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  const optim::CosineSchedule sched{3e-3, 3e-4, 3, 8};
  for (int it = 0; it < 10; ++it) {
    INFO("step " << it);
    const auto xs = random_tokens(n, c.vocab_size, 400 + it);
    const auto ys = random_tokens(n, c.vocab_size, 500 + it);
    auto sc = cpu->train_step(xs.data(), ys.data(), n, sched.at(it), opt, 1.0);
    auto sg = gpu->train_step(xs.data(), ys.data(), n, sched.at(it), opt, 1.0);
    REQUIRE(sc.ok());
    REQUIRE(sg.ok());
    CHECK(std::abs(sg->loss - sc->loss) <= 1e-3);
    CHECK(sg->grad_norm == Approx(sc->grad_norm).epsilon(1e-3));
  }
}

}  // namespace
}  // namespace starling::cuda
