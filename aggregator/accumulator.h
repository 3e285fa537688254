// Streaming aggregation: each client update is validated and folded into one running weighted
// sum the moment it is complete, so memory is one model-sized vector however many clients report.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/compress/update_stream.h"
#include "core/util/status.h"

namespace starling::v1 {
class EncodedUpdate;
}

namespace starling::aggregator {

// How updates are combined. kMean folds each update into a running weighted sum (memory: one
// model). kMedian (coordinate-wise, unweighted; Yin et al. 2018) and kTrimmedMean (per
// coordinate, drop the trim_fraction largest and smallest, average the rest, unweighted) must see
// every update, so they keep each decoded update until the round closes (memory: one model per
// update). kKrum / kMultiKrum (Blanchard et al. 2017) keep every update too: each update i is
// scored by the sum of squared L2 distances to its n - f - 2 nearest other updates (f =
// byzantine_f, the number of Byzantine clients tolerated), and the mean of the krum_m updates
// with the lowest scores is the result (Krum: krum_m = 1; Multi-Krum with krum_m = 0: n - f),
// unweighted; ties go to the update folded first. Krum's guarantee needs n >= 2f + 3 updates;
// with fewer, each update is scored against its max(1, n - f - 2) nearest (the config check
// keeps rounds from closing with fewer). clip_norm > 0 scales each update to L2 norm at most
// clip_norm before it is combined.
enum class RobustRule { kMean, kMedian, kTrimmedMean, kKrum, kMultiKrum };
struct AggregationRule {
  RobustRule rule = RobustRule::kMean;
  double trim_fraction = 0.1;
  double clip_norm = 0.0;
  int byzantine_f = 0;  // kKrum, kMultiKrum
  int krum_m = 0;       // kMultiKrum: updates averaged; 0: n - f
  // Threads a streamed update is checked and folded with (aggregator/stream_fold.h): the sum
  // is bit-identical for any count.
  int fold_threads = 1;
};

// Krum / Multi-Krum selection over `updates` (each of the same size): the indices of the
// `m` updates with the lowest Krum scores, lowest score first (ties: lower index first).
// m is clamped to [1, n]. REQUIRES: !updates.empty().
std::vector<size_t> krum_select(const std::vector<std::vector<float>>& updates, int f, int m);

// True when every value an update carries (dense, half-precision, sparse and scale arrays) is
// finite, so that decode_add cannot write a NaN or infinity into the sum.
bool update_is_finite(const compress::EncodedUpdate& update);
bool segment_is_finite(const compress::Segment& segment);

// sum = sum_k w_k decode(update_k), total = sum_k w_k. Not thread-safe. Move-only: it keeps
// the buffers of the last parsed update, so that parsing the next one of the same shape
// allocates nothing (fresh allocations of model-sized buffers cost more than the parse itself).
class UpdateAccumulator {
 public:
  explicit UpdateAccumulator(int64_t numel, AggregationRule rule = {});
  ~UpdateAccumulator();
  UpdateAccumulator(UpdateAccumulator&&) noexcept;
  UpdateAccumulator& operator=(UpdateAccumulator&&) noexcept;

  // Parses `bytes` (a serialized EncodedUpdate from an untrusted peer) and folds it with
  // weight `weight` via decode_add. On any error (malformed bytes, wrong size, non-finite
  // values, weight not positive and finite) the sum is unchanged and the error says why.
  Status fold_bytes(std::string_view bytes, float weight);
  // The same for an update stream (core/compress/update_stream.h) of `total_bytes` that `read`
  // serves, folded a window at a time (aggregator/stream_fold.h); the robust rules decode it
  // into one model-sized vector as fold() does.
  Status fold_stream(const compress::ReadAt& read, uint64_t total_bytes, float weight);
  // fold_stream for bytes that start with the stream magic (read in place, not copied), else
  // fold_bytes.
  Status fold_payload(std::string_view bytes, float weight);
  Status fold(const compress::EncodedUpdate& update, float weight);

  // The combined update: sum / total for kMean, else the robust rule. REQUIRES: count() > 0.
  void mean_into(std::span<float> out) const;
  void reset();

  std::span<const float> sum() const { return sum_; }
  // The sum's storage, for a server that turns it into the round's step in place (mean_into
  // may write into it too) rather than keep a second model-sized vector; reset() before the
  // next fold.
  std::span<float> mutable_sum() { return sum_; }
  double total_weight() const { return total_; }
  int count() const { return count_; }
  int clipped() const { return clipped_; }  // updates scaled down by clip_norm
  // kKrum / kMultiKrum: updates left out of the last mean_into (0 for the other rules).
  int excluded() const { return excluded_; }

 private:
  // Folds scratch_ (one decoded update) under the clip and robust rules.
  Status fold_decoded(float weight);
  // fold_stream and fold_payload: `fold(sum, weight, options)` folds one stream into a sum.
  template <typename FoldInto>
  Status fold_stream_with(float weight, FoldInto&& fold);

  std::vector<float> sum_;
  AggregationRule rule_;
  std::vector<float> scratch_;
  // fold_bytes: the wire message and the parsed update, reused across calls.
  std::unique_ptr<v1::EncodedUpdate> wire_;
  compress::EncodedUpdate parsed_;
  std::vector<std::vector<float>> kept_;  // robust rules only
  int clipped_ = 0;
  mutable int excluded_ = 0;
  double total_ = 0.0;
  int count_ = 0;
};

}  // namespace starling::aggregator
