// FusedReplicas: N replicas of the fused engine that train as one. Rank r takes rows
// [r B/N, (r + 1) B/N) of every batch of B rows, and FusedGpt::set_data_parallel averages the
// gradients during backward, so a step is the step of one engine on all B rows. The ranks are
// threads of this process, one per rank: CPU ranks reduce over a comm::ThreadGroup, GPU ranks
// (one per GPU) over NCCL, bootstrapped through it. `starling train --gpus 0,1` (and --ranks N
// on the CPU) and a federated client with [client] gpus = [0, 1] both run it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/thread_group.h"
#include "core/util/status.h"
#include "models/gpt/fused_gpt.h"

namespace starling::models {

class FusedReplicas {
 public:
  // Rank r's engine, sized for the rows of one rank; every rank's of the same config and shape.
  using MakeReplica = std::function<Result<std::unique_ptr<FusedGpt>>(int rank)>;

  // Makes `ranks` engines, joins them (NCCL with rank r on gpus[r] when `gpus` is not empty,
  // else the ThreadGroup's CPU ranks) and broadcasts rank 0's weights. `threads_per_rank`: the
  // OpenMP threads of each rank's thread. `timeout` bounds every collective: a rank that never
  // arrives fails every rank with DeadlineExceeded, never a hang. `overlap`: gradients reduced
  // while backward goes on. Errors name the rank.
  static Result<std::unique_ptr<FusedReplicas>> make(int ranks, const MakeReplica& make_replica,
                                                     std::vector<int> gpus, bool overlap,
                                                     int threads_per_rank,
                                                     std::chrono::milliseconds timeout);
  // Whether this build can join `gpus` (several need NCCL): Unimplemented naming the reason.
  static Status check_gpus(const std::vector<int>& gpus);
  ~FusedReplicas();
  FusedReplicas(const FusedReplicas&) = delete;
  FusedReplicas& operator=(const FusedReplicas&) = delete;

  int ranks() const { return static_cast<int>(replicas_.size()); }
  // Rows of one rank's slice of a batch.
  int64_t rows_per_rank() const { return replicas_.front()->batch(); }
  FusedGpt& replica(int rank) { return *replicas_[static_cast<size_t>(rank)]; }
  const std::vector<int>& gpus() const { return gpus_; }

  // fn(r) for every rank at once, each on its own thread (bound to its device). The first
  // error aborts the group, so a rank waiting in a collective fails at once with it; that
  // error is returned, naming its rank. After an error the group is broken: make a new one.
  Status on_ranks(const std::function<Status(int rank)>& fn);

  // One step on ranks() * rows_per_rank() rows (count = rows * T tokens, row-major): each rank
  // trains on its slice. The loss is the ranks' mean, the norm the averaged gradient's.
  Result<FusedStepResult> train_step(const int32_t* idx, const int32_t* targets, size_t count,
                                     double lr, const FusedOptimizer& opt, double grad_clip);
  // The mean loss of a batch whose rows split evenly over the ranks (forward only, no
  // collective). InvalidArgument when they do not.
  Result<double> loss(const int32_t* idx, const int32_t* targets, size_t count);

 private:
  FusedReplicas(std::vector<int> gpus, int threads_per_rank, std::chrono::milliseconds timeout,
                int ranks);

  std::vector<int> gpus_;
  int threads_per_rank_;
  std::unique_ptr<comm::ThreadGroup> group_;
  std::vector<std::unique_ptr<comm::Communicator>> boot_;   // ThreadGroup handles
  std::vector<std::unique_ptr<comm::Communicator>> comms_;  // NCCL (GPUs), else empty
  // Last: destroyed first, while the communicators they hold still exist.
  std::vector<std::unique_ptr<FusedGpt>> replicas_;
};

}  // namespace starling::models
