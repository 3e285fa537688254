// Link and device emulation: seeded, per client, with the documented arithmetic.
#include "sim/link.h"

#include <catch2/catch.hpp>

namespace starling::sim {
namespace {

TEST_CASE("client profiles are reproducible and spread around the median", "[sim]") {
  LinkOptions o;
  o.down_mbps = 80;
  o.up_mbps = 8;
  o.step_ms = 10;
  const LinkModel a(o, 5), b(o, 5), c(o, 6);
  double log_sum = 0;
  for (int k = 0; k < 2000; ++k) {
    const auto p = a.profile(k), q = b.profile(k);
    CHECK(p.down_bytes_per_s == q.down_bytes_per_s);
    CHECK(p.seconds_per_step == q.seconds_per_step);
    CHECK(p.down_bytes_per_s / p.up_bytes_per_s == Approx(10.0));
    CHECK(p.join_round == 1);
    log_sum += std::log(p.down_bytes_per_s / 10e6);
  }
  CHECK(std::fabs(log_sum / 2000) < 0.05);  // median 80 Mbit/s = 10 MB/s
  CHECK(a.profile(1).latency_s != c.profile(1).latency_s);
  CHECK(a.profile(1).latency_s != a.profile(2).latency_s);
}

TEST_CASE("availability traces: offline rounds, dropouts, late joiners, stragglers", "[sim]") {
  LinkOptions o;
  o.availability = 0.7;
  o.dropout = 0.2;
  o.late_join_fraction = 0.5;
  o.late_join_rounds = 10;
  o.straggler_fraction = 0.25;
  o.straggler_slowdown = 100;
  o.speed_spread = 0;
  const LinkModel m(o, 1);
  int online_r1 = 0, online_r20 = 0, drops = 0, late = 0, slow = 0;
  for (int k = 0; k < 4000; ++k) {
    online_r1 += m.available(k, 1);
    online_r20 += m.available(k, 20);
    drops += m.drops(k, 3, 0);
    const auto p = m.profile(k);
    late += p.join_round > 1;
    CHECK(p.join_round <= 11);
    CHECK_FALSE(m.available(k, p.join_round - 1));
    slow += p.seconds_per_step > 1.0;  // 20 ms * 100
    CHECK(m.available(k, 7) == m.available(k, 7));
  }
  CHECK(late == Approx(2000).margin(150));
  CHECK(online_r1 == Approx(0.5 * 0.7 * 4000).margin(150));
  CHECK(online_r20 == Approx(0.7 * 4000).margin(150));
  CHECK(drops == Approx(800).margin(100));
  CHECK(slow == Approx(1000).margin(100));
}

TEST_CASE("transfer time: latency plus bytes, plus a round trip per lost chunk", "[sim]") {
  LinkOptions o;
  const LinkModel clean(o, 1);
  CHECK(clean.transfer_seconds(0, 1, 0, 1'000'000, 4, 500'000.0, 0.05) == Approx(2.05));
  o.loss = 0.5;
  const LinkModel lossy(o, 1);
  const double t = lossy.transfer_seconds(0, 1, 0, 1'000'000, 4, 500'000.0, 0.05);
  CHECK(t == lossy.transfer_seconds(0, 1, 0, 1'000'000, 4, 500'000.0, 0.05));
  // Each resend costs a round trip (0.1 s) and a chunk (0.5 s).
  const double resends = (t - 2.05) / 0.6;
  CHECK(resends == Approx(std::round(resends)).margin(1e-9));
  double total = 0;
  for (int k = 0; k < 1000; ++k) total += lossy.transfer_seconds(k, 1, 1, 1'000'000, 4, 5e5, 0.05);
  // Expected resends per chunk with loss 1/2: 1, so 4 per transfer.
  CHECK(total / 1000 == Approx(2.05 + 4 * 0.6).epsilon(0.05));
}

}  // namespace
}  // namespace starling::sim
