// ThreadGroup collectives with 1-4 ranks: bit-exact results on exact inputs, and errors (not
// hangs) for mismatched calls and missing ranks. Every test runs under a deadline.
#include "core/comm/thread_group.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

namespace starling::comm {
namespace {

using std::chrono::milliseconds;

// Runs fn(comm) on `n` threads, one per rank; fails (and aborts the group, so nothing hangs)
// if they are not all done within `deadline`. Returns each rank's status.
std::vector<Status> run_ranks(ThreadGroup& g, const std::function<Status(Communicator&)>& fn,
                              milliseconds deadline = milliseconds(5000)) {
  const int n = g.size();
  std::vector<std::future<Status>> futs;
  std::vector<std::thread> threads;
  std::vector<std::promise<Status>> proms(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    futs.push_back(proms[static_cast<size_t>(r)].get_future());
    threads.emplace_back([&g, &fn, &proms, r] {
      auto c = g.communicator(r);
      proms[static_cast<size_t>(r)].set_value(fn(*c));
    });
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  bool done = true;
  for (auto& f : futs) done = done && f.wait_until(until) == std::future_status::ready;
  if (!done) g.abort();
  for (auto& t : threads) t.join();
  REQUIRE(done);
  std::vector<Status> out;
  for (auto& f : futs) out.push_back(f.get());
  return out;
}

// Rank r's exact input: small integers and powers of two, so any summation order is exact.
std::vector<float> exact_input(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>((static_cast<int>(i) % 7) - 3 + r) * (i % 2 ? 0.5f : 4.0f);
  }
  return v;
}

TEST_CASE("all_reduce sum and avg are bit-exact on every rank") {
  const int n = GENERATE(1, 2, 3, 4);
  const size_t count = GENERATE(size_t{0}, size_t{1}, size_t{5}, size_t{1027});
  const bool avg = GENERATE(false, true);
  ThreadGroup g(n);
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  auto st = run_ranks(g, [&](Communicator& c) {
    auto v = exact_input(c.rank(), count);
    Status s = c.all_reduce(v, avg ? ReduceOp::kAvg : ReduceOp::kSum);
    got[static_cast<size_t>(c.rank())] = v;
    return s;
  });
  std::vector<float> want(count, 0.0f);
  for (int r = 0; r < n; ++r) {
    auto v = exact_input(r, count);
    for (size_t i = 0; i < count; ++i) want[i] += v[i];
  }
  if (avg) {
    for (auto& w : want) w /= static_cast<float>(n);
  }
  for (int r = 0; r < n; ++r) {
    INFO("ranks " << n << " rank " << r << " count " << count << " avg " << avg);
    REQUIRE(st[static_cast<size_t>(r)].ok());
    REQUIRE(got[static_cast<size_t>(r)] == want);  // bit-exact
  }
}

TEST_CASE("all_reduce is reproducible on inexact inputs across runs") {
  // Non-representable sums still give one answer: the order is fixed by rank, not by timing.
  const int n = 4;
  std::vector<float> first;
  for (int run = 0; run < 20; ++run) {
    ThreadGroup g(n);
    std::vector<float> r0;
    auto st = run_ranks(g, [&](Communicator& c) {
      std::vector<float> v(257);
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = 0.1f * static_cast<float>(c.rank() + 1) + 1e-7f * i;
      Status s = c.all_reduce(v, ReduceOp::kAvg);
      if (c.rank() == 0) r0 = v;
      return s;
    });
    for (auto& s : st) REQUIRE(s.ok());
    if (run == 0) first = r0;
    REQUIRE(r0 == first);
  }
}

TEST_CASE("broadcast, all_gather and barrier") {
  const int n = GENERATE(1, 2, 3, 4);
  ThreadGroup g(n);
  SECTION("broadcast from every root") {
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<float>> got(static_cast<size_t>(n));
      auto st = run_ranks(g, [&](Communicator& c) {
        auto v = exact_input(c.rank(), 33);
        Status s = c.broadcast(v, root);
        got[static_cast<size_t>(c.rank())] = v;
        return s;
      });
      for (int r = 0; r < n; ++r) {
        REQUIRE(st[static_cast<size_t>(r)].ok());
        REQUIRE(got[static_cast<size_t>(r)] == exact_input(root, 33));
      }
    }
  }
  SECTION("all_gather concatenates in rank order") {
    std::vector<std::vector<float>> got(static_cast<size_t>(n));
    auto st = run_ranks(g, [&](Communicator& c) {
      auto in = exact_input(c.rank(), 6);
      std::vector<float> out(6 * static_cast<size_t>(n), -1.0f);
      Status s = c.all_gather(in, out);
      got[static_cast<size_t>(c.rank())] = out;
      return s;
    });
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      auto v = exact_input(r, 6);
      want.insert(want.end(), v.begin(), v.end());
    }
    for (int r = 0; r < n; ++r) {
      REQUIRE(st[static_cast<size_t>(r)].ok());
      REQUIRE(got[static_cast<size_t>(r)] == want);
    }
  }
  SECTION("many collectives in a row") {
    auto st = run_ranks(g, [&](Communicator& c) -> Status {
      std::vector<float> v(9, 1.0f);
      for (int i = 0; i < 200; ++i) {
        RETURN_IF_ERROR(c.barrier());
        RETURN_IF_ERROR(c.all_reduce(v, ReduceOp::kAvg));
        RETURN_IF_ERROR(c.broadcast(v, i % c.size()));
      }
      for (float x : v) {
        if (x != 1.0f) return internal_error("drifted");
      }
      return ok_status();
    });
    for (auto& s : st) REQUIRE(s.ok());
  }
}

TEST_CASE("mismatched collectives fail on every rank without hanging") {
  ThreadGroup g(3, milliseconds(2000));
  SECTION("element counts differ") {
    auto st = run_ranks(g, [&](Communicator& c) {
      std::vector<float> v(c.rank() == 1 ? 4 : 5, 1.0f);
      return c.all_reduce(v, ReduceOp::kSum);
    });
    for (auto& s : st) {
      REQUIRE(s.code() == StatusCode::kInvalidArgument);
      REQUIRE(s.message().find("rank 1") != std::string::npos);
    }
  }
  SECTION("different collectives") {
    auto st = run_ranks(g, [&](Communicator& c) {
      std::vector<float> v(4, 1.0f);
      return c.rank() == 2 ? c.broadcast(v, 0) : c.all_reduce(v, ReduceOp::kSum);
    });
    for (auto& s : st) REQUIRE(s.code() == StatusCode::kInvalidArgument);
  }
  SECTION("all_gather output of the wrong size") {
    auto st = run_ranks(g, [&](Communicator& c) {
      std::vector<float> in(2, 1.0f), out(c.rank() == 0 ? 5 : 6);
      return c.all_gather(in, out);
    });
    for (auto& s : st) REQUIRE(s.code() == StatusCode::kInvalidArgument);
  }
  SECTION("broadcast root out of range") {
    auto st = run_ranks(g, [&](Communicator& c) {
      std::vector<float> v(2, 1.0f);
      return c.broadcast(v, 3);
    });
    for (auto& s : st) REQUIRE(s.code() == StatusCode::kInvalidArgument);
  }
  // The group is broken after an error: later collectives fail fast.
  auto st = run_ranks(g, [&](Communicator& c) { return c.barrier(); });
  for (auto& s : st) REQUIRE_FALSE(s.ok());
}

TEST_CASE("a rank that never arrives makes the others time out") {
  ThreadGroup g(3, milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  auto st = run_ranks(g, [&](Communicator& c) {
    std::vector<float> v(4, 1.0f);
    if (c.rank() == 2) return ok_status();  // skips the collective
    return c.all_reduce(v, ReduceOp::kSum);
  });
  REQUIRE(std::chrono::steady_clock::now() - t0 < milliseconds(2000));
  REQUIRE(st[0].code() == StatusCode::kDeadlineExceeded);
  REQUIRE(st[1].code() == StatusCode::kDeadlineExceeded);
  REQUIRE(st[2].ok());
}

TEST_CASE("abort fails a rank in or entering a collective") {
  ThreadGroup g(2, milliseconds(60000));
  auto st = run_ranks(g, [&](Communicator& c) {
    if (c.rank() == 1) {
      g.abort();  // whether rank 0 is already waiting or not, it must not wait for rank 1
      return ok_status();
    }
    return c.barrier();
  });
  REQUIRE(st[0].code() == StatusCode::kCancelled);
}

}  // namespace
}  // namespace starling::comm
