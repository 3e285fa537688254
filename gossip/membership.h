// Gossip membership with heartbeat counters (van Renesse et al. 1998): every member advances its
// own counter each period and gossips its view; a member whose counter has not advanced for the
// failure timeout is dropped. A restarted member comes back with a higher incarnation. Pure
// logic over an injected clock, so tests drive it with a fake one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/wire/messages.pb.h"

namespace starling::gossip {

using SteadyTime = std::chrono::steady_clock::time_point;

struct MemberState {
  std::string address;  // host:port others dial
  uint64_t incarnation = 0;
  uint64_t heartbeat = 0;
  bool alive = true;
  bool left = false;
  SteadyTime updated{};  // when the heartbeat last advanced here
};

// Not thread-safe.
class Membership {
 public:
  // `incarnation` must grow across restarts of the same node (e.g. its start time in ms).
  Membership(std::string self_id, std::string self_address, uint64_t incarnation,
             std::chrono::milliseconds fail_timeout);

  // Advances our own heartbeat (call every heartbeat period).
  void tick();
  // Our view to gossip: every live member (ourselves included) and known leaves.
  v1::GossipMembership view() const;
  // Folds a peer's view in: a member is (re)learned, or refreshed, when it brings a higher
  // incarnation, or the same incarnation with a higher heartbeat. Entries about ourselves are
  // ignored. Returns the ids that became alive here.
  std::vector<std::string> merge(const v1::GossipMembership& view, SteadyTime now);
  // Drops members whose heartbeat has not advanced for the failure timeout; returns their ids.
  std::vector<std::string> expire(SteadyTime now);
  // Announces our leave in the next view().
  void leave() { self_left_ = true; }

  // Live members' ids, ourselves included, sorted: the order the topology is laid over.
  std::vector<std::string> live_ids() const;
  std::optional<std::string> address_of(const std::string& id) const;
  const std::string& self_id() const { return self_id_; }
  bool is_alive(const std::string& id) const;
  const std::map<std::string, MemberState>& members() const { return members_; }

 private:
  std::string self_id_;
  std::string self_address_;
  uint64_t incarnation_;
  uint64_t heartbeat_ = 0;
  bool self_left_ = false;
  std::chrono::milliseconds fail_timeout_;
  std::map<std::string, MemberState> members_;  // others, dead ones kept as tombstones
};

}  // namespace starling::gossip
