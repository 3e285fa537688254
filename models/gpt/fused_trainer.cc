// The fused GPT engine under train_gpt's loop. Evaluation runs the fused forward on batches of
// the training shape; checkpoints go through a host models::Gpt loaded from the fused weights,
// so their format is train_gpt's.
#include "models/gpt/fused_trainer.h"

#include <string>

#include "models/gpt/fused_gpt.h"

namespace starling::models {

namespace {

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

}  // namespace

GptEngineFactory fused_engine_factory(const FusedTrainOptions& options) {
  return [options](const GptConfig& gc,
                   const v1::RunConfig& cfg) -> Result<std::unique_ptr<GptEngine>> {
    const auto& tc = cfg.train();
    if (tc.optimizer() != v1::TrainConfig::ADAMW) {
      return unimplemented("the fused engine supports train.optimizer = \"adamw\" only");
    }
    RETURN_IF_ERROR(check_fused_gpt_config(gc, tc.batch_size(), gc.block_size));
    std::unique_ptr<FusedBackend> backend;
    if (options.cuda) {
      ASSIGN_OR_RETURN(backend, make_fused_cuda_backend(options.gpu));
    } else {
      backend = make_fused_cpu_backend();
    }
    ASSIGN_OR_RETURN(auto model, FusedGpt::make(gc, tc.batch_size(), gc.block_size, tc.seed(),
                                                std::move(backend)));
    RETURN_IF_ERROR(model->set_bf16_matmuls(tc.precision() == v1::TrainConfig::BF16));
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
