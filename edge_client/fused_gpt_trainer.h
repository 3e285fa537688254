// The GPT client trainer on the fused engine (models/gpt/fused_gpt.h): the same windows, steps,
// clipping and AdamW (fresh moments every round) as GptTrainer, on the CPU backend or on a GPU
// (CUDA backend), where the model, its gradients and the AdamW state stay across rounds and only
// the loss and the gradient norm come back per step. What `[client] device = "cuda"` runs; with
// several GPUs (`[client] gpus = [0, 1]`) one data-parallel replica per GPU
// (models/gpt/fused_replicas.h), each taking batch_size / GPUs rows of every step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "edge_client/edge_client.h"
#include "edge_client/gpt_trainer.h"
#include "models/gpt/fused_gpt.h"
#include "models/gpt/fused_replicas.h"

namespace starling::edge_client {

struct FusedDevice {
  bool cuda = false;      // false: the fused CPU backend
  std::vector<int> gpus;  // with cuda: one data-parallel rank per GPU (empty: GPU 0)
  // The CPU backend's data-parallel ranks (threads): the code several GPUs run, on the CPU.
  int cpu_ranks = 1;

  int ranks() const {
    return cuda ? std::max(1, static_cast<int>(gpus.size())) : std::max(1, cpu_ranks);
  }
  int gpu(int rank) const { return gpus.empty() ? 0 : gpus[static_cast<size_t>(rank)]; }
};

// The flat layout of the fused engine's parameters (models::fused_gpt_layout of a GPT or of an
// MDLM's trunk): models::Gpt's state-dict names, shapes and order, the federation's layout.
compress::Layout layout_of_fused(const models::GptConfig& config);

// The backend of rank `rank` on `device`: the CPU backend, or the CUDA backend on its GPU (the
// backend's error when that GPU is missing).
Result<std::unique_ptr<models::FusedBackend>> make_fused_backend(const FusedDevice& device,
                                                                 int rank);
// Where a fused trainer on `device` runs, e.g. "fused CPU engine" or "cuda:0,1 (NVIDIA H200, fused
// engine, data parallel over 2 GPUs)"; `backend` names the first rank's backend.
std::string fused_device_name(const FusedDevice& device, const models::FusedBackend& backend);

class FusedGptTrainer : public LocalTrainer {
 public:
  // Trains on tokens[begin, end) of the shared stream. FailedPrecondition naming the key for
  // what the fused engine does not run (model.local_optimizer SGD, local.prox_mu > 0, dropout);
  // the backend's error when the GPU is missing. REQUIRES: end - begin > block_size.
  static Result<std::unique_ptr<FusedGptTrainer>> create(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      GptTrainerOptions options, FusedDevice device);

  ~FusedGptTrainer() override;
  FusedGptTrainer(const FusedGptTrainer&) = delete;
  FusedGptTrainer& operator=(const FusedGptTrainer&) = delete;

  const compress::Layout& layout() const override { return layout_; }
  // The codec `spec` on the engine's device (rank 0's GPU: the GPU codecs, so only the encoded
  // bytes reach the host; the CPU backend: the host codec), over the update train() leaves
  // there when given an empty delta. The encoders share the trainer's update buffer and must
  // not outlive it.
  Result<std::unique_ptr<UpdateEncoder>> make_encoder(const std::string& spec,
                                                      uint64_t seed) override;
  // GptTrainer::train's windows and steps (the plan's seed draws them), AdamW with plan's
  // learning rate from zeroed moments, global-norm clipping at grad_clip. With several ranks the
  // plan's batch must split evenly over them (InvalidArgument naming client.gpus).
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;
  // Where it runs, e.g. "cuda:0 (NVIDIA H200, fused engine)", "cuda:0,1 (..., data parallel)"
  // or "fused CPU engine".
  const std::string& where() const { return where_; }

 private:
  FusedGptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
                  GptTrainerOptions options, FusedDevice device, compress::Layout layout);
  // The engine (or replicas) for batches of `batch` rows, made on first use and again when the
  // batch changes.
  Status ensure_engine(int64_t batch);
  // The round's local steps on the engine or the replicas, from `global`.
  Status run_steps(std::span<const float> global, const v1::RoundPlan& plan, int64_t steps,
                   double* loss_sum);
  int64_t layout_numel() const;

  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_;
  int64_t end_;
  GptTrainerOptions options_;
  FusedDevice device_;
  compress::Layout layout_;
  std::string where_;
  // One per rank, made by create() (so a missing GPU fails there), taken by the first engine.
  std::vector<std::unique_ptr<models::FusedBackend>> backends_;
  std::unique_ptr<models::FusedGpt> engine_;         // one rank
  std::unique_ptr<models::FusedReplicas> replicas_;  // several
  // make_encoder's: a backend on rank 0's device with the global model and the update of the
  // last train() given an empty delta (device_delta_ready_).
  std::unique_ptr<models::FusedBackend> codec_backend_;
  float* global_dev_ = nullptr;
  float* delta_dev_ = nullptr;
  bool device_delta_ready_ = false;
};

}  // namespace starling::edge_client
