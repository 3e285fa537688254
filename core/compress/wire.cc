// EncodedUpdate <-> starling.v1.EncodedUpdate (core/wire/codec.proto): typed arrays become
// little-endian bytes fields and back.
#include <cstring>

#include "core/compress/codec.h"
#include "core/wire/codec.pb.h"

namespace starling::compress {
namespace {

template <typename T>
std::string to_bytes(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
Status from_bytes(const std::string& b, std::vector<T>& out, const char* field, int seg) {
  if (b.size() % sizeof(T) != 0) {
    return data_loss("segment " + std::to_string(seg) + ": field '" + field + "' has " +
                     std::to_string(b.size()) + " bytes, not a whole number of elements");
  }
  out.resize(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
  return ok_status();
}

}  // namespace

void segment_fields_to_message(const Segment& s, v1::CodecSegment* p) {
  p->set_codec(static_cast<v1::CodecId>(s.codec));
  p->set_offset(s.offset);
  p->set_numel(s.numel);
  for (int64_t d : s.shape) p->add_shape(d);
  p->set_block(s.block);
  p->set_levels(s.levels);
  p->set_k(s.k);
  p->set_rank(s.rank);
  p->set_seed(s.seed);
  p->set_values(static_cast<v1::ValueCodingId>(s.values));
}

std::string serialize_update(const EncodedUpdate& update) {
  v1::EncodedUpdate msg;
  msg.set_numel(update.numel);
  for (const Segment& s : update.segments) {
    v1::CodecSegment* p = msg.add_segments();
    segment_fields_to_message(s, p);
    p->set_f32(to_bytes(s.f32));
    p->set_u16(to_bytes(s.u16));
    p->set_i8(to_bytes(s.i8));
    p->set_scales(to_bytes(s.scales));
    p->set_indices(to_bytes(s.indices));
    p->set_bits(to_bytes(s.bits));
  }
  return msg.SerializeAsString();
}

Status update_from_message(const v1::EncodedUpdate& msg, EncodedUpdate& out) {
  out.numel = msg.numel();
  out.segments.resize(static_cast<size_t>(msg.segments_size()));
  for (int i = 0; i < msg.segments_size(); ++i) {
    const v1::CodecSegment& p = msg.segments(i);
    Segment& s = out.segments[static_cast<size_t>(i)];
    const int codec = static_cast<int>(p.codec());
    if (codec < static_cast<int>(CodecKind::kIdentity) ||
        codec > static_cast<int>(CodecKind::kSign)) {
      return data_loss("segment " + std::to_string(i) + ": unknown codec id " +
                       std::to_string(codec));
    }
    const int values = static_cast<int>(p.values());
    if (values < 0 || values > static_cast<int>(ValueCoding::kInt8)) {
      return data_loss("segment " + std::to_string(i) + ": unknown value coding " +
                       std::to_string(values));
    }
    s.codec = static_cast<CodecKind>(codec);
    s.values = static_cast<ValueCoding>(values);
    s.offset = p.offset();
    s.numel = p.numel();
    s.shape.assign(p.shape().begin(), p.shape().end());
    s.block = p.block();
    s.levels = p.levels();
    s.k = p.k();
    s.rank = p.rank();
    s.seed = p.seed();
    RETURN_IF_ERROR(from_bytes(p.f32(), s.f32, "f32", i));
    RETURN_IF_ERROR(from_bytes(p.u16(), s.u16, "u16", i));
    RETURN_IF_ERROR(from_bytes(p.i8(), s.i8, "i8", i));
    RETURN_IF_ERROR(from_bytes(p.scales(), s.scales, "scales", i));
    RETURN_IF_ERROR(from_bytes(p.indices(), s.indices, "indices", i));
    RETURN_IF_ERROR(from_bytes(p.bits(), s.bits, "bits", i));
  }
  return ok_status();
}

Result<EncodedUpdate> parse_update(std::string_view bytes) {
  v1::EncodedUpdate msg;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return data_loss("encoded update: not a valid starling.v1.EncodedUpdate message");
  }
  EncodedUpdate out;
  RETURN_IF_ERROR(update_from_message(msg, out));
  return out;
}

}  // namespace starling::compress
