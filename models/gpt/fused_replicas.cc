#include "models/gpt/fused_replicas.h"

#include <omp.h>

#include <string>
#include <thread>

#include "core/comm/run_ranks.h"
#if defined(STARLING_HAVE_NCCL)
#include "core/comm/nccl/nccl_communicator.h"
#endif

namespace starling::models {

FusedReplicas::FusedReplicas(std::vector<int> gpus, int threads_per_rank,
                             std::chrono::milliseconds timeout, int ranks)
    : gpus_(std::move(gpus)),
      threads_per_rank_(std::max(1, threads_per_rank)),
      group_(std::make_unique<comm::ThreadGroup>(ranks, timeout)) {}

FusedReplicas::~FusedReplicas() = default;

Status FusedReplicas::check_gpus(const std::vector<int>& gpus) {
#if defined(STARLING_HAVE_NCCL)
  (void)gpus;
  return ok_status();
#else
  if (gpus.size() <= 1) return ok_status();
  return unimplemented("data parallel over " + std::to_string(gpus.size()) +
                       " GPUs needs NCCL, which this build was made without");
#endif
}

Result<std::unique_ptr<FusedReplicas>> FusedReplicas::make(int ranks,
                                                           const MakeReplica& make_replica,
                                                           std::vector<int> gpus, bool overlap,
                                                           int threads_per_rank,
                                                           std::chrono::milliseconds timeout) {
  if (ranks < 1) return invalid_argument("data-parallel ranks must be at least 1");
  if (!gpus.empty() && static_cast<int>(gpus.size()) != ranks) {
    return invalid_argument(std::to_string(ranks) + " data-parallel ranks on " +
                            std::to_string(gpus.size()) + " GPUs: one rank per GPU");
  }
  const bool cuda = !gpus.empty();
  RETURN_IF_ERROR(check_gpus(gpus));
  auto e = std::unique_ptr<FusedReplicas>(
      new FusedReplicas(std::move(gpus), threads_per_rank, timeout, ranks));
  for (int r = 0; r < ranks; ++r) {
    e->boot_.push_back(e->group_->communicator(r));
    ASSIGN_OR_RETURN(auto model, make_replica(r), "rank " + std::to_string(r));
    if (!e->replicas_.empty() && (model->batch() != e->rows_per_rank() ||
                                  model->num_parameters() != e->replicas_[0]->num_parameters())) {
      return internal_error("data-parallel rank " + std::to_string(r) +
                            ": its engine's shape differs from rank 0's");
    }
    e->replicas_.push_back(std::move(model));
  }
  e->comms_.resize(static_cast<size_t>(ranks));
  // Collective: the NCCL join (the unique id through the ThreadGroup) and the broadcast of rank
  // 0's weights.
  FusedReplicas* self = e.get();
  const auto join = [self, cuda, overlap](int r) -> Status {
    comm::Communicator* c = self->boot_[static_cast<size_t>(r)].get();
    if (cuda) {
#if defined(STARLING_HAVE_NCCL)
      ASSIGN_OR_RETURN(self->comms_[static_cast<size_t>(r)],
                       comm::NcclCommunicator::create(*c, self->gpus_[static_cast<size_t>(r)]));
      c = self->comms_[static_cast<size_t>(r)].get();
#else
      (void)c;
      (void)overlap;
      return unimplemented("several GPUs need NCCL, which this build was made without");
#endif
    }
    return self->replicas_[static_cast<size_t>(r)]->set_data_parallel(c, overlap);
  };
  RETURN_IF_ERROR(e->on_ranks(join));
  return e;
}

Status FusedReplicas::on_ranks(const std::function<Status(int)>& fn) {
  const int n = ranks();
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(threads_per_rank_);
      replicas_[static_cast<size_t>(r)]->backend().bind_thread();
      Status s = fn(r);
      if (!s.ok()) {
        s = Status(s.code(), "rank " + std::to_string(r) + ": " + s.message());
        group_->abort(s);
      }
      st[static_cast<size_t>(r)] = std::move(s);
    });
  }
  for (auto& t : threads) t.join();
  return comm::first_error(st);
}

Result<FusedStepResult> FusedReplicas::train_step(const int32_t* idx, const int32_t* targets,
                                                  size_t count, double lr,
                                                  const FusedOptimizer& opt, double grad_clip) {
  const auto t = static_cast<size_t>(replicas_[0]->time());
  const size_t slice = static_cast<size_t>(rows_per_rank()) * t;
  if (count != slice * static_cast<size_t>(ranks())) {
    return invalid_argument("a batch of " + std::to_string(count / t) + " rows for " +
                            std::to_string(ranks()) + " data-parallel ranks of " +
                            std::to_string(rows_per_rank()) + " rows each");
  }
  std::vector<FusedStepResult> out(static_cast<size_t>(ranks()));
  RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
    const size_t at = static_cast<size_t>(r) * slice;
    ASSIGN_OR_RETURN(out[static_cast<size_t>(r)],
                     replicas_[static_cast<size_t>(r)]->train_step(idx + at, targets + at, slice,
                                                                   lr, opt, grad_clip));
    return ok_status();
  }));
  // Every rank reports the ranks' mean loss and the norm of the averaged gradient.
  return out[0];
}

Result<double> FusedReplicas::loss(const int32_t* idx, const int32_t* targets, size_t count) {
  const auto t = static_cast<size_t>(replicas_[0]->time());
  const size_t rows = count / t, n = static_cast<size_t>(ranks());
  if (count % t != 0 || rows % n != 0 || rows / n > static_cast<size_t>(rows_per_rank())) {
    return invalid_argument("an evaluation batch of " + std::to_string(rows) +
                            " rows does not split over " + std::to_string(n) +
                            " ranks of at most " + std::to_string(rows_per_rank()) + " rows");
  }
  const size_t slice = rows / n * t;
  std::vector<double> losses(n);
  RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
    const size_t at = static_cast<size_t>(r) * slice;
    ASSIGN_OR_RETURN(losses[static_cast<size_t>(r)],
                     replicas_[static_cast<size_t>(r)]->loss(idx + at, targets + at, slice));
    return ok_status();
  }));
  double sum = 0.0;
  for (double l : losses) sum += l;  // equal slices: the mean of the means
  return sum / static_cast<double>(n);
}

}  // namespace starling::models
