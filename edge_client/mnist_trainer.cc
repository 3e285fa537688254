// Local SGD on one MNIST partition.
#include "edge_client/mnist_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/autograd/autograd.h"
#include "core/ops/ops.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "edge_client/local_steps.h"
#include "edge_client/model_params.h"

namespace starling::edge_client {

std::unique_ptr<models::Classifier> make_mnist_model(const MnistTrainerOptions& options,
                                                     int64_t pixels, uint64_t seed) {
  if (options.model == MnistModel::kCnn) {
    models::CnnConfig c = options.cnn;
    c.side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(pixels))));
    return std::make_unique<models::Cnn>(c, seed, options.init);
  }
  return std::make_unique<models::Mlp>(models::MlpConfig{pixels, options.hidden, 10}, seed,
                                       options.init);
}

models::InitSpec init_spec(const v1::FedModelConfig& model) {
  models::InitSpec s;
  switch (model.init()) {
    case v1::FedModelConfig::TORCH:
      s.kind = models::ClassifierInit::kTorch;
      break;
    case v1::FedModelConfig::GLOROT:
      s.kind = models::ClassifierInit::kGlorot;
      break;
    case v1::FedModelConfig::TRUNCATED_NORMAL:
      s.kind = models::ClassifierInit::kTruncatedNormal;
      break;
  }
  s.std = model.init_std();
  s.bias = model.init_bias();
  return s;
}

MnistTrainer::MnistTrainer(std::shared_ptr<const data::MnistSet> train,
                           std::vector<int64_t> indices, MnistTrainerOptions options)
    : data_(std::move(train)),
      indices_(std::move(indices)),
      options_(options),
      model_(make_mnist_model(options, data_->pixels(), 0)),
      layout_(layout_of(*model_)) {}

uint64_t MnistTrainer::working_set_bytes(const v1::RoundPlan& plan) const {
  uint64_t numel = 0;
  for (const auto& t : layout_) numel += static_cast<uint64_t>(shape_numel(t.shape));
  const uint64_t batch = std::max<uint64_t>(plan.batch_size(), 1);
  uint64_t per_example = static_cast<uint64_t>(data_->pixels() + 4 * options_.hidden + 30);
  if (options_.model == MnistModel::kCnn) {
    const auto px = static_cast<uint64_t>(data_->pixels());
    per_example = px * (1 + 25) + 3 * px * static_cast<uint64_t>(options_.cnn.channels1) +
                  px / 4 * static_cast<uint64_t>(options_.cnn.channels1) * 25 +
                  3 * px / 4 * static_cast<uint64_t>(options_.cnn.channels2) +
                  static_cast<uint64_t>(4 * options_.cnn.hidden + 30);
  }
  const uint64_t acts = batch * per_example * 4 * 2;
  return 2 * numel * 4 + acts;
}

Result<TrainReport> MnistTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                        std::span<float> delta) {
  if (indices_.empty()) return failed_precondition("this client has no training examples");
  if (plan.batch_size() == 0) return invalid_argument("round plan with batch size 0");
  const Device device = options_.device;
  if (model_->parameters().front().device() != device) {
    RETURN_IF_ERROR(prepare_device(device), "client.device");
    RETURN_IF_ERROR(model_->to(device), "client.device");
  }
  RETURN_IF_ERROR(load_flat(*model_, global));
  model_->train(true);
  const int64_t n = static_cast<int64_t>(indices_.size());
  const int64_t batch = std::min<int64_t>(plan.batch_size(), n);
  const int64_t per_epoch = (n + batch - 1) / batch;
  const int64_t steps = plan.local_steps() ? plan.local_steps() : per_epoch * options_.epochs;
  const int64_t in = data_->pixels();
  const auto params = model_->parameters();

  ASSIGN_OR_RETURN(ProxSgd sgd, ProxSgd::create(params, global, options_.prox_mu));
  Rng rng(plan.seed());
  std::vector<int64_t> order = indices_;
  double loss_sum = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t pos = step % per_epoch;
    if (pos == 0) {
      for (size_t i = order.size(); i > 1; --i) {
        std::swap(order[i - 1], order[static_cast<size_t>(rng.below(i))]);
      }
    }
    const int64_t from = pos * batch;
    const int64_t b = std::min(batch, n - from);
    Tensor x = Tensor::uninitialized({b, in});
    std::vector<int32_t> y(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      const int64_t ex = order[static_cast<size_t>(from + i)];
      std::memcpy(x.data<float>() + i * in, data_->images.data() + ex * in,
                  static_cast<size_t>(in) * sizeof(float));
      y[static_cast<size_t>(i)] = data_->labels[static_cast<size_t>(ex)];
    }
    model_->zero_grad();
    Tensor labels = Tensor::from_vector(y, {b});
    if (!device.is_cpu()) {  // the batch moves; the rest of the step stays on the device
      ASSIGN_OR_RETURN(x, x.to(device));
      ASSIGN_OR_RETURN(labels, labels.to(device));
    }
    Tensor loss = ops::cross_entropy(model_->forward(x), labels);
    loss_sum += loss.item();
    autograd::backward(loss);
    sgd.step(plan.learning_rate());
  }
  const auto local = flatten(*model_);
  for (size_t i = 0; i < local.size(); ++i) delta[i] = local[i] - global[i];
  return TrainReport{static_cast<uint64_t>(n),
                     static_cast<float>(loss_sum / static_cast<double>(steps))};
}

}  // namespace starling::edge_client
