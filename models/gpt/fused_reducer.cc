#include "models/gpt/fused_reducer.h"

#include <span>
#include <string>

namespace starling::models {

GradientReducer::GradientReducer(comm::Communicator& comm, FusedBackend& backend, bool overlap)
    : comm_(comm), backend_(backend), overlap_(overlap) {
  if (overlap_) worker_ = std::thread([this] { worker_loop(); });
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Status GradientReducer::run(const Job& job) {
  backend_.wait_marked(job.mark);
  RETURN_IF_ERROR(comm_.all_reduce(std::span<float>(job.data, job.n), comm::ReduceOp::kAvg),
                  "averaging gradient range " + std::to_string(job.index) + " (" +
                      std::to_string(job.n) + " floats) over " + std::to_string(comm_.size()) +
                      " ranks");
  return ok_status();
}

void GradientReducer::ready(float* data, size_t n) {
  Job job{data, n, next_index_++, backend_.mark()};
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(job));
  if (overlap_) {
    ++in_flight_;
    cv_.notify_all();
  }
}

void GradientReducer::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    const Job job = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !first_error_.ok();  // after an error the step is lost: do not block on it
    lock.unlock();
    Status s = skip ? ok_status() : run(job);
    lock.lock();
    if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
    --in_flight_;
    cv_.notify_all();
  }
}

Status GradientReducer::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (overlap_) {
    cv_.wait(lock, [this] { return in_flight_ == 0; });
  } else {
    while (!queue_.empty()) {
      const Job job = std::move(queue_.front());
      queue_.pop_front();
      if (first_error_.ok()) {
        lock.unlock();
        Status s = run(job);
        lock.lock();
        if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
      }
    }
  }
  Status out = std::move(first_error_);
  first_error_ = ok_status();
  next_index_ = 0;
  return out;
}

}  // namespace starling::models
