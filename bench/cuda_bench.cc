// cuda_bench: times each CUDA kernel of core/cuda at GPT-2 124M training shapes (B=16, T=1024,
// C=768, H=12, V=50304) and prints one markdown table row per op: time per call, and the
// achieved bandwidth or TFLOP/s. Built only with the CUDA backend.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda/device.h"
#include "core/cuda/handles.h"
#include "core/cuda/kernels.h"

namespace {

using starling::cuda::DeviceArray;

// Mean milliseconds per call of fn over `iters` calls on `stream`, after warmup.
float time_ms(const std::function<void()>& fn, cudaStream_t stream, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  auto start = starling::cuda::make_event(), stop = starling::cuda::make_event();
  STARLING_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  for (int i = 0; i < iters; ++i) fn();
  STARLING_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
  STARLING_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0.0f;
  STARLING_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms / static_cast<float>(iters);
}

void row(const char* op, const std::string& shape, float ms, double bytes, double flops) {
  std::printf("| %s | %s | %.3f |", op, shape.c_str(), ms);
  if (bytes > 0)
    std::printf(" %.0f GB/s |", bytes / (ms * 1e-3) / 1e9);
  else
    std::printf(" |");
  if (flops > 0)
    std::printf(" %.1f TFLOP/s |\n", flops / (ms * 1e-3) / 1e12);
  else
    std::printf(" |\n");
}

DeviceArray<float> filled(size_t n, float value) {
  return DeviceArray<float>::from_host(std::vector<float>(n, value));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("cuda_bench: CUDA kernel timings at GPT-2 124M shapes");
  int b = 16, t = 1024, c = 768, h = 12, v = 50304, iters = 20;
  app.add_option("-B", b, "batch");
  app.add_option("-T", t, "sequence length");
  app.add_option("-C", c, "channels");
  app.add_option("-H", h, "heads");
  app.add_option("-V", v, "vocabulary");
  app.add_option("--iters", iters, "timed calls per op");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto devs = starling::cuda::devices();
    if (devs.empty()) {
      std::fprintf(stderr, "cuda_bench: no CUDA device visible\n");
      return 2;
    }
    std::printf("GPU: %s (sm_%d%d)\n\n", devs[0].name.c_str(), devs[0].compute_major,
                devs[0].compute_minor);
    std::printf("| op | shape | ms | bandwidth | compute |\n|---|---|---|---|---|\n");
    auto stream_owner = starling::cuda::make_stream();
    cudaStream_t s = stream_owner.get();
    auto cublas = starling::cuda::make_cublas();
    const size_t n = static_cast<size_t>(b) * t, nc = n * c;
    const std::string ntc = "N=" + std::to_string(n) + " C=" + std::to_string(c);

    {
      auto x = filled(nc, 0.5f), w = filled(c, 1.0f), bias = filled(c, 0.0f), y = filled(nc, 0),
           dy = filled(nc, 1.0f), dx = filled(nc, 0), mean = filled(n, 0), rstd = filled(n, 0),
           dw = filled(c, 0), db = filled(c, 0);
      float ms = time_ms(
          [&] {
            starling::cuda::layer_norm_forward(y.get(), mean.get(), rstd.get(), x.get(), w.get(),
                                               bias.get(), static_cast<int>(n), c, 1e-5f, s);
          },
          s, iters);
      row("layer_norm fwd", ntc, ms, 2.0 * nc * 4, 0);
      ms = time_ms(
          [&] {
            starling::cuda::layer_norm_backward(dx.get(), dw.get(), db.get(), dy.get(), x.get(),
                                                w.get(), mean.get(), rstd.get(),
                                                static_cast<int>(n), c, s);
          },
          s, iters);
      row("layer_norm bwd", ntc, ms, 5.0 * nc * 4, 0);
    }
    {
      const size_t m = nc * 4;
      auto x = filled(m, 0.5f), y = filled(m, 0), dy = filled(m, 1.0f);
      float ms = time_ms([&] { starling::cuda::gelu_forward(y.get(), x.get(), m, s); }, s, iters);
      row("gelu fwd", "n=" + std::to_string(m), ms, 2.0 * m * 4, 0);
      ms = time_ms([&] { starling::cuda::gelu_backward(y.get(), dy.get(), x.get(), m, s); }, s,
                   iters);
      row("gelu bwd", "n=" + std::to_string(m), ms, 3.0 * m * 4, 0);
    }
    {
      const int in = c, out = 3 * c;
      auto x = filled(nc, 0.01f), w = filled(static_cast<size_t>(out) * in, 0.01f),
           bias = filled(out, 0.0f), y = filled(n * out, 0), dy = filled(n * out, 0.01f),
           dx = filled(nc, 0), dw = filled(static_cast<size_t>(out) * in, 0), db = filled(out, 0);
      const double flops = 2.0 * n * in * out;
      const std::string shape =
          "N=" + std::to_string(n) + " " + std::to_string(in) + "->" + std::to_string(out);
      float ms = time_ms(
          [&] {
            starling::cuda::linear_forward(y.get(), x.get(), w.get(), bias.get(),
                                           static_cast<int>(n), in, out, cublas.get(), s);
          },
          s, iters);
      row("linear fwd (fp32)", shape, ms, 0, flops);
      auto lt = starling::cuda::make_cublas_lt();
      DeviceArray<char> workspace(size_t{32} << 20);
      ms = time_ms(
          [&] {
            starling::cuda::linear_forward_lt(y.get(), x.get(), w.get(), bias.get(),
                                              static_cast<int>(n), in, out, lt.get(),
                                              workspace.get(), workspace.size(), cublas.get(), s);
          },
          s, iters);
      row("linear fwd, cuBLASLt bias epilogue (fp32)", shape, ms, 0, flops);
      ms = time_ms(
          [&] {
            starling::cuda::linear_backward(dx.get(), dw.get(), db.get(), dy.get(), x.get(),
                                            w.get(), static_cast<int>(n), in, out, cublas.get(), s);
          },
          s, iters);
      row("linear bwd (fp32)", shape, ms, 0, 2 * flops);
    }
    {
      const size_t att_n = static_cast<size_t>(b) * h * t * t;
      auto qkv = filled(nc * 3, 0.01f), out = filled(nc, 0), att = filled(att_n, 0),
           scratch = filled(att_n, 0), dout = filled(nc, 0.01f), dqkv = filled(nc * 3, 0);
      const double flops = 4.0 * b * h * static_cast<double>(t) * t * (c / h);  // causal: half
      const std::string shape = "B=" + std::to_string(b) + " T=" + std::to_string(t) +
                                " C=" + std::to_string(c) + " H=" + std::to_string(h) + " causal";
      float ms = time_ms(
          [&] {
            starling::cuda::attention_forward(out.get(), att.get(), qkv.get(), b, t, c, h, true,
                                              cublas.get(), s);
          },
          s, iters);
      row("attention fwd (fp32)", shape, ms, 0, flops);
      ms = time_ms(
          [&] {
            starling::cuda::attention_backward(dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                                               att.get(), b, t, c, h, cublas.get(), s);
          },
          s, iters);
      row("attention bwd (fp32)", shape, ms, 0, 2 * flops);
      // The flash kernels on the same shape: (B, H, T) log-sum-exps instead of att.
      ms = time_ms(
          [&] {
            starling::cuda::flash_attention_forward(out.get(), att.get(), qkv.get(), b, t, c, h,
                                                    starling::cuda::AttnMaskKind::kCausal, 1, s);
          },
          s, iters);
      row("flash attention fwd (fp32)", shape, ms, 0, flops);
      ms = time_ms(
          [&] {
            starling::cuda::flash_attention_backward(dqkv.get(), scratch.get(), dout.get(),
                                                     qkv.get(), out.get(), att.get(), b, t, c, h,
                                                     starling::cuda::AttnMaskKind::kCausal, 1, s);
          },
          s, iters);
      row("flash attention bwd (fp32)", shape, ms, 0, 2 * flops);
      ms = time_ms(
          [&] {
            starling::cuda::flash_attention_forward_bf16(out.get(), att.get(), qkv.get(), b, t, c,
                                                         h, starling::cuda::AttnMaskKind::kCausal,
                                                         1, s);
          },
          s, iters);
      row("flash attention fwd (bf16 tensor cores)", shape, ms, 0, flops);
      ms = time_ms(
          [&] {
            starling::cuda::flash_attention_backward_bf16(
                dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(), att.get(), b, t, c, h,
                starling::cuda::AttnMaskKind::kCausal, 1, s);
          },
          s, iters);
      row("flash attention bwd (bf16 tensor cores)", shape, ms, 0, 2 * flops);
    }
    {
      const size_t nv = n * static_cast<size_t>(v);
      auto logits = filled(nv, 0.01f), dlogits = filled(nv, 0), losses = filled(n, 0),
           loss = filled(1, 0), dloss = filled(1, 1.0f);
      auto targets = DeviceArray<int>::from_host(std::vector<int>(n, 1));
      DeviceArray<int> count(1);
      const std::string shape = "N=" + std::to_string(n) + " V=" + std::to_string(v);
      float ms = time_ms(
          [&] {
            starling::cuda::cross_entropy_forward(losses.get(), loss.get(), count.get(),
                                                  logits.get(), targets.get(), static_cast<int>(n),
                                                  v, -100, s);
          },
          s, iters);
      row("cross_entropy fwd", shape, ms, 2.0 * nv * 4, 0);
      ms = time_ms(
          [&] {
            starling::cuda::cross_entropy_backward(dlogits.get(), logits.get(), targets.get(),
                                                   dloss.get(), count.get(), static_cast<int>(n), v,
                                                   -100, s);
          },
          s, iters);
      row("cross_entropy bwd", shape, ms, 3.0 * nv * 4, 0);
    }
    {
      const size_t p = 124'000'000;
      auto params = filled(p, 0.1f), grads = filled(p, 0.01f), m = filled(p, 0), vv = filled(p, 0);
      DeviceArray<__nv_bfloat16> p16(p);
      long step = 0;
      float ms = time_ms(
          [&] {
            starling::cuda::AdamWStep st;
            st.step = ++step;
            st.weight_decay = 0.1;
            starling::cuda::adamw_step(params.get(), p16.get(), grads.get(), m.get(), vv.get(), p,
                                       st, s);
          },
          s, iters);
      row("adamw step (+bf16 copy)", "124M params", ms, p * (4.0 * 7 + 2), 0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
}
