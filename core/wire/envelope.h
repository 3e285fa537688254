// Envelope encoding: the one place that turns protocol messages into frame payloads and back.
// Decoding treats its input as untrusted: any malformed payload is an error, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/messages.pb.h"

namespace starling::wire {

// Version spoken by this build; Hello.protocol_version carries it.
inline constexpr uint32_t kProtocolVersion = 1;

// The serialized envelope (frame payload, without the length header).
Result<std::string> encode_envelope(const v1::Envelope& envelope, uint32_t max_bytes);
// The whole frame (length header and envelope) in one buffer, ready to write.
Result<std::string> encode_framed_envelope(const v1::Envelope& envelope, uint32_t max_bytes);
// The same frame appended to `out` (whose capacity a caller may reuse); `out` is unchanged on
// error.
Status append_framed_envelope(std::string& out, const v1::Envelope& envelope, uint32_t max_bytes);
// Parses a frame payload. DataLoss on malformed bytes; Unimplemented when the body is a
// message type this build does not know (a newer peer); unknown fields are ignored.
Result<v1::Envelope> decode_envelope(std::string_view payload);
// Name of the body's message type ("hello", "chunk", ...), "none" when unset.
std::string_view body_name(const v1::Envelope& envelope);

}  // namespace starling::wire
