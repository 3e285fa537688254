// Local steps of an MDLM on one client's text.
#include "edge_client/mdlm_trainer.h"

#include <string>

#include "edge_client/gpt_trainer.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

v1::RunConfig mdlm_run_config(const v1::FederationConfig& c, int64_t vocab) {
  v1::RunConfig rc;
  auto* m = rc.mutable_model();
  m->set_arch(v1::ModelConfig::MDLM);
  m->set_vocab_size(static_cast<int32_t>(vocab));
  m->set_block_size(static_cast<int32_t>(c.model().block_size()));
  m->set_n_layer(static_cast<int32_t>(c.model().n_layer()));
  m->set_n_head(static_cast<int32_t>(c.model().n_head()));
  m->set_n_embd(static_cast<int32_t>(c.model().n_embd()));
  m->set_causal(false);
  m->set_pos_encoding(c.model().pos_encoding());
  m->set_rope_base(c.model().rope_base());
  rc.mutable_data()->set_dataset("tinyshakespeare");
  rc.mutable_data()->set_data_dir(c.data().data_dir());
  *rc.mutable_diffusion() = c.model().diffusion();
  rc.mutable_train()->set_seed(c.model().seed());
  return rc;
}

MdlmTrainerOptions mdlm_trainer_options(const v1::FederationConfig& c, int64_t vocab) {
  MdlmTrainerOptions o;
  o.model = models::MdlmConfig::from_proto(mdlm_run_config(c, vocab), vocab);
  o.epochs = c.local().epochs();
  o.steps = local_step_options(c);
  return o;
}

MdlmTrainer::MdlmTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
                         int64_t end, MdlmTrainerOptions options)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      options_(options),
      model_(options.model, 0),
      layout_(layout_of(model_)) {}

Result<TrainReport> MdlmTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                       std::span<float> delta) {
  const int64_t T = options_.model.block_size;
  const int64_t n = end_ - begin_;
  RETURN_IF_ERROR(check_text_round(begin_, end_, tokens_->size(), T, plan));
  const int64_t B = plan.batch_size();
  const int64_t steps = gpt_local_steps(n, T, options_.epochs, plan);
  const int32_t* tok = tokens_->data() + begin_;
  std::vector<int32_t> x;
  auto batch_loss = [&](int64_t, Rng& rng) {
    draw_windows(rng, tok, n, B, T, x, nullptr);
    return model_.loss(Tensor::from_vector(x, {B, T}), rng);
  };
  ASSIGN_OR_RETURN(const float loss,
                   run_local_steps(model_, global, plan, steps, options_.steps, batch_loss, delta));
  return TrainReport{static_cast<uint64_t>(n), loss};
}

}  // namespace starling::edge_client
