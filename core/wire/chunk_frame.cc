// Hand-written protobuf wire format for the one large message: Envelope field 14 (Chunk) with
// fields 1 transfer_id, 2 index (varints), 3 data (bytes), 4 crc32c (varint). proto3 leaves out
// fields holding their default, and the generated code writes fields in number order.
#include "core/wire/chunk_frame.h"

#include <array>

#include "core/wire/frame.h"

namespace starling::wire {
namespace {

constexpr uint32_t kEnvelopeSeq = 1;
constexpr uint32_t kEnvelopeChunk = 14;
constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;

constexpr uint8_t tag(uint32_t field, uint32_t wire_type) {
  return static_cast<uint8_t>((field << 3) | wire_type);
}

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void put_varint(std::string& out, uint64_t v) {
  std::array<char, 10> buf{};
  size_t n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out.append(buf.data(), n);
}

size_t chunk_body_size(const ChunkView& c) {
  size_t n = 0;
  if (c.transfer_id != 0) n += 1 + varint_size(c.transfer_id);
  if (c.index != 0) n += 1 + varint_size(c.index);
  if (!c.data.empty()) n += 1 + varint_size(c.data.size()) + c.data.size();
  if (c.crc32c != 0) n += 1 + varint_size(c.crc32c);
  return n;
}

// Reads one varint; false at the end of input or past 10 bytes.
bool get_varint(std::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80) == 0) return shift < 63 || b <= 1;
  }
  return false;
}

bool get_length_delimited(std::string_view& in, std::string_view& out) {
  uint64_t n = 0;
  if (!get_varint(in, n) || n > in.size()) return false;
  out = in.substr(0, n);
  in.remove_prefix(n);
  return true;
}

std::optional<ChunkView> parse_chunk_body(std::string_view in) {
  ChunkView c;
  unsigned seen = 0;
  while (!in.empty()) {
    uint64_t key = 0;
    if (!get_varint(in, key)) return std::nullopt;
    const uint64_t field = key >> 3;
    const uint64_t wire_type = key & 7;
    if (field < 1 || field > 4 || (seen & (1u << field)) != 0) return std::nullopt;
    seen |= 1u << field;
    if (field == 3) {
      if (wire_type != kLengthDelimited || !get_length_delimited(in, c.data)) return std::nullopt;
      continue;
    }
    uint64_t v = 0;
    if (wire_type != kVarint || !get_varint(in, v)) return std::nullopt;
    if (field == 1) c.transfer_id = v;
    if (field == 2) c.index = v;
    if (field == 4) {
      if (v > UINT32_MAX) return std::nullopt;
      c.crc32c = static_cast<uint32_t>(v);
    }
  }
  return c;
}

}  // namespace

ChunkView view_of(const v1::Chunk& chunk) {
  return ChunkView{chunk.transfer_id(), chunk.index(), chunk.data(), chunk.crc32c()};
}

size_t chunk_envelope_size(const ChunkView& chunk) {
  const size_t body = chunk_body_size(chunk);
  return 1 + varint_size(body) + body;
}

Status append_chunk_frame(std::string& out, const ChunkView& chunk, uint32_t max_bytes) {
  const size_t body = chunk_body_size(chunk);
  const size_t size = 1 + varint_size(body) + body;
  if (size > max_bytes) {
    return invalid_argument("chunk message of " + std::to_string(size) +
                            " bytes exceeds the frame limit of " + std::to_string(max_bytes));
  }
  out.reserve(out.size() + kFrameHeaderBytes + size);
  const auto n = static_cast<uint32_t>(size);
  const char header[kFrameHeaderBytes] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                                          static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(header, kFrameHeaderBytes);
  out.push_back(static_cast<char>(tag(kEnvelopeChunk, kLengthDelimited)));
  put_varint(out, body);
  if (chunk.transfer_id != 0) {
    out.push_back(static_cast<char>(tag(1, kVarint)));
    put_varint(out, chunk.transfer_id);
  }
  if (chunk.index != 0) {
    out.push_back(static_cast<char>(tag(2, kVarint)));
    put_varint(out, chunk.index);
  }
  if (!chunk.data.empty()) {
    out.push_back(static_cast<char>(tag(3, kLengthDelimited)));
    put_varint(out, chunk.data.size());
    out.append(chunk.data);
  }
  if (chunk.crc32c != 0) {
    out.push_back(static_cast<char>(tag(4, kVarint)));
    put_varint(out, chunk.crc32c);
  }
  return ok_status();
}

std::optional<ChunkView> parse_chunk_envelope(std::string_view payload) {
  std::optional<ChunkView> chunk;
  bool seen_seq = false;
  while (!payload.empty()) {
    uint64_t key = 0;
    if (!get_varint(payload, key)) return std::nullopt;
    if (key == tag(kEnvelopeSeq, kVarint) && !seen_seq) {
      uint64_t seq = 0;
      if (!get_varint(payload, seq)) return std::nullopt;
      seen_seq = true;
    } else if (key == tag(kEnvelopeChunk, kLengthDelimited) && !chunk) {
      std::string_view body;
      if (!get_length_delimited(payload, body)) return std::nullopt;
      chunk = parse_chunk_body(body);
      if (!chunk) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  return chunk;
}

}  // namespace starling::wire
