// The local trainer of MNIST clients: the 2NN or the CNN trained with minibatch SGD on this
// client's partition for E epochs (or the plan's local steps), with FedProx's proximal term.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/data/mnist.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "models/mlp/cnn.h"
#include "models/mlp/mlp.h"

namespace starling::edge_client {

enum class MnistModel { k2NN, kCnn };

struct MnistTrainerOptions {
  int64_t hidden = 200;   // 2NN
  models::InitSpec init;  // 2NN and CNN
  uint32_t epochs = 1;    // used when the plan's local_steps is 0
  float prox_mu = 0.0f;   // FedProx: gradient += mu (w - w_global)
  MnistModel model = MnistModel::k2NN;
  models::CnnConfig cnn;  // CNN (side is taken from the data)
  // Where the classifier trains: the CPU, or a GPU ([client] device "cuda": the model moves there
  // on the first round, which fails with the reason when the GPU is not there).
  Device device;
};

// [model] init, init_std and init_bias as an InitSpec.
models::InitSpec init_spec(const v1::FedModelConfig& model);

// The classifier `options` describe for images of `pixels` (a square side^2 for the CNN).
std::unique_ptr<models::Classifier> make_mnist_model(const MnistTrainerOptions& options,
                                                     int64_t pixels, uint64_t seed);

class MnistTrainer : public LocalTrainer {
 public:
  // `indices` select this client's examples of `train`. REQUIRES: non-empty.
  MnistTrainer(std::shared_ptr<const data::MnistSet> train, std::vector<int64_t> indices,
               MnistTrainerOptions options);
  const compress::Layout& layout() const override { return layout_; }
  // Batches are shuffled with the plan's seed, so a round repeats bit for bit.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;
  // Gradients and the flattened local model (2 x parameters) plus one batch's activations
  // and their gradients.
  uint64_t working_set_bytes(const v1::RoundPlan& plan) const override;

 private:
  std::shared_ptr<const data::MnistSet> data_;
  std::vector<int64_t> indices_;
  MnistTrainerOptions options_;
  std::unique_ptr<models::Classifier> model_;
  compress::Layout layout_;
};

}  // namespace starling::edge_client
