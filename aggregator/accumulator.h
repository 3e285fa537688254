// Streaming aggregation: each client update is validated and folded into one running weighted
// sum the moment it is complete, so memory is one model-sized vector however many clients report.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::aggregator {

// How updates are combined. kMean folds each update into a running weighted sum (memory: one
// model). kMedian (coordinate-wise, unweighted; Yin et al. 2018) and kTrimmedMean (per
// coordinate, drop the trim_fraction largest and smallest, average the rest, unweighted) must see
// every update, so they keep each decoded update until the round closes (memory: one model per
// update). clip_norm > 0 scales each update to L2 norm at most clip_norm before it is combined.
enum class RobustRule { kMean, kMedian, kTrimmedMean };
struct AggregationRule {
  RobustRule rule = RobustRule::kMean;
  double trim_fraction = 0.1;
  double clip_norm = 0.0;
};

// True when every value an update carries (dense, half-precision, sparse and scale arrays) is
// finite, so that decode_add cannot write a NaN or infinity into the sum.
bool update_is_finite(const compress::EncodedUpdate& update);

// sum = sum_k w_k decode(update_k), total = sum_k w_k. Not thread-safe.
class UpdateAccumulator {
 public:
  explicit UpdateAccumulator(int64_t numel, AggregationRule rule = {})
      : sum_(static_cast<size_t>(numel), 0.0f), rule_(rule) {}

  // Parses `bytes` (a serialized EncodedUpdate from an untrusted peer) and folds it with
  // weight `weight` via decode_add. On any error (malformed bytes, wrong size, non-finite
  // values, weight not positive and finite) the sum is unchanged and the error says why.
  Status fold_bytes(std::string_view bytes, float weight);
  Status fold(const compress::EncodedUpdate& update, float weight);

  // The combined update: sum / total for kMean, else the robust rule. REQUIRES: count() > 0.
  void mean_into(std::span<float> out) const;
  void reset();

  std::span<const float> sum() const { return sum_; }
  double total_weight() const { return total_; }
  int count() const { return count_; }
  int clipped() const { return clipped_; }  // updates scaled down by clip_norm

 private:
  std::vector<float> sum_;
  AggregationRule rule_;
  std::vector<float> scratch_;
  std::vector<std::vector<float>> kept_;  // robust rules only
  int clipped_ = 0;
  double total_ = 0.0;
  int count_ = 0;
};

}  // namespace starling::aggregator
