// train_mdlm: train_gpt's loop with the diffusion objective and a deterministic NELBO evaluation.
#include "models/mdlm/trainer.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/data/text_dataset.h"
#include "core/data/text_file.h"
#include "core/optim/optimizer.h"
#include "models/gpt/checkpoint.h"
#include "models/mdlm/checkpoint.h"

namespace starling::models {

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kLn2 = 0.69314718055994530942;
constexpr uint64_t kEvalSeed = 0x5eed;  // fixed: evaluations of every run use the same t and masks

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}

}  // namespace

namespace {

// The evaluation loop shared by every mdlm_eval_nelbo: `num_seqs` windows evenly spaced over
// `tokens`, one time (or masked count) per diffusion block from a shuffled even grid, masks drawn
// from Rng(seed) by `model` (its weights are not read); `batch_loss` gives each batch's NELBO.
Result<double> eval_batches(
    const Mdlm& model, std::span<const int32_t> tokens, int64_t num_seqs, int64_t batch,
    uint64_t seed, std::optional<MaskSampling> masking,
    const std::function<Result<double>(const Tensor& x0, const NoisedBatch& noised)>& batch_loss) {
  const MdlmConfig& c = model.config();
  const int64_t len = c.block_size, nb = c.num_blocks(), units = num_seqs * nb;
  // Count masking evaluates with its own estimator (k masked per block from an even grid):
  // the same bound, far less variance per window.
  const bool count =
      masking.value_or(c.masking) == MaskSampling::kCount && c.noise == DiffusionNoise::kAbsorbing;
  const auto n_tok = static_cast<int64_t>(tokens.size());
  Rng rng(seed);
  // One time per diffusion block (per window for MDLM) from an evenly spaced grid, shuffled.
  std::vector<int64_t> perm(static_cast<size_t>(units));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = units - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  double total = 0.0;
  for (int64_t s0 = 0; s0 < num_seqs; s0 += batch) {
    const int64_t b = std::min(batch, num_seqs - s0);
    std::vector<int32_t> x(static_cast<size_t>(b * len));
    std::vector<double> t(static_cast<size_t>(b * nb));
    for (int64_t i = 0; i < b; ++i) {
      const int64_t k = s0 + i;
      const int64_t start = num_seqs > 1 ? k * (n_tok - len) / (num_seqs - 1) : 0;
      std::copy(tokens.begin() + start, tokens.begin() + start + len, x.begin() + i * len);
      for (int64_t j = 0; j < nb; ++j) {
        const double u = (static_cast<double>(perm[k * nb + j]) + 0.5) / static_cast<double>(units);
        t[i * nb + j] = count ? u : c.eps + (1.0 - c.eps) * u;
      }
    }
    const Tensor x0 = Tensor::from_vector(x, {b, len});
    const NoisedBatch noised = count ? model.corrupt_count(x0, t, rng) : model.corrupt(x0, t, rng);
    ASSIGN_OR_RETURN(const double loss, batch_loss(x0, noised));
    total += loss * static_cast<double>(b);
  }
  return total / static_cast<double>(num_seqs);
}

// The default engine: the autograd Mdlm with core/optim's AdamW (or SGD), weight decay on the
// matrices only.
class AutogradMdlmEngine final : public MdlmEngine {
 public:
  AutogradMdlmEngine(const MdlmConfig& mc, const v1::TrainConfig& tc)
      : model_(mc, tc.seed()), opt_(make_optimizer(model_.parameters(), tc)) {}
  std::string describe() const override { return "autograd engine"; }
  int64_t num_parameters() const override { return model_.num_parameters(); }
  Result<Step> step(const Tensor& x0, Rng& noise_rng, double lr, double grad_clip) override {
    const AutogradStep r =
        autograd_step(model_.loss(x0, noise_rng), model_.parameters(), *opt_, lr, grad_clip);
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const Tensor& x0, std::span<const double> t, const Tensor& xt) override {
    autograd::NoGradGuard ng;
    const bool was_training = model_.training();
    model_.train(false);
    const double loss = model_.loss(x0, t, xt).item();
    model_.train(was_training);
    return loss;
  }
  Result<const Mdlm*> host_model() override { return &model_; }

 private:
  Mdlm model_;
  std::unique_ptr<optim::Optimizer> opt_;
};

}  // namespace

double mdlm_eval_nelbo(Mdlm& model, std::span<const int32_t> tokens, int64_t num_seqs,
                       int64_t batch, uint64_t seed, double* denoise_accuracy,
                       std::optional<MaskSampling> masking) {
  autograd::NoGradGuard ng;
  const bool was_training = model.training();
  model.train(false);
  const int64_t V = model.config().vocab_size;
  int64_t correct = 0, corrupted = 0;
  const auto nelbo =
      eval_batches(model, tokens, num_seqs, batch, seed, masking,
                   [&](const Tensor& x0, const NoisedBatch& noised) -> Result<double> {
                     const double loss = model.loss(x0, noised.t, noised.xt).item();
                     if (denoise_accuracy) {
                       const Tensor logits = model.forward(noised.xt, x0).contiguous();
                       const float* l = logits.data<float>();
                       const Tensor xt_c = noised.xt.contiguous();
                       const int32_t* xt = xt_c.data<int32_t>();
                       const int32_t* x = x0.data<int32_t>();  // from_vector: contiguous
                       for (int64_t r = 0; r < x0.numel(); ++r) {
                         if (xt[r] == x[r]) continue;
                         const float* row = l + r * V;
                         const auto arg = std::max_element(row, row + V) - row;
                         correct += arg == x[r] ? 1 : 0;
                         ++corrupted;
                       }
                     }
                     return loss;
                   });
  model.train(was_training);
  if (denoise_accuracy) {
    *denoise_accuracy =
        corrupted > 0 ? static_cast<double>(correct) / static_cast<double>(corrupted) : 0.0;
  }
  return *nelbo;  // the autograd loss never fails
}

namespace {
// Every non-overlapping window of block_size tokens (at least one).
int64_t full_windows(const Mdlm& model, std::span<const int32_t> tokens) {
  return std::max<int64_t>(1, static_cast<int64_t>(tokens.size()) / model.config().block_size);
}
}  // namespace

double mdlm_eval_full(Mdlm& model, std::span<const int32_t> tokens, int64_t batch,
                      std::optional<uint64_t> seed, std::optional<MaskSampling> masking) {
  return mdlm_eval_nelbo(model, tokens, full_windows(model, tokens), batch,
                         seed.value_or(kEvalSeed), nullptr, masking);
}

Result<double> mdlm_eval_nelbo(const Mdlm& model, std::span<const int32_t> tokens, int64_t num_seqs,
                               int64_t batch, uint64_t seed, const MdlmBatchLoss& batch_loss,
                               std::optional<MaskSampling> masking) {
  return eval_batches(model, tokens, num_seqs, batch, seed, masking,
                      [&](const Tensor& x0, const NoisedBatch& noised) {
                        return batch_loss(x0, noised.t, noised.xt);
                      });
}

Result<double> mdlm_eval_full(const Mdlm& model, std::span<const int32_t> tokens, int64_t batch,
                              const MdlmBatchLoss& batch_loss, std::optional<uint64_t> seed,
                              std::optional<MaskSampling> masking) {
  return mdlm_eval_nelbo(model, tokens, full_windows(model, tokens), batch,
                         seed.value_or(kEvalSeed), batch_loss, masking);
}

Result<TrainSummary> train_mdlm(const v1::RunConfig& cfg, const std::string& config_source,
                                const MdlmEngineFactory& make) {
  const auto& tc = cfg.train();
  if (tc.threads() > 0) omp_set_num_threads(tc.threads());

  // Data.
  ASSIGN_OR_RETURN(TextData text_data, load_text_data(cfg, config_source));
  const data::TextDataset& ds = text_data.dataset;
  const std::shared_ptr<const data::Tokenizer>& tokenizer = text_data.tokenizer;

  // Model and optimizer.
  const MdlmConfig mc = MdlmConfig::from_proto(cfg, tokenizer->vocab_size());
  RETURN_IF_ERROR(mc.validate(), config_source);
  if (mc.vocab_size < tokenizer->vocab_size()) {
    return invalid_argument(config_source + ": model.vocab_size " + std::to_string(mc.vocab_size) +
                            " is smaller than the tokenizer's " +
                            std::to_string(tokenizer->vocab_size()));
  }
  if (cfg.model().causal()) {
    spdlog::warn("{}: model.causal = true is ignored: the MDLM attends both ways", config_source);
  }
  const int64_t b = tc.batch_size(), t = mc.block_size;
  if (ds.val_size() < t + 1 || ds.train_size() < t + 1) {
    return failed_precondition(config_source + ": train and val need at least block_size + 1 (" +
                               std::to_string(t + 1) + ") tokens each");
  }
  std::unique_ptr<MdlmEngine> engine;
  if (make) {
    ASSIGN_OR_RETURN(engine, make(mc, cfg), config_source);
  } else {
    engine = std::make_unique<AutogradMdlmEngine>(mc, tc);
  }
  spdlog::info(
      "model: {} ({} noise, eps {:g}, {} masking, {} positions) L={} H={} C={} T={} V={}, {} "
      "parameters ({:.2f}M), seed {}; {}",
      mc.block_diffusion() ? fmt::format("block diffusion, blocks of {}", mc.block_length)
                           : std::string("MDLM"),
      mc.noise == DiffusionNoise::kAbsorbing ? "absorbing" : "uniform", mc.eps,
      mc.masking == MaskSampling::kCount ? (mc.antithetic ? "antithetic count" : "count")
                                         : "bernoulli",
      mc.rope ? "rope" : "learned", mc.n_layer, mc.n_head, mc.n_embd, mc.block_size, mc.vocab_size,
      engine->num_parameters(), static_cast<double>(engine->num_parameters()) / 1e6, tc.seed(),
      engine->describe());
  const MdlmBatchLoss eval_loss = [&](const Tensor& x0, std::span<const double> times,
                                      const Tensor& xt) {
    return engine->eval_loss(x0, times, xt);
  };
  const optim::CosineSchedule sched{tc.learning_rate(), tc.min_lr(), tc.warmup_iters(),
                                    tc.lr_decay_iters()};

  // Outputs.
  const std::filesystem::path out_dir = tc.out_dir();
  ASSIGN_OR_RETURN(std::ofstream metrics, config::open_run_dir(cfg, config_source));

  Rng batch_rng(tc.seed() + 1);
  Rng noise_rng(tc.seed() + 3);
  spdlog::info("rng: batches seed {}, noise seed {}, evaluation seed {}", tc.seed() + 1,
               tc.seed() + 3, kEvalSeed);
  const int64_t max_iters = tc.max_iters();
  const int64_t eval_seqs = std::max(1, tc.eval_iters()) * b;
  TrainSummary sum;
  sum.best_val_loss = 1e30;
  sum.checkpoint = out_dir / "ckpt.safetensors";
  const auto t0 = Clock::now();
  int64_t window_tokens = 0;
  double window_seconds = 0.0;
  double train_seconds = 0.0;

  for (int64_t it = 0; it <= max_iters; ++it) {
    const double lr = tc.decay_lr() ? sched.at(it) : tc.learning_rate();
    const bool eval_now =
        (tc.eval_interval() > 0 && it % tc.eval_interval() == 0) || it == max_iters;
    if (eval_now) {
      ASSIGN_OR_RETURN(const Mdlm* model, engine->host_model(),
                       "evaluation at step " + std::to_string(it));
      ASSIGN_OR_RETURN(const double tr,
                       mdlm_eval_nelbo(*model, ds.tokens(data::Split::kTrain), eval_seqs, b,
                                       kEvalSeed, eval_loss),
                       "evaluation at step " + std::to_string(it));
      ASSIGN_OR_RETURN(
          const double va,
          mdlm_eval_nelbo(*model, ds.tokens(data::Split::kVal), eval_seqs, b, kEvalSeed, eval_loss),
          "evaluation at step " + std::to_string(it));
      sum.train_loss = tr;
      sum.val_loss = va;
      spdlog::info("step {}: train NELBO {:.4f} ({:.4f} bpc), val NELBO {:.4f} ({:.4f} bpc)", it,
                   tr, tr / kLn2, va, va / kLn2);
      metrics << "{\"event\":\"eval\",\"iter\":" << it << ",\"train_loss\":" << tr
              << ",\"val_loss\":" << va << ",\"train_bpc\":" << tr / kLn2
              << ",\"val_bpc\":" << va / kLn2 << "}\n";
      metrics.flush();
      const MdlmCheckpointInfo info{it, tr, va};
      if (it > 0 && va < sum.best_val_loss) {
        sum.best_val_loss = va;
        RETURN_IF_ERROR(
            save_mdlm_checkpoint(out_dir / "best.safetensors", *model, cfg, *tokenizer, info));
      }
      RETURN_IF_ERROR(save_mdlm_checkpoint(sum.checkpoint, *model, cfg, *tokenizer, info));
    }
    if (it == max_iters) break;

    const auto s0 = Clock::now();
    ASSIGN_OR_RETURN(data::Batch batch, ds.get_batch(data::Split::kTrain, b, t, batch_rng));
    ASSIGN_OR_RETURN(const MdlmEngine::Step step,
                     engine->step(batch.x, noise_rng, lr, tc.grad_clip()),
                     "step " + std::to_string(it));
    const double loss_v = step.loss, gnorm = step.grad_norm;
    if (!std::isfinite(loss_v)) {
      return internal_error("training diverged at step " + std::to_string(it) + ": loss is " +
                            std::to_string(loss_v) + " (lower train.learning_rate?)");
    }
    const double step_seconds = std::chrono::duration<double>(Clock::now() - s0).count();
    train_seconds += step_seconds;
    window_seconds += step_seconds;
    window_tokens += b * t;
    sum.iters = it + 1;

    if (tc.log_interval() > 0 && (it % tc.log_interval() == 0 || it + 1 == max_iters)) {
      const double tps =
          window_seconds > 0 ? static_cast<double>(window_tokens) / window_seconds : 0.0;
      const double per_iter = train_seconds / static_cast<double>(it + 1);
      spdlog::info(
          "step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | ETA {}", it,
          max_iters, loss_v, lr, gnorm, tps,
          format_eta(per_iter * static_cast<double>(max_iters - it - 1)));
      metrics << "{\"event\":\"train\",\"iter\":" << it << ",\"loss\":" << loss_v
              << ",\"lr\":" << lr << ",\"grad_norm\":" << gnorm << ",\"tokens_per_s\":" << tps
              << engine->metrics_fields() << "}\n";
      window_seconds = 0.0;
      window_tokens = 0;
    }
  }

  // The whole validation split once: every non-overlapping window, one stratified time each.
  ASSIGN_OR_RETURN(const Mdlm* final_model, engine->host_model(), "final evaluation");
  const int64_t full_seqs = full_windows(*final_model, ds.tokens(data::Split::kVal));
  ASSIGN_OR_RETURN(const double full,
                   mdlm_eval_full(*final_model, ds.tokens(data::Split::kVal), b, eval_loss),
                   "final evaluation");
  spdlog::info("final: val NELBO over {} windows of {} tokens: {:.4f} nats/token, {:.4f} bpc",
               full_seqs, t, full, full / kLn2);
  metrics << "{\"event\":\"final\",\"iter\":" << sum.iters << ",\"val_loss_full\":" << full
          << ",\"val_bpc_full\":" << full / kLn2 << ",\"windows\":" << full_seqs << "}\n";

  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_second =
      train_seconds > 0 ? static_cast<double>(sum.iters * b * t) / train_seconds : 0.0;
  spdlog::info(
      "done: {} steps in {:.1f} s ({:.0f} tok/s training, {}), val NELBO {:.4f} ({:.4f} bpc), "
      "checkpoint {}",
      sum.iters, sum.seconds, sum.tokens_per_second, engine->describe(), sum.val_loss,
      sum.val_loss / kLn2, sum.checkpoint.string());
  return sum;
}

Result<std::string> sample_mdlm_checkpoint(const std::filesystem::path& path, int64_t steps,
                                           double temperature, uint64_t seed, int64_t num_samples,
                                           std::optional<bool> kv_cache) {
  ASSIGN_OR_RETURN(LoadedMdlm loaded, load_mdlm_checkpoint(path));
  const auto& dc = loaded.config.diffusion();
  if (steps <= 0) steps = dc.sampling_steps();
  if (steps <= 0) return invalid_argument("sampling steps must be positive");
  if (num_samples <= 0) return invalid_argument("num_samples must be positive");
  Rng rng(seed);
  SampleStats st;
  const bool kv = kv_cache.value_or(loaded.config.sample().kv_cache());
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids =
      loaded.model->sample(num_samples, steps, temperature, dc.cached_sampler(), rng, &st, kv);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(
      "mdlm sample: {} x {} tokens, {} steps, temperature {}, seed {}: {} network calls, "
      "{} saved by the cache",
      num_samples, loaded.model->config().block_size, st.steps, temperature, seed, st.network_calls,
      st.cached_steps);
  spdlog::info(
      "mdlm sample: {:.3f} s, {:.1f} tokens/s (kv cache {}{})", secs,
      static_cast<double>(num_samples * loaded.model->config().block_size) / std::max(secs, 1e-9),
      kv ? "on" : "off",
      loaded.model->config().block_diffusion() ? "" : ", unused without block diffusion");
  const int64_t len = loaded.model->config().block_size;
  std::string out;
  for (int64_t i = 0; i < num_samples; ++i) {
    ASSIGN_OR_RETURN(std::string text,
                     loaded.tokenizer->decode(std::span<const int32_t>(ids).subspan(
                         static_cast<size_t>(i * len), static_cast<size_t>(len))));
    if (i > 0) out += "\n---\n";
    out += text;
  }
  return out;
}

}  // namespace starling::models
