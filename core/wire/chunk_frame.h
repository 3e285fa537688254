// Chunk frames without protobuf copies: the bytes of a framed Envelope{chunk} written straight
// from a view of the payload, and parsed back as a view into the receive buffer. Both produce
// and accept exactly what the generated protobuf code does, so either side may use either path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/messages.pb.h"

namespace starling::wire {

// v1::Chunk whose data is borrowed: valid only as long as the bytes it points into.
struct ChunkView {
  uint64_t transfer_id = 0;
  uint64_t index = 0;
  std::string_view data;
  uint32_t crc32c = 0;  // of data
};

ChunkView view_of(const v1::Chunk& chunk);

// Size of the serialized Envelope{chunk} (without the frame header).
size_t chunk_envelope_size(const ChunkView& chunk);
// Appends the frame (4-byte length and Envelope{chunk}) to `out`; byte-identical to
// encode_framed_envelope() of the same message. InvalidArgument when the envelope exceeds
// max_bytes (then `out` is unchanged).
Status append_chunk_frame(std::string& out, const ChunkView& chunk, uint32_t max_bytes);

// The chunk of a frame payload that is a plain Envelope{chunk} (seq allowed, no unknown or
// repeated fields), as a view into `payload`; std::nullopt for anything else, including
// malformed bytes: decode_envelope() then gives the authoritative answer.
std::optional<ChunkView> parse_chunk_envelope(std::string_view payload);

}  // namespace starling::wire
