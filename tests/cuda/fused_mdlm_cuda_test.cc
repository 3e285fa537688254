// [cuda] What the fused MDLM adds to the CUDA backend, against the CPU backend (the oracle):
// bidirectional attention, the weighted cross-entropy over a padded vocabulary, and FusedMdlm's
// gradients and training steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "models/gpt/fused_backend.h"
#include "models/mdlm/fused_engine.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::cuda {
namespace {

using models::FusedBackend;
using testing::random_floats;
using testing::require_close;

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Backend buffers freed with the arena.
class Arena {
 public:
  explicit Arena(FusedBackend& be) : be_(be) {}
  ~Arena() {
    for (void* p : owned_) be_.free(p);
  }
  template <typename T>
  T* put(const std::vector<T>& host) {
    T* p = make<T>(host.size());
    be_.copy_to_backend(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  template <typename T>
  T* make(size_t n) {
    auto p = be_.alloc(n * sizeof(T));
    REQUIRE(p.ok());
    owned_.push_back(*p);
    return static_cast<T*>(*p);
  }
  template <typename T>
  std::vector<T> get(const T* p, size_t n) {
    std::vector<T> out(n);
    be_.copy_to_host(out.data(), p, n * sizeof(T));
    return out;
  }

 private:
  FusedBackend& be_;
  std::vector<void*> owned_;
};

std::unique_ptr<FusedBackend> cuda_backend() {
  auto r = models::make_fused_cuda_backend(0);
  REQUIRE(r.ok());
  return std::move(*r);
}

// Attention forward and backward with `mask` on random inputs (seeds seed, seed + 1) on the CPU
// and CUDA backends: outputs, probabilities and dqkv agree. Returns the GPU's probabilities.
// Attention forward and backward on the CPU backend and on the CUDA backend three times: with its
// fp32 flash kernels (the default: no (B, H, T, T) probabilities), with the probabilities
// materialized (STARLING_CUDA_ATTENTION=materialized), and with the tensor-core flash kernels
// (STARLING_CUDA_ATTENTION=bf16). out and dqkv agree with the CPU's (fp32 1e-5, bf16 1e-2; every
// element written: dqkv starts as NaN), the materialized probabilities too. Returns the GPU's
// materialized probabilities.
std::vector<float> attention_matches_cpu(int b, int t, int c, int h, const ops::AttnMask& mask,
                                         uint64_t seed) {
  const size_t nqkv = size_t(b) * t * 3 * c, nout = size_t(b) * t * c;
  const auto qkv = random_floats(nqkv, seed), dout = random_floats(nout, seed + 1);
  std::vector<float> out[4], att[4], dqkv[4];
  auto cpu = models::make_fused_cpu_backend();
  auto flash = cuda_backend();
  ::setenv("STARLING_CUDA_ATTENTION", "materialized", 1);
  auto materialized = cuda_backend();
  ::unsetenv("STARLING_CUDA_ATTENTION");
  ::setenv("STARLING_CUDA_ATTENTION", "bf16", 1);
  auto tensor_cores = cuda_backend();
  ::unsetenv("STARLING_CUDA_ATTENTION");
  FusedBackend* backends[4] = {cpu.get(), flash.get(), materialized.get(), tensor_cores.get()};
  REQUIRE(flash->attention_state_floats(b, t, c, h) == size_t(b) * h * t);
  REQUIRE(materialized->attention_state_floats(b, t, c, h) == size_t(b) * h * t * t);
  for (int i = 0; i < 4; ++i) {
    const size_t natt = backends[i]->attention_state_floats(b, t, c, h);
    const size_t nscratch = backends[i]->attention_scratch_floats(b, t, c, h);
    Arena a(*backends[i]);
    float* q = a.put(qkv);
    float* d = a.put(dout);
    float* o = a.make<float>(nout);
    float* p = a.make<float>(natt);
    float* s = a.make<float>(nscratch);
    float* g = a.put(std::vector<float>(nqkv, std::nanf("")));
    backends[i]->attention_forward(o, p, q, b, t, c, h, mask);
    backends[i]->attention_backward(g, s, d, q, o, p, b, t, c, h, mask);
    out[i] = a.get(o, nout);
    att[i] = a.get(p, natt);
    dqkv[i] = a.get(g, nqkv);
  }
  for (int i = 1; i < 4; ++i) {
    INFO((i == 1 ? "flash" : i == 2 ? "materialized" : "tensor cores"));
    const double tol = i == 3 ? 1e-2 : 1e-5;
    require_close(out[i], as_double(out[0]), tol);
    require_close(dqkv[i], as_double(dqkv[0]), tol);
  }
  require_close(att[2], as_double(att[0]));
  return att[2];
}

TEST_CASE("fused backend attention, causal and bidirectional, matches the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [b, t, c, h] = GENERATE(
      table<int, int, int, int>({{1, 1, 4, 1}, {2, 5, 12, 3}, {1, 33, 16, 2}, {3, 70, 48, 6}}));
  const bool causal = GENERATE(false, true);
  INFO("B " << b << " T " << t << " C " << c << " H " << h << " causal " << causal);
  const auto att = attention_matches_cpu(
      b, t, c, h, causal ? ops::AttnMask::causal() : ops::AttnMask::full(), 1);
  if (!causal && t > 1) {  // every key is seen: no probability above the diagonal is 0
    CHECK(att[1] > 0.0f);
  }
}

TEST_CASE("fused backend attention under block-causal and block-diffusion masks matches the CPU",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  // (B, T, C, H, block, diffusion): block-causal and the [x_t | x_0] layout, blocks of 1 (the
  // autoregressive end), odd block counts, and rows longer than one thread block.
  const auto [b, t, c, h, block, diffusion] =
      GENERATE(table<int, int, int, int, int, bool>({{1, 6, 12, 3, 2, false},
                                                     {2, 35, 16, 2, 5, false},
                                                     {1, 130, 48, 6, 13, false},
                                                     {1, 4, 12, 3, 1, true},
                                                     {2, 12, 16, 2, 3, true},
                                                     {1, 136, 48, 6, 4, true}}));
  INFO("B " << b << " T " << t << " C " << c << " H " << h << " block " << block << " diffusion "
            << diffusion);
  const ops::AttnMask mask =
      diffusion ? ops::AttnMask::block_diffusion(block) : ops::AttnMask::block_causal(block);
  REQUIRE(mask.check(t).empty());
  const auto att = attention_matches_cpu(b, t, c, h, mask, 21);
  // The GPU's probabilities are 0 exactly off the mask's key ranges and positive on them.
  for (int i = 0; i < t; ++i) {
    const auto r = mask.key_ranges(i, t);
    for (int j = 0; j < t; ++j) {
      const bool in = (j >= r[0] && j < r[1]) || (j >= r[2] && j < r[3]);
      const float pr = att[size_t(i) * t + j];
      INFO("query " << i << " key " << j);
      REQUIRE((in ? pr > 0.0f : pr == 0.0f));
    }
  }
}

TEST_CASE("weighted cross-entropy over a padded vocabulary matches the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto [n, v, vp] =
      GENERATE(table<int, int, int>({{1, 2, 3}, {7, 65, 66}, {13, 1001, 1001}, {9, 2051, 2056}}));
  const bool weighted = GENERATE(true, false);
  INFO("N " << n << " V " << v << " VP " << vp << " weighted " << weighted);
  const auto logits = random_floats(size_t(n) * vp, 3, 3.0);
  auto weights = random_floats(size_t(n), 4);
  for (auto& w : weights) w = std::abs(w) + 0.01f;
  Rng rng(5);
  std::vector<int> targets(n);
  for (auto& e : targets) e = static_cast<int>(rng.below(static_cast<uint64_t>(v)));
  if (weighted && n > 2) targets[2] = -1;  // ignored rows: the weighted loss only
  std::vector<float> losses[2], loss[2], dlogits[2];
  auto cpu = models::make_fused_cpu_backend();
  auto gpu = cuda_backend();
  FusedBackend* backends[2] = {cpu.get(), gpu.get()};
  for (int i = 0; i < 2; ++i) {
    Arena a(*backends[i]);
    float* l = a.put(logits);
    int* tg = a.put(targets);
    float* w = weighted ? a.put(weights) : nullptr;
    float* ls = a.make<float>(size_t(n));
    float* lo = a.make<float>(1);
    float* dl = a.put(std::vector<float>(logits.size(), 7.0f));  // overwritten everywhere
    backends[i]->cross_entropy_forward(ls, lo, l, tg, w, n, v, vp);
    backends[i]->cross_entropy_backward(dl, l, tg, w, n, v, vp);
    losses[i] = a.get(ls, size_t(n));
    loss[i] = a.get(lo, 1);
    dlogits[i] = a.get(dl, logits.size());
  }
  require_close(losses[1], as_double(losses[0]));
  require_close(loss[1], as_double(loss[0]));
  require_close(dlogits[1], as_double(dlogits[0]));
  for (int r = 0; r < n; ++r) {
    for (int j = v; j < vp; ++j) CHECK(dlogits[1][size_t(r) * vp + j] == 0.0f);
  }
}

models::MdlmConfig mdlm_shape(int which) {
  models::MdlmConfig c;
  if (which == 0) {  // tiny, with biases, odd sizes, antithetic count masks
    c.vocab_size = 29;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 34;
    c.bias = true;
    c.masking = models::MaskSampling::kCount;
    c.antithetic = true;
  } else {  // configs/mdlm_char_cpu.toml's shape
    c.vocab_size = 65;
    c.block_size = 64;
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 128;
  }
  return c;
}

std::unique_ptr<models::FusedMdlm> make_mdlm(const models::MdlmConfig& c, int64_t b, bool gpu) {
  auto m =
      models::FusedMdlm::make(c, b, 1, gpu ? cuda_backend() : models::make_fused_cpu_backend());
  REQUIRE(m.ok());
  return std::move(*m);
}

Tensor random_x0(int64_t b, const models::MdlmConfig& c, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> x(static_cast<size_t>(b * c.block_size));
  for (auto& e : x) e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
  return Tensor::from_vector(x, {b, c.block_size});
}

TEST_CASE("fused MDLM on CUDA: gradients and 10 steps match the CPU backend", "[cuda]") {
  STARLING_REQUIRE_GPU();
  // (rope, block_length): the plain MDLM; rotary positions; block diffusion with learned
  // positions (wpe read with period T) and with rotary ones, over rows [x_t | x_0] of 2T.
  const auto [rope, block_length] =
      GENERATE(table<bool, int64_t>({{false, 0}, {true, 0}, {false, 4}, {true, 2}, {true, 8}}));
  const int which = GENERATE(0, 1);
  INFO("rope " << rope << " block_length " << block_length << " shape " << which);
  auto c = mdlm_shape(which);
  c.rope = rope;
  if (rope && which == 0) c.n_embd = 36;  // RoPE needs an even head size: 2 heads of 18
  c.block_length = block_length;
  const int64_t b = rope || block_length > 0 ? 4 : 8;
  auto cpu = make_mdlm(c, b, false);  // both from models::Mdlm(c, 1)'s initialization
  auto gpu = make_mdlm(c, b, true);
  // One corrupted batch: loss, logits and every gradient.
  const Tensor x0 = random_x0(b, c, 31);
  Rng r_cpu(32);
  const auto dc = cpu->draw(x0, r_cpu);
  auto lc = cpu->forward_backward(dc.x0, dc.noised.t, dc.noised.xt);
  auto lg = gpu->forward_backward(dc.x0, dc.noised.t, dc.noised.xt);
  REQUIRE(lc.ok());
  REQUIRE(lg.ok());
  CHECK(*lg == Approx(*lc).epsilon(1e-5));
  testing::require_close(gpu->trunk().logits_host(), as_double(cpu->trunk().logits_host()), 1e-4);
  const auto gc = cpu->trunk().gradients_host(), gg = gpu->trunk().gradients_host();
  for (const auto& p : cpu->trunk().layout()) {
    INFO(p.name);
    const auto off = static_cast<std::ptrdiff_t>(p.offset);
    const auto len = static_cast<std::ptrdiff_t>(p.numel);
    require_close(std::vector<float>(gg.begin() + off, gg.begin() + off + len),
                  as_double(std::vector<float>(gc.begin() + off, gc.begin() + off + len)), 1e-4);
  }
  // Ten steps with the same data and noise streams.
  const models::FusedOptimizer opt{0.9, 0.99, 1e-8, 0.1};
  Rng n_cpu(33), n_gpu(33);
  for (int it = 0; it < 10; ++it) {
    INFO("step " << it);
    const Tensor x = random_x0(b, c, 300 + static_cast<uint64_t>(it));
    auto sc = cpu->train_step(x, n_cpu, 3e-3, opt, 1.0);
    auto sg = gpu->train_step(x, n_gpu, 3e-3, opt, 1.0);
    REQUIRE(sc.ok());
    REQUIRE(sg.ok());
    CHECK(std::abs(sg->loss - sc->loss) <= 1e-3 * std::max(1.0, sc->loss));
    CHECK(sg->grad_norm == Approx(sc->grad_norm).epsilon(1e-3));
  }
  // The host model sees the GPU's weights.
  auto host = gpu->host_model();
  REQUIRE(host.ok());
  CHECK((*host)->state_dict().size() == gpu->trunk().layout().size());
}

}  // namespace
}  // namespace starling::cuda
