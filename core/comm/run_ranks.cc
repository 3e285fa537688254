// run_ranks: one thread per rank; the first failing rank aborts the group with its error.
#include "core/comm/run_ranks.h"

#include <thread>

#include "core/comm/thread_group.h"

namespace starling::comm {

std::vector<Status> run_ranks(int n, std::chrono::milliseconds timeout,
                              const std::function<Status(Communicator& comm)>& fn) {
  ThreadGroup group(n, timeout);
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&group, &fn, &out, r] {
      auto comm = group.communicator(r);
      Status st = fn(*comm);
      if (!st.ok()) {
        group.abort(Status(StatusCode::kCancelled,
                           "rank " + std::to_string(r) + " stopped: " + st.message()));
      }
      out[static_cast<size_t>(r)] = std::move(st);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

Status first_error(const std::vector<Status>& statuses) {
  for (const auto& s : statuses) {
    if (!s.ok() && s.code() != StatusCode::kCancelled &&
        s.code() != StatusCode::kDeadlineExceeded) {
      return s;
    }
  }
  for (const auto& s : statuses) {
    if (!s.ok()) return s;
  }
  return ok_status();
}

}  // namespace starling::comm
