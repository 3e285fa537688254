// Heartbeat-counter membership.
#include "gossip/membership.h"

#include <algorithm>

namespace starling::gossip {

Membership::Membership(std::string self_id, std::string self_address, uint64_t incarnation,
                       std::chrono::milliseconds fail_timeout)
    : self_id_(std::move(self_id)),
      self_address_(std::move(self_address)),
      incarnation_(incarnation),
      fail_timeout_(fail_timeout) {}

void Membership::tick() { ++heartbeat_; }

v1::GossipMembership Membership::view() const {
  v1::GossipMembership v;
  v1::GossipMember* self = v.add_members();
  self->set_node_id(self_id_);
  self->set_address(self_address_);
  self->set_incarnation(incarnation_);
  self->set_heartbeat(heartbeat_);
  self->set_left(self_left_);
  for (const auto& [id, m] : members_) {
    if (!m.alive && !m.left) continue;  // a silent death is each member's own finding
    v1::GossipMember* e = v.add_members();
    e->set_node_id(id);
    e->set_address(m.address);
    e->set_incarnation(m.incarnation);
    e->set_heartbeat(m.heartbeat);
    e->set_left(m.left);
  }
  return v;
}

std::vector<std::string> Membership::merge(const v1::GossipMembership& view, SteadyTime now) {
  std::vector<std::string> joined;
  for (const v1::GossipMember& e : view.members()) {
    if (e.node_id().empty() || e.node_id() == self_id_) continue;
    auto it = members_.find(e.node_id());
    if (it == members_.end()) {
      if (e.left()) {
        members_[e.node_id()] = {e.address(), e.incarnation(), e.heartbeat(), false, true, now};
        continue;
      }
      members_[e.node_id()] = {e.address(), e.incarnation(), e.heartbeat(), true, false, now};
      joined.push_back(e.node_id());
      continue;
    }
    MemberState& m = it->second;
    const bool newer = e.incarnation() > m.incarnation ||
                       (e.incarnation() == m.incarnation && e.heartbeat() > m.heartbeat);
    const bool leaves = e.left() && e.incarnation() >= m.incarnation && !m.left;
    if (!newer && !leaves) continue;
    const bool was_alive = m.alive;
    m.heartbeat =
        e.incarnation() > m.incarnation ? e.heartbeat() : std::max(m.heartbeat, e.heartbeat());
    m.address = e.address();
    m.incarnation = e.incarnation();
    m.left = e.left();
    m.alive = !e.left();
    m.updated = now;
    if (m.alive && !was_alive) joined.push_back(e.node_id());
  }
  return joined;
}

std::vector<std::string> Membership::expire(SteadyTime now) {
  std::vector<std::string> dropped;
  for (auto& [id, m] : members_) {
    if (m.alive && now - m.updated > fail_timeout_) {
      m.alive = false;
      dropped.push_back(id);
    }
  }
  return dropped;
}

std::vector<std::string> Membership::live_ids() const {
  std::vector<std::string> ids;
  if (!self_left_) ids.push_back(self_id_);
  for (const auto& [id, m] : members_) {
    if (m.alive) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::optional<std::string> Membership::address_of(const std::string& id) const {
  if (id == self_id_) return self_address_;
  auto it = members_.find(id);
  if (it == members_.end()) return std::nullopt;
  return it->second.address;
}

bool Membership::is_alive(const std::string& id) const {
  if (id == self_id_) return !self_left_;
  auto it = members_.find(id);
  return it != members_.end() && it->second.alive;
}

}  // namespace starling::gossip
