// [cuda] The fused backend's rotary positions (core/cuda/rope_cuda.cu) against the CPU backend
// (models/gpt/fused_cpu.cc, the oracle): forward and inverse rotations of packed q and k, rows
// whose positions repeat with a period, sizes that are not multiples of the block size.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "models/gpt/fused_backend.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

using models::FusedBackend;
using testing::random_floats;
using testing::require_close;

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ops::rope's tables: cos and sin of p * base^(-2i/D) for p < period, i < D/2, rounded to fp32.
void rope_tables(int period, int d, double base, std::vector<float>* cs, std::vector<float>* sn) {
  const int half = d / 2;
  cs->assign(static_cast<size_t>(period) * half, 0.0f);
  sn->assign(cs->size(), 0.0f);
  for (int p = 0; p < period; ++p) {
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(base, -2.0 * i / d);
      (*cs)[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      (*sn)[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// Runs rope(inverse) on a copy of qkv in `be`; returns the rotated rows.
std::vector<float> run_rope(FusedBackend& be, const std::vector<float>& qkv,
                            const std::vector<float>& cs, const std::vector<float>& sn, int n,
                            int c, int h, int period, bool inverse) {
  auto alloc = [&](size_t bytes) {
    auto p = be.alloc(bytes);
    REQUIRE(p.ok());
    return *p;
  };
  void* x = alloc(qkv.size() * sizeof(float));
  void* pc = alloc(cs.size() * sizeof(float));
  void* ps = alloc(sn.size() * sizeof(float));
  be.copy_to_backend(x, qkv.data(), qkv.size() * sizeof(float));
  be.copy_to_backend(pc, cs.data(), cs.size() * sizeof(float));
  be.copy_to_backend(ps, sn.data(), sn.size() * sizeof(float));
  be.rope(static_cast<float*>(x), static_cast<const float*>(pc), static_cast<const float*>(ps), n,
          c, h, period, inverse);
  std::vector<float> out(qkv.size());
  be.copy_to_host(out.data(), x, out.size() * sizeof(float));
  for (void* p : {x, pc, ps}) be.free(p);
  return out;
}

TEST_CASE("fused backend RoPE on CUDA matches the CPU backend, forward and inverse", "[cuda]") {
  STARLING_REQUIRE_GPU();
  // (N rows, C, H, period): D = 2, odd pair counts, two periods per row set (block diffusion's
  // [x_t | x_0]), and more pairs than one thread block.
  const auto [n, c, h, period] = GENERATE(table<int, int, int, int>(
      {{1, 2, 1, 1}, {7, 12, 2, 7}, {70, 48, 8, 35}, {300, 128, 4, 100}, {129, 96, 2, 43}}));
  const bool inverse = GENERATE(false, true);
  INFO("N " << n << " C " << c << " H " << h << " period " << period << " inverse " << inverse);
  std::vector<float> cs, sn;
  rope_tables(period, c / h, 10000.0, &cs, &sn);
  const auto qkv = random_floats(static_cast<size_t>(n) * 3 * c, 7);
  auto cpu = models::make_fused_cpu_backend();
  auto gpu = models::make_fused_cuda_backend(0);
  REQUIRE(gpu.ok());
  const auto want = run_rope(*cpu, qkv, cs, sn, n, c, h, period, inverse);
  const auto got = run_rope(**gpu, qkv, cs, sn, n, c, h, period, inverse);
  require_close(got, as_double(want), 1e-6);
  // v is untouched; q and k moved (unless every row sits at position 0).
  double moved = 0.0;
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < 3 * c; ++j) {
      const size_t k = static_cast<size_t>(r) * 3 * c + j;
      if (j >= 2 * c) {
        REQUIRE(got[k] == qkv[k]);
      } else {
        moved = std::max(moved, static_cast<double>(std::abs(got[k] - qkv[k])));
      }
    }
  }
  if (period > 1) CHECK(moved > 1e-3);
  // The inverse undoes the rotation on the GPU too.
  const auto back = run_rope(**gpu, got, cs, sn, n, c, h, period, !inverse);
  require_close(back, as_double(qkv), 1e-6);
}

}  // namespace
}  // namespace starling::cuda
