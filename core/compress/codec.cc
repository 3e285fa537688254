// The per-tensor codec behind make_codec, and the error-feedback wrapper.
#include "core/compress/codec.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/compress/internal/kernels.h"

namespace starling::compress {
namespace {

// One TensorEncoder per tensor of the layout, each on its own random stream.
class PerTensorCodec final : public Codec {
 public:
  PerTensorCodec(Layout layout, int64_t numel, std::vector<internal::TensorEncoder> encoders)
      : layout_(std::move(layout)), numel_(numel), encoders_(std::move(encoders)) {}

  Status encode_into(std::span<const float> delta, EncodedUpdate& out) override {
    if (static_cast<int64_t>(delta.size()) != numel_) {
      return invalid_argument("encode: delta has " + std::to_string(delta.size()) +
                              " elements, layout " + std::to_string(numel_));
    }
    out.numel = numel_;
    out.segments.resize(layout_.size());
    for (size_t t = 0; t < layout_.size(); ++t) {
      const TensorInfo& info = layout_[t];
      const auto x = delta.subspan(static_cast<size_t>(info.offset),
                                   static_cast<size_t>(shape_numel(info.shape)));
      RETURN_IF_ERROR(encoders_[t].encode(x, out.segments[t]), "encode '" + info.name + "'");
    }
    return ok_status();
  }

  const Layout& layout() const override { return layout_; }

 private:
  Layout layout_;
  int64_t numel_;
  std::vector<internal::TensorEncoder> encoders_;
};

}  // namespace

Layout flat_layout(int64_t n) { return {TensorInfo{"", Shape{n}, 0}}; }

Result<int64_t> validate_layout(const Layout& layout) {
  int64_t next = 0;
  for (const TensorInfo& t : layout) {
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
        return invalid_argument("layout: tensor '" + t.name + "' has a bad shape");
      }
    }
    if (t.offset != next) {
      return invalid_argument("layout: tensor '" + t.name + "' starts at " +
                              std::to_string(t.offset) + ", expected " + std::to_string(next) +
                              " (tensors must tile the update in order)");
    }
    if (n > (int64_t{1} << 32) - 1) {
      return invalid_argument("layout: tensor '" + t.name + "' exceeds 2^32 - 1 elements");
    }
    next += n;
  }
  return next;
}

size_t Segment::payload_bytes() const {
  return f32.size() * 4 + u16.size() * 2 + i8.size() + scales.size() * 4 + indices.size() * 4 +
         bits.size() + (codec == CodecKind::kRandk ? sizeof(seed) : 0);
}

size_t EncodedUpdate::payload_bytes() const {
  size_t total = 0;
  for (const Segment& s : segments) total += s.payload_bytes();
  return total;
}

Result<std::unique_ptr<Codec>> make_codec(const CompressionSpec& spec, Layout layout,
                                          uint64_t seed) {
  ASSIGN_OR_RETURN(const int64_t numel, validate_layout(layout), "make_codec");
  const Rng root(seed);
  std::vector<internal::TensorEncoder> encoders;
  encoders.reserve(layout.size());
  bool any_ef = false;
  std::vector<uint8_t> mask(layout.size(), 0);
  for (size_t t = 0; t < layout.size(); ++t) {
    const CodecSpec& s = spec.spec_for(layout[t].name);
    RETURN_IF_ERROR(validate_codec_spec(s), "make_codec: tensor '" + layout[t].name + "'");
    encoders.emplace_back(s, layout[t], root.fork(t));
    mask[t] = s.error_feedback ? 1 : 0;
    any_ef = any_ef || s.error_feedback;
  }
  std::unique_ptr<Codec> codec =
      std::make_unique<PerTensorCodec>(std::move(layout), numel, std::move(encoders));
  if (!any_ef) return codec;
  return std::unique_ptr<Codec>(std::make_unique<ErrorFeedback>(std::move(codec), std::move(mask)));
}

Result<std::unique_ptr<Codec>> make_codec(std::string_view spec, Layout layout, uint64_t seed) {
  ASSIGN_OR_RETURN(CompressionSpec cs, parse_compression_spec(spec));
  return make_codec(cs, std::move(layout), seed);
}

ErrorFeedback::ErrorFeedback(std::unique_ptr<Codec> inner, std::vector<uint8_t> mask)
    : inner_(std::move(inner)), mask_(std::move(mask)) {
  auto numel = validate_layout(inner_->layout());
  const size_t n = numel.ok() ? static_cast<size_t>(*numel) : 0;
  residual_.assign(n, 0.0f);
  corrected_.assign(n, 0.0f);
  if (mask_.size() != inner_->layout().size()) mask_.assign(inner_->layout().size(), 1);
}

Result<EncodedUpdate> Codec::encode(std::span<const float> delta) {
  EncodedUpdate out;
  RETURN_IF_ERROR(encode_into(delta, out));
  return out;
}

Status Codec::restore_state(std::span<const float> state) {
  if (state.empty()) return ok_status();
  return invalid_argument("this codec keeps no state, but " + std::to_string(state.size()) +
                          " values were given to restore");
}

Status ErrorFeedback::restore_state(std::span<const float> state) {
  if (state.size() != residual_.size()) {
    return invalid_argument("error feedback: saved residual has " + std::to_string(state.size()) +
                            " elements, the layout " + std::to_string(residual_.size()));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (!std::isfinite(state[i])) {
      return invalid_argument("error feedback: saved residual element " + std::to_string(i) +
                              " is not finite");
    }
  }
  std::copy(state.begin(), state.end(), residual_.begin());
  return ok_status();
}

Status ErrorFeedback::encode_into(std::span<const float> delta, EncodedUpdate& sent) {
  if (delta.size() != residual_.size()) {
    return invalid_argument("error feedback: delta has " + std::to_string(delta.size()) +
                            " elements, residual " + std::to_string(residual_.size()));
  }
  for (size_t i = 0; i < delta.size(); ++i) corrected_[i] = delta[i] + residual_[i];
  RETURN_IF_ERROR(inner_->encode_into(corrected_, sent), "error feedback");
  // residual = corrected - decoded, as decode_add(-1) rounds it: corrected + (-1 * decoded),
  // computed in place; the old residual's buffer takes the next round's corrected delta.
  RETURN_IF_ERROR(decode_add(sent, corrected_, -1.0f), "error feedback");
  std::swap(residual_, corrected_);
  const Layout& layout = inner_->layout();
  for (size_t t = 0; t < layout.size(); ++t) {
    if (mask_[t]) continue;
    const auto begin = residual_.begin() + layout[t].offset;
    std::fill(begin, begin + shape_numel(layout[t].shape), 0.0f);
  }
  return ok_status();
}

}  // namespace starling::compress
