// Server optimizer steps.
#include "aggregator/strategy.h"

#include <cmath>

namespace starling::aggregator {

std::string_view strategy_name(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::kFedAvg:
      return "fedavg";
    case StrategyKind::kFedAvgM:
      return "fedavgm";
    case StrategyKind::kFedAdam:
      return "fedadam";
    case StrategyKind::kFedYogi:
      return "fedyogi";
    case StrategyKind::kFedAdagrad:
      return "fedadagrad";
  }
  return "?";
}

Result<StrategyKind> parse_strategy(std::string_view name) {
  for (auto k : {StrategyKind::kFedAvg, StrategyKind::kFedAvgM, StrategyKind::kFedAdam,
                 StrategyKind::kFedYogi, StrategyKind::kFedAdagrad}) {
    if (strategy_name(k) == name) return k;
  }
  return invalid_argument("unknown strategy '" + std::string(name) +
                          "' (fedavg, fedavgm, fedadam, fedyogi, fedadagrad)");
}

ServerOptimizer::ServerOptimizer(StrategyOptions options, int64_t numel) : options_(options) {
  const auto n = static_cast<size_t>(numel);
  if (options_.kind != StrategyKind::kFedAvg) m_.assign(n, 0.0f);
  if (options_.kind == StrategyKind::kFedAdam || options_.kind == StrategyKind::kFedYogi ||
      options_.kind == StrategyKind::kFedAdagrad) {
    v_.assign(n, options_.tau * options_.tau);
  }
}

std::vector<std::pair<std::string, std::vector<float>*>> ServerOptimizer::slots() {
  std::vector<std::pair<std::string, std::vector<float>*>> out;
  if (!m_.empty()) out.emplace_back("m", &m_);
  if (!v_.empty()) out.emplace_back("v", &v_);
  return out;
}

void ServerOptimizer::apply(std::span<float> global, std::span<const float> delta) {
  const size_t n = global.size();
  const float lr = options_.server_lr;
  switch (options_.kind) {
    case StrategyKind::kFedAvg:
      if (lr == 1.0f) {
        for (size_t i = 0; i < n; ++i) global[i] += delta[i];
      } else {
        for (size_t i = 0; i < n; ++i) global[i] += lr * delta[i];
      }
      return;
    case StrategyKind::kFedAvgM:
      for (size_t i = 0; i < n; ++i) {
        m_[i] = options_.momentum * m_[i] + delta[i];
        global[i] += lr * m_[i];
      }
      return;
    case StrategyKind::kFedAdam:
    case StrategyKind::kFedYogi:
    case StrategyKind::kFedAdagrad:
      break;
  }
  const float b1 = options_.beta1;
  const float b2 = options_.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float d = delta[i];
    const float d2 = d * d;
    m_[i] = b1 * m_[i] + (1 - b1) * d;
    if (options_.kind == StrategyKind::kFedAdam) {
      v_[i] = b2 * v_[i] + (1 - b2) * d2;
    } else if (options_.kind == StrategyKind::kFedYogi) {
      const float diff = v_[i] - d2;
      const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
      v_[i] = v_[i] - (1 - b2) * d2 * sign;
    } else {
      v_[i] = v_[i] + d2;
    }
    global[i] += lr * m_[i] / (std::sqrt(v_[i]) + options_.tau);
  }
}

}  // namespace starling::aggregator
