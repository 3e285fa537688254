// The exec trainer ([client] trainer = "exec"): each round is handed to the user's own program
// (PyTorch, JAX, anything), while the client keeps the transport, scheduling, compression,
// error feedback and crash-safe state. The protocol (docs/own_model.md), per round R:
//   <dir>/round-R/global.safetensors  the global model: the federation's tensors, f32
//   <dir>/round-R/round.json          {"protocol": 1, "mode": "train", "round", "local_steps",
//                                      "batch_size", "learning_rate", "seed", "node_id",
//                                      "partition", "num_partitions", "data_path",
//                                      "deadline_unix_ms"}
// then trainer_command runs (no shell; stdin /dev/null, stdout and stderr appended to
// round-R/trainer.log) with STARLING_ROUND_DIR, STARLING_GLOBAL, STARLING_ROUND_JSON,
// STARLING_OUTPUT and STARLING_METRICS in its environment, and must, exiting 0, leave
//   STARLING_OUTPUT (update.safetensors)   every tensor of the global model, same names and
//       shapes, any float dtype: the new weights, or with metadata {"starling.content":
//       "delta"} the update (new - global)
//   STARLING_METRICS (metrics.json)        {"num_samples": N > 0, "loss": x, ...}
// A command that cannot start, exits non-zero, outlives timeout (SIGTERM, then SIGKILL after 2
// s, to its whole process group), or leaves missing, extra, misshapen or non-finite tensors
// loses that round only (round_failures_recoverable), with the reason and the last lines of
// its log. "evaluate" mode (evaluate()) writes no STARLING_OUTPUT; metrics.json then carries
// "loss" and optionally "accuracy".
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"
#include "edge_client/edge_client.h"

namespace starling::edge_client {

struct ExecTrainerOptions {
  std::vector<std::string> command;  // argv; argv[0] is searched on PATH when it has no '/'
  std::filesystem::path dir;         // where round-R/ folders are made (created when missing)
  std::chrono::milliseconds timeout{600'000};
  std::string node_id;
  uint32_t partition = 0;
  uint32_t num_partitions = 1;
  std::string data_path;     // [data] path, handed on as round.json's data_path
  bool keep_rounds = false;  // keep every round-R/ (else only the latest is left on disk)
};

struct ExecMetrics {
  uint64_t num_samples = 0;
  double loss = 0.0;
  double accuracy = 0.0;
  bool has_loss = false;
  bool has_accuracy = false;
};

class ExecTrainer : public LocalTrainer {
 public:
  // InvalidArgument for an empty command or a layout that does not tile its vector.
  static Result<std::unique_ptr<ExecTrainer>> create(compress::Layout layout,
                                                     ExecTrainerOptions options);

  const compress::Layout& layout() const override { return layout_; }
  Result<TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                            std::span<float> delta) override;
  bool round_failures_recoverable() const override { return true; }
  // The same command in "evaluate" mode on `model` (round.json's round: `round`).
  Result<ExecMetrics> evaluate(std::span<const float> model, uint64_t round);

 private:
  ExecTrainer(compress::Layout layout, ExecTrainerOptions options, int64_t numel)
      : layout_(std::move(layout)), options_(std::move(options)), numel_(numel) {}
  // Prepares round-R/, runs the command, returns its metrics; `output` (may be empty for
  // evaluate) receives the tensors it wrote and `is_delta` whether they are an update.
  Result<ExecMetrics> run_round(std::span<const float> model, const v1::RoundPlan& plan,
                                const std::string& mode, std::span<float> output, bool* is_delta);

  compress::Layout layout_;
  ExecTrainerOptions options_;
  int64_t numel_ = 0;
  std::filesystem::path previous_;  // the last round's folder, removed by the next one
};

// The executable argv[0] names: itself when it contains a '/', else the first match on PATH.
// NotFound naming it otherwise.
Result<std::string> resolve_executable(const std::string& name);

// Runs argv with `env` added to ours, stdin from /dev/null and stdout + stderr appended to
// `log`, in a process group of its own that dies with this thread (PR_SET_PDEATHSIG); waits
// at most `timeout`. OK on exit 0; otherwise Internal ("exited with status 3", "killed by
// signal 11") or DeadlineExceeded, each followed by the last lines of `log`.
Status run_with_deadline(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         const std::filesystem::path& log, std::chrono::milliseconds timeout);

}  // namespace starling::edge_client
