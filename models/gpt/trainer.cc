// train_gpt: nanoGPT's training loop in C++ (same batches, schedule, clipping and evaluation).
#include "models/gpt/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <span>
#include <tuple>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/data/text_dataset.h"
#include "core/data/text_file.h"
#include "core/optim/optimizer.h"
#include "models/gpt/checkpoint.h"
#include "models/gpt/hf.h"
#include "models/gpt/lora.h"

namespace starling::models {

namespace {

using Clock = std::chrono::steady_clock;

std::string format_eta(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buf;
}

// Mean loss over eval_iters batches of each split.
Result<std::pair<double, double>> estimate_loss(GptEngine& engine, const data::TextDataset& ds,
                                                const v1::RunConfig& cfg, Rng& rng) {
  double out[2] = {0, 0};
  const int64_t b = cfg.train().batch_size(), t = cfg.model().block_size();
  const int n = std::max(1, cfg.train().eval_iters());
  for (int s = 0; s < 2; ++s) {
    const auto split = s == 0 ? data::Split::kTrain : data::Split::kVal;
    for (int i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(data::Batch batch, ds.get_batch(split, b, t, rng));
      ASSIGN_OR_RETURN(const double loss, engine.eval_loss(batch));
      out[s] += loss;
    }
    out[s] /= n;
  }
  return std::make_pair(out[0], out[1]);
}

// The default engine: the autograd Gpt with core/optim's AdamW (or SGD), weight decay on the
// matrices only.
// With a pretrained `base` the weights start from it; with `lora` enabled the base is frozen
// (shared, not copied) and the optimizer steps the adapters only.
class AutogradEngine final : public GptEngine {
 public:
  AutogradEngine(std::unique_ptr<Gpt> model, const v1::TrainConfig& tc, const LoraSpec& lora)
      : model_(std::move(model)),
        params_(model_->trainable_parameters()),
        opt_(make_optimizer(params_, tc)),
        lora_(lora) {}
  std::string describe() const override {
    if (!lora_.enabled()) return "autograd engine";
    return fmt::format("autograd engine, LoRA rank {} on {} ({} trained parameters)", lora_.rank,
                       fmt::join(lora_.targets, ", "), model_->num_trainable_parameters());
  }
  int64_t num_parameters() const override { return model_->num_parameters(); }
  Result<Step> step(const data::Batch& batch, double lr, double grad_clip) override {
    const AutogradStep r =
        autograd_step(model_->loss(batch.x, batch.y), params_, *opt_, lr, grad_clip);
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const data::Batch& batch) override {
    autograd::NoGradGuard ng;
    model_->train(false);
    const double loss = model_->loss(batch.x, batch.y).item();
    model_->train(true);
    return loss;
  }
  Result<const Gpt*> host_model() override { return model_.get(); }

 private:
  std::unique_ptr<Gpt> model_;
  std::vector<Tensor> params_;
  std::unique_ptr<optim::Optimizer> opt_;
  LoraSpec lora_;
};

}  // namespace

AutogradStep autograd_step(const Tensor& loss, const std::vector<Tensor>& params,
                           optim::Optimizer& opt, double lr, double grad_clip) {
  const double loss_v = loss.item();
  if (!std::isfinite(loss_v)) return AutogradStep{loss_v, 0.0};
  autograd::backward(loss);
  const double gnorm = optim::clip_grad_norm(params, grad_clip);
  opt.step(lr);
  opt.zero_grad();
  return AutogradStep{loss_v, gnorm};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::vector<Tensor>& params,
                                                 const v1::TrainConfig& tc) {
  auto groups = optim::decay_matrices_only(params);
  if (tc.optimizer() == v1::TrainConfig::SGD) {
    return std::make_unique<optim::Sgd>(groups,
                                        optim::SgdOptions{tc.momentum(), tc.weight_decay(), false});
  }
  return std::make_unique<optim::AdamW>(
      groups, optim::AdamWOptions{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()});
}

Result<std::pair<double, int64_t>> full_split_loss(
    std::span<const int32_t> tokens, int64_t b, int64_t t,
    const std::function<Result<double>(const data::Batch&)>& batch_loss) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t windows = n > t ? (n - 1) / t / b * b : 0;
  double total = 0.0;
  std::vector<int32_t> x(static_cast<size_t>(b * t)), y(static_cast<size_t>(b * t));
  for (int64_t w0 = 0; w0 < windows; w0 += b) {
    for (int64_t i = 0; i < b; ++i) {
      const int64_t s = (w0 + i) * t;
      std::copy_n(tokens.begin() + s, t, x.begin() + i * t);
      std::copy_n(tokens.begin() + s + 1, t, y.begin() + i * t);
    }
    ASSIGN_OR_RETURN(const double loss,
                     batch_loss({Tensor::from_vector(x, {b, t}), Tensor::from_vector(y, {b, t})}));
    total += loss * static_cast<double>(b);
  }
  return std::make_pair(windows > 0 ? total / static_cast<double>(windows) : 0.0, windows);
}

Result<TrainSummary> train_gpt(const v1::RunConfig& cfg_in, const std::string& config_source,
                               const GptEngineFactory& make) {
  v1::RunConfig cfg = cfg_in;
  const auto& tc = cfg.train();
  if (tc.threads() > 0) omp_set_num_threads(tc.threads());

  // A pretrained start ([model] init_from) brings the shape and the tokenizer; [model]
  // block_size, when set, is the context trained on (at most the base's positions).
  std::unique_ptr<Gpt> base;
  std::shared_ptr<const data::Tokenizer> base_tokenizer;
  int64_t context = 0;
  if (!cfg.model().init_from().empty()) {
    const std::string key = config_source + ": model.init_from";
    ASSIGN_OR_RETURN(auto data_dir, data::resolve_data_dir(cfg.data().data_dir()), key);
    ASSIGN_OR_RETURN(PretrainedGpt pre, load_pretrained_gpt(cfg.model().init_from(), data_dir),
                     key);
    const auto& m = cfg_in.model();
    ShapeKeys keys;
    if (m.has_n_layer()) keys.n_layer = m.n_layer();
    if (m.has_n_head()) keys.n_head = m.n_head();
    if (m.has_n_embd()) keys.n_embd = m.n_embd();
    if (m.has_vocab_size() && m.vocab_size() > 0) keys.vocab_size = m.vocab_size();
    if (m.has_block_size()) keys.block_size = m.block_size();
    if (m.has_pos_encoding()) keys.rope = m.pos_encoding() == v1::ModelConfig::ROPE;
    RETURN_IF_ERROR(check_pretrained_shape(pre, keys, config_source));
    context = m.has_block_size() ? m.block_size() : pre.model.block_size();
    const std::string init_from = cfg.model().init_from();
    *cfg.mutable_model() = pre.model;
    cfg.mutable_model()->set_init_from(init_from);
    cfg.mutable_model()->set_dropout(m.dropout());
    base = std::move(pre.gpt);
    base_tokenizer = std::move(pre.tokenizer);
    spdlog::info("model: {} from {}", pre.describe, init_from);
  }
  ASSIGN_OR_RETURN(const LoraSpec lora, lora_spec_from_proto(cfg.lora(), config_source));
  if ((lora.enabled() || base) && make) {
    return unimplemented(config_source + (lora.enabled() ? ": [lora]" : ": model.init_from") +
                         " trains on the autograd engine for now; set train.engine = "
                         "\"autograd\" (and no --device cuda)");
  }

  // Data.
  ASSIGN_OR_RETURN(TextData text_data, load_text_data(cfg, config_source, base_tokenizer));
  const data::TextDataset& ds = text_data.dataset;
  const std::shared_ptr<const data::Tokenizer>& tokenizer = text_data.tokenizer;

  // Model and optimizer.
  GptConfig gc = GptConfig::from_proto(cfg.model(), tokenizer->vocab_size());
  RETURN_IF_ERROR(gc.validate(), config_source);
  if (gc.vocab_size < tokenizer->vocab_size()) {
    return invalid_argument(config_source + ": model.vocab_size " + std::to_string(gc.vocab_size) +
                            " is smaller than the tokenizer's " +
                            std::to_string(tokenizer->vocab_size()));
  }
  if (!make && tc.precision() == v1::TrainConfig::BF16) {
    return invalid_argument(config_source +
                            ": train.precision = \"bf16\" runs on the fused engine (train.engine "
                            "= \"fused\", or --device cuda); the autograd engine is fp32 only");
  }
  std::unique_ptr<GptEngine> engine;
  if (make) {
    ASSIGN_OR_RETURN(engine, make(gc, cfg), config_source);
  } else {
    ASSIGN_OR_RETURN(auto model, make_gpt(gc, tc.seed(), base.get(), lora), config_source);
    engine = std::make_unique<AutogradEngine>(std::move(model), tc, lora);
  }
  base.reset();  // a LoRA model shares the base's storage; a full fine-tune copied it
  // The context trained on; the checkpoints' config describes the whole model (its position
  // table) and no longer needs the base: the weights it holds are complete (adapters merged).
  if (context > 0) cfg.mutable_model()->set_block_size(static_cast<int32_t>(context));
  v1::RunConfig ckpt_cfg = cfg;
  ckpt_cfg.mutable_model()->set_block_size(static_cast<int32_t>(gc.block_size));
  ckpt_cfg.mutable_model()->clear_init_from();
  ckpt_cfg.clear_lora();
  spdlog::info("model: GPT L={} H={} C={} T={} V={}, {:.2f}M parameters, seed {}; {}", gc.n_layer,
               gc.n_head, gc.n_embd, gc.block_size, gc.vocab_size,
               static_cast<double>(engine->num_parameters()) / 1e6, tc.seed(), engine->describe());
  const optim::CosineSchedule sched{tc.learning_rate(), tc.min_lr(), tc.warmup_iters(),
                                    tc.lr_decay_iters()};

  // Outputs.
  const std::filesystem::path out_dir = tc.out_dir();
  ASSIGN_OR_RETURN(std::ofstream metrics, config::open_run_dir(cfg, config_source));

  Rng batch_rng(tc.seed() + 1);
  Rng eval_rng(tc.seed() + 2);
  const int64_t b = tc.batch_size(), t = cfg.model().block_size();
  const int64_t max_iters = tc.max_iters();
  TrainSummary sum;
  sum.best_val_loss = 1e30;
  sum.checkpoint = out_dir / "ckpt.safetensors";
  const auto t0 = Clock::now();
  // Throughput counts training steps only (evaluation and checkpointing excluded).
  int64_t window_tokens = 0;
  double window_seconds = 0.0;
  double train_seconds = 0.0;

  for (int64_t it = 0; it <= max_iters; ++it) {
    const double lr = tc.decay_lr() ? sched.at(it) : tc.learning_rate();
    const bool eval_now =
        (tc.eval_interval() > 0 && it % tc.eval_interval() == 0) || it == max_iters;
    if (eval_now) {
      ASSIGN_OR_RETURN(auto losses, estimate_loss(*engine, ds, cfg, eval_rng));
      sum.train_loss = losses.first;
      sum.val_loss = losses.second;
      spdlog::info("step {}: train loss {:.4f}, val loss {:.4f}", it, losses.first, losses.second);
      metrics << "{\"event\":\"eval\",\"iter\":" << it << ",\"train_loss\":" << losses.first
              << ",\"val_loss\":" << losses.second << "}\n";
      metrics.flush();
      const GptCheckpointInfo info{it, losses.first, losses.second};
      ASSIGN_OR_RETURN(const Gpt* model, engine->host_model(),
                       "checkpoint at step " + std::to_string(it));
      if (it > 0 && losses.second < sum.best_val_loss) {
        sum.best_val_loss = losses.second;
        RETURN_IF_ERROR(
            save_gpt_checkpoint(out_dir / "best.safetensors", *model, ckpt_cfg, *tokenizer, info));
      }
      RETURN_IF_ERROR(save_gpt_checkpoint(sum.checkpoint, *model, ckpt_cfg, *tokenizer, info));
    }
    if (it == max_iters) break;

    const auto s0 = Clock::now();
    ASSIGN_OR_RETURN(data::Batch batch, ds.get_batch(data::Split::kTrain, b, t, batch_rng));
    ASSIGN_OR_RETURN(const GptEngine::Step step, engine->step(batch, lr, tc.grad_clip()),
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
  // The whole validation split once, as the MDLM trainer reports its bound (docs/mdlm.md).
  ASSIGN_OR_RETURN(const auto full, full_split_loss(ds.tokens(data::Split::kVal), b, t,
                                                    [&](const data::Batch& batch) {
                                                      return engine->eval_loss(batch);
                                                    }));
  if (full.second > 0) {
    constexpr double kLn2 = 0.69314718055994530942;
    spdlog::info(
        "final: val loss over {} windows of {} tokens: {:.4f} nats/token, {:.4f} bits/token",
        full.second, t, full.first, full.first / kLn2);
    metrics << "{\"event\":\"final\",\"iter\":" << sum.iters << ",\"val_loss_full\":" << full.first
            << ",\"val_bpc_full\":" << full.first / kLn2 << ",\"windows\":" << full.second << "}\n";
  }

  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_second =
      train_seconds > 0 ? static_cast<double>(sum.iters * b * t) / train_seconds : 0.0;
  spdlog::info(
      "done: {} steps in {:.1f} s ({:.0f} tok/s training, {}), val loss {:.4f}, checkpoint {}",
      sum.iters, sum.seconds, sum.tokens_per_second, engine->describe(), sum.val_loss,
      sum.checkpoint.string());
  return sum;
}

}  // namespace starling::models
