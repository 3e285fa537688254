// The fused GPT engine under train_gpt's loop. Evaluation runs the fused forward on batches of
// the training shape; checkpoints go through a host models::Gpt loaded from the fused weights,
// so their format is train_gpt's.
#include "models/gpt/fused_trainer.h"

#include <omp.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "models/gpt/fused_gpt.h"
#include "models/gpt/fused_replicas.h"

namespace starling::models {

namespace {

// One FusedGpt of `rows` rows on the CPU backend or GPU `gpu`, with train.attention and
// train.precision applied.
Result<std::unique_ptr<FusedGpt>> make_engine(const GptConfig& gc, const v1::TrainConfig& tc,
                                              int64_t rows, bool cuda, int gpu) {
  std::unique_ptr<FusedBackend> backend;
  if (cuda) {
    ASSIGN_OR_RETURN(backend, make_fused_cuda_backend(gpu));
  } else {
    backend = make_fused_cpu_backend();
  }
  backend->set_attention(fused_attention(tc));
  ASSIGN_OR_RETURN(auto model,
                   FusedGpt::make(gc, rows, gc.block_size, tc.seed(), std::move(backend)));
  RETURN_IF_ERROR(model->set_bf16_matmuls(tc.precision() == v1::TrainConfig::BF16));
  return model;
}

class FusedEngine final : public GptEngine {
 public:
  FusedEngine(std::unique_ptr<FusedGpt> model, const GptConfig& gc, const v1::TrainConfig& tc)
      : model_(std::move(model)),
        where_(model_->backend().name()),
        opt_{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()},
        host_(gc, tc.seed()) {}

  std::string describe() const override {
    return std::string("fused engine (") + (model_->backend().bf16_matmuls() ? "bf16" : "fp32") +
           " linear layers) on " + where_ + " (" +
           std::to_string((model_->backend().bytes_in_use() + 500'000) / 1'000'000) +
           " MB of buffers)";
  }
  int64_t num_parameters() const override { return static_cast<int64_t>(model_->num_parameters()); }
  Result<Step> step(const data::Batch& batch, double lr, double grad_clip) override {
    ASSIGN_OR_RETURN(FusedStepResult r,
                     model_->train_step(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                                        static_cast<size_t>(batch.x.numel()), lr, opt_, grad_clip));
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const data::Batch& batch) override {
    return model_->loss(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                        static_cast<size_t>(batch.x.numel()));
  }
  Result<const Gpt*> host_model() override {
    RETURN_IF_ERROR(host_.load(model_->state_dict()), "fused GPT weights");
    return &host_;
  }
  std::string metrics_fields() const override {
    return ",\"engine\":\"fused\",\"device\":\"" + where_ + "\",\"precision\":\"" +
           (model_->backend().bf16_matmuls() ? "bf16" : "fp32") + "\"";
  }

 private:
  std::unique_ptr<FusedGpt> model_;
  std::string where_;
  FusedOptimizer opt_;
  Gpt host_;  // checkpoints are written from it
};

// N replicas of the fused engine, one per rank (FusedTrainOptions: CPU threads or GPUs), under
// train_gpt's loop (FusedReplicas: one thread per rank, so the ranks share the host's data
// sampler, logs and checkpoints without another process). Evaluation splits the batch the same
// way (no collectives); rank 0's weights are checkpointed.
class FusedRanksEngine final : public GptEngine {
 public:
  static Result<std::unique_ptr<GptEngine>> make(const GptConfig& gc, const v1::TrainConfig& tc,
                                                 const FusedTrainOptions& o) {
    const bool cuda = o.cuda;
    const int n = cuda ? static_cast<int>(o.gpus.size()) : o.ranks;
    if (tc.batch_size() % n != 0) {
      return invalid_argument("train.batch_size " + std::to_string(tc.batch_size()) +
                              " is not a multiple of the " + std::to_string(n) +
                              " data-parallel ranks (each takes batch_size / ranks rows)");
    }
    const int threads = std::max(1, (tc.threads() > 0 ? tc.threads() : omp_get_max_threads()) / n);
    // A generous collective timeout: rank 0 evaluates and checkpoints between steps.
    ASSIGN_OR_RETURN(
        auto replicas,
        FusedReplicas::make(
            n,
            [&](int r) {
              return make_engine(gc, tc, tc.batch_size() / n, cuda,
                                 cuda ? o.gpus[static_cast<size_t>(r)] : 0);
            },
            cuda ? o.gpus : std::vector<int>{}, o.overlap, threads, std::chrono::minutes(10)));
    return std::unique_ptr<GptEngine>(new FusedRanksEngine(gc, tc, std::move(replicas)));
  }

  std::string describe() const override {
    FusedGpt& m = replicas_->replica(0);
    const auto& gpus = replicas_->gpus();
    std::string where = gpus.empty() ? "CPU threads" : "GPUs";
    for (size_t i = 0; i < gpus.size(); ++i) where += (i ? "," : " ") + std::to_string(gpus[i]);
    return "fused engine (" + std::string(m.backend().bf16_matmuls() ? "bf16" : "fp32") +
           " linear layers), data parallel: " + std::to_string(replicas_->ranks()) + " ranks on " +
           where + " x " + std::to_string(replicas_->rows_per_rank()) +
           " rows, gradients averaged during backward";
  }
  int64_t num_parameters() const override {
    return static_cast<int64_t>(replicas_->replica(0).num_parameters());
  }
  Result<Step> step(const data::Batch& batch, double lr, double grad_clip) override {
    ASSIGN_OR_RETURN(
        const FusedStepResult r,
        replicas_->train_step(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                              static_cast<size_t>(batch.x.numel()), lr, opt_, grad_clip));
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const data::Batch& batch) override {
    return replicas_->loss(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                           static_cast<size_t>(batch.x.numel()));
  }
  Result<const Gpt*> host_model() override {
    RETURN_IF_ERROR(host_.load(replicas_->replica(0).state_dict()), "fused GPT weights (rank 0)");
    return &host_;
  }
  std::string metrics_fields() const override {
    return ",\"engine\":\"fused\",\"ranks\":" + std::to_string(replicas_->ranks()) +
           ",\"device\":\"" +
           (replicas_->gpus().empty() ? std::string("cpu") : std::string("cuda")) + "\"";
  }

 private:
  FusedRanksEngine(const GptConfig& gc, const v1::TrainConfig& tc,
                   std::unique_ptr<FusedReplicas> replicas)
      : opt_{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()},
        host_(gc, tc.seed()),
        replicas_(std::move(replicas)) {}

  FusedOptimizer opt_;
  Gpt host_;
  std::unique_ptr<FusedReplicas> replicas_;
};

}  // namespace

FusedBackend::Attention fused_attention(const v1::TrainConfig& tc) {
  switch (tc.attention()) {
    case v1::TrainConfig::MATERIALIZED:
      return FusedBackend::Attention::kMaterialized;
    case v1::TrainConfig::FLASH_BF16:
      return FusedBackend::Attention::kFlashBf16;
    case v1::TrainConfig::FLASH:
      break;
  }
  return FusedBackend::Attention::kFlash;
}

GptEngineFactory fused_engine_factory(const FusedTrainOptions& options) {
  return [options](const GptConfig& gc,
                   const v1::RunConfig& cfg) -> Result<std::unique_ptr<GptEngine>> {
    const auto& tc = cfg.train();
    if (tc.optimizer() != v1::TrainConfig::ADAMW) {
      return unimplemented("the fused engine supports train.optimizer = \"adamw\" only");
    }
    RETURN_IF_ERROR(check_fused_gpt_config(gc, tc.batch_size(), gc.block_size));
    if (options.ranks < 1) return invalid_argument("data-parallel ranks must be at least 1");
    if ((options.cuda && options.gpus.size() > 1) || (!options.cuda && options.ranks > 1)) {
      return FusedRanksEngine::make(gc, tc, options);
    }
    ASSIGN_OR_RETURN(auto model, make_engine(gc, tc, tc.batch_size(), options.cuda,
                                             options.gpus.empty() ? options.gpu : options.gpus[0]));
    return std::unique_ptr<GptEngine>(std::make_unique<FusedEngine>(std::move(model), gc, tc));
  };
}

Result<TrainSummary> train_gpt_fused(const v1::RunConfig& cfg, const std::string& config_source,
                                     const FusedTrainOptions& options) {
  if (cfg.model().arch() != v1::ModelConfig::GPT) {
    return unimplemented(config_source +
                         ": the fused engine (train.engine = \"fused\", --device cuda) trains "
                         "model.arch = \"gpt\" only");
  }
  return train_gpt(cfg, config_source, fused_engine_factory(options));
}

}  // namespace starling::models
