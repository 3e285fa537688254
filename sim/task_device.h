// Where a model kind's built-in trainers run ([client] device and gpus), shared by the kinds that
// train on the fused engine: none (the CPU trainers), or a FusedDevice per client. In a
// simulation the virtual clients spread over the GPUs (client k on gpus[k % n], one each); an
// edge client's trainer takes them all as data-parallel ranks (sim::TaskUse).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "edge_client/fused_gpt_trainer.h"
#include "sim/task.h"

namespace starling::sim {

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

  // The image kinds (DDPM, CNN, 2NN: autograd models through the ops' device forms) train each
  // client on one GPU: client `client`'s device (the CPU without fused()).
  Device image_device(int client) const;
  // Every GPU of to_check() is there (the CUDA backend installed), and an edge client names at
  // most one; errors name `source` and the key.
  Status check_image(std::string_view source) const;
  // ", clients train on cuda:0" / ", clients train on cuda:0,1 (client k on GPU k mod 2)"; empty
  // without fused().
  std::string describe_image() const;

  // A language-model kind's trainer of client `client` on tokens[begin, end): `Cpu`'s (the
  // autograd trainer) without fused(), else `Fused::create` on of(client). A GPU that went away
  // after the task was made gives a trainer whose every round fails with the reason (never a
  // silent CPU run).
  template <class Cpu, class Fused, class Options>
  std::unique_ptr<edge_client::LocalTrainer> text_trainer(
      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
      const Options& options, int client, const compress::Layout& layout) const {
    if (!fused()) return std::make_unique<Cpu>(std::move(tokens), begin, end, options);
    auto t = Fused::create(std::move(tokens), begin, end, options, of(client));
    if (t.ok()) return std::move(*t);
    return std::make_unique<FailedTrainer>(layout, t.status());
  }
  // Whether [client] device can train here: `Fused::create` on every device of to_check() (each
  // GPU exists, several join for an edge client's data parallel, the engine takes the model).
  // The first error, naming `source` and the key.
  template <class Fused, class Options>
  Status check_text(std::string_view source, std::shared_ptr<const std::vector<int32_t>> tokens,
                    int64_t begin, int64_t end, const Options& options) const {
    for (const auto& d : to_check()) {
      auto t = Fused::create(tokens, begin, end, options, d);
      if (!t.ok()) {
        return t.status().with_context(std::string(source) + ": key 'client.device' = \"cuda\"");
      }
    }
    return ok_status();
  }

 private:
  std::string gpu_list() const;  // "0,1" (fused_->gpus; "0" when empty). REQUIRES: fused().

  TaskUse use_;
  bool spread_;  // kSimulation: virtual clients spread over the GPUs
  std::optional<edge_client::FusedDevice> fused_;
};

// [client] device and gpus for one edge client of an image kind: the CPU, or its one GPU checked
// as check_image() does. Errors name `source` and the key.
Result<Device> image_client_device(const v1::FederationConfig& config, std::string_view source);

}  // namespace starling::sim
