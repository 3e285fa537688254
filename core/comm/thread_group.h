// ThreadGroup: a CPU Communicator for N ranks that are N threads of one process, sharing memory.
// It is how multi-rank logic (bucketed all-reduce, data-parallel steps) is tested without GPUs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"

namespace starling::comm {

// A group of `size` ranks. Create it once, hand communicator(r) to the thread of rank r.
// Every wait inside a collective is bounded by `timeout`; abort() wakes every waiter with an
// error. The group must outlive its communicators. Thread-safe.
class ThreadGroup {
 public:
  // REQUIRES: size >= 1.
  explicit ThreadGroup(int size,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const { return size_; }
  // The handle of rank `rank`. REQUIRES: 0 <= rank < size(); one handle per rank in use.
  std::unique_ptr<Communicator> communicator(int rank);
  // Breaks the group: every current and later collective returns Cancelled.
  void abort();
  // Breaks the group with `why` (e.g. the error that stopped one rank): every current and later
  // collective returns it, with the collective and rank added as context.
  void abort(Status why) { abort_with(std::move(why)); }

 private:
  friend class ThreadCommunicator;

  enum class Kind : uint8_t { kAllReduceSum, kAllReduceAvg, kBroadcast, kAllGather, kBarrier };
  // What one rank posted for the current collective.
  struct Slot {
    Kind kind = Kind::kBarrier;
    float* data = nullptr;       // all_reduce, broadcast: in place; all_gather: out
    const float* in = nullptr;   // all_gather
    size_t count = 0;            // all_reduce, broadcast: data; all_gather: in
    size_t out_count = 0;        // all_gather
    int root = 0;                // broadcast
    std::vector<float> partial;  // all_reduce: this rank's chunk of the reduced result
  };

  void abort_with(Status why);
  // Blocks until all ranks arrive (OK), or the deadline passes / the group breaks (error).
  Status arrive();
  // Checks that all posted slots describe the same collective; same answer on every rank.
  Status validate() const;

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<Slot> slots_;

  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  Status broken_status_;
};

}  // namespace starling::comm
