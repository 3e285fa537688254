// NcclCommunicator: the Communicator over NCCL, one rank per GPU. Built only when CUDA and NCCL
// are found (target starling_core_comm_nccl); spans passed to it are device memory.
#pragma once

#include <chrono>
#include <memory>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace starling::comm {

// One rank of an NCCL communicator bound to one device. Each collective is enqueued on the
// communicator's own stream and waited for before returning, so it behaves like the CPU
// implementation (overlap with compute comes with the bucketed async API, not here).
// Thread-compatible; one thread per rank.
class NcclCommunicator final : public Communicator {
 public:
  // Joins an NCCL group of `bootstrap.size()` ranks on CUDA device `device`: rank 0 makes the
  // unique id and broadcasts it through `bootstrap` (e.g. a ThreadGroup communicator), then
  // every rank joins a non-blocking NCCL communicator. bootstrap's rank and size become this
  // one's. `timeout` bounds the join and every collective: a rank that is missing (crashed,
  // never called) makes the others fail with DeadlineExceeded naming the collective, after
  // which the communicator is aborted and every later call fails at once (never a hang).
  static Result<std::unique_ptr<NcclCommunicator>> create(
      Communicator& bootstrap, int device,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000));
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce(std::span<float> data, ReduceOp op) override;
  Status broadcast(std::span<float> data, int root) override;
  Status all_gather(std::span<const float> in, std::span<float> out) override;
  Status barrier() override;

 private:
  struct State;
  NcclCommunicator(int rank, int size, std::unique_ptr<State> state);
  Status finish(const char* what, int nccl_result);
  // The first error (a timeout, a peer's failure) breaks the communicator for good.
  Status broken_;

  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<State> state_;
};

}  // namespace starling::comm
