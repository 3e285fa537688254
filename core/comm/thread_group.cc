// ThreadGroup: collectives over shared memory. Each collective is two rendezvous: after the
// first every rank can read every other rank's posted buffers; after the second every rank has
// finished reading them, so each may overwrite its own.
#include "core/comm/thread_group.h"

#include <cassert>
#include <cstring>
#include <string>

namespace starling::comm {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }

  Status all_reduce(std::span<float> data, ReduceOp op) override {
    ThreadGroup::Slot& s = post(op == ReduceOp::kSum ? ThreadGroup::Kind::kAllReduceSum
                                                     : ThreadGroup::Kind::kAllReduceAvg);
    s.data = data.data();
    s.count = data.size();
    return run(
        "all_reduce",
        [&] {
          // This rank reduces its chunk, adding ranks in order 0..N-1: the order never depends on
          // which thread arrived first.
          const int n = group_->size_;
          const size_t lo = data.size() * rank_ / n, hi = data.size() * (rank_ + 1) / n;
          s.partial.resize(hi - lo);
          for (size_t j = lo; j < hi; ++j) {
            float acc = group_->slots_[0].data[j];
            for (int k = 1; k < n; ++k) acc += group_->slots_[k].data[j];
            if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
            s.partial[j - lo] = acc;
          }
        },
        [&] {
          const int n = group_->size_;
          for (int k = 0; k < n; ++k) {
            const size_t lo = data.size() * k / n;
            const auto& p = group_->slots_[k].partial;
            if (!p.empty()) std::memcpy(data.data() + lo, p.data(), p.size() * sizeof(float));
          }
        });
  }

  Status broadcast(std::span<float> data, int root) override {
    ThreadGroup::Slot& s = post(ThreadGroup::Kind::kBroadcast);
    s.data = data.data();
    s.count = data.size();
    s.root = root;
    return run(
        "broadcast",
        [&] {
          if (rank_ != root && !data.empty()) {
            std::memcpy(data.data(), group_->slots_[root].data, data.size() * sizeof(float));
          }
        },
        [] {});
  }

  Status all_gather(std::span<const float> in, std::span<float> out) override {
    ThreadGroup::Slot& s = post(ThreadGroup::Kind::kAllGather);
    s.in = in.data();
    s.count = in.size();
    s.data = out.data();
    s.out_count = out.size();
    return run(
        "all_gather",
        [&] {
          for (int k = 0; k < group_->size_; ++k) {
            if (in.empty()) break;
            std::memcpy(out.data() + k * in.size(), group_->slots_[k].in,
                        in.size() * sizeof(float));
          }
        },
        [] {});
  }

  Status barrier() override {
    post(ThreadGroup::Kind::kBarrier);
    return run(
        "barrier", [] {}, [] {});
  }

 private:
  ThreadGroup::Slot& post(ThreadGroup::Kind kind) {
    ThreadGroup::Slot& s = group_->slots_[rank_];
    s.kind = kind;
    s.data = nullptr;
    s.in = nullptr;
    s.count = s.out_count = 0;
    s.root = 0;
    return s;
  }

  // read: runs between the rendezvous (may read every rank's slot); write: after the second
  // (may write this rank's own buffers). Both run only when the collective is consistent.
  template <typename Read, typename Write>
  Status run(const char* what, Read read, Write write) {
    const std::string ctx = std::string("comm: ") + what + " on rank " + std::to_string(rank_);
    RETURN_IF_ERROR(group_->arrive(), ctx);
    const Status valid = group_->validate();
    if (valid.ok()) read();
    RETURN_IF_ERROR(group_->arrive(), ctx);
    if (!valid.ok()) {
      group_->abort_with(valid.with_context("comm: group broken"));
      return valid.with_context(ctx);
    }
    write();
    return ok_status();
  }

  ThreadGroup* group_;
  int rank_;
};

ThreadGroup::ThreadGroup(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), slots_(static_cast<size_t>(size)) {
  assert(size >= 1);
}

ThreadGroup::~ThreadGroup() = default;

std::unique_ptr<Communicator> ThreadGroup::communicator(int rank) {
  assert(rank >= 0 && rank < size_);
  return std::make_unique<ThreadCommunicator>(this, rank);
}

void ThreadGroup::abort() { abort_with(Status(StatusCode::kCancelled, "comm: group aborted")); }

void ThreadGroup::abort_with(Status why) {
  std::lock_guard lk(mu_);
  if (broken_) return;
  broken_ = true;
  broken_status_ = std::move(why);
  cv_.notify_all();
}

Status ThreadGroup::arrive() {
  std::unique_lock lk(mu_);
  if (broken_) return broken_status_;
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return ok_status();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (generation_ == gen && !broken_) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && generation_ == gen && !broken_) {
      broken_ = true;
      broken_status_ = deadline_exceeded("not every rank arrived within " +
                                         std::to_string(timeout_.count()) + " ms");
      cv_.notify_all();
    }
  }
  if (generation_ != gen) return ok_status();
  return broken_status_;
}

Status ThreadGroup::validate() const {
  const Slot& a = slots_[0];
  for (int k = 0; k < size_; ++k) {
    const Slot& b = slots_[k];
    const std::string who = "rank " + std::to_string(k);
    if (b.kind != a.kind)
      return invalid_argument(who + " called a different collective than rank 0");
    if (b.count != a.count) {
      return invalid_argument(who + " passed " + std::to_string(b.count) + " elements, rank 0 " +
                              std::to_string(a.count));
    }
    if (b.kind == Kind::kAllGather && b.out_count != b.count * size_) {
      return invalid_argument(who + " all_gather output holds " + std::to_string(b.out_count) +
                              " elements, needs " + std::to_string(b.count * size_));
    }
    if (b.kind == Kind::kBroadcast && (b.root != a.root || b.root < 0 || b.root >= size_)) {
      return invalid_argument(who + " broadcast root " + std::to_string(b.root) +
                              " differs from rank 0's or is out of range");
    }
  }
  return ok_status();
}

}  // namespace starling::comm
