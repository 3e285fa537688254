// The CUDA flash-attention kernels' arithmetic (core/cuda/internal/flash_attention.h), run on the
// CPU the way the kernels run it: block by block, each block's kRows threads one after another
// between the same barriers, tiles skipped when no thread of the block needs them. Held to
// ops::attention_packed in float64 (forward and, through autograd, backward) under every mask, on
// head sizes that exercise each register width and shapes that leave partial tiles and blocks.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/cuda/internal/flash_attention.h"
#include "core/cuda/internal/flash_attention_tc.h"
#include "core/ops/attention.h"
#include "core/util/rng.h"

namespace flash = starling::cuda::flash;
namespace tc = starling::cuda::flash_tc;
using starling::Rng;
using starling::Tensor;
namespace ops = starling::ops;

namespace {

using flash::kRows;
using flash::kTile;

// The forward kernel's loop, every block and thread on the CPU.
template <int DM>
void emulate_forward(std::vector<float>& out, std::vector<float>& lse,
                     const std::vector<float>& qkv, const flash::Shape& s, int* tiles_skipped) {
  std::vector<float> ks(kTile * DM), vs(kTile * DM);
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int blk = 0; blk * kRows < s.t; ++blk) {
      std::vector<flash::FwdRow<DM>> rows(kRows);
      for (int tid = 0; tid < kRows; ++tid) {
        flash::fwd_begin<DM>(rows[tid], qkv.data(), s, bh, blk * kRows + tid);
      }
      for (int j0 = 0; j0 < s.t; j0 += kTile) {
        std::vector<bool> need(kRows);
        bool any = false;
        for (int tid = 0; tid < kRows; ++tid) {
          need[tid] = flash::needs_keys(rows[tid].keys, rows[tid].valid, j0);
          any = any || need[tid];
        }
        if (!any) {
          ++*tiles_skipped;
          continue;
        }
        for (int tid = 0; tid < kRows; ++tid) {
          flash::load_tile<DM>(ks.data(), qkv.data() + s.c, 3 * s.c, s, bh, j0, tid, kRows);
          flash::load_tile<DM>(vs.data(), qkv.data() + 2 * s.c, 3 * s.c, s, bh, j0, tid, kRows);
        }
        for (int tid = 0; tid < kRows; ++tid) {
          if (need[tid]) flash::fwd_tile<DM>(rows[tid], ks.data(), vs.data(), j0, s.t);
        }
      }
      for (int tid = 0; tid < kRows; ++tid) {
        flash::fwd_end<DM>(rows[tid], out.data(), lse.data(), s, bh);
      }
    }
  }
}

// The delta, dQ, dV and dK kernels' loops.
template <int DM>
void emulate_backward(std::vector<float>& dqkv, const std::vector<float>& dout,
                      const std::vector<float>& qkv, const std::vector<float>& out,
                      const std::vector<float>& lse, const flash::Shape& s) {
  std::vector<float> delta(static_cast<size_t>(s.b) * s.h * s.t);
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int i = 0; i < s.t; ++i) flash::delta_row(delta.data(), dout.data(), out.data(), s, bh, i);
  }
  std::vector<float> t1(kTile * DM), t2(kTile * DM);
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int blk = 0; blk * kRows < s.t; ++blk) {
      std::vector<flash::DqRow<DM>> rows(kRows);
      for (int tid = 0; tid < kRows; ++tid) {
        flash::dq_begin<DM>(rows[tid], qkv.data(), dout.data(), lse.data(), delta.data(), s, bh,
                            blk * kRows + tid);
      }
      for (int j0 = 0; j0 < s.t; j0 += kTile) {
        std::vector<bool> need(kRows);
        bool any = false;
        for (int tid = 0; tid < kRows; ++tid) {
          need[tid] = flash::needs_keys(rows[tid].keys, rows[tid].valid, j0);
          any = any || need[tid];
        }
        if (!any) continue;
        for (int tid = 0; tid < kRows; ++tid) {
          flash::load_tile<DM>(t1.data(), qkv.data() + s.c, 3 * s.c, s, bh, j0, tid, kRows);
          flash::load_tile<DM>(t2.data(), qkv.data() + 2 * s.c, 3 * s.c, s, bh, j0, tid, kRows);
        }
        for (int tid = 0; tid < kRows; ++tid) {
          if (need[tid]) flash::dq_tile<DM>(rows[tid], t1.data(), t2.data(), j0, s.t);
        }
      }
      for (int tid = 0; tid < kRows; ++tid) flash::dq_end<DM>(rows[tid], dqkv.data(), s, bh);
    }
  }
  auto kv_pass = [&](auto dk_tag) {
    constexpr bool kDk = decltype(dk_tag)::value;
    std::vector<flash::QueryInfo> info(kTile);
    for (int bh = 0; bh < s.b * s.h; ++bh) {
      for (int blk = 0; blk * kRows < s.t; ++blk) {
        const int j_lo = blk * kRows, j_hi = std::min(s.t, j_lo + kRows);
        std::vector<flash::KvRow<DM>> rows(kRows);
        for (int tid = 0; tid < kRows; ++tid) {
          flash::kv_begin<DM, kDk>(rows[tid], qkv.data(), s, bh, j_lo + tid);
        }
        for (int i0 = 0; i0 < s.t; i0 += kTile) {
          bool any = false;
          std::vector<flash::QueryInfo> mine(kTile);
          for (int tid = 0; tid < kTile; ++tid) {
            mine[tid] = flash::query_info(s, lse.data(), delta.data(), bh, i0 + tid);
            any = any || flash::needs_queries(mine[tid], j_lo, j_hi);
          }
          if (!any) continue;
          for (int tid = 0; tid < kRows; ++tid) {
            if (tid < kTile) info[tid] = mine[tid];
            flash::load_tile<DM>(t1.data(), qkv.data(), 3 * s.c, s, bh, i0, tid, kRows);
            flash::load_tile<DM>(t2.data(), dout.data(), s.c, s, bh, i0, tid, kRows);
          }
          for (int tid = 0; tid < kRows; ++tid)
            flash::scale_tile<DM>(t1.data(), s.scale, tid, kRows);
          for (int tid = 0; tid < kRows; ++tid) {
            flash::kv_tile<DM, kDk>(rows[tid], t1.data(), t2.data(), info.data(), i0, s.t);
          }
        }
        for (int tid = 0; tid < kRows; ++tid) flash::kv_end<DM, kDk>(rows[tid], dqkv.data(), s, bh);
      }
    }
  };
  kv_pass(std::false_type{});
  kv_pass(std::true_type{});
}

// The tensor-core kernels' phases (flash_attention_tc.h), warp by warp and lane by lane between
// the kernels' barriers, with warp_gemm's host loop in place of WMMA.
struct SmemBuffer {
  explicit SmemBuffer(size_t bytes) : raw(bytes + 128) {
    const auto at = reinterpret_cast<uintptr_t>(raw.data());
    base = raw.data() + ((128 - at % 128) % 128);
  }
  std::vector<char> raw;
  char* base;
};

template <int DP>
void emulate_tc_forward(std::vector<float>& out, std::vector<float>& lse,
                        const std::vector<float>& qkv, const flash::Shape& s) {
  SmemBuffer buf(tc::fwd_smem_bytes(DP));
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int row0 = 0; row0 < s.t; row0 += tc::kBlock) {
      const tc::FwdSmem m = tc::fwd_smem(buf.base, DP);
      for (int tid = 0; tid < tc::kThreads; ++tid)
        tc::fwd_begin(m, DP, qkv.data(), s, bh, row0, tid);
      for (int j0 = 0; j0 < s.t; j0 += tc::kTile) {
        bool any = false;
        for (int tid = 0; tid < tc::kThreads; ++tid) any = any || tc::fwd_needs(m, tid, j0);
        if (!any) continue;
        for (int tid = 0; tid < tc::kThreads; ++tid)
          tc::fwd_load(m, DP, qkv.data(), s, bh, j0, tid);
        for (int w = 0; w < tc::kWarps; ++w) {
          tc::fwd_scores(m, DP, w);
          for (int lane = 0; lane < 32; ++lane) tc::fwd_rowmax(m, w, lane, j0, s.t);
          for (int lane = 0; lane < 32; ++lane) tc::fwd_probs(m, w, lane, j0, s.t);
          for (int lane = 0; lane < 32; ++lane) tc::fwd_rescale(m, DP, w, lane);
          for (int lane = 0; lane < 32; ++lane) tc::fwd_state(m, w, lane);
          tc::fwd_accumulate(m, DP, w);
        }
      }
      for (int w = 0; w < tc::kWarps; ++w) {
        for (int lane = 0; lane < 32; ++lane) {
          tc::fwd_end(m, DP, out.data(), lse.data(), s, bh, row0, w, lane);
        }
      }
    }
  }
}

template <int DP>
void emulate_tc_backward(std::vector<float>& dqkv, const std::vector<float>& dout,
                         const std::vector<float>& qkv, const std::vector<float>& out,
                         const std::vector<float>& lse, const flash::Shape& s) {
  std::vector<float> delta(static_cast<size_t>(s.b) * s.h * s.t);
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int i = 0; i < s.t; ++i) flash::delta_row(delta.data(), dout.data(), out.data(), s, bh, i);
  }
  SmemBuffer dq_buf(tc::dq_smem_bytes(DP)), kv_buf(tc::kv_smem_bytes(DP));
  for (int bh = 0; bh < s.b * s.h; ++bh) {
    for (int row0 = 0; row0 < s.t; row0 += tc::kBlock) {
      const tc::DqSmem m = tc::dq_smem(dq_buf.base, DP);
      for (int tid = 0; tid < tc::kThreads; ++tid) {
        tc::dq_begin(m, DP, qkv.data(), dout.data(), lse.data(), delta.data(), s, bh, row0, tid);
      }
      for (int j0 = 0; j0 < s.t; j0 += tc::kTile) {
        bool any = false;
        for (int tid = 0; tid < tc::kThreads; ++tid) any = any || tc::dq_needs(m, tid, j0);
        if (!any) continue;
        for (int tid = 0; tid < tc::kThreads; ++tid) tc::dq_load(m, DP, qkv.data(), s, bh, j0, tid);
        for (int w = 0; w < tc::kWarps; ++w) {
          tc::dq_products(m, DP, w);
          for (int lane = 0; lane < 32; ++lane) tc::dq_grads(m, w, lane, j0, row0, s.t);
          tc::dq_accumulate(m, DP, w);
        }
      }
      for (int tid = 0; tid < tc::kThreads; ++tid) tc::dq_end(m, DP, dqkv.data(), s, bh, row0, tid);
    }
    for (int key0 = 0; key0 < s.t; key0 += tc::kBlock) {
      const tc::KvSmem m = tc::kv_smem(kv_buf.base, DP);
      for (int tid = 0; tid < tc::kThreads; ++tid)
        tc::kv_begin(m, DP, qkv.data(), s, bh, key0, tid);
      for (int i0 = 0; i0 < s.t; i0 += tc::kTile) {
        bool any = false;
        for (int tid = 0; tid < tc::kThreads; ++tid) {
          any = tc::kv_info(m, s, lse.data(), delta.data(), bh, i0, key0, tid) || any;
        }
        if (!any) continue;
        for (int tid = 0; tid < tc::kThreads; ++tid) {
          tc::kv_load(m, DP, qkv.data(), dout.data(), s, bh, i0, tid);
        }
        for (int w = 0; w < tc::kWarps; ++w) {
          tc::kv_products(m, DP, w);
          for (int lane = 0; lane < 32; ++lane) tc::kv_grads(m, w, lane, key0, i0, s.t);
          tc::kv_accumulate(m, DP, w);
        }
      }
      for (int tid = 0; tid < tc::kThreads; ++tid) tc::kv_end(m, DP, dqkv.data(), s, bh, key0, tid);
    }
  }
}

std::vector<float> randn(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

Tensor f64(const std::vector<float>& v, const starling::Shape& shape, bool grad) {
  Tensor t = Tensor::from_vector(std::vector<double>(v.begin(), v.end()), shape);
  if (grad) t.set_requires_grad(true);
  return t;
}

void require_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  double err = 0.0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    scale = std::max(scale, std::abs(want[i]));
  }
  INFO("normalized error " << err / scale);
  REQUIRE(err / scale <= rel);
}

template <int DM>
void check(int b, int t, int c, int h, const ops::AttnMask& mask, int kind) {
  const flash::Shape s = flash::shape_of(b, t, c, h, kind, static_cast<int>(mask.block));
  const size_t nqkv = size_t(b) * t * 3 * c, nout = size_t(b) * t * c;
  const auto qkv = randn(nqkv, 1000 + t), dout = randn(nout, 2000 + t);
  // Poisoned outputs: every element must be written.
  std::vector<float> out(nout, NAN), lse(size_t(b) * h * t, NAN), dqkv(nqkv, NAN);
  int skipped = 0;
  emulate_forward<DM>(out, lse, qkv, s, &skipped);
  emulate_backward<DM>(dqkv, dout, qkv, out, lse, s);

  Tensor x = f64(qkv, {b, t, 3 * c}, true);
  Tensor y = ops::attention_packed(x, h, mask);
  starling::autograd::backward(y, f64(dout, {b, t, c}, false));
  const auto want_out = y.to_double_vector(), want_dqkv = x.grad().to_double_vector();
  require_close(out, want_out, 1e-5);
  require_close(dqkv, want_dqkv, 1e-5);
  // Causal masks skip the key tiles past a block's last query.
  if (kind == flash::kCausal && t > kRows) CHECK(skipped > 0);

  // The tensor-core kernels: bf16 operands, so 1e-2 of the float64 result.
  constexpr int DP = DM < 16 ? 16 : DM;
  std::vector<float> tout(nout, NAN), tlse(size_t(b) * h * t, NAN), tdqkv(nqkv, NAN);
  emulate_tc_forward<DP>(tout, tlse, qkv, s);
  emulate_tc_backward<DP>(tdqkv, dout, qkv, tout, tlse, s);
  INFO("tensor cores");
  require_close(tout, want_out, 1e-2);
  require_close(tdqkv, want_dqkv, 1e-2);
}

}  // namespace

TEST_CASE("flash attention (CUDA kernels' arithmetic, emulated) matches attention in float64",
          "[ops]") {
  struct Case {
    int b, t, c, h;
  };
  // D = 17 (DM 32), 8 (16), 32 (32), 64 (64), 80 (128); T past one block of 64 queries and
  // not a multiple of the 32-key tile.
  const auto [b, t, c, h] = GENERATE(values<Case>(
      {{2, 40, 34, 2}, {1, 16, 16, 2}, {1, 72, 64, 2}, {1, 96, 128, 2}, {1, 24, 80, 1}}));
  const int kind = GENERATE(0, 1, 2, 3);
  // Block masks: a block that divides T (T / 2 for block diffusion).
  const int block = kind == flash::kBlockDiffusion ? (t / 2) % 3 == 0 ? 3 : 4 : 8;
  ops::AttnMask mask = kind == flash::kFull          ? ops::AttnMask::full()
                       : kind == flash::kCausal      ? ops::AttnMask::causal()
                       : kind == flash::kBlockCausal ? ops::AttnMask::block_causal(block)
                                                     : ops::AttnMask::block_diffusion(block);
  INFO("B " << b << " T " << t << " C " << c << " H " << h << " mask " << kind << " block "
            << block);
  REQUIRE(mask.check(t).empty());
  const int d = c / h;
  if (d <= 16) {
    check<16>(b, t, c, h, mask, kind);
  } else if (d <= 32) {
    check<32>(b, t, c, h, mask, kind);
  } else if (d <= 64) {
    check<64>(b, t, c, h, mask, kind);
  } else {
    check<128>(b, t, c, h, mask, kind);
  }
}
