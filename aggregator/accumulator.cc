// Validation and folding of client updates.
#include "aggregator/accumulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "aggregator/stream_fold.h"
#include "core/wire/codec.pb.h"

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

UpdateAccumulator::UpdateAccumulator(int64_t numel, AggregationRule rule)
    : sum_(static_cast<size_t>(numel), 0.0f),
      rule_(rule),
      wire_(std::make_unique<v1::EncodedUpdate>()) {}
UpdateAccumulator::~UpdateAccumulator() = default;
UpdateAccumulator::UpdateAccumulator(UpdateAccumulator&&) noexcept = default;
UpdateAccumulator& UpdateAccumulator::operator=(UpdateAccumulator&&) noexcept = default;

std::vector<size_t> krum_select(const std::vector<std::vector<float>>& updates, int f, int m) {
  const size_t n = updates.size();
  // Pairwise squared distances in double: the scores of far-away outliers must not overflow.
  std::vector<double> d2(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      double s = 0.0;
      const auto& a = updates[i];
      const auto& b = updates[j];
      for (size_t k = 0; k < a.size(); ++k) {
        const double d = static_cast<double>(a[k]) - static_cast<double>(b[k]);
        s += d * d;
      }
      d2[i * n + j] = d2[j * n + i] = s;
    }
  }
  const long long nearest_wanted = static_cast<long long>(n) - f - 2;
  const size_t nearest = static_cast<size_t>(std::clamp<long long>(
      nearest_wanted, 1, std::max<long long>(1, static_cast<long long>(n) - 1)));
  std::vector<double> score(n, 0.0);
  std::vector<double> row;
  for (size_t i = 0; i < n; ++i) {
    row.clear();
    for (size_t j = 0; j < n; ++j) {
      if (j != i) row.push_back(d2[i * n + j]);
    }
    const size_t take = std::min(nearest, row.size());
    std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(take), row.end());
    for (size_t k = 0; k < take; ++k) score[i] += row[k];
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return score[a] < score[b]; });
  order.resize(std::clamp<size_t>(static_cast<size_t>(std::max(m, 1)), 1, n));
  return order;
}

bool segment_is_finite(const compress::Segment& s) {
  return all_finite(s.f32) && all_finite(s.scales) && all_finite_half(s.u16, segment_is_bf16(s));
}

bool update_is_finite(const compress::EncodedUpdate& update) {
  return std::all_of(update.segments.begin(), update.segments.end(),
                     [](const compress::Segment& s) { return segment_is_finite(s); });
}

// fold_stream's body; `fold(sum, weight, options)` folds the stream into `sum`.
template <typename FoldInto>
Status UpdateAccumulator::fold_stream_with(float weight, FoldInto&& fold) {
  if (rule_.rule == RobustRule::kMean) {
    MemorySum sum(sum_);
    StreamFoldOptions opt;
    opt.clip_norm = rule_.clip_norm;
    opt.threads = rule_.fold_threads;
    ASSIGN_OR_RETURN(const StreamFoldResult r, fold(sum, weight, opt));
    if (r.clipped) ++clipped_;
    total_ += weight;
    ++count_;
    return ok_status();
  }
  if (!(weight > 0.0f) || !std::isfinite(weight)) {
    return invalid_argument("update weight " + std::to_string(weight) + " is not positive");
  }
  scratch_.assign(sum_.size(), 0.0f);
  MemorySum decoded(scratch_);
  StreamFoldOptions opt;
  opt.threads = rule_.fold_threads;
  RETURN_IF_ERROR(fold(decoded, 1.0f, opt).status());
  return fold_decoded(weight);
}

Status UpdateAccumulator::fold_stream(const compress::ReadAt& read, uint64_t total_bytes,
                                      float weight) {
  return fold_stream_with(weight, [&](SumWindows& sum, float w, const StreamFoldOptions& opt) {
    return fold_update_stream(read, total_bytes, sum, w, opt);
  });
}

Status UpdateAccumulator::fold_payload(std::string_view bytes, float weight) {
  if (compress::is_update_stream(bytes)) {
    return fold_stream_with(weight, [&](SumWindows& sum, float w, const StreamFoldOptions& opt) {
      return fold_update_stream(bytes, sum, w, opt);
    });
  }
  return fold_bytes(bytes, weight);
}

Status UpdateAccumulator::fold_bytes(std::string_view bytes, float weight) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !wire_->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return data_loss("malformed update: not a valid starling.v1.EncodedUpdate message");
  }
  RETURN_IF_ERROR(compress::update_from_message(*wire_, parsed_), "malformed update");
  return fold(parsed_, weight);
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
    total_ += weight;
    ++count_;
    return ok_status();
  }
  scratch_.resize(sum_.size());
  RETURN_IF_ERROR(compress::decode(update, scratch_), "update rejected");
  return fold_decoded(weight);
}

Status UpdateAccumulator::fold_decoded(float weight) {
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
  if (rule_.rule == RobustRule::kKrum || rule_.rule == RobustRule::kMultiKrum) {
    int m = 1;
    if (rule_.rule == RobustRule::kMultiKrum) {
      m = rule_.krum_m > 0 ? rule_.krum_m : static_cast<int>(n) - rule_.byzantine_f;
    }
    const auto chosen = krum_select(kept_, rule_.byzantine_f, m);
    excluded_ = static_cast<int>(n - chosen.size());
    for (size_t i = 0; i < sum_.size(); ++i) {
      double s = 0.0;
      for (size_t k : chosen) s += kept_[k][i];
      out[i] = static_cast<float>(s / static_cast<double>(chosen.size()));
    }
    return;
  }
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
  excluded_ = 0;
}

}  // namespace starling::aggregator
