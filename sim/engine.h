// The two ways `starling simulate` runs a federation. In-process: virtual clients trained by a
// worker pool, each update encoded, framed and chunked into the protocol's messages and decoded
// again by the aggregator's accumulator, strategy and robust rules, with link and device
// emulation giving a simulated wall clock. Loopback: the real Aggregator and one EdgeClient per
// client over mutual TLS on 127.0.0.1, with throwaway certificates.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "sim/client_state.h"
#include "sim/task.h"

namespace starling::sim {

// One completed round, as metrics.jsonl records it (deterministic: no real time in it).
struct RoundRecord {
  uint64_t round = 0;
  int available = 0;
  int selected = 0;
  int dropped = 0;     // vanished mid-round (availability traces)
  int stragglers = 0;  // reported after the round closed (deadline or quorum reached)
  int updates = 0;     // folded
  int rejected = 0;
  int attempts = 1;  // 1 + failed tries of this round
  double examples = 0;
  double train_loss = 0;
  uint64_t bytes_up = 0;     // framed bytes clients sent this round (all selected)
  uint64_t bytes_down = 0;   // framed bytes the aggregator sent this round
  uint64_t bytes_total = 0;  // cumulative, both directions
  double sim_round_seconds = 0;
  double sim_seconds = 0;  // cumulative simulated wall time
  // [secagg]: clients that shared keys but sent no masked vector (their masks were removed),
  // and the round's graph degree and threshold (0 without secagg).
  int secagg_dropped = 0;
  int secagg_degree = 0;
  int secagg_threshold = 0;
  // [secagg] noise_multiplier: the epsilon spent so far at secagg.dp_delta.
  double dp_epsilon = 0;
  bool evaluated = false;
  double test_loss = 0;
  double test_accuracy = 0;
  double real_seconds = 0;  // cumulative real wall time (timing.jsonl, not metrics.jsonl)

  std::string metrics_json() const;
};

struct SimResult {
  std::string mode;  // "in-process" or "loopback"
  int num_clients = 0;
  int workers = 0;
  std::vector<RoundRecord> rounds;
  std::vector<uint32_t> participation;  // rounds each client's update was folded in
  std::vector<float> global;            // the final model
  ResidualStore::Stats residuals;
  double real_seconds = 0;
};

using RoundCallback = std::function<void(const RoundRecord&)>;
// The model after each completed round (a crash-safe run saves it).
using ModelCallback = std::function<Status(uint64_t round, std::span<const float> model)>;

class Ranks;

// REQUIRES: config validated (SimTask::create did). `out_dir` receives residual spill files.
// `ranks` (null: one process): an MPI job sharing the run (sim/ranks.h). Every rank calls this
// with the same config; each trains the selected clients it owns, the partial sums meet on rank
// 0, and every rank returns the same rounds and model (rank 0 alone evaluates). Robust rules
// and [secagg] are refused there: they need every update in one place. `on_model` (optional)
// sees the model after every round; an error from it ends the run.
Result<SimResult> run_in_process(const v1::FederationConfig& config, SimTask& task,
                                 const std::filesystem::path& out_dir,
                                 const RoundCallback& on_round, const Ranks* ranks = nullptr,
                                 const ModelCallback& on_model = {});
Result<SimResult> run_loopback(const v1::FederationConfig& config, SimTask& task,
                               const std::filesystem::path& out_dir, const RoundCallback& on_round);

}  // namespace starling::sim
