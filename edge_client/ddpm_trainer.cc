// Local steps of a DDPM U-Net on one client's images.
#include "edge_client/ddpm_trainer.h"

#include <algorithm>
#include <string>

#include "edge_client/model_params.h"

namespace starling::edge_client {

int64_t ddpm_local_steps(int64_t num_images, uint32_t epochs, const v1::RoundPlan& plan) {
  if (plan.local_steps() > 0) return plan.local_steps();
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(plan.batch_size(), num_images));
  return static_cast<int64_t>(epochs) * std::max<int64_t>(1, (num_images + batch - 1) / batch);
}

v1::RunConfig ddpm_run_config(const v1::FederationConfig& c) {
  v1::RunConfig rc;
  rc.mutable_model()->set_arch(v1::ModelConfig::DDPM);
  rc.mutable_data()->set_dataset(c.data().dataset());
  rc.mutable_data()->set_data_dir(c.data().data_dir());
  *rc.mutable_ddpm() = c.model().ddpm();
  rc.mutable_ddpm()->set_ema_decay(0.0f);
  rc.mutable_train()->set_seed(c.model().seed());
  return rc;
}

DdpmTrainerOptions ddpm_trainer_options(const v1::FederationConfig& c) {
  DdpmTrainerOptions o;
  o.model = models::DdpmConfig::from_proto(ddpm_run_config(c));
  o.epochs = c.local().epochs();
  o.steps = local_step_options(c);
  return o;
}

Tensor ddpm_images(const data::MnistSet& set, std::span<const int64_t> indices) {
  const int64_t px = set.pixels();
  Tensor t = Tensor::uninitialized({static_cast<int64_t>(indices.size()), 1, set.rows, set.cols});
  float* dst = t.data<float>();
  for (size_t i = 0; i < indices.size(); ++i) {
    const float* src = set.images.data() + indices[i] * px;
    for (int64_t p = 0; p < px; ++p) dst[static_cast<int64_t>(i) * px + p] = src[p] * 2.0f - 1.0f;
  }
  return t;
}

DdpmTrainer::DdpmTrainer(std::shared_ptr<const data::MnistSet> train, std::vector<int64_t> indices,
                         DdpmTrainerOptions options)
    : data_(std::move(train)),
      indices_(std::move(indices)),
      options_(options),
      model_(options.model, 0),
      layout_(layout_of(model_.net())) {}

Result<TrainReport> DdpmTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                       std::span<float> delta) {
  if (indices_.empty()) return failed_precondition("this client has no training images");
  if (model_.device() != options_.device) {
    RETURN_IF_ERROR(prepare_device(options_.device), "client.device");
    RETURN_IF_ERROR(model_.to(options_.device), "client.device");
  }
  if (plan.batch_size() == 0) return invalid_argument("round plan with batch size 0");
  const int64_t n = static_cast<int64_t>(indices_.size());
  const int64_t batch = std::min<int64_t>(plan.batch_size(), n);
  const int64_t per_epoch = (n + batch - 1) / batch;
  const int64_t steps = ddpm_local_steps(n, options_.epochs, plan);
  std::vector<int64_t> order = indices_;
  auto batch_loss = [&](int64_t step, Rng& rng) {
    const int64_t pos = step % per_epoch;
    if (pos == 0) {
      for (size_t i = order.size(); i > 1; --i) {
        std::swap(order[i - 1], order[static_cast<size_t>(rng.below(i))]);
      }
    }
    const int64_t from = pos * batch;
    const int64_t b = std::min(batch, n - from);
    const Tensor x0 = ddpm_images(*data_, std::span<const int64_t>(order).subspan(
                                              static_cast<size_t>(from), static_cast<size_t>(b)));
    return model_.loss(x0, rng);
  };
  ASSIGN_OR_RETURN(const float loss, run_local_steps(model_.net(), global, plan, steps,
                                                     options_.steps, batch_loss, delta));
  return TrainReport{static_cast<uint64_t>(n), loss};
}

}  // namespace starling::edge_client
