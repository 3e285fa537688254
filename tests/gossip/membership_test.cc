// Membership: joins through peer-list exchange, heartbeats, failure detection on a fake clock,
// leave, and rejoin with a new incarnation.
#include "gossip/membership.h"

#include <catch2/catch.hpp>

using namespace starling;
using namespace starling::gossip;
using std::chrono::milliseconds;

TEST_CASE("membership: join, heartbeat, timeout, rejoin and leave", "[gossip]") {
  const SteadyTime t0{};
  Membership a("a", "h:1", 100, milliseconds(1000));
  Membership b("b", "h:2", 100, milliseconds(1000));
  Membership c("c", "h:3", 100, milliseconds(1000));

  // c knows only b, b knows a: the peer-list exchange spreads everyone.
  REQUIRE(b.merge(a.view(), t0) == std::vector<std::string>{"a"});
  REQUIRE(c.merge(b.view(), t0) == std::vector<std::string>{"b", "a"});
  REQUIRE(c.live_ids() == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(c.address_of("a") == "h:1");

  // a keeps beating, b falls silent: c drops b after the timeout, not before.
  for (int step = 1; step <= 5; ++step) {
    a.tick();
    const auto now = t0 + milliseconds(300 * step);
    REQUIRE(c.merge(a.view(), now).empty());
    const auto dropped = c.expire(now);
    if (step < 4) REQUIRE(dropped.empty());
    if (step == 4) REQUIRE(dropped == std::vector<std::string>{"b"});
  }
  REQUIRE(c.live_ids() == std::vector<std::string>{"a", "c"});
  REQUIRE_FALSE(c.is_alive("b"));

  // Stale gossip about b (same incarnation, no newer heartbeat) does not revive it.
  Membership stale("d", "h:4", 1, milliseconds(1000));
  REQUIRE(stale.merge(b.view(), t0).size() == 2);
  REQUIRE(c.merge(stale.view(), t0 + milliseconds(1600)) == std::vector<std::string>{"d"});
  REQUIRE_FALSE(c.is_alive("b"));

  // b restarts: a higher incarnation brings it back, at its new address.
  Membership b2("b", "h:22", 200, milliseconds(1000));
  REQUIRE(c.merge(b2.view(), t0 + milliseconds(1700)) == std::vector<std::string>{"b"});
  REQUIRE(c.address_of("b") == "h:22");

  // A clean leave is gossiped and drops the member at once.
  b2.leave();
  REQUIRE(b2.live_ids() == std::vector<std::string>{});
  REQUIRE(c.merge(b2.view(), t0 + milliseconds(1800)).empty());
  REQUIRE_FALSE(c.is_alive("b"));
  // Entries about ourselves are never taken from others.
  Membership liar("x", "h:9", 1, milliseconds(1000));
  liar.merge(c.view(), t0);
  REQUIRE(c.merge(liar.view(), t0) == std::vector<std::string>{"x"});
  REQUIRE(c.is_alive("c"));
}
