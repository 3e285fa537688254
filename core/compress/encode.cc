// CPU encoders of one tensor: dense conversions, int8, QSGD, top-k (exact and sampled), random-k
// and sign. PowerSGD lives in powersgd.cc. Each encoder checks the values it reads for
// non-finite ones in the same pass that reads them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/compress/internal/kernels.h"

namespace starling::compress::internal {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;

Status nonfinite_error() { return invalid_argument("non-finite value in the update"); }

int64_t keep_count(int64_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::clamp<int64_t>(static_cast<int64_t>(k), 1, n);
}

// The k largest |x[cand[i]]| among candidates `cand` (index order kept), exact, ties by index.
void exact_topk(std::span<const float> x, int64_t k, std::vector<float>& scratch,
                std::vector<uint32_t>& cand, std::vector<uint32_t>& out) {
  out.clear();
  const int64_t m = static_cast<int64_t>(cand.size());
  if (k >= m) {
    out = cand;
    return;
  }
  scratch.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) scratch[static_cast<size_t>(i)] = std::fabs(x[cand[i]]);
  auto kth = scratch.begin() + (m - k);
  std::nth_element(scratch.begin(), kth, scratch.end());
  const float t = *kth;
  int64_t greater = 0;
  for (auto it = kth; it != scratch.end(); ++it) greater += *it > t ? 1 : 0;
  int64_t ties = k - greater;
  for (uint32_t i : cand) {
    const float a = std::fabs(x[i]);
    if (a > t || (a == t && ties-- > 0)) out.push_back(i);
  }
}

inline uint32_t abs_bits(float v) { return std::bit_cast<uint32_t>(v) & kAbsMask; }

}  // namespace

void encode_values(std::span<const float> v, ValueCoding coding, int block, Segment& seg) {
  seg.values = coding;
  switch (coding) {
    case ValueCoding::kF32:
      seg.f32.assign(v.begin(), v.end());
      break;
    case ValueCoding::kF16:
      seg.u16.resize(v.size());
      static_cast<void>(floats_to_f16(v, seg.u16.data()));
      break;
    case ValueCoding::kBf16:
      seg.u16.resize(v.size());
      static_cast<void>(floats_to_bf16(v, seg.u16.data()));
      break;
    case ValueCoding::kInt8:
      seg.block = block;
      seg.i8.resize(v.size());
      seg.scales.resize((v.size() + static_cast<size_t>(block) - 1) / static_cast<size_t>(block));
      static_cast<void>(quantize_int8(v, block, seg.i8.data(), seg.scales.data()));
      break;
  }
}

void randk_indices(int64_t n, int64_t k, uint64_t seed, std::vector<uint32_t>& out) {
  out.resize(static_cast<size_t>(k));
  if (k == 0) return;
  const Strata s(n, k);
  Rng rng(seed);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t pick = static_cast<int64_t>(rng.below(static_cast<uint64_t>(s.size(j))));
    out[static_cast<size_t>(j)] = static_cast<uint32_t>(s.start(j) + pick);
  }
}

TensorEncoder::TensorEncoder(CodecSpec spec, TensorInfo info, Rng rng)
    : spec_(spec), info_(std::move(info)), rng_(rng) {}

Status TensorEncoder::encode(std::span<const float> x, Segment& seg) {
  const int64_t n = static_cast<int64_t>(x.size());
  // Reset every field. Arrays this codec fills keep their size (so a reused update is not
  // zero-filled again before being overwritten); the others are emptied.
  seg.block = seg.levels = seg.rank = 0;
  seg.k = 0;
  seg.seed = 0;
  seg.values = ValueCoding::kF32;
  const CodecKind kind = spec_.kind;
  const bool sparse = kind == CodecKind::kTopk || kind == CodecKind::kRandk;
  const ValueCoding vc = spec_.values;
  if (!(kind == CodecKind::kIdentity || kind == CodecKind::kPowerSgd ||
        (sparse && vc == ValueCoding::kF32))) {
    seg.f32.clear();
  }
  if (!(kind == CodecKind::kFp16 || kind == CodecKind::kBf16 ||
        (sparse && (vc == ValueCoding::kF16 || vc == ValueCoding::kBf16)))) {
    seg.u16.clear();
  }
  const bool int8_values = sparse && vc == ValueCoding::kInt8;
  if (!(kind == CodecKind::kInt8 || kind == CodecKind::kQsgd || int8_values)) seg.i8.clear();
  if (!(kind == CodecKind::kInt8 || kind == CodecKind::kQsgd || kind == CodecKind::kSign ||
        int8_values)) {
    seg.scales.clear();
  }
  if (kind != CodecKind::kTopk) seg.indices.clear();
  if (kind != CodecKind::kSign) seg.bits.clear();
  seg.offset = info_.offset;
  seg.numel = n;
  seg.shape = info_.shape;
  seg.codec = spec_.kind;
  switch (spec_.kind) {
    case CodecKind::kIdentity:
      seg.f32.resize(x.size());
      return copy_floats(x, seg.f32.data()) ? nonfinite_error() : ok_status();
    case CodecKind::kFp16:
      seg.u16.resize(x.size());
      return floats_to_f16(x, seg.u16.data()) ? nonfinite_error() : ok_status();
    case CodecKind::kBf16:
      seg.u16.resize(x.size());
      return floats_to_bf16(x, seg.u16.data()) ? nonfinite_error() : ok_status();
    case CodecKind::kInt8: {
      const size_t b = static_cast<size_t>(spec_.block);
      seg.block = spec_.block;
      seg.i8.resize(x.size());
      seg.scales.resize((x.size() + b - 1) / b);
      return quantize_int8(x, spec_.block, seg.i8.data(), seg.scales.data()) ? ok_status()
                                                                             : nonfinite_error();
    }
    case CodecKind::kQsgd: {
      const size_t b = static_cast<size_t>(spec_.bucket);
      const float s = static_cast<float>(spec_.levels);
      seg.block = spec_.bucket;
      seg.levels = spec_.levels;
      seg.i8.resize(x.size());
      seg.scales.resize((x.size() + b - 1) / b);
      for (size_t start = 0, blk = 0; start < x.size(); start += b, ++blk) {
        const size_t end = std::min(x.size(), start + b);
        double sq0 = 0.0, sq1 = 0.0;
        uint32_t bad = 0;
        size_t i = start;
        for (; i + 2 <= end; i += 2) {
          sq0 += static_cast<double>(x[i]) * x[i];
          sq1 += static_cast<double>(x[i + 1]) * x[i + 1];
          bad |= nonfinite(x[i]) | nonfinite(x[i + 1]);
        }
        for (; i < end; ++i) {
          sq0 += static_cast<double>(x[i]) * x[i];
          bad |= nonfinite(x[i]);
        }
        if (bad) return nonfinite_error();
        const float norm = static_cast<float>(std::sqrt(sq0 + sq1));
        seg.scales[blk] = norm;
        const float inv = norm > 0.0f ? s / norm : 0.0f;
        for (i = start; i < end; ++i) {
          const float r = std::min(std::fabs(x[i]) * inv, s);
          const float fl = static_cast<float>(static_cast<int>(r));
          const float level = fl + (rng_.uniform_f() < r - fl ? 1.0f : 0.0f);
          const int l = static_cast<int>(std::min(level, s));
          seg.i8[i] = static_cast<int8_t>(x[i] < 0.0f ? -l : l);
        }
      }
      return ok_status();
    }
    case CodecKind::kTopk:
      return encode_topk(x, seg);
    case CodecKind::kRandk: {
      const int64_t k = keep_count(n, spec_.ratio);
      seg.k = k;
      seg.seed = rng_.next_u64();
      randk_indices(n, k, seg.seed, picked_);
      scratch_.resize(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) scratch_[static_cast<size_t>(j)] = x[picked_[j]];
      if (has_nonfinite(scratch_)) return nonfinite_error();
      encode_values(scratch_, spec_.values, spec_.block, seg);
      return ok_status();
    }
    case CodecKind::kPowerSgd:
      return encode_powersgd(x, seg);
    case CodecKind::kSign: {
      seg.bits.resize((x.size() + 7) / 8);
      double sum = 0.0;
      if (sign_pack(x, seg.bits.data(), &sum)) return nonfinite_error();
      // The sign bit decides, so -0.0 decodes as -scale.
      seg.scales.assign(1, n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f);
      return ok_status();
    }
  }
  return internal_error("unhandled codec kind");
}

Status TensorEncoder::encode_topk(std::span<const float> x, Segment& seg) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t k = keep_count(n, spec_.ratio);
  seg.indices.clear();
  seg.indices.reserve(static_cast<size_t>(k));
  constexpr int64_t kMinSample = 256;
  const int64_t m =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(spec_.sample * static_cast<double>(n))),
                          std::min(n, kMinSample), n);
  if (!spec_.approx || m >= n || k == n) {
    // Exact: radix select on the bits of |x| (monotone in |x|). A histogram of the top 11 bits
    // finds the bin holding the k-th largest; selection inside that bin finds it exactly.
    constexpr int kShift = 20;
    std::array<int64_t, (kAbsMask >> kShift) + 1> hist{};
    uint32_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      bad |= nonfinite(x[i]);
      ++hist[abs_bits(x[i]) >> kShift];
    }
    if (bad) return nonfinite_error();
    if (k > 0) {
      int64_t above = 0;
      size_t bin = hist.size() - 1;
      while (above + hist[bin] < k) above += hist[bin--];
      bits_.clear();
      bits_.reserve(static_cast<size_t>(hist[bin]));
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t a = abs_bits(x[i]);
        if ((a >> kShift) == bin) bits_.push_back(a);
      }
      const int64_t want = k - above;  // 1 ..= hist[bin]
      auto kth = bits_.end() - want;
      std::nth_element(bits_.begin(), kth, bits_.end());
      const uint32_t t = *kth;
      int64_t greater = above;
      for (auto it = kth; it != bits_.end(); ++it) greater += *it > t ? 1 : 0;
      int64_t ties = k - greater;
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t a = abs_bits(x[i]);
        if (a > t || (a == t && ties-- > 0)) seg.indices.push_back(static_cast<uint32_t>(i));
      }
    }
  } else {
    // Deep Gradient Compression: the threshold is a quantile of a random sample, taken about
    // three standard errors low so that usually more than k elements pass; the exact top-k of
    // those is then kept (DGC's hierarchical second stage).
    scratch_.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      scratch_[static_cast<size_t>(i)] = std::fabs(x[rng_.below(static_cast<uint64_t>(n))]);
    }
    const double expected =
        static_cast<double>(k) * static_cast<double>(m) / static_cast<double>(n);
    const int64_t ks = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(expected + 3.0 * std::sqrt(expected) + 2.0)), 1, m);
    if (has_nonfinite(scratch_)) return nonfinite_error();
    auto kth = scratch_.begin() + (m - ks);
    std::nth_element(scratch_.begin(), kth, scratch_.end());
    const uint32_t t = abs_bits(*kth);
    picked_.clear();
    uint32_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      bad |= nonfinite(x[i]);
      if (abs_bits(x[i]) >= t) picked_.push_back(static_cast<uint32_t>(i));
    }
    if (bad) return nonfinite_error();
    exact_topk(x, k, scratch_, picked_, seg.indices);
  }
  seg.k = static_cast<int64_t>(seg.indices.size());
  scratch_.resize(seg.indices.size());
  for (size_t j = 0; j < seg.indices.size(); ++j) scratch_[j] = x[seg.indices[j]];
  encode_values(std::span<const float>(scratch_.data(), seg.indices.size()), spec_.values,
                spec_.block, seg);
  return ok_status();
}

}  // namespace starling::compress::internal
