// FusedMdlm: host-side corruption (a models::Mdlm), staging of inputs, targets and weights for
// the fused trunk, and the fused MdlmEngine under train_mdlm's loop.
#include "models/mdlm/fused_engine.h"

#include <cmath>
#include <string>
#include <utility>

namespace starling::models {

ops::AttnMask fused_mdlm_attn_mask(const MdlmConfig& c) {
  return c.block_diffusion() ? ops::AttnMask::block_diffusion(c.block_tokens())
                             : ops::AttnMask::full();
}

namespace {

// The trunk's sequence: x_t (T), or [x_t | x_0] (2T) with block diffusion.
int64_t trunk_time(const MdlmConfig& c) {
  return c.block_diffusion() ? 2 * c.block_size : c.block_size;
}

}  // namespace

Status check_fused_mdlm_config(const MdlmConfig& c, int64_t batch) {
  RETURN_IF_ERROR(c.validate(), "fused MDLM");
  if (c.noise != DiffusionNoise::kAbsorbing) {
    return unimplemented(
        "fused MDLM: diffusion.noise = \"uniform\" is not supported (absorbing noise only); use "
        "train.engine = \"autograd\"");
  }
  if (c.dropout > 0.0) {
    return unimplemented("fused MDLM: model.dropout = " + std::to_string(c.dropout) +
                         " is not supported (the fused engine has no dropout); set "
                         "model.dropout = 0 or use train.engine = \"autograd\"");
  }
  if (batch <= 0) return invalid_argument("fused MDLM: train.batch_size must be positive");
  const int64_t rows = c.antithetic ? 2 * batch : batch;
  RETURN_IF_ERROR(
      check_fused_gpt_config(c.trunk_config(), rows, trunk_time(c), fused_mdlm_attn_mask(c)),
      "fused MDLM");
  return ok_status();
}

FusedMdlm::FusedMdlm(const MdlmConfig& config, int64_t batch, uint64_t seed)
    : config_(config), batch_(batch), host_(std::make_unique<Mdlm>(config, seed)) {}

Result<std::unique_ptr<FusedMdlm>> FusedMdlm::make(const MdlmConfig& config, int64_t batch,
                                                   uint64_t seed,
                                                   std::unique_ptr<FusedBackend> backend) {
  RETURN_IF_ERROR(check_fused_mdlm_config(config, batch));
  std::unique_ptr<FusedMdlm> m(new FusedMdlm(config, batch, seed));
  const int64_t rows = config.antithetic ? 2 * batch : batch;
  ASSIGN_OR_RETURN(m->trunk_,
                   FusedGpt::make(config.trunk_config(), rows, trunk_time(config), seed,
                                  std::move(backend), fused_mdlm_attn_mask(config)),
                   "fused MDLM");
  // SUBS: the loss reads the V data logits, never [MASK]'s (wte's row V).
  RETURN_IF_ERROR(m->trunk_->set_loss_vocab(config.vocab_size), "fused MDLM");
  // The autograd Mdlm's initialization, whatever models::Gpt's is.
  RETURN_IF_ERROR(m->trunk_->load(m->host_->state_dict()), "fused MDLM: initial weights");
  return m;
}

Result<FusedBatch> FusedMdlm::stage(const Tensor& x0, std::span<const double> t, const Tensor& xt,
                                    bool pad) {
  const int64_t len = config_.block_size, v = config_.vocab_size;
  if (x0.dtype() != DType::kI32 || x0.dim() != 2 || x0.shape()[1] != len) {
    return invalid_argument("fused MDLM: x0 must be i32 of shape (b, T = " + std::to_string(len) +
                            "), got " + shape_str(x0.shape()));
  }
  if (xt.dtype() != DType::kI32 || xt.shape() != x0.shape()) {
    return invalid_argument("fused MDLM: xt must be i32 of x0's shape " + shape_str(x0.shape()) +
                            ", got " + shape_str(xt.shape()));
  }
  const int64_t b = x0.shape()[0];
  if (b < 1 || b > rows()) {
    return invalid_argument("fused MDLM: a batch of " + std::to_string(b) +
                            " sequences; this engine takes 1 to " + std::to_string(rows()));
  }
  const int64_t nb = config_.num_blocks(), bl = len / nb;
  if (static_cast<int64_t>(t.size()) != b * nb) {
    return invalid_argument("fused MDLM: " + std::to_string(t.size()) + " times for " +
                            std::to_string(b) + " sequences (" +
                            (nb == 1 ? std::string("one each")
                                     : "one per diffusion block: " + std::to_string(nb) + " each") +
                            ")");
  }
  for (size_t i = 0; i < t.size(); ++i) {
    if (!(std::isfinite(t[i]) && t[i] > 0.0 && t[i] <= 1.0)) {
      return invalid_argument(
          "fused MDLM: time " + std::to_string(t[i]) + " of sequence " +
          std::to_string(static_cast<int64_t>(i) / nb) +
          (nb == 1 ? std::string() : ", block " + std::to_string(static_cast<int64_t>(i) % nb)) +
          " is outside (0, 1]");
    }
  }
  const Tensor x0c = x0.contiguous(), xtc = xt.contiguous();
  const int32_t* px = x0c.data<int32_t>();
  const int32_t* pz = xtc.data<int32_t>();
  // Each trunk row: x_t, then with block diffusion x_0 (its positions repeat x_t's; no targets).
  const int64_t seq = trunk_->time();
  const size_t n = static_cast<size_t>((pad ? rows() : b) * seq);
  idx_.assign(n, 0);  // padding rows: any token, every target ignored
  targets_.assign(n, -1);
  weights_.assign(n, 0.0f);
  const double norm = 1.0 / static_cast<double>(b * len);
  const auto mask = static_cast<int32_t>(v);
  const bool bd = seq != len;
  for (int64_t k = 0; k < b * len; ++k) {
    const int64_t row = k / len, col = k % len;
    const auto at = static_cast<size_t>(row * seq + col);
    const int32_t z = pz[k];
    if (z < 0 || z > mask) {
      return invalid_argument("fused MDLM: xt at position " + std::to_string(k) + " (" +
                              std::to_string(z) +
                              ") is outside [0, V] ([MASK] = " + std::to_string(mask) + ")");
    }
    // x0 is an input too with block diffusion: every token must be a data token then.
    if ((z == mask || bd) && (px[k] < 0 || px[k] >= mask)) {
      return invalid_argument("fused MDLM: x0 at position " + std::to_string(k) + " (" +
                              std::to_string(px[k]) + ") is outside the vocabulary [0, " +
                              std::to_string(v) + ")");
    }
    idx_[at] = z;
    if (bd) idx_[at + static_cast<size_t>(len)] = px[k];
    if (z != mask) continue;
    // Mdlm::loss's weight: (1/t) / (b*T) on each masked position, t of the position's block.
    targets_[at] = px[k];
    weights_[at] = static_cast<float>(norm / t[static_cast<size_t>(row * nb + col / bl)]);
  }
  return FusedBatch{idx_.data(), targets_.data(), weights_.data(), n};
}

Result<double> FusedMdlm::loss(const Tensor& x0, std::span<const double> t, const Tensor& xt) {
  // Forward only: the trunk runs the batch's b rows, not the engine's full (antithetic) 2B.
  ASSIGN_OR_RETURN(const FusedBatch fb, stage(x0, t, xt, false));
  return trunk_->loss(fb);
}

Result<double> FusedMdlm::forward_backward(const Tensor& x0, std::span<const double> t,
                                           const Tensor& xt) {
  ASSIGN_OR_RETURN(const FusedBatch fb, stage(x0, t, xt));
  return trunk_->forward_backward(fb);
}

FusedMdlm::Draw FusedMdlm::draw(const Tensor& x0, Rng& rng) const {
  // Mdlm::loss(x0, rng)'s draws, through the host model's own functions.
  const Mdlm& m = *host_;
  if (config_.masking == MaskSampling::kCount) {
    NoisedBatch first = m.corrupt_count(x0, rng);
    if (!config_.antithetic) return Draw{x0, std::move(first)};
    NoisedBatch pair = m.antithetic_pair(first, x0, rng);
    const Tensor x0c = x0.contiguous();
    const int32_t* p = x0c.data<int32_t>();
    const auto n = static_cast<size_t>(x0c.numel());
    std::vector<int32_t> twice(2 * n);
    std::copy_n(p, n, twice.begin());
    std::copy_n(p, n, twice.begin() + static_cast<std::ptrdiff_t>(n));
    return Draw{Tensor::from_vector(twice, pair.xt.shape()), std::move(pair)};
  }
  const auto t = m.sample_times(x0.shape()[0] * config_.num_blocks(), rng);
  return Draw{x0, m.corrupt(x0, t, rng)};
}

Result<FusedStepResult> FusedMdlm::train_step(const Tensor& x0, Rng& rng, double lr,
                                              const FusedOptimizer& opt, double grad_clip) {
  if (x0.dtype() != DType::kI32 || x0.shape() != Shape{batch_, config_.block_size}) {
    return invalid_argument(
        "fused MDLM: a training batch must be i32 of shape (B = " + std::to_string(batch_) +
        ", T = " + std::to_string(config_.block_size) + "), got " + shape_str(x0.shape()));
  }
  const Draw d = draw(x0, rng);
  ASSIGN_OR_RETURN(const FusedBatch fb, stage(d.x0, d.noised.t, d.noised.xt));
  return trunk_->train_step(fb, lr, opt, grad_clip);
}

Result<const Mdlm*> FusedMdlm::host_model() {
  RETURN_IF_ERROR(host_->load(trunk_->state_dict()), "fused MDLM weights");
  return host_.get();
}

namespace {

class FusedMdlmEngine final : public MdlmEngine {
 public:
  FusedMdlmEngine(std::unique_ptr<FusedMdlm> model, const v1::TrainConfig& tc)
      : model_(std::move(model)),
        where_(model_->trunk().backend().name()),
        opt_{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()} {}

  std::string describe() const override {
    auto& backend = model_->trunk().backend();
    return std::string("fused engine (") + (backend.bf16_matmuls() ? "bf16" : "fp32") +
           " linear layers) on " + where_ + " (" +
           std::to_string((backend.bytes_in_use() + 500'000) / 1'000'000) + " MB of buffers)";
  }
  int64_t num_parameters() const override { return model_->num_parameters(); }
  Result<Step> step(const Tensor& x0, Rng& noise_rng, double lr, double grad_clip) override {
    ASSIGN_OR_RETURN(const FusedStepResult r,
                     model_->train_step(x0, noise_rng, lr, opt_, grad_clip));
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const Tensor& x0, std::span<const double> t, const Tensor& xt) override {
    return model_->loss(x0, t, xt);
  }
  Result<const Mdlm*> host_model() override { return model_->host_model(); }
  std::string metrics_fields() const override {
    return ",\"engine\":\"fused\",\"device\":\"" + where_ + "\",\"precision\":\"" +
           (model_->trunk().backend().bf16_matmuls() ? "bf16" : "fp32") + "\"";
  }

 private:
  std::unique_ptr<FusedMdlm> model_;
  std::string where_;
  FusedOptimizer opt_;
};

}  // namespace

MdlmEngineFactory fused_mdlm_engine_factory(const FusedTrainOptions& options) {
  return [options](const MdlmConfig& mc,
                   const v1::RunConfig& cfg) -> Result<std::unique_ptr<MdlmEngine>> {
    const auto& tc = cfg.train();
    if (tc.optimizer() != v1::TrainConfig::ADAMW) {
      return unimplemented(
          "the fused MDLM engine supports train.optimizer = \"adamw\" only (SGD runs on "
          "train.engine = \"autograd\")");
    }
    RETURN_IF_ERROR(check_fused_mdlm_config(mc, tc.batch_size()));
    std::unique_ptr<FusedBackend> backend;
    if (options.cuda) {
      ASSIGN_OR_RETURN(backend, make_fused_cuda_backend(options.gpu));
    } else {
      backend = make_fused_cpu_backend();
    }
    backend->set_attention(fused_attention(tc));
    ASSIGN_OR_RETURN(auto model,
                     FusedMdlm::make(mc, tc.batch_size(), tc.seed(), std::move(backend)));
    RETURN_IF_ERROR(model->trunk().set_bf16_matmuls(tc.precision() == v1::TrainConfig::BF16));
    return std::unique_ptr<MdlmEngine>(std::make_unique<FusedMdlmEngine>(std::move(model), tc));
  };
}

Result<TrainSummary> train_mdlm_fused(const v1::RunConfig& cfg, const std::string& config_source,
                                      const FusedTrainOptions& options) {
  if (cfg.model().arch() != v1::ModelConfig::MDLM) {
    return invalid_argument(config_source +
                            ": the fused MDLM trainer needs model.arch = \"mdlm\" (GPT configs "
                            "train with train_gpt_fused)");
  }
  return train_mdlm(cfg, config_source, fused_mdlm_engine_factory(options));
}

}  // namespace starling::models
