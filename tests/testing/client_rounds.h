// Helpers of the client trainers' tests: a random token stream, a round plan, and two trainers'
// rounds compared from the same global models.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "tests/testing/fused_weights.h"

namespace starling::testing {

// n token ids uniform in [0, vocab), seeded.
inline std::shared_ptr<const std::vector<int32_t>> random_tokens(int n, int vocab, uint32_t seed) {
  auto v = std::make_shared<std::vector<int32_t>>();
  std::mt19937 gen(seed);
  for (int i = 0; i < n; ++i) v->push_back(static_cast<int32_t>(gen() % vocab));
  return v;
}

inline v1::RoundPlan round_plan(uint64_t seed, uint32_t steps, uint32_t batch, float lr = 0.01f) {
  v1::RoundPlan p;
  p.set_round(1);
  p.set_local_steps(steps);
  p.set_batch_size(batch);
  p.set_learning_rate(lr);
  p.set_seed(seed);
  return p;
}

// The rounds of `plans` on `ref` and `got`, each from the global `g` moved by ref's update: the
// same sample counts, losses within `loss_eps` relative, updates within `tol` normalized
// (normalized_error), and got's updates not all zero.
inline void check_same_rounds(edge_client::LocalTrainer& ref, edge_client::LocalTrainer& got,
                              std::vector<float> g, const std::vector<v1::RoundPlan>& plans,
                              double loss_eps, double tol) {
  for (const auto& p : plans) {
    std::vector<float> dr(g.size()), dg(g.size());
    auto rr = ref.train(g, p, dr);
    auto rg = got.train(g, p, dg);
    INFO(rr.status().to_string() << " / " << rg.status().to_string());
    REQUIRE(rr.ok());
    REQUIRE(rg.ok());
    CHECK(rg->num_samples == rr->num_samples);
    CHECK(rg->loss == Approx(rr->loss).epsilon(loss_eps));
    const double e = normalized_error(dg.data(), dr.data(), dr.size());
    INFO("round seed " << p.seed() << ": normalized error " << e);
    CHECK(e <= tol);
    CHECK(std::any_of(dg.begin(), dg.end(), [](float x) { return x != 0.0f; }));
    for (size_t i = 0; i < g.size(); ++i) g[i] += dr[i];
  }
}

}  // namespace starling::testing
