// The Hello exchange that opens every connection: building ours, checking the peer's against
// its verified certificate, and choosing a codec both sides decode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/net/tls.h"
#include "core/util/status.h"
#include "core/wire/messages.pb.h"

namespace starling::net {

// Our Hello, speaking wire::kProtocolVersion.
v1::Hello make_hello(const std::string& node_id, v1::Role role,
                     const std::vector<std::string>& codecs, uint32_t max_frame_bytes);

// OK when the peer speaks our protocol version, claims the node id of its certificate, and a
// role its certificate allows (server: aggregator, client: client, peer: peer). Otherwise
// FailedPrecondition (version) or PermissionDenied (identity), naming the peer.
Status check_hello(const v1::Hello& hello, const PeerIdentity& peer);

// Milliseconds since the Unix epoch, now.
uint64_t unix_now_ms();
// A Heartbeat stamped now: what keeps a quiet connection from the peer's idle deadline
// (Deadlines::idle).
v1::Envelope make_heartbeat();

// The first of `ours` that the peer also lists; NotFound when they share none.
Result<std::string> negotiate_codec(const std::vector<std::string>& ours, const v1::Hello& theirs);

}  // namespace starling::net
