// DataParallel over ThreadGroup ranks on a tiny GPT: replicas stay bit-identical, N ranks with
// per-rank batch B/N follow 1 rank with batch B, bucket boundaries change nothing, and an error
// on one rank reaches every rank as a Status (never a hang). Also the autograd leaf hook.
#include "core/comm/data_parallel.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "core/autograd/autograd.h"
#include "core/comm/run_ranks.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/optim/optimizer.h"
#include "core/util/rng.h"
#include "models/gpt/gpt.h"

namespace starling::comm {
namespace {

using std::chrono::milliseconds;

models::GptConfig tiny_gpt() {
  models::GptConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

constexpr int64_t kT = 8;
constexpr int64_t kGlobalBatch = 8;

// Rows [lo, hi) of step `step`'s global batch: the same tokens whatever the number of ranks.
std::pair<Tensor, Tensor> batch_rows(int step, int64_t lo, int64_t hi) {
  Rng rng(1000 + static_cast<uint64_t>(step));
  std::vector<int32_t> all(static_cast<size_t>(kGlobalBatch * (kT + 1)));
  for (auto& v : all) v = static_cast<int32_t>(rng.below(13));
  std::vector<int32_t> x, y;
  for (int64_t b = lo; b < hi; ++b) {
    const int32_t* row = all.data() + b * (kT + 1);
    x.insert(x.end(), row, row + kT);
    y.insert(y.end(), row + 1, row + kT + 1);
  }
  return {Tensor::from_vector(x, {hi - lo, kT}), Tensor::from_vector(y, {hi - lo, kT})};
}

std::vector<float> flatten(const models::Gpt& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    out.insert(out.end(), p.data<float>(), p.data<float>() + p.numel());
  }
  return out;
}

struct RankTrace {
  std::vector<double> loss;                // global mean loss of each step
  std::vector<std::vector<float>> params;  // flattened parameters after each step
};

struct RunOptions {
  int ranks = 2;
  int steps = 5;
  DataParallelOptions dp;
};

// Trains the tiny GPT on `ranks` threads: rank r starts from its own seed (the broadcast makes
// them equal) and takes its contiguous share of every global batch.
std::vector<RankTrace> train(const RunOptions& o) {
  std::vector<RankTrace> traces(static_cast<size_t>(o.ranks));
  auto st = run_ranks(o.ranks, milliseconds(5000), [&](Communicator& comm) -> Status {
    const int r = comm.rank();
    models::Gpt model(tiny_gpt(), 100 + static_cast<uint64_t>(r));
    ASSIGN_OR_RETURN(auto dp, DataParallel::make(model.named_parameters(), comm, o.dp));
    optim::AdamW opt(optim::decay_matrices_only(model.parameters()),
                     optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
    const int64_t per = kGlobalBatch / o.ranks;
    RankTrace& tr = traces[static_cast<size_t>(r)];
    for (int s = 0; s < o.steps; ++s) {
      auto [x, y] = batch_rows(s, r * per, (r + 1) * per);
      Tensor loss = model.loss(x, y);
      std::vector<float> l{static_cast<float>(loss.item())};
      RETURN_IF_ERROR(dp->backward(loss));
      RETURN_IF_ERROR(comm.all_reduce(l, ReduceOp::kAvg));
      optim::clip_grad_norm(model.parameters(), 1.0);
      opt.step(1e-2);
      opt.zero_grad();
      tr.loss.push_back(l[0]);
      tr.params.push_back(flatten(model));
    }
    return ok_status();
  });
  for (const auto& s : st) REQUIRE(s.ok());
  return traces;
}

TEST_CASE("data parallel replicas stay bit-identical across steps") {
  const int n = GENERATE(2, 4);
  const bool overlap = GENERATE(true, false);
  RunOptions o;
  o.ranks = n;
  o.dp.overlap = overlap;
  o.dp.bucket_bytes = 4096;  // several buckets, so several all-reduces overlap backward
  const auto tr = train(o);
  const std::vector<float> init = flatten(models::Gpt(tiny_gpt(), 100));
  for (int s = 0; s < o.steps; ++s) {
    for (int r = 1; r < n; ++r) {
      const auto& a = tr[0].params[static_cast<size_t>(s)];
      const auto& b = tr[static_cast<size_t>(r)].params[static_cast<size_t>(s)];
      REQUIRE(a.size() == b.size());
      REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
  }
  // Not trivially equal: the ranks were built from different seeds (the broadcast of rank 0's
  // values made them equal), and the steps moved the parameters.
  REQUIRE(flatten(models::Gpt(tiny_gpt(), 101)) != init);
  REQUIRE(tr[0].params[0] != init);
  REQUIRE(tr[0].params.back() != tr[0].params.front());
}

TEST_CASE("N ranks with batch B/N match 1 rank with batch B") {
  // Tolerance: 1e-5 relative on the loss of each of 5 steps and on the parameters (max abs
  // difference over max abs value); only the fp32 summation order of the batch mean differs.
  const int n = GENERATE(2, 4);
  RunOptions one;
  one.ranks = 1;
  RunOptions many;
  many.ranks = n;
  const auto a = train(one), b = train(many);
  for (int s = 0; s < one.steps; ++s) {
    const double la = a[0].loss[static_cast<size_t>(s)], lb = b[0].loss[static_cast<size_t>(s)];
    INFO("step " << s << ": 1 rank " << la << ", " << n << " ranks " << lb);
    REQUIRE(std::abs(la - lb) <= 1e-5 * std::abs(la));
  }
  const auto& pa = a[0].params.back();
  const auto& pb = b[0].params.back();
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(pa[i]));
    max_diff = std::max(max_diff, std::abs(pa[i] - pb[i]));
  }
  INFO("max parameter difference " << max_diff << " of max " << max_abs);
  REQUIRE(max_diff <= 1e-5f * max_abs);
  REQUIRE(pa != b[0].params.front());  // training moved them
}

TEST_CASE("bucket boundaries do not change the result") {
  RunOptions ref;
  ref.ranks = 2;
  ref.steps = 3;
  const auto want = train(ref).at(0).params.back();  // default: 25 MB, one bucket
  const size_t bytes = GENERATE(size_t{4}, size_t{1024}, size_t{100000});
  const bool overlap = GENERATE(true, false);
  RunOptions o = ref;
  o.dp.bucket_bytes = bytes;
  o.dp.overlap = overlap;
  const auto got = train(o).at(0).params.back();
  REQUIRE(got.size() == want.size());
  REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
}

TEST_CASE("bucket assignment: reverse order, a cap smaller than one parameter, one bucket") {
  models::Gpt model(tiny_gpt(), 1);
  const size_t np = model.parameters().size();
  std::vector<std::vector<std::vector<size_t>>> layouts(3);
  auto st = run_ranks(1, milliseconds(5000), [&](Communicator& comm) -> Status {
    const size_t caps[] = {4, 1024, size_t{25} << 20};
    for (int i = 0; i < 3; ++i) {
      DataParallelOptions o;
      o.bucket_bytes = caps[i];
      o.overlap = i == 0;
      ASSIGN_OR_RETURN(auto dp, DataParallel::make(model.named_parameters(), comm, o));
      layouts[static_cast<size_t>(i)] = dp->bucket_params();
    }
    return ok_status();
  });
  REQUIRE(st[0].ok());
  // Smaller than any parameter: one bucket per parameter, last parameter first.
  REQUIRE(layouts[0].size() == np);
  for (size_t b = 0; b < np; ++b) REQUIRE(layouts[0][b] == std::vector<size_t>{np - 1 - b});
  // 1 KiB: every bucket within the cap unless it holds a single larger parameter.
  const auto params = model.parameters();
  size_t seen = 0;
  for (const auto& b : layouts[1]) {
    size_t bytes = 0;
    for (size_t i : b) bytes += static_cast<size_t>(params[i].numel()) * 4;
    REQUIRE((b.size() == 1 || bytes <= 1024));
    seen += b.size();
  }
  REQUIRE(seen == np);
  REQUIRE(layouts[1].size() > 1);
  REQUIRE(layouts[1].size() < np);
  // 25 MB: one bucket for everything.
  REQUIRE(layouts[2].size() == 1);
  REQUIRE(layouts[2][0].size() == np);
}

TEST_CASE("a mismatched model is an error on every rank") {
  const int n = GENERATE(2, 4);
  const bool same_count = GENERATE(true, false);  // different widths, or different depths
  auto st = run_ranks(n, milliseconds(5000), [&](Communicator& comm) -> Status {
    models::GptConfig c = tiny_gpt();
    if (comm.rank() == n - 1) {
      if (same_count) {
        c.n_embd = 8;
      } else {
        c.n_layer = 3;
      }
    }
    models::Gpt model(c, 7);
    ASSIGN_OR_RETURN(auto dp, DataParallel::make(model.named_parameters(), comm));
    return ok_status();
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << st[static_cast<size_t>(r)].message());
    REQUIRE(st[static_cast<size_t>(r)].code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(st[static_cast<size_t>(r)].message(),
                 Catch::Contains("rank " + std::to_string(n - 1) + "'s model differs"));
  }
}

TEST_CASE("an invalid parameter on one rank is an error on every rank") {
  auto st = run_ranks(3, milliseconds(5000), [&](Communicator& comm) -> Status {
    std::vector<std::pair<std::string, Tensor>> params;
    params.emplace_back("w", comm.rank() == 2 ? Tensor() : Tensor::zeros({4}));
    params.emplace_back("b", Tensor::zeros({2}, comm.rank() == 2 ? DType::kF64 : DType::kF32));
    ASSIGN_OR_RETURN(auto dp, DataParallel::make(std::move(params), comm));
    return ok_status();
  });
  for (const auto& s : st) REQUIRE(s.code() == StatusCode::kInvalidArgument);
  REQUIRE_THAT(st[2].message(), Catch::Contains("parameter 'w' must be a defined"));
  REQUIRE_THAT(st[0].message(), Catch::Contains("rank 2 has an invalid parameter"));
  REQUIRE_THAT(st[1].message(), Catch::Contains("rank 2 has an invalid parameter"));
}

TEST_CASE("a rank that fails mid-training stops every rank with its error") {
  const int n = GENERATE(2, 3);
  const bool overlap = GENERATE(true, false);
  const auto t0 = std::chrono::steady_clock::now();
  auto st = run_ranks(n, milliseconds(5000), [&](Communicator& comm) -> Status {
    models::Gpt model(tiny_gpt(), 3);
    DataParallelOptions o;
    o.overlap = overlap;
    o.bucket_bytes = 2048;
    ASSIGN_OR_RETURN(auto dp, DataParallel::make(model.named_parameters(), comm, o));
    for (int s = 0; s < 4; ++s) {
      if (s == 2 && comm.rank() == 1) return data_loss("rank 1 lost its data shard");
      auto [x, y] = batch_rows(s, 0, 2);
      RETURN_IF_ERROR(dp->backward(model.loss(x, y)), "step " + std::to_string(s));
      model.zero_grad();
    }
    return ok_status();
  });
  // Aborting the group ends the wait at once (the 5 s collective timeout is never reached).
  REQUIRE(std::chrono::steady_clock::now() - t0 < milliseconds(4000));
  REQUIRE(st[1].code() == StatusCode::kDataLoss);
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    INFO("rank " << r << ": " << st[static_cast<size_t>(r)].message());
    REQUIRE(st[static_cast<size_t>(r)].code() == StatusCode::kCancelled);
    REQUIRE_THAT(st[static_cast<size_t>(r)].message(),
                 Catch::Contains("rank 1 stopped: rank 1 lost its data shard"));
  }
  REQUIRE(first_error(st).code() == StatusCode::kDataLoss);
}

// Forwards to another communicator and counts the all-reduces that have started.
class CountingComm final : public Communicator {
 public:
  explicit CountingComm(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Status all_reduce(std::span<float> data, ReduceOp op) override {
    {
      std::lock_guard lk(mu_);
      ++started_;
    }
    cv_.notify_all();
    return inner_.all_reduce(data, op);
  }
  Status broadcast(std::span<float> data, int root) override {
    return inner_.broadcast(data, root);
  }
  Status all_gather(std::span<const float> in, std::span<float> out) override {
    return inner_.all_gather(in, out);
  }
  Status barrier() override { return inner_.barrier(); }
  // Whether an all-reduce has started, waiting up to `d` for one.
  bool wait_started(milliseconds d) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, d, [this] { return started_ > 0; });
  }

 private:
  Communicator& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int started_ = 0;
};

TEST_CASE("with overlap, bucket all-reduces start while backward is still running") {
  // The GPT's first parameter (wte, also the head) is the last gradient backward finishes.
  // When it is reported, the earlier buckets must already be in flight with overlap on, and
  // must not be with overlap off (they wait for finish()).
  const bool overlap = GENERATE(true, false);
  bool started_before_end = false;
  auto st = run_ranks(1, milliseconds(5000), [&](Communicator& inner) -> Status {
    CountingComm comm(inner);
    models::Gpt model(tiny_gpt(), 5);
    DataParallelOptions o;
    o.overlap = overlap;
    o.bucket_bytes = 1024;
    ASSIGN_OR_RETURN(auto dp, DataParallel::make(model.named_parameters(), comm, o));
    const Tensor wte = model.parameters().front();
    auto [x, y] = batch_rows(0, 0, 2);
    autograd::backward(model.loss(x, y), Tensor(), [&](const Tensor& leaf) {
      if (leaf.impl() == wte.impl()) {
        started_before_end = comm.wait_started(milliseconds(overlap ? 2000 : 100));
      }
      dp->grad_ready(leaf);
    });
    return dp->finish();
  });
  REQUIRE(st[0].ok());
  REQUIRE(started_before_end == overlap);
}

TEST_CASE("backward reports each leaf once, after its last gradient contribution") {
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  Tensor b = Tensor::from_vector(std::vector<float>{4, 5, 6}, {3}).set_requires_grad(true);
  // L = sum(a * b + a * a + b): a gets two contributions, b two.
  Tensor loss = ops::sum(ops::add(ops::add(ops::mul(a, b), ops::mul(a, a)), b));
  std::vector<std::pair<const void*, std::vector<float>>> calls;
  autograd::backward(loss, Tensor(), [&](const Tensor& leaf) {
    const Tensor g = leaf.grad();
    calls.emplace_back(leaf.impl().get(),
                       std::vector<float>(g.data<float>(), g.data<float>() + g.numel()));
  });
  REQUIRE(calls.size() == 2);
  for (const auto& [who, g] : calls) {
    if (who == a.impl().get()) {
      REQUIRE(g == std::vector<float>{4 + 2, 5 + 4, 6 + 6});  // b + 2a
    } else {
      REQUIRE(who == b.impl().get());
      REQUIRE(g == std::vector<float>{2, 3, 4});  // a + 1
    }
  }
}

}  // namespace
}  // namespace starling::comm
