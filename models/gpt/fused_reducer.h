// Data-parallel gradient averaging for the fused engine (FusedGpt::set_data_parallel): ranges of
// the flat gradient buffer are averaged over a comm::Communicator as backward finishes them, on a
// worker thread while backward goes on (overlap), or all at the end of backward.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "core/comm/communicator.h"
#include "core/util/status.h"
#include "models/gpt/fused_backend.h"

namespace starling::models {

class GradientReducer {
 public:
  // `comm` reduces memory of `backend`'s kind (a ThreadGroup for the CPU backend, NCCL for the
  // CUDA one); both must outlive the reducer.
  GradientReducer(comm::Communicator& comm, FusedBackend& backend, bool overlap);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The n floats at data (backend memory) are final for this step: average them over the ranks.
  // Every rank must call ready() for the same ranges in the same order. With overlap the
  // collective starts on the worker once the work enqueued so far is done (FusedBackend::mark).
  void ready(float* data, size_t n);
  // Waits for every range given since the last finish() (running them now without overlap) and
  // returns the first error, naming the range.
  Status finish();

  comm::Communicator& comm() const { return comm_; }

 private:
  struct Job {
    float* data = nullptr;
    size_t n = 0;
    size_t index = 0;  // the range's position in the step, for errors
    std::shared_ptr<void> mark;
  };
  Status run(const Job& job);
  void worker_loop();

  comm::Communicator& comm_;
  FusedBackend& backend_;
  const bool overlap_;
  size_t next_index_ = 0;
  std::deque<Job> queue_;  // overlap: waiting for the worker; else: waiting for finish()
  size_t in_flight_ = 0;   // queued or running on the worker
  Status first_error_;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread worker_;
};

}  // namespace starling::models
