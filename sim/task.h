// What a federation trains, built from a FederationConfig by its model kind (sim/model_kind.h):
// the aggregator's model and evaluation, and the trainers of simulated clients. Clients are
// virtual: make_trainer materializes one client's trainer only for the round it trains.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"

namespace starling::sim {

struct TaskEval {
  double loss = 0.0;
  double accuracy = 0.0;  // label accuracy (MNIST) or next-character accuracy (GPT)
};

// What a task is made for. kSimulation: every client's training data is loaded (virtual clients
// train on it); with [client] device "cuda", virtual client k trains on GPU gpus[k % gpus].
// kClient: one edge client's trainer (`starling client`, `starling peer`): the data as for a
// simulation, and [client] gpus are that one client's data-parallel ranks. kServer: the
// aggregator's view (model, evaluation, save): image kinds then load the test split alone, and
// make_trainer, make_central_trainer and local_steps must not be called.
enum class TaskUse { kSimulation, kClient, kServer };

// The task of one model kind (sim/model_kind.h): what every role asks of the model a federation
// trains.
class SimTask {
 public:
  // Validates `config`, then builds its model kind's task (sim/model_kinds.cc): loads the
  // dataset and partitions it. Errors name `source` and the key.
  static Result<std::unique_ptr<SimTask>> create(const v1::FederationConfig& config,
                                                 std::string_view source,
                                                 TaskUse use = TaskUse::kSimulation);
  virtual ~SimTask() = default;

  virtual int num_clients() const = 0;
  virtual const compress::Layout& layout() const = 0;
  // The initial global model ([model].seed).
  virtual std::vector<float> initial_model() const = 0;
  // Client k's trainer, holding only what that client needs. Thread-safe (reads shared data).
  virtual std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const = 0;
  // One trainer over every client's training data: the centralized baseline of a simulation
  // (simulate.central_baseline); nullptr for tasks without one.
  virtual std::unique_ptr<edge_client::LocalTrainer> make_central_trainer() const {
    return nullptr;
  }
  // A client's trainer on its own data at `path` ([data] path, core/data/local_data.h);
  // `describe` says what was read. The language models take .txt / .jsonl text in the task's
  // vocabulary; InvalidArgument for the tasks that take no local text.
  virtual Result<std::unique_ptr<edge_client::LocalTrainer>> make_local_trainer(
      const std::filesystem::path& path, std::string* describe) const;
  // Client k's training examples (tokens for the language models), a gossip peer's averaging
  // weight; 1 for the tasks that do not say.
  virtual double client_examples(int /*client*/) const { return 1.0; }
  // Local steps client k takes for `plan` (to emulate its compute time).
  virtual int64_t local_steps(int client, const v1::RoundPlan& plan) const = 0;
  // The global model on the held-out data. Not thread-safe.
  virtual TaskEval evaluate(std::span<const float> global) = 0;
  // Writes the model as safetensors (a GPT as a checkpoint `starling sample` reads).
  virtual Status save_model(const std::filesystem::path& path, std::span<const float> global,
                            uint64_t round) const = 0;
  // One line: dataset, clients, model size.
  virtual std::string describe() const = 0;
};

}  // namespace starling::sim
