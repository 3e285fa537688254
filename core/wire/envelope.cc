// Envelope encoding and validation.
#include "core/wire/envelope.h"

#include <limits>
#include <string>

#include "core/wire/frame.h"

namespace starling::wire {
namespace {

Status check_size(const v1::Envelope& envelope, size_t size, uint32_t max_bytes) {
  if (size <= max_bytes) return ok_status();
  return invalid_argument(std::string(body_name(envelope)) + " message of " + std::to_string(size) +
                          " bytes exceeds the frame limit of " + std::to_string(max_bytes));
}

}  // namespace

Result<std::string> encode_envelope(const v1::Envelope& envelope, uint32_t max_bytes) {
  const size_t size = envelope.ByteSizeLong();
  RETURN_IF_ERROR(check_size(envelope, size, max_bytes));
  std::string out;
  if (!envelope.SerializeToString(&out)) return internal_error("cannot serialize envelope");
  return out;
}

Result<std::string> encode_framed_envelope(const v1::Envelope& envelope, uint32_t max_bytes) {
  std::string out;
  RETURN_IF_ERROR(append_framed_envelope(out, envelope, max_bytes));
  return out;
}

Status append_framed_envelope(std::string& out, const v1::Envelope& envelope, uint32_t max_bytes) {
  const size_t size = envelope.ByteSizeLong();
  RETURN_IF_ERROR(check_size(envelope, size, max_bytes));
  const size_t start = out.size();
  out.resize(start + kFrameHeaderBytes + size);
  auto* p = reinterpret_cast<uint8_t*>(out.data() + start);
  const auto n = static_cast<uint32_t>(size);
  p[0] = static_cast<uint8_t>(n >> 24);
  p[1] = static_cast<uint8_t>(n >> 16);
  p[2] = static_cast<uint8_t>(n >> 8);
  p[3] = static_cast<uint8_t>(n);
  // ByteSizeLong() above cached the sizes this serializer relies on.
  envelope.SerializeWithCachedSizesToArray(p + kFrameHeaderBytes);
  return ok_status();
}

Result<v1::Envelope> decode_envelope(std::string_view payload) {
  if (payload.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return data_loss("envelope too large to parse");
  }
  v1::Envelope envelope;
  if (!envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return data_loss("malformed envelope (" + std::to_string(payload.size()) + " bytes)");
  }
  if (envelope.body_case() == v1::Envelope::BODY_NOT_SET) {
    return unimplemented("envelope carries no message type known to protocol version " +
                         std::to_string(kProtocolVersion));
  }
  return envelope;
}

std::string_view body_name(const v1::Envelope& envelope) {
  switch (envelope.body_case()) {
    case v1::Envelope::kHello:
      return "hello";
    case v1::Envelope::kRoundPlan:
      return "round_plan";
    case v1::Envelope::kModelDownload:
      return "model_download";
    case v1::Envelope::kUpdateUpload:
      return "update_upload";
    case v1::Envelope::kChunk:
      return "chunk";
    case v1::Envelope::kChunkAck:
      return "chunk_ack";
    case v1::Envelope::kAck:
      return "ack";
    case v1::Envelope::kError:
      return "error";
    case v1::Envelope::kHeartbeat:
      return "heartbeat";
    case v1::Envelope::kGossipExchange:
      return "gossip_exchange";
    case v1::Envelope::kGossipMembership:
      return "gossip_membership";
    case v1::Envelope::BODY_NOT_SET:
      return "none";
  }
  return "none";
}

}  // namespace starling::wire
