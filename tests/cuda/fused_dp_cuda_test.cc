// [cuda] The fused engine's data parallel on the GPU path: CUDA backends, NCCL on device memory,
// the reducer's worker waiting on CUDA events (FusedBackend::mark). One rank per visible GPU;
// on a single-GPU machine one NCCL rank, whose average is the identity, so the data-parallel
// engine must train exactly as the plain one. Several ranks: replicas stay bit-identical.
// Compiled to nothing where CMake found no NCCL.
#if defined(STARLING_HAVE_NCCL)
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "core/comm/nccl/nccl_communicator.h"
#include "core/comm/thread_group.h"
#include "models/gpt/fused_gpt.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing/fused_weights.h"

namespace starling::models {
namespace {

constexpr int64_t kT = 32;

GptConfig config() {
  GptConfig c;
  c.vocab_size = 65;
  c.block_size = kT;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 64;
  c.bias = true;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng.below(65));
  return v;
}

std::unique_ptr<FusedGpt> make(int gpu, int64_t rows) {
  auto backend = make_fused_cuda_backend(gpu);
  REQUIRE(backend.ok());
  auto m = FusedGpt::make(config(), rows, kT, 1, std::move(*backend));
  REQUIRE(m.ok());
  REQUIRE((*m)->load(testing::random_fused_weights(config(), 5, 0.1)).ok());
  return std::move(*m);
}

TEST_CASE("fused data parallel over NCCL: replicas equal, one rank trains as the plain engine",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  const bool overlap = GENERATE(true, false);
  INFO("overlap " << overlap);
  const int n = static_cast<int>(cuda::devices().size());
  const int64_t rows = 4;
  const auto x = tokens(static_cast<size_t>(n * rows * kT * 3), 1),
             y = tokens(static_cast<size_t>(n * rows * kT * 3), 2);
  comm::ThreadGroup group(n, std::chrono::milliseconds(60000));
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<std::vector<float>> params(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.communicator(r);
      auto comm = comm::NcclCommunicator::create(*boot, r);
      if (!comm.ok()) {
        st[static_cast<size_t>(r)] = comm.status();
        return;
      }
      auto m = make(r, rows);
      m->backend().bind_thread();
      Status s = m->set_data_parallel(comm->get(), overlap);
      for (int step = 0; s.ok() && step < 3; ++step) {
        const size_t at = (static_cast<size_t>(step) * n + static_cast<size_t>(r)) * rows * kT;
        auto res = m->train_step(x.data() + at, y.data() + at, rows * kT, 1e-3, {}, 1.0);
        s = res.status();
      }
      if (s.ok()) params[static_cast<size_t>(r)] = m->parameters_host();
      st[static_cast<size_t>(r)] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) REQUIRE(s.ok());
  for (int r = 1; r < n; ++r) CHECK(params[static_cast<size_t>(r)] == params[0]);
  if (n == 1) {
    STARLING_CUDA_CHECK(cudaSetDevice(0));
    auto plain = make(0, rows);
    for (int step = 0; step < 3; ++step) {
      const size_t at = static_cast<size_t>(step) * rows * kT;
      REQUIRE(plain->train_step(x.data() + at, y.data() + at, rows * kT, 1e-3, {}, 1.0).ok());
    }
    CHECK(plain->parameters_host() == params[0]);  // the average over one rank changes nothing
  }
}

}  // namespace
}  // namespace starling::models
#endif  // STARLING_HAVE_NCCL
