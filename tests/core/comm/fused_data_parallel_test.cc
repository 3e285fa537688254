// The fused engine's data parallel (FusedGpt::set_data_parallel, models/gpt/fused_reducer.h) over
// ThreadGroup ranks on the fused CPU backend, the same code a GPU client runs over NCCL: N ranks
// with B/N rows each follow one engine with B rows (fp32, 1e-5), replicas stay bit-identical and
// start from rank 0's weights, overlap changes nothing, and an error on one rank stops every rank
// with a Status, never a hang.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/comm/run_ranks.h"
#include "core/util/rng.h"
#include "models/gpt/fused_gpt.h"
#include "tests/testing/fused_weights.h"

namespace starling::comm {
namespace {

using models::FusedGpt;
using std::chrono::milliseconds;

constexpr int64_t kB = 4, kT = 16;
constexpr int kSteps = 3;
// AdamW with eps = 1e-3: m / (sqrt(v) + eps) with the default 1e-8 turns rounding in a gradient
// near zero into an update of up to the learning rate (1e-3 of the weights' scale after three
// steps, varying with the thread count); a larger eps bounds that, so the weights after three
// steps say something about the gradients.
const models::FusedOptimizer kOpt{0.9, 0.99, 1e-3, 0.1};

models::GptConfig config() {
  models::GptConfig c;
  c.vocab_size = 29;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 34;  // odd sizes: no block size divides them
  c.bias = true;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng.uniform() * 29) % 29;
  return v;
}

// Steps' global batches: kSteps x (kB rows of kT), inputs and targets.
struct Data {
  std::vector<int32_t> x = tokens(kSteps * kB * kT, 1), y = tokens(kSteps * kB * kT, 2);
};

std::unique_ptr<FusedGpt> make(int64_t rows, uint64_t weight_seed) {
  auto m = FusedGpt::make(config(), rows, kT, 1, models::make_fused_cpu_backend());
  REQUIRE(m.ok());
  REQUIRE((*m)->load(testing::random_fused_weights(config(), weight_seed, 0.1)).ok());
  return std::move(*m);
}

struct Run {
  std::vector<float> grads;  // after the first step: the (clipped) gradient AdamW used
  std::vector<float> params;
  std::vector<double> losses;
};

// One engine, all kB rows per step.
Run single(const Data& d) {
  auto m = make(kB, 7);
  Run r;
  for (int s = 0; s < kSteps; ++s) {
    const size_t at = static_cast<size_t>(s) * kB * kT;
    auto st = m->train_step(d.x.data() + at, d.y.data() + at, kB * kT, 1e-2, kOpt, 1.0);
    REQUIRE(st.ok());
    r.losses.push_back(st->loss);
    if (s == 0) r.grads = m->gradients_host();
  }
  r.params = m->parameters_host();
  return r;
}

double normalized_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}

TEST_CASE("fused data parallel: N ranks of B/N rows follow one engine of B rows", "[comm]") {
  const int n = GENERATE(2, 4);
  const bool overlap = GENERATE(true, false);
  INFO("ranks " << n << " overlap " << overlap);
  const Data d;
  const Run want = single(d);
  std::vector<Run> got(static_cast<size_t>(n));
  const auto statuses = run_ranks(n, milliseconds(20000), [&](Communicator& c) -> Status {
    const int r = c.rank();
    // Every rank but 0 starts from other weights: set_data_parallel broadcasts rank 0's.
    auto m = make(kB / n, r == 0 ? 7 : 100 + static_cast<uint64_t>(r));
    RETURN_IF_ERROR(m->set_data_parallel(&c, overlap));
    // forward_backward stays local: on rank 0 alone it must issue no collective (one would not
    // match the other ranks' and fail the run).
    if (r == 0) RETURN_IF_ERROR(m->forward_backward(d.x.data(), d.y.data(), kB / n * kT).status());
    Run& out = got[static_cast<size_t>(r)];
    for (int s = 0; s < kSteps; ++s) {
      const size_t at = (static_cast<size_t>(s) * kB + static_cast<size_t>(r) * (kB / n)) * kT;
      ASSIGN_OR_RETURN(auto st, m->train_step(d.x.data() + at, d.y.data() + at,
                                              static_cast<size_t>(kB / n * kT), 1e-2, kOpt, 1.0));
      out.losses.push_back(st.loss);
      if (s == 0) out.grads = m->gradients_host();
    }
    out.params = m->parameters_host();
    return ok_status();
  });
  REQUIRE(first_error(statuses).ok());
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Run& g = got[static_cast<size_t>(r)];
    // The mean of the ranks' losses is the loss over all rows.
    for (int s = 0; s < kSteps; ++s) CHECK(g.losses[s] == Approx(want.losses[s]).epsilon(1e-5));
    // The averaged gradient is the gradient over all rows (sums in another order: fp32 1e-5).
    CHECK(normalized_diff(g.grads, want.grads) <= 1e-5);
    // The weights after three steps (see kOpt); the replicas, which average the very same sums,
    // agree bit for bit.
    CHECK(normalized_diff(g.params, want.params) <= 1e-5);
    CHECK(g.params == got[0].params);
  }
  // The update moved the weights: the comparison is not of two untouched models.
  CHECK(normalized_diff(want.params, make(kB, 7)->parameters_host()) > 1e-4);
}

TEST_CASE("fused data parallel: an error on one rank stops every rank", "[comm]") {
  const bool overlap = GENERATE(true, false);
  INFO("overlap " << overlap);
  const Data d;
  const auto t0 = std::chrono::steady_clock::now();
  const auto statuses = run_ranks(2, milliseconds(20000), [&](Communicator& c) -> Status {
    auto m = make(kB / 2, 7);
    RETURN_IF_ERROR(m->set_data_parallel(&c, overlap));
    std::vector<int32_t> x(d.x.begin(), d.x.begin() + kB / 2 * kT);
    if (c.rank() == 1) x[3] = 99;  // outside the vocabulary: rank 1's step fails before backward
    for (int s = 0; s < 2; ++s) {
      ASSIGN_OR_RETURN(auto st, m->train_step(x.data(), d.y.data(), x.size(), 1e-2, {}, 1.0),
                       "rank " + std::to_string(c.rank()));
      (void)st;
    }
    return ok_status();
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_FALSE(statuses[0].ok());  // waiting in its all-reduce when rank 1 gave up
  CHECK_FALSE(statuses[1].ok());
  CHECK(first_error(statuses).message().find("outside the vocabulary") != std::string::npos);
  CHECK(seconds < 10.0);  // the group was aborted, not left to its 20 s collective timeout
}

}  // namespace
}  // namespace starling::comm
