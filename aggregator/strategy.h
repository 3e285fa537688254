// Server optimizers on the aggregated delta (Reddi et al. 2021, "Adaptive Federated
// Optimization"): FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad. The delta is the weighted mean
// of client deltas (local - global), so it points downhill and is added, not subtracted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::aggregator {

enum class StrategyKind { kFedAvg, kFedAvgM, kFedAdam, kFedYogi, kFedAdagrad };
std::string_view strategy_name(StrategyKind kind);  // "fedavg"
Result<StrategyKind> parse_strategy(std::string_view name);

struct StrategyOptions {
  StrategyKind kind = StrategyKind::kFedAvg;
  float server_lr = 1.0f;
  float momentum = 0.9f;  // FedAvgM
  float beta1 = 0.9f;     // FedAdam, FedYogi
  float beta2 = 0.99f;    // FedAdam, FedYogi
  float tau = 1e-3f;      // adaptivity
};

// Per element i, with d the aggregated delta and x the global model:
//   FedAvg      x += lr d                (lr == 1: x += d, exactly)
//   FedAvgM     m = momentum m + d;  x += lr m
//   FedAdam     m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d^2;              x += lr m / (sqrt(v)+tau)
//   FedYogi     m as Adam;  v = v - (1-b2) d^2 sign(v - d^2);            x += lr m / (sqrt(v)+tau)
//   FedAdagrad  m as Adam;  v = v + d^2;                                 x += lr m / (sqrt(v)+tau)
// v starts at tau^2, m at 0 (as in the paper). Thread-compatible.
class ServerOptimizer {
 public:
  ServerOptimizer(StrategyOptions options, int64_t numel);
  void apply(std::span<float> global, std::span<const float> delta);
  const StrategyOptions& options() const { return options_; }
  // State slots for checkpoints: ("m", m), ("v", v); only those the strategy uses.
  std::vector<std::pair<std::string, std::vector<float>*>> slots();

 private:
  StrategyOptions options_;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace starling::aggregator
