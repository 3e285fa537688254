// decode_add: validates every segment of an update before touching the destination, then adds
// weight * decoded value per element (sparse segments only where they carry values).
#include <algorithm>
#include <cmath>
#include <string>

#include "core/compress/internal/kernels.h"

namespace starling::compress {
namespace {

using internal::bf16_bits_to_float;
using internal::half_to_float;

Status bad(const Segment& s, size_t index, const std::string& what) {
  return data_loss("segment " + std::to_string(index) + " (" +
                   std::string(codec_kind_name(s.codec)) + "): " + what);
}

bool all_finite_nonneg(const std::vector<float>& v) {
  for (float f : v) {
    if (!(f >= 0.0f && f <= 3.4028235e38f)) return false;
  }
  return true;
}

size_t blocks_of(int64_t n, int32_t block) { return static_cast<size_t>((n + block - 1) / block); }

// Kept values of a sparse segment: count k, coded by s.values.
Status check_values(const Segment& s, size_t index, int64_t k) {
  const size_t uk = static_cast<size_t>(k);
  switch (s.values) {
    case ValueCoding::kF32:
      if (s.f32.size() != uk) return bad(s, index, "expected " + std::to_string(k) + " values");
      return ok_status();
    case ValueCoding::kF16:
    case ValueCoding::kBf16:
      if (s.u16.size() != uk) return bad(s, index, "expected " + std::to_string(k) + " values");
      return ok_status();
    case ValueCoding::kInt8:
      if (s.block < 1) return bad(s, index, "int8 values need block >= 1");
      if (s.i8.size() != uk || s.scales.size() != blocks_of(k, s.block)) {
        return bad(s, index, "int8 values: code or scale count does not match k");
      }
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative scale");
      return ok_status();
  }
  return bad(s, index, "unknown value coding");
}

}  // namespace

Status check_segment(const Segment& s, size_t index) {
  const int64_t n = s.numel;
  const size_t un = static_cast<size_t>(n);
  switch (s.codec) {
    case CodecKind::kIdentity:
      if (s.f32.size() != un) return bad(s, index, "value count does not match numel");
      return ok_status();
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      if (s.u16.size() != un) return bad(s, index, "value count does not match numel");
      return ok_status();
    case CodecKind::kInt8:
      if (s.block < 1) return bad(s, index, "block must be >= 1");
      if (s.i8.size() != un) return bad(s, index, "code count does not match numel");
      if (s.scales.size() != blocks_of(n, s.block)) return bad(s, index, "wrong block count");
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative scale");
      return ok_status();
    case CodecKind::kQsgd: {
      if (s.block < 1) return bad(s, index, "bucket must be >= 1");
      if (s.levels < 1 || s.levels > 127) return bad(s, index, "levels must be in [1, 127]");
      if (s.i8.size() != un) return bad(s, index, "code count does not match numel");
      if (s.scales.size() != blocks_of(n, s.block)) return bad(s, index, "wrong bucket count");
      if (!all_finite_nonneg(s.scales)) return bad(s, index, "non-finite or negative norm");
      const int lim = s.levels;
      for (int8_t c : s.i8) {
        if (c > lim || c < -lim) return bad(s, index, "code outside [-levels, levels]");
      }
      return ok_status();
    }
    case CodecKind::kTopk: {
      if (s.k < 0 || s.k > n) return bad(s, index, "k outside [0, numel]");
      if (s.indices.size() != static_cast<size_t>(s.k)) {
        return bad(s, index, "index count does not match k");
      }
      int64_t prev = -1;
      for (uint32_t i : s.indices) {
        if (static_cast<int64_t>(i) <= prev || static_cast<int64_t>(i) >= n) {
          return bad(s, index, "indices must increase strictly and stay below numel");
        }
        prev = i;
      }
      return check_values(s, index, s.k);
    }
    case CodecKind::kRandk:
      if (s.k < 0 || s.k > n || (s.k == 0 && n > 0)) {
        return bad(s, index, "k outside [1, numel]");
      }
      return check_values(s, index, s.k);
    case CodecKind::kPowerSgd: {
      int64_t prod = 1;
      for (int64_t d : s.shape) {
        if (d < 0 || __builtin_mul_overflow(prod, d, &prod)) return bad(s, index, "bad shape");
      }
      if (prod != n) return bad(s, index, "shape does not match numel");
      if (s.rank < 1 || s.rank > 1024) return bad(s, index, "rank must be in [1, 1024]");
      int64_t rows = 0, cols = 0;
      if (!internal::powersgd_applies(s.shape, s.rank, &rows, &cols)) {
        return bad(s, index, "shape and rank do not describe a low-rank matrix");
      }
      const size_t want = static_cast<size_t>(s.rank) * static_cast<size_t>(rows + cols);
      if (s.f32.size() != want) return bad(s, index, "factor sizes do not match shape and rank");
      return ok_status();
    }
    case CodecKind::kSign:
      if (s.bits.size() != (un + 7) / 8) return bad(s, index, "bit count does not match numel");
      if (s.scales.size() != 1 || !all_finite_nonneg(s.scales)) {
        return bad(s, index, "needs one finite, non-negative scale");
      }
      return ok_status();
  }
  return bad(s, index, "unknown codec");
}

namespace {

// Value j of a sparse segment, decoded.
template <ValueCoding kCoding>
inline float value_at(const Segment& s, size_t j) {
  if constexpr (kCoding == ValueCoding::kF32) {
    return s.f32[j];
  } else if constexpr (kCoding == ValueCoding::kF16) {
    return half_to_float(s.u16[j]);
  } else if constexpr (kCoding == ValueCoding::kBf16) {
    return bf16_bits_to_float(s.u16[j]);
  } else {
    return static_cast<float>(s.i8[j]) * s.scales[j / static_cast<size_t>(s.block)];
  }
}

template <ValueCoding kCoding>
void add_sparse(const Segment& s, float* dst, float w, const std::vector<uint32_t>& idx,
                const internal::Strata* strata) {
  const size_t k = idx.size();
  if (strata == nullptr) {
    for (size_t j = 0; j < k; ++j) dst[idx[j]] += w * value_at<kCoding>(s, j);
  } else {
    for (size_t j = 0; j < k; ++j) {
      const float scale = static_cast<float>(strata->size(static_cast<int64_t>(j)));
      dst[idx[j]] += w * (value_at<kCoding>(s, j) * scale);
    }
  }
}

void add_sparse_any(const Segment& s, float* dst, float w, const std::vector<uint32_t>& idx,
                    const internal::Strata* strata) {
  switch (s.values) {
    case ValueCoding::kF32:
      return add_sparse<ValueCoding::kF32>(s, dst, w, idx, strata);
    case ValueCoding::kF16:
      return add_sparse<ValueCoding::kF16>(s, dst, w, idx, strata);
    case ValueCoding::kBf16:
      return add_sparse<ValueCoding::kBf16>(s, dst, w, idx, strata);
    case ValueCoding::kInt8:
      return add_sparse<ValueCoding::kInt8>(s, dst, w, idx, strata);
  }
}

void add_segment(const Segment& s, float* dst, float w) {
  const size_t n = static_cast<size_t>(s.numel);
  switch (s.codec) {
    case CodecKind::kIdentity:
      internal::add_f32(s.f32, dst, w);
      return;
    case CodecKind::kFp16:
      internal::add_f16(s.u16, dst, w);
      return;
    case CodecKind::kBf16:
      internal::add_bf16(s.u16, dst, w);
      return;
    case CodecKind::kInt8:
    case CodecKind::kQsgd: {
      const size_t b = static_cast<size_t>(s.block);
      const float inv_levels =
          s.codec == CodecKind::kQsgd ? 1.0f / static_cast<float>(s.levels) : 1.0f;
      const std::span<const int8_t> q(s.i8);
      for (size_t start = 0, blk = 0; start < n; start += b, ++blk) {
        const size_t len = std::min(n - start, b);
        internal::add_i8(q.subspan(start, len), s.scales[blk] * inv_levels, dst + start, w);
      }
      return;
    }
    case CodecKind::kTopk:
      add_sparse_any(s, dst, w, s.indices, nullptr);
      return;
    case CodecKind::kRandk: {
      if (s.k == 0) return;  // an empty tensor: nothing sampled, nothing to add
      std::vector<uint32_t> idx;
      internal::randk_indices(s.numel, s.k, s.seed, idx);
      const internal::Strata strata(s.numel, s.k);
      add_sparse_any(s, dst, w, idx, &strata);
      return;
    }
    case CodecKind::kPowerSgd: {
      const int64_t rows = s.shape[0];
      const int64_t cols = s.numel / rows;
      internal::powersgd_decode_add(s.f32.data(), s.f32.data() + rows * s.rank, rows, cols, s.rank,
                                    dst, w);
      return;
    }
    case CodecKind::kSign:
      internal::add_sign(s.bits, n, w * s.scales[0], w * -s.scales[0], dst);
      return;
  }
}

}  // namespace

Status decode_add_segment(const Segment& s, size_t index, std::span<float> dst, float weight) {
  if (s.numel < 0 || static_cast<size_t>(s.numel) != dst.size()) {
    return invalid_argument("decode_add_segment: segment has " + std::to_string(s.numel) +
                            " elements, destination " + std::to_string(dst.size()));
  }
  RETURN_IF_ERROR(check_segment(s, index), "decode_add");
  add_segment(s, dst.data(), weight);
  return ok_status();
}

Status decode_add(const EncodedUpdate& update, std::span<float> dst, float weight) {
  if (update.numel < 0 || static_cast<size_t>(update.numel) != dst.size()) {
    return invalid_argument("decode_add: update has " + std::to_string(update.numel) +
                            " elements, destination " + std::to_string(dst.size()));
  }
  int64_t next = 0;
  for (size_t i = 0; i < update.segments.size(); ++i) {
    const Segment& s = update.segments[i];
    if (s.offset != next || s.numel < 0 || s.numel > update.numel - next) {
      return bad(s, i, "segments must tile [0, numel) in order").with_context("decode_add");
    }
    next += s.numel;
    RETURN_IF_ERROR(check_segment(s, i), "decode_add");
  }
  if (next != update.numel) {
    return data_loss("decode_add: segments cover " + std::to_string(next) + " of " +
                     std::to_string(update.numel) + " elements");
  }
  for (const Segment& s : update.segments) add_segment(s, dst.data() + s.offset, weight);
  return ok_status();
}

Status decode(const EncodedUpdate& update, std::span<float> dst) {
  if (update.numel < 0 || static_cast<size_t>(update.numel) != dst.size()) {
    return invalid_argument("decode: update has " + std::to_string(update.numel) +
                            " elements, destination " + std::to_string(dst.size()));
  }
  std::fill(dst.begin(), dst.end(), 0.0f);
  return decode_add(update, dst, 1.0f);
}

}  // namespace starling::compress
