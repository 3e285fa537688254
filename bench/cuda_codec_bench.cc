// cuda_codec_bench: the GPU update codecs (core/cuda/codec_gpu.h, codec_kernels.h) on a
// GPT-2-124M-shaped delta, beside the CPU codec (core/compress) on the same data in the same run.
// Prints markdown rows: GB/s of fp32 input for encode and decode_add, end to end (GpuCodec /
// GpuDecoder, host EncodedUpdate included) and for the kernels alone. Built only with CUDA.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/cuda/codec_gpu.h"
#include "core/cuda/codec_kernels.h"
#include "core/cuda/device.h"
#include "core/cuda/handles.h"
#include "core/util/rng.h"

namespace {

namespace cc = starling::compress;
using starling::Shape;
using starling::cuda::DeviceArray;

// GPT-2 small (124,439,808 parameters) in Hugging Face naming, as bench/codec_bench.cc builds it;
// --scale shrinks the vocabulary, the positions and the number of layers together.
cc::Layout gpt2_layout(double scale) {
  auto scaled = [&](int64_t v) { return std::max<int64_t>(1, std::llround(v * scale)); };
  const int64_t c = 768, vocab = scaled(50257), ctx = scaled(1024), layers = scaled(12);
  std::vector<std::pair<std::string, Shape>> tensors = {{"wte.weight", {vocab, c}},
                                                        {"wpe.weight", {ctx, c}}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    tensors.push_back({h + "ln_1.weight", {c}});
    tensors.push_back({h + "ln_1.bias", {c}});
    tensors.push_back({h + "attn.c_attn.weight", {c, 3 * c}});
    tensors.push_back({h + "attn.c_attn.bias", {3 * c}});
    tensors.push_back({h + "attn.c_proj.weight", {c, c}});
    tensors.push_back({h + "attn.c_proj.bias", {c}});
    tensors.push_back({h + "ln_2.weight", {c}});
    tensors.push_back({h + "ln_2.bias", {c}});
    tensors.push_back({h + "mlp.c_fc.weight", {c, 4 * c}});
    tensors.push_back({h + "mlp.c_fc.bias", {4 * c}});
    tensors.push_back({h + "mlp.c_proj.weight", {4 * c, c}});
    tensors.push_back({h + "mlp.c_proj.bias", {c}});
  }
  tensors.push_back({"ln_f.weight", {c}});
  tensors.push_back({"ln_f.bias", {c}});
  cc::Layout layout;
  int64_t offset = 0;
  for (auto& [name, shape] : tensors) {
    layout.push_back(cc::TensorInfo{name, shape, offset});
    offset += starling::shape_numel(shape);
  }
  return layout;
}

// Best wall seconds of fn over reps calls (fn returns once its work is done).
double best_seconds(const std::function<void()>& fn, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Mean seconds per call of fn on `stream` over iters calls, timed with events after a warmup.
double device_seconds(const std::function<void()>& fn, cudaStream_t stream, int iters) {
  fn();
  auto start = starling::cuda::make_event(), stop = starling::cuda::make_event();
  STARLING_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  for (int i = 0; i < iters; ++i) fn();
  STARLING_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
  STARLING_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0.0f;
  STARLING_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms * 1e-3 / iters;
}

void check(const starling::Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.to_string());
}

int64_t keep(int64_t n, double ratio) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n))), 1, n);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("cuda_codec_bench: GPU update codecs beside the CPU codecs, GPT-2 124M delta");
  double scale = 1.0;
  int reps = 3, iters = 10;
  std::vector<std::string> specs = {"int8:block=256", "topk:ratio=0.01", "randk:ratio=0.01",
                                    "powersgd:rank=4", "topk:ratio=0.01,ef=1;*.bias=identity"};
  app.add_option("--scale", scale, "fraction of GPT-2 124M (vocabulary, positions, layers)")
      ->check(CLI::Range(1e-4, 1.0));
  app.add_option("--reps", reps, "repetitions of the end-to-end and CPU runs (best is reported)")
      ->check(CLI::Range(1, 100));
  app.add_option("--iters", iters, "timed calls per kernel row")->check(CLI::Range(1, 1000));
  app.add_option("--codecs", specs, "codec specs")->delimiter(';');
  CLI11_PARSE(app, argc, argv);
  try {
    const auto devs = starling::cuda::devices();
    if (devs.empty()) {
      std::fprintf(stderr, "cuda_codec_bench: no CUDA device visible\n");
      return 2;
    }
    const cc::Layout layout = gpt2_layout(scale);
    const int64_t n = layout.back().offset + starling::shape_numel(layout.back().shape);
    const size_t un = static_cast<size_t>(n);
    const double gb = 4.0 * static_cast<double>(n) / 1e9;
    std::printf("GPU: %s (sm_%d%d); delta: %lld floats (%.1f MB), %zu tensors\n\n",
                devs[0].name.c_str(), devs[0].compute_major, devs[0].compute_minor,
                static_cast<long long>(n), gb * 1e3, layout.size());

    std::vector<float> delta(un), host_dst(un, 0.0f);
    starling::Rng rng(1234);
    for (auto& v : delta) v = static_cast<float>(rng.normal() * 1e-3);
    auto stream_owner = starling::cuda::make_stream();
    cudaStream_t s = stream_owner.get();
    auto cublas = starling::cuda::make_cublas();
    auto ddelta = DeviceArray<float>::from_host(delta);
    DeviceArray<float> ddst(un);
    STARLING_CUDA_CHECK(cudaMemset(ddst.get(), 0, un * sizeof(float)));
    // Setup copies ran on the legacy stream; `s` is non-blocking and does not wait for it.
    STARLING_CUDA_CHECK(cudaDeviceSynchronize());

    std::printf(
        "| codec | ratio | CPU enc GB/s | CPU dec_add GB/s | GPU enc GB/s (to host) | "
        "GPU dec_add GB/s (from host) | x enc | x dec |\n|---|---|---|---|---|---|---|---|\n");
    for (const auto& spec : specs) {
      auto cpu = cc::make_codec(spec, layout, 7);
      check(cpu.status(), spec.c_str());
      auto gpu = starling::cuda::GpuCodec::make(spec, layout, 7, s, cublas.get());
      check(gpu.status(), spec.c_str());
      cc::EncodedUpdate cpu_enc, gpu_enc;
      const double cpu_e =
          best_seconds([&] { check((*cpu)->encode_into(delta, cpu_enc), "cpu"); }, reps);
      const double cpu_d = best_seconds(
          [&] { check(cc::decode_add(cpu_enc, host_dst, 0.5f), "cpu decode_add"); }, reps);
      check((*gpu)->encode_into(ddelta.get(), gpu_enc), "gpu");  // warmup
      const double gpu_e =
          best_seconds([&] { check((*gpu)->encode_into(ddelta.get(), gpu_enc), "gpu"); }, reps);
      starling::cuda::GpuDecoder decoder(s);
      check(decoder.decode_add(gpu_enc, ddst.get(), n, 0.5f), "gpu decode_add");  // warmup
      STARLING_CUDA_CHECK(cudaStreamSynchronize(s));
      const double gpu_d = best_seconds(
          [&] {
            check(decoder.decode_add(gpu_enc, ddst.get(), n, 0.5f), "gpu decode_add");
            STARLING_CUDA_CHECK(cudaStreamSynchronize(s));
          },
          reps);
      const double ratio =
          4.0 * static_cast<double>(n) / static_cast<double>(cc::serialize_update(gpu_enc).size());
      std::printf("| %s | %.1f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f |\n", spec.c_str(), ratio,
                  gb / cpu_e, gb / cpu_d, gb / gpu_e, gb / gpu_d, cpu_e / gpu_e, cpu_d / gpu_d);
      std::fflush(stdout);
    }

    // The kernels alone: outputs stay on the device (what a PyTorch-on-GPU peer measures).
    std::printf("\n| kernel (device only) | what | GB/s of fp32 input |\n|---|---|---|\n");
    auto kernel_row = [&](const char* name, const std::string& what, double sec) {
      std::printf("| %s | %s | %.1f |\n", name, what.c_str(), gb / sec);
      std::fflush(stdout);
    };
    {
      const int block = 256;
      DeviceArray<int8_t> q(un);
      DeviceArray<float> sc((un + block - 1) / block);
      DeviceArray<unsigned> flag(1);
      kernel_row("int8_encode", "block 256, whole delta",
                 device_seconds(
                     [&] {
                       starling::cuda::int8_encode(q.get(), sc.get(), flag.get(), ddelta.get(), un,
                                                   block, s);
                     },
                     s, iters));
      kernel_row("int8_decode_add", "block 256, whole delta",
                 device_seconds(
                     [&] {
                       starling::cuda::int8_decode_add(ddst.get(), q.get(), sc.get(), un, block,
                                                       1.0f, 0.5f, s);
                     },
                     s, iters));
    }
    {
      starling::cuda::TopkSelector selector;
      size_t max_t = 1;
      for (const auto& t : layout) {
        max_t = std::max(max_t, static_cast<size_t>(starling::shape_numel(t.shape)));
      }
      selector.reserve(static_cast<int64_t>(max_t), s);
      DeviceArray<uint32_t> idx(max_t);
      DeviceArray<float> vals(max_t);
      DeviceArray<unsigned> flag(1);
      kernel_row("top-k select + gather", "1% per tensor, exact (radix sort)",
                 device_seconds(
                     [&] {
                       for (const auto& t : layout) {
                         const int64_t tn = starling::shape_numel(t.shape), k = keep(tn, 0.01);
                         selector.select(idx.get(), flag.get(), ddelta.get() + t.offset, tn, k, s);
                         starling::cuda::gather(vals.get(), idx.get(), static_cast<size_t>(k),
                                                ddelta.get() + t.offset, s);
                       }
                     },
                     s, iters));
    }
    {
      const int64_t k = keep(n, 0.01);
      std::vector<uint32_t> hidx(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j)
        hidx[static_cast<size_t>(j)] = static_cast<uint32_t>(j * (n / k));
      auto idx = DeviceArray<uint32_t>::from_host(hidx);
      DeviceArray<float> vals(static_cast<size_t>(k));
      STARLING_CUDA_CHECK(cudaDeviceSynchronize());
      kernel_row("random-k gather", "1%, indices on device",
                 device_seconds(
                     [&] {
                       starling::cuda::gather(vals.get(), idx.get(), static_cast<size_t>(k),
                                              ddelta.get(), s);
                     },
                     s, iters));
      kernel_row("random-k scatter_add", "1%, indices on device",
                 device_seconds(
                     [&] {
                       starling::cuda::randk_scatter_add(ddst.get(), idx.get(), vals.get(), n, k,
                                                         0.5f, s);
                     },
                     s, iters));
    }
    {
      const int rank = 4;
      size_t max_p = 1, max_q = 1;
      for (const auto& t : layout) {
        if (t.shape.size() != 2) continue;
        max_p = std::max(max_p, static_cast<size_t>(t.shape[0] * rank));
        max_q = std::max(max_q, static_cast<size_t>(t.shape[1] * rank));
      }
      DeviceArray<float> p(max_p), qt(max_q);
      STARLING_CUDA_CHECK(cudaMemset(qt.get(), 0, max_q * sizeof(float)));
      STARLING_CUDA_CHECK(cudaDeviceSynchronize());
      kernel_row("PowerSGD P = M Q, Q^T = P^T M", "rank 4, every matrix (cuBLAS fp32)",
                 device_seconds(
                     [&] {
                       for (const auto& t : layout) {
                         if (t.shape.size() != 2) continue;
                         const float* m = ddelta.get() + t.offset;
                         starling::cuda::powersgd_project(p.get(), m, qt.get(), t.shape[0],
                                                          t.shape[1], rank, cublas.get(), s);
                         starling::cuda::powersgd_back(qt.get(), m, p.get(), t.shape[0], t.shape[1],
                                                       rank, cublas.get(), s);
                       }
                     },
                     s, iters));
      kernel_row("PowerSGD decode_add", "rank 4, every matrix",
                 device_seconds(
                     [&] {
                       for (const auto& t : layout) {
                         if (t.shape.size() != 2) continue;
                         starling::cuda::powersgd_decode_add(ddst.get() + t.offset, p.get(),
                                                             qt.get(), t.shape[0], t.shape[1], rank,
                                                             0.5f, s);
                       }
                     },
                     s, iters));
    }
    std::printf(
        "\nGB/s = 4 bytes x numel / time. End-to-end rows include the device<->host copies of the "
        "encoded arrays (pageable memory) and the CPU fallbacks; x = GPU / CPU.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_codec_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
