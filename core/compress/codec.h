// Codecs for model updates: a Codec encodes a flat float delta (with its per-tensor layout) into
// an EncodedUpdate; decode_add folds an encoded update into a dense sum without a dense copy.
// ErrorFeedback wraps any codec so that what was not sent this round is added to the next delta.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/spec.h"
#include "core/tensor/tensor.h"
#include "core/util/status.h"

namespace starling::v1 {
class EncodedUpdate;  // core/wire/codec.proto
class CodecSegment;
}  // namespace starling::v1

namespace starling::compress {

// One tensor of the flat update: elements [offset, offset + numel(shape)).
struct TensorInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;
};
// Tensors in offset order that tile [0, numel) exactly, without gaps or overlaps.
using Layout = std::vector<TensorInfo>;

// A layout of one unnamed vector of n elements.
Layout flat_layout(int64_t n);
// Checks that `layout` tiles [0, numel) in order; returns numel.
Result<int64_t> validate_layout(const Layout& layout);

// One tensor's encoding. Arrays are host-order (little-endian on the wire, see codec.proto).
// Error bounds, per element x of a tensor, for the decoded value y:
//   identity  y == x.
//   fp16      |y - x| <= 2^-11 |x| for 2^-14 <= |x| <= 65504, <= 2^-25 below; larger values
//             saturate to +-65504.
//   bf16      |y - x| <= 2^-8 |x| (normal floats).
//   int8      |y - x| <= absmax(block) / 254 (1 + 2^-20).
//   qsgd      E[y] == x; |y - x| <= ||bucket||_2 / levels (1 + 2^-20).
//   topk      y == x for the k largest |x| (ties: lowest index first), 0 elsewhere; approx keeps
//             a subset of those, at most k, all with |x| >= a threshold estimated from a sample.
//   randk     E[y] == x: one index drawn uniformly per stratum of size s ~ n/k, y = x * s there.
//   powersgd  y = P Q^T, exact for matrices of rank <= r; with the warm start the error falls
//             toward the best rank-r error over rounds. Vectors (1-D) and matrices where the
//             factors would not be smaller are sent as identity.
//   sign      y = sign(x) * mean(|x|) over the tensor (the sign bit: +0 gives +, -0 gives -).
// Sparse codecs' kept values are coded by `values`, adding that coding's bound.
struct Segment {
  CodecKind codec = CodecKind::kIdentity;
  int64_t offset = 0;
  int64_t numel = 0;
  Shape shape;
  int32_t block = 0;
  int32_t levels = 0;
  int64_t k = 0;
  int32_t rank = 0;
  uint64_t seed = 0;
  ValueCoding values = ValueCoding::kF32;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<int8_t> i8;
  std::vector<float> scales;
  std::vector<uint32_t> indices;
  std::vector<uint8_t> bits;

  // Payload bytes (what the wire carries besides a few header fields).
  size_t payload_bytes() const;
};

struct EncodedUpdate {
  int64_t numel = 0;
  std::vector<Segment> segments;

  size_t payload_bytes() const;
};

// Wire form (starling.v1.EncodedUpdate). parse_update returns DataLoss for bytes that are not a
// well-formed message (unknown codec ids, array lengths that are not whole elements); the
// semantic checks happen in decode_add.
std::string serialize_update(const EncodedUpdate& update);
Result<EncodedUpdate> parse_update(std::string_view bytes);
// The parsed wire message into `out`, reusing out's arrays (a receiver that keeps one
// EncodedUpdate allocates nothing once they are large enough). Same errors as parse_update.
Status update_from_message(const v1::EncodedUpdate& msg, EncodedUpdate& out);
// A segment's fields (codec, offset, numel, shape, block, levels, k, rank, seed, values) into
// `out`, its arrays left alone.
void segment_fields_to_message(const Segment& s, v1::CodecSegment* out);

// dst[i] = dst[i] + weight * y[i] for the decoded values y, each rounded once as written, so
// decode_add(u, d, w) is bit-identical to d[i] + w * decoded[i]. Sparse codecs touch only the
// elements they carry. The update is validated (sizes, index ranges, block counts, finite
// scales, level ranges) before dst is written: on error dst is unchanged. REQUIRES: dst.size()
// == update.numel, else InvalidArgument.
Status decode_add(const EncodedUpdate& update, std::span<float> dst, float weight);
// The checks decode_add makes of one segment on its own (sizes, index ranges, block counts,
// finite scales, level ranges); `index` names it in the error. Its offset is not checked.
Status check_segment(const Segment& s, size_t index);
// decode_add of one segment into dst, which holds its s.numel elements (dst[0] is element
// s.offset of the whole update). On error dst is unchanged.
Status decode_add_segment(const Segment& s, size_t index, std::span<float> dst, float weight);
// dst = decoded values (zero fill, then decode_add with weight 1).
Status decode(const EncodedUpdate& update, std::span<float> dst);

// Encodes deltas of a fixed layout. Codecs may keep state between calls (PowerSGD's warm start,
// the random streams of QSGD and random-k), so a Codec belongs to one sender. Thread-compatible.
class Codec {
 public:
  virtual ~Codec() = default;
  // Encodes `delta` (size numel of the layout) into `out`, reusing the capacity of its arrays
  // (a sender that keeps one EncodedUpdate allocates nothing after the first round). Non-finite
  // values are InvalidArgument (random-k checks only the values it samples); on error `out` holds
  // no meaningful update.
  virtual Status encode_into(std::span<const float> delta, EncodedUpdate& out) = 0;
  // encode_into a fresh EncodedUpdate.
  Result<EncodedUpdate> encode(std::span<const float> delta);
  virtual const Layout& layout() const = 0;
  // The state a sender must keep across a restart so that no part of an update is lost: the
  // error-feedback residual (numel floats), or nothing for codecs without one. Random streams
  // and warm starts are not part of it (a restarted sender re-seeds them).
  virtual std::span<const float> persistent_state() const { return {}; }
  // Restores what persistent_state() returned. InvalidArgument when the size does not match,
  // or when the codec keeps no state and `state` is not empty.
  virtual Status restore_state(std::span<const float> state);
};

// Per tensor, the codec spec_for(tensor name) chooses. When any chosen spec has ef=1 the result
// is an ErrorFeedback around it, keeping residuals for those tensors only. Random choices come
// from streams forked from `seed`, so two codecs made alike encode alike.
Result<std::unique_ptr<Codec>> make_codec(const CompressionSpec& spec, Layout layout,
                                          uint64_t seed);
// From the text form of parse_compression_spec, e.g. "topk:ratio=0.01,ef=1;*.bias=identity".
Result<std::unique_ptr<Codec>> make_codec(std::string_view spec, Layout layout, uint64_t seed);

// Error feedback (EF-SGD, EF21-style residual kept by the sender). encode(delta):
//   corrected[i] = delta[i] + residual[i]          (float)
//   sent         = inner.encode(corrected)
//   residual[i]  = corrected[i] - decode(sent)[i]  (float; 0 in tensors whose mask is 0)
// So decode(sent) + residual_new == delta + residual_old holds up to the rounding of those two
// float operations, and exactly whenever they are exact (e.g. fp16, bf16, int8, top-k).
class ErrorFeedback final : public Codec {
 public:
  // `mask` (one entry per tensor of inner's layout, or empty for all) marks the tensors that keep
  // a residual.
  ErrorFeedback(std::unique_ptr<Codec> inner, std::vector<uint8_t> mask);
  Status encode_into(std::span<const float> delta, EncodedUpdate& out) override;
  const Layout& layout() const override { return inner_->layout(); }
  std::span<const float> residual() const { return residual_; }
  std::span<const float> persistent_state() const override { return residual_; }
  // Non-finite residuals are InvalidArgument (a corrupt state must not poison every update).
  Status restore_state(std::span<const float> state) override;

 private:
  std::unique_ptr<Codec> inner_;
  std::vector<uint8_t> mask_;
  std::vector<float> residual_;
  std::vector<float> corrected_;
};

}  // namespace starling::compress
