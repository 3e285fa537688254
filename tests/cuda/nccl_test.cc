// [cuda] NcclCommunicator with one rank per visible GPU (one on a single-GPU machine), its
// unique id exchanged through a ThreadGroup; exact inputs, so results are asserted bit-exact.
// Compiled to nothing where CMake found no NCCL (no starling_core_comm_nccl target).
#if defined(STARLING_HAVE_NCCL)
#include <nccl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>

#include "core/comm/nccl/nccl_communicator.h"
#include "core/comm/thread_group.h"
#include "tests/cuda/cuda_testing.h"

namespace starling::comm {
namespace {

TEST_CASE("NCCL all_reduce, broadcast, all_gather with one rank per GPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int n = static_cast<int>(cuda::devices().size());
  ThreadGroup group(n, std::chrono::milliseconds(60000));
  std::vector<Status> st(n);
  std::vector<std::vector<float>> sum(n), gathered(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto boot = group.communicator(r);
      auto comm = NcclCommunicator::create(*boot, r);
      if (!comm.ok()) {
        st[r] = comm.status();
        return;
      }
      STARLING_CUDA_CHECK(cudaSetDevice(r));
      std::vector<float> h(1027);
      for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(int(i % 9) - 4 + r);
      auto d = cuda::DeviceArray<float>::from_host(h);
      st[r] = (*comm)->all_reduce({d.get(), d.size()}, ReduceOp::kSum);
      if (!st[r].ok()) return;
      sum[r] = d.to_host();
      cuda::DeviceArray<float> all(h.size() * n);
      st[r] = (*comm)->all_gather({d.get(), d.size()}, {all.get(), all.size()});
      if (st[r].ok()) st[r] = (*comm)->barrier();
      gathered[r] = all.to_host();
      // Broadcast from the last rank: every rank ends with that rank's values.
      auto own = cuda::DeviceArray<float>::from_host(std::vector<float>(7, static_cast<float>(r)));
      if (st[r].ok()) st[r] = (*comm)->broadcast({own.get(), own.size()}, n - 1);
      if (st[r].ok() && own.to_host() != std::vector<float>(7, static_cast<float>(n - 1))) {
        st[r] = internal_error("broadcast delivered the wrong values");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(st[r].ok());
    for (size_t i = 0; i < sum[r].size(); ++i) {
      float want = 0.0f;
      for (int k = 0; k < n; ++k) want += static_cast<float>(int(i % 9) - 4 + k);
      REQUIRE(sum[r][i] == want);
    }
    REQUIRE(gathered[r].size() == sum[r].size() * n);
    for (int k = 0; k < n; ++k) {
      REQUIRE(std::equal(sum[r].begin(), sum[r].end(), gathered[r].begin() + k * sum[r].size()));
    }
  }
}

TEST_CASE("NCCL: a rank that never joins makes the others fail by the deadline", "[cuda]") {
  STARLING_REQUIRE_GPU();
  ThreadGroup group(2, std::chrono::milliseconds(60000));
  // Rank 1 takes part in the unique-id exchange (the bootstrap), then never joins NCCL.
  std::thread missing([&] {
    auto boot = group.communicator(1);
    std::vector<float> id(sizeof(ncclUniqueId) / sizeof(float));
    (void)boot->broadcast(id, 0);
  });
  auto boot = group.communicator(0);
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = NcclCommunicator::create(*boot, 0, std::chrono::milliseconds(3000));
  const auto took = std::chrono::steady_clock::now() - t0;
  missing.join();
  REQUIRE_FALSE(comm.ok());
  CHECK(comm.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(comm.status().message(), Catch::Contains("missing") && Catch::Contains("rank 0 of 2"));
  CHECK(took < std::chrono::seconds(20));
}

}  // namespace
}  // namespace starling::comm
#endif  // STARLING_HAVE_NCCL
