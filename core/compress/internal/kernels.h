// Private to core/compress: per-tensor encoders (CPU reference, the oracle of later CUDA
// kernels), the element conversions they share with decoding, and the random-k strata.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/rng.h"

namespace starling::compress::internal {

static_assert(std::endian::native == std::endian::little, "the wire arrays are little-endian");

// fp16 -> float, exact (subnormals, infinities and NaN included); branch-light for loops.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  float mag;
  if (em >= 0x0400u) {
    uint32_t bits = (em << 13) + ((127u - 15u) << 23);
    if (em >= 0x7c00u) bits += (128u - 16u) << 23;  // inf / NaN keep an all-ones exponent
    mag = std::bit_cast<float>(bits);
  } else {
    mag = static_cast<float>(em) * 0x1.0p-24f;  // subnormal or zero, exact
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
}

inline float bf16_bits_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Nonzero when v is infinite or NaN (|v| bits >= the infinity pattern).
inline uint32_t nonfinite(float v) {
  return ((std::bit_cast<uint32_t>(v) & 0x7fffffffu) + 0x00800000u) & 0x80000000u;
}
bool has_nonfinite(std::span<const float> x);
// The float at p, at any alignment.
inline float load_f32(const char* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// has_nonfinite and add_f32 for n floats stored at p, at any alignment (arrays read in place).
bool has_nonfinite_bytes(const char* p, size_t n);
void add_f32_bytes(const char* p, size_t n, float* dst, float weight);
// out[i] = x[i]; returns nonzero when x holds a non-finite value.
uint32_t copy_floats(std::span<const float> x, float* out);

// float -> fp16 (round to nearest even), saturating finite values at +-65504. Returns nonzero
// when x holds a non-finite value.
uint32_t floats_to_f16(std::span<const float> x, uint16_t* out);
// float -> bf16 (round to nearest even), saturating finite values at the largest bf16; returns
// as floats_to_f16.
uint32_t floats_to_bf16(std::span<const float> x, uint16_t* out);
// Sign bits of x (element i in bit i % 8 of bits[i / 8]; bits holds (n + 7) / 8 bytes) and the
// sum of |x| in double over eight lanes (element i in lane i % 8, then a fixed tree). Returns
// nonzero when x holds a non-finite value.
uint32_t sign_pack(std::span<const float> x, uint8_t* bits, double* abs_sum);
uint32_t sign_pack_scalar(const float* x, size_t n, uint8_t* bits, double* abs_sum);
// dst[i] += weight * v[i]; dst[i] += weight * bf16 h[i]; dst[i] += weight * (q[i] * scale);
// dst[i] += (bit i set ? neg : pos). Vector paths round exactly as these expressions read.
void add_f32(std::span<const float> v, float* dst, float weight);
void add_bf16(std::span<const uint16_t> h, float* dst, float weight);
void add_i8(std::span<const int8_t> q, float scale, float* dst, float weight);
void add_sign(std::span<const uint8_t> bits, size_t n, float pos, float neg, float* dst);
// dst[i] += weight * fp16 h[i].
void add_f16(std::span<const uint16_t> h, float* dst, float weight);

// Blockwise absmax int8: scale[b] = absmax(block b) / 127, q = round-to-nearest-even(x * 127 /
// absmax) in [-127, 127]. Returns false (writing nothing useful) when x holds a non-finite value.
bool quantize_int8(std::span<const float> x, int block, int8_t* q, float* scales);
// The plain-loop version of quantize_int8: the oracle of the vector (and later CUDA) paths.
bool quantize_int8_scalar(const float* x, size_t n, size_t block, int8_t* q, float* scales);

// Codes the kept values of a sparse segment into seg.f32 / u16 / i8 + scales, per seg.values.
void encode_values(std::span<const float> values, ValueCoding coding, int block, Segment& seg);

// Random-k strata: n elements split into k strata [start(j), start(j) + size(j)), the first
// n % k of size n / k + 1, the rest n / k; one index is drawn uniformly in each.
struct Strata {
  int64_t n = 0, k = 0, base = 0, extra = 0;
  Strata(int64_t n_, int64_t k_)
      : n(n_), k(k_), base(k_ > 0 ? n_ / k_ : 0), extra(k_ > 0 ? n_ % k_ : 0) {}
  int64_t start(int64_t j) const { return j * base + (j < extra ? j : extra); }
  int64_t size(int64_t j) const { return base + (j < extra ? 1 : 0); }
};
// The k indices of a random-k segment, increasing, regenerated identically from `seed`.
void randk_indices(int64_t n, int64_t k, uint64_t seed, std::vector<uint32_t>& out);

// The encoder of one tensor: its spec, its random stream and its warm-start state.
class TensorEncoder {
 public:
  TensorEncoder(CodecSpec spec, TensorInfo info, Rng rng);
  // Encodes x (the tensor's elements) into seg; seg.offset, numel and shape are set here.
  Status encode(std::span<const float> x, Segment& seg);
  const CodecSpec& spec() const { return spec_; }

 private:
  Status encode_topk(std::span<const float> x, Segment& seg);
  Status encode_powersgd(std::span<const float> x, Segment& seg);

  CodecSpec spec_;
  TensorInfo info_;
  Rng rng_;
  std::vector<float> scratch_;    // |x| for selection
  std::vector<float> q_;          // PowerSGD warm start: Q (cols x rank, column c contiguous)
  std::vector<uint32_t> picked_;  // candidate indices
  std::vector<uint32_t> bits_;    // top-k: |x| bits of the threshold's histogram bin
};

// PowerSGD geometry of a tensor: rows = shape[0], cols = numel / rows; false for vectors or
// when the factors would not be smaller than the matrix.
bool powersgd_applies(const Shape& shape, int rank, int64_t* rows, int64_t* cols);
// dst[i*cols + j] += w * (sum_c P[i][c] * Q[c][j]) for P rows x rank and Q stored rank x cols.
void powersgd_decode_add(const float* p, const float* q, int64_t rows, int64_t cols, int rank,
                         float* dst, float weight);
// P = M Q and Q^T += P^T M (M rows x cols, Q^T rank x cols, P rows x rank).
void powersgd_project(const float* m, int64_t rows, int64_t cols, const float* qt, int r, float* p);
void powersgd_back(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* qt);
// The plain-loop references of PowerSGD's three products (vector paths match them bit for bit):
// P = M Q (M rows x cols, Q^T rank x cols, P rows x rank), Q^T += P^T M, and decode_add.
void powersgd_project_scalar(const float* m, int64_t rows, int64_t cols, const float* qt, int r,
                             float* p);
void powersgd_back_scalar(const float* m, int64_t rows, int64_t cols, const float* p, int r,
                          float* qt);
void powersgd_decode_add_scalar(const float* p, const float* q, int64_t rows, int64_t cols,
                                int rank, float* dst, float weight);

}  // namespace starling::compress::internal
