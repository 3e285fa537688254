// Masked diffusion language model (MDLM, Sahoo et al. 2024) and its uniform-noise variant (UDLM,
// Schiff et al. 2024): the GPT trunk with bidirectional attention, the continuous-time NELBO
// under the log-linear schedule, and the ancestral sampler with its cached variant.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/ops/attention.h"
#include "core/util/rng.h"
#include "core/util/status.h"
#include "models/gpt/gpt.h"

namespace starling::v1 {
class RunConfig;
}

namespace starling::models {

// How training draws masks (absorbing noise only), see Mdlm::corrupt_count.
enum class MaskSampling : uint8_t {
  kBernoulli,  // t per sequence, each token masked with probability 1 - alpha(t)
  kCount,      // k ~ U{1..T} masked positions per sequence, t = k / T
};

enum class DiffusionNoise : uint8_t {
  kAbsorbing,  // tokens jump to [MASK] (id V); MDLM
  kUniform,    // tokens jump to a uniformly random token in [0, V); UDLM
};

struct MdlmConfig {
  int64_t vocab_size = 65;  // V: data tokens; the absorbing model adds [MASK] = V
  int64_t block_size = 64;  // T
  int64_t n_layer = 4;      // L
  int64_t n_head = 4;       // H
  int64_t n_embd = 128;     // C
  double dropout = 0.0;
  bool bias = false;
  bool rope = false;  // [model] pos_encoding = "rope": rotary q, k and no wpe
  double rope_base = 10000.0;
  DiffusionNoise noise = DiffusionNoise::kAbsorbing;
  double eps = 1e-3;                                // alpha(t) = 1 - (1 - eps) t
  MaskSampling masking = MaskSampling::kBernoulli;  // [diffusion] masking (training only)
  // [diffusion] block_length: 0 or block_size = MDLM over the whole sequence; 0 < L' <
  // block_size = block diffusion (BD3-LM) over blocks of L' tokens, absorbing noise only.
  int64_t block_length = 0;
  // [diffusion] antithetic (count masking only): each training sequence also goes in with the
  // complementary mask of every block plus one position of the first (k' = L + 1 - k masked,
  // again uniform on 1..L), so every token is a target at least once per step; twice the compute
  // per step, the same data.
  bool antithetic = false;

  // vocab_size from [model] unless 0, then `tokenizer_vocab`; noise and eps from [diffusion].
  static MdlmConfig from_proto(const v1::RunConfig& c, int64_t tokenizer_vocab);
  Status validate() const;
  // The trunk's shape: bidirectional, V + 1 embeddings when absorbing, V when uniform.
  GptConfig trunk_config() const;

  // Whether the model is a block diffusion (0 < block_length < block_size).
  bool block_diffusion() const { return block_length > 0 && block_length < block_size; }
  // Diffusion blocks per sequence (1 for MDLM) and tokens per block.
  int64_t num_blocks() const { return block_diffusion() ? block_size / block_length : 1; }
  int64_t block_tokens() const { return block_size / num_blocks(); }

  double alpha(double t) const { return 1.0 - (1.0 - eps) * t; }
  double dalpha() const { return -(1.0 - eps); }  // d alpha / dt
};

// A corrupted batch: x_t and the time of each diffusion block (one per sequence for MDLM).
struct NoisedBatch {
  Tensor xt;              // (B, T) i32
  std::vector<double> t;  // (B * num_blocks) in (0, 1], row-major (sequence, block)
};

struct SampleStats {
  int64_t steps = 0;          // denoising steps taken
  int64_t network_calls = 0;  // forward passes actually run
  int64_t cached_steps = 0;   // steps that reused the previous output (nothing changed)
  // Block diffusion with the KV cache: forward passes that ran a finished block as clean and
  // appended its keys and values to the cache (not counted in network_calls).
  int64_t kv_appends = 0;
};

class Mdlm : public nn::Module {
 public:
  // Weights drawn from Rng(seed); dropout masks from a separate stream of the same seed.
  Mdlm(const MdlmConfig& c, uint64_t seed);

  const MdlmConfig& config() const { return config_; }
  int32_t mask_id() const { return static_cast<int32_t>(config_.vocab_size); }

  // xt: (B, T) i32 -> logits over the data tokens (B, T, V) (the [MASK] column of the tied head
  // is dropped, which is SUBS's "[MASK] logit = -inf"). Differentiable. With block diffusion,
  // x0 (B, T) i32 is the clean sequence the blocks condition on: the trunk runs on [xt | x0]
  // (B, 2T) with ops::AttnMask::block_diffusion, so block b of xt sees itself and x0's blocks
  // before b only; x0 is required then and ignored otherwise.
  Tensor forward(const Tensor& xt, const Tensor& x0 = Tensor()) const;
  // The logits of the sampler's layout: x (B, n) i32, n a multiple of the block length, holds
  // clean blocks followed by one noisy block; block-causal attention (each block sees itself
  // and the blocks before it), so the last block's logits equal forward(xt, x0)'s for that
  // block. For MDLM n = T and the attention is bidirectional. -> (B, n, V).
  Tensor prefix_forward(const Tensor& x) const;
  // The full SUBS output as in the paper, no history: (B, T, V + 1) for absorbing noise with
  // column V = -inf, and at unmasked positions 0 for the input token and -inf elsewhere (the
  // input is copied). For uniform noise the same as forward(). x0 as for forward().
  Tensor subs_logits(const Tensor& xt, const Tensor& x0 = Tensor()) const;

  // Stratified ("low-discrepancy") times t_i = eps + (1 - eps) (i + u_i) / n, i < n (n = B *
  // num_blocks for a batch: one time per diffusion block).
  std::vector<double> sample_times(int64_t n, Rng& rng) const;
  // Corrupts x0 (B, T) i32: each token of block (b, k) independently with probability
  // 1 - alpha(t[b * num_blocks + k]) becomes [MASK] (absorbing) or a uniform token (uniform).
  // REQUIRES: t.size() == B * num_blocks.
  NoisedBatch corrupt(const Tensor& x0, std::span<const double> t, Rng& rng) const;

  // NELBO per token (nats) of x0 given its corruption xt at times t (one per block), summed over
  // every position and divided by B * T. Absorbing: (1/t) * -log p(x0 | xt) on masked positions
  // only, t the time of the position's block (the log-linear weight -alpha'/(1 - alpha) = 1/t);
  // with block diffusion the sum over blocks of each block's NELBO given the clean blocks before
  // it. Uniform: the continuous-time UDLM integrand.
  Tensor loss(const Tensor& x0, std::span<const double> t, const Tensor& xt) const;
  // Exact-count masking of x0 (B, T) (absorbing noise): each block of L tokens (L = T for MDLM)
  // gets k = 1 + floor(L u) masked positions, u stratified over the B * num_blocks blocks as in
  // sample_times, chosen uniformly without replacement, and t = k / L. loss(x0, t, xt) is then
  // the mean over blocks of L times the mean masked CE, divided by T: an unbiased estimate of the
  // eps -> 0 NELBO (integral_0^1 (1/t) Binomial(k; L, t) dt = 1/k, and given k the masked set
  // of the Bernoulli corruption is uniform).
  NoisedBatch corrupt_count(const Tensor& x0, Rng& rng) const;
  // The same with the given u in [0, 1) per block (B * num_blocks values): k = 1 + floor(L u);
  // `rng` draws only which positions. The deterministic evaluation passes an even grid.
  NoisedBatch corrupt_count(const Tensor& x0, std::span<const double> u, Rng& rng) const;
  // The antithetic partner of a count-masked batch `first` of x0 (B, T): returns 2B rows, the
  // first B = first.xt, row B + i = in every block, the complement of row i's mask plus one of
  // its masked positions drawn from `rng`; times t = k / L for all 2 B num_blocks blocks.
  NoisedBatch antithetic_pair(const NoisedBatch& first, const Tensor& x0, Rng& rng) const;
  // Draws the training corruption from `rng` (sample_times + corrupt, or corrupt_count with
  // MaskSampling::kCount, and its antithetic_pair with `antithetic`), then loss(x0, t, xt) (the
  // mean of the two halves with `antithetic`).
  Tensor loss(const Tensor& x0, Rng& rng) const;

  // Ancestral sampling of `num` sequences of block_size tokens with `steps` steps from t = 1 to
  // t = 0 (all-[MASK] start for absorbing, uniform tokens for uniform noise); with block
  // diffusion the blocks are drawn left to right, `steps` steps each, every block conditioned
  // on the ones already drawn. With `cached`, a step where no token changed reuses the previous
  // network output; the result is the same as uncached for the same rng. Returns (num, T) ids
  // in [0, V), row-major. Eval mode, no grad. With `kv_cache` and block diffusion, the keys and
  // values of the finished (clean) blocks are kept per layer (nn::KvCache): each step runs only
  // the noisy block against the cache (not appended), and a finished block is run once as clean
  // and appended; the logits equal prefix_forward's up to float summation order (and so do the
  // draws, except where that order moves a uniform across a boundary). No effect without block
  // diffusion (every position is noisy there).
  std::vector<int32_t> sample(int64_t num, int64_t steps, double temperature, bool cached, Rng& rng,
                              SampleStats* stats = nullptr, bool kv_cache = true);
  // The sampler's cached network call: block (B, n) i32 at positions [cache.length(),
  // cache.length() + n), attending to the cached rows and to the whole block -> data logits
  // (B, n, V). With `append` the block's keys and values join the cache. Inference only.
  Tensor block_forward_cached(const Tensor& block, nn::KvCache& cache, bool append) const;

  // Loads a state dict (strict).
  Status load(const io::StateDict& sd) { return load_state_dict(sd, true); }

  std::shared_ptr<GptTrunk> transformer;

 private:
  // ids (B, n) -> (B, n, V_trunk) with `mask` (positions repeat per mask.position_period).
  Tensor trunk_forward(const Tensor& ids, const ops::AttnMask& mask) const;
  Tensor data_logits(const Tensor& raw) const;  // drops the [MASK] column (absorbing)
  MdlmConfig config_;
  Rng dropout_rng_;
};

// The UDLM continuous-time NELBO integrand of one position, in float64, without autograd: the
// reference the tensor implementation is tested against. x0, z in [0, N); probs: the model's
// x_theta (N values summing to 1); alpha = alpha(t), dalpha = alpha'(t).
//   (-alpha'/(N alpha)) [N/xb_th[z] - N/xb[z] - sum_{y != z} (xb[y]/xb[z])
//                        log(xb_th[y] xb[z] / (xb_th[z] xb[y]))],
// xb = N alpha onehot(x0) + (1 - alpha), xb_th = N alpha probs + (1 - alpha).
double udlm_integrand(int32_t x0, int32_t z, std::span<const double> probs, double alpha,
                      double dalpha);

}  // namespace starling::models
