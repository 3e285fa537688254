// The local trainer of image-diffusion clients: a DDPM U-Net (models/ddpm) trained with the
// epsilon objective on this client's MNIST-style images with the shared local step loop.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/data/mnist.h"
#include "core/wire/config.pb.h"
#include "edge_client/edge_client.h"
#include "edge_client/local_steps.h"
#include "models/ddpm/ddpm.h"

namespace starling::edge_client {

struct DdpmTrainerOptions {
  models::DdpmConfig model;  // its ema_decay must be 0: the federation moves the raw weights
  uint32_t epochs = 1;       // used when the plan's local_steps is 0
  LocalStepOptions steps;
  // Where the U-Net trains: the CPU, or a GPU ([client] device "cuda"; the model moves there on
  // the first round, which fails with the reason when the GPU is not there).
  Device device;
};

// Local steps of a round: the plan's local_steps, else epochs passes of ceil(n / batch) steps.
int64_t ddpm_local_steps(int64_t num_images, uint32_t epochs, const v1::RoundPlan& plan);

// The images of `set` selected by `indices` as a (N, 1, H, W) f32 tensor scaled to [-1, 1].
Tensor ddpm_images(const data::MnistSet& set, std::span<const int64_t> indices);

// The `starling train` config of a federation's DDPM (model.arch = DDPM): [model.ddpm] with
// ema_decay 0, [data] dataset and data_dir. Checkpoints of the federation carry it.
v1::RunConfig ddpm_run_config(const v1::FederationConfig& config);
// The trainer options of that config ([local] epochs, local_step_options).
DdpmTrainerOptions ddpm_trainer_options(const v1::FederationConfig& config);

class DdpmTrainer : public LocalTrainer {
 public:
  // `indices` select this client's images of `train`. REQUIRES: options.model valid.
  DdpmTrainer(std::shared_ptr<const data::MnistSet> train, std::vector<int64_t> indices,
              DdpmTrainerOptions options);
  const compress::Layout& layout() const override { return layout_; }
  // Batches of plan.batch_size images, shuffled each epoch, with steps and noise drawn per
  // batch, all from the plan's seed. num_samples is the client's image count.
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;

 private:
  std::shared_ptr<const data::MnistSet> data_;
  std::vector<int64_t> indices_;
  DdpmTrainerOptions options_;
  models::Ddpm model_;
  compress::Layout layout_;
};

}  // namespace starling::edge_client
