// Where a model kind's built-in trainers run ([client] device and gpus), shared by the kinds that
// train on the fused engine: none (the CPU trainers), or a FusedDevice per client. In a
// simulation the virtual clients spread over the GPUs (client k on gpus[k % n], one each); an
// edge client's trainer takes them all as data-parallel ranks (sim::TaskUse).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "core/compress/codec.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "edge_client/fused_gpt_trainer.h"
#include "sim/task.h"

namespace starling::sim {

class TaskDevice {
 public:
  TaskDevice(const v1::FederationConfig& config, TaskUse use);

  // [client] device "cuda": the fused engine; else the CPU trainers.
  bool fused() const { return fused_.has_value(); }
  // Where client `client` trains. REQUIRES: fused().
  edge_client::FusedDevice of(int client) const;
  // The devices a task must check before its first round: one per GPU in a simulation, the
  // client's ranks otherwise (empty without fused()).
  std::vector<edge_client::FusedDevice> to_check() const;
  // ", clients train on cuda:0,1 (fused engine: virtual client k on GPU k mod 2)" and the like;
  // empty without fused().
  std::string describe() const;

 private:
  TaskUse use_;
  bool spread_;  // kSimulation: virtual clients spread over the GPUs
  std::optional<edge_client::FusedDevice> fused_;
};

// A trainer that could not be made: every round fails with the reason. `recoverable`: the
// client may try again later (LocalTrainer::round_failures_recoverable, e.g. an exec trainer).
class FailedTrainer final : public edge_client::LocalTrainer {
 public:
  FailedTrainer(compress::Layout layout, Status why, bool recoverable = false)
      : layout_(std::move(layout)), why_(std::move(why)), recoverable_(recoverable) {}
  const compress::Layout& layout() const override { return layout_; }
  Result<edge_client::TrainReport> train(std::span<const float>, const v1::RoundPlan&,
                                         std::span<float>) override {
    return why_;
  }
  bool round_failures_recoverable() const override { return recoverable_; }

 private:
  compress::Layout layout_;
  Status why_;
  bool recoverable_;
};

}  // namespace starling::sim
