// Hello validation.
#include "core/net/hello.h"

#include <algorithm>
#include <chrono>

#include "core/wire/envelope.h"

namespace starling::net {

v1::Hello make_hello(const std::string& node_id, v1::Role role,
                     const std::vector<std::string>& codecs, uint32_t max_frame_bytes) {
  v1::Hello h;
  h.set_protocol_version(wire::kProtocolVersion);
  h.set_role(role);
  h.set_node_id(node_id);
  for (const auto& c : codecs) h.add_supported_codecs(c);
  h.set_max_frame_bytes(max_frame_bytes);
  return h;
}

Status check_hello(const v1::Hello& hello, const PeerIdentity& peer) {
  if (hello.protocol_version() != wire::kProtocolVersion) {
    return failed_precondition("peer " + peer.describe() + " speaks protocol version " +
                               std::to_string(hello.protocol_version()) + ", this node " +
                               std::to_string(wire::kProtocolVersion));
  }
  if (hello.node_id() != peer.node_id) {
    return permission_denied("peer " + peer.describe() + " claims to be '" + hello.node_id() +
                             "' but its certificate names '" + peer.node_id + "'");
  }
  // A leaf aggregator's certificate serves both faces of it: the aggregator its own clients
  // connect to, and the leaf that uploads to the tier above.
  const bool allowed = peer.role == "server"   ? hello.role() == v1::ROLE_AGGREGATOR
                       : peer.role == "client" ? hello.role() == v1::ROLE_CLIENT
                       : peer.role == "peer"   ? hello.role() == v1::ROLE_PEER
                       : peer.role == "leaf"
                           ? hello.role() == v1::ROLE_LEAF || hello.role() == v1::ROLE_AGGREGATOR
                           : false;
  if (hello.role() == v1::ROLE_UNSPECIFIED || !allowed) {
    return permission_denied("peer " + peer.describe() + " claims role " +
                             v1::Role_Name(hello.role()) + " but its certificate is for role '" +
                             peer.role + "'");
  }
  return ok_status();
}

Result<std::string> negotiate_codec(const std::vector<std::string>& ours, const v1::Hello& theirs) {
  for (const auto& c : ours) {
    if (std::find(theirs.supported_codecs().begin(), theirs.supported_codecs().end(), c) !=
        theirs.supported_codecs().end()) {
      return c;
    }
  }
  return not_found("no codec in common with '" + theirs.node_id() + "'");
}

uint64_t unix_now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

v1::Envelope make_heartbeat() {
  v1::Envelope e;
  e.mutable_heartbeat()->set_sent_unix_ms(unix_now_ms());
  return e;
}

}  // namespace starling::net
