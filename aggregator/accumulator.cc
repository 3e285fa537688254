// Validation and folding of client updates.
#include "aggregator/accumulator.h"

#include <algorithm>
#include <cmath>

namespace starling::aggregator {
namespace {

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// fp16 and bf16 both mark infinities and NaNs with an all-ones exponent.
bool all_finite_half(const std::vector<uint16_t>& v, bool bf16) {
  const uint16_t mask = bf16 ? 0x7F80 : 0x7C00;
  return std::all_of(v.begin(), v.end(), [mask](uint16_t x) { return (x & mask) != mask; });
}

bool segment_is_bf16(const compress::Segment& s) {
  using compress::CodecKind;
  using compress::ValueCoding;
  if (s.codec == CodecKind::kBf16) return true;
  if (s.codec == CodecKind::kTopk || s.codec == CodecKind::kRandk) {
    return s.values == ValueCoding::kBf16;
  }
  return false;
}

}  // namespace

bool update_is_finite(const compress::EncodedUpdate& update) {
  for (const auto& s : update.segments) {
    if (!all_finite(s.f32) || !all_finite(s.scales)) return false;
    if (!all_finite_half(s.u16, segment_is_bf16(s))) return false;
  }
  return true;
}

Status UpdateAccumulator::fold_bytes(std::string_view bytes, float weight) {
  ASSIGN_OR_RETURN(auto update, compress::parse_update(bytes), "malformed update");
  return fold(update, weight);
}

Status UpdateAccumulator::fold(const compress::EncodedUpdate& update, float weight) {
  if (!(weight > 0.0f) || !std::isfinite(weight)) {
    return invalid_argument("update weight " + std::to_string(weight) + " is not positive");
  }
  if (update.numel != static_cast<int64_t>(sum_.size())) {
    return invalid_argument("update of " + std::to_string(update.numel) +
                            " elements for a model of " + std::to_string(sum_.size()));
  }
  if (!update_is_finite(update)) return invalid_argument("update holds non-finite values");
  if (rule_.rule == RobustRule::kMean && rule_.clip_norm <= 0) {
    RETURN_IF_ERROR(compress::decode_add(update, sum_, weight), "update rejected");
  } else {
    scratch_.resize(sum_.size());
    RETURN_IF_ERROR(compress::decode(update, scratch_), "update rejected");
    double norm2 = 0.0;
    for (float v : scratch_) norm2 += static_cast<double>(v) * v;
    const double norm = std::sqrt(norm2);
    if (!std::isfinite(norm)) return invalid_argument("update norm overflows");
    float scale = 1.0f;
    if (rule_.clip_norm > 0 && norm > rule_.clip_norm) {
      scale = static_cast<float>(rule_.clip_norm / norm);
      ++clipped_;
    }
    if (rule_.rule == RobustRule::kMean) {
      const float w = weight * scale;
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += w * scratch_[i];
    } else {
      if (scale != 1.0f) {
        for (float& v : scratch_) v *= scale;
      }
      kept_.push_back(scratch_);
    }
  }
  total_ += weight;
  ++count_;
  return ok_status();
}

void UpdateAccumulator::mean_into(std::span<float> out) const {
  if (rule_.rule == RobustRule::kMean) {
    const auto total = static_cast<float>(total_);
    for (size_t i = 0; i < sum_.size(); ++i) out[i] = sum_[i] / total;
    return;
  }
  const size_t n = kept_.size();
  const size_t trim =
      rule_.rule == RobustRule::kTrimmedMean
          ? std::min((n - 1) / 2, static_cast<size_t>(rule_.trim_fraction * static_cast<double>(n)))
          : 0;
  std::vector<float> column(n);
  for (size_t i = 0; i < sum_.size(); ++i) {
    for (size_t k = 0; k < n; ++k) column[k] = kept_[k][i];
    std::sort(column.begin(), column.end());
    if (rule_.rule == RobustRule::kMedian) {
      out[i] = n % 2 ? column[n / 2] : 0.5f * (column[n / 2 - 1] + column[n / 2]);
    } else {
      double s = 0.0;
      for (size_t k = trim; k < n - trim; ++k) s += column[k];
      out[i] = static_cast<float>(s / static_cast<double>(n - 2 * trim));
    }
  }
}

void UpdateAccumulator::reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  kept_.clear();
  total_ = 0.0;
  count_ = 0;
  clipped_ = 0;
}

}  // namespace starling::aggregator
