// Element conversions shared by encoders and decode_add: fp16 / bf16 in both directions and the
// finiteness check. x86 CPUs with F16C / AVX2 take the vector paths (same results bit for bit:
// round to nearest even, no fused multiply-add); arm64 encodes fp16 / bf16 and checks
// finiteness with NEON (every arm64 CPU has it; the same bits); others run the plain loops.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/compress/internal/kernels.h"
#include "core/tensor/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define STARLING_COMPRESS_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define STARLING_COMPRESS_NEON 1
#endif

namespace starling::compress::internal {
namespace {

constexpr float kF16Max = 65504.0f;
constexpr float kBf16Max = 0x1.fep127f;

inline float clamp_abs(float v, float lim) { return v > lim ? lim : (v < -lim ? -lim : v); }

inline uint32_t abs_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// Round to nearest even for |v| < 2^22, without a libm call or a branch.
inline float round_even(float v) {
  const float magic = std::copysign(0x1.8p23f, v);
  return (v + magic) - magic;
}

// One int8 block from its absmax bits; false when the block holds inf or NaN.
inline bool finish_block(uint32_t mbits, float* scale, float* inv) {
  if (mbits >= 0x7f800000u) return false;
  const float amax = std::bit_cast<float>(mbits);
  *inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  // A block below 127 / FLT_MAX (3.7e-37) would scale by infinity: it encodes as zeros (what
  // the CUDA kernel writes too), an error far below any float a model update carries.
  if (std::isinf(*inv)) *inv = 0.0f;
  *scale = amax / 127.0f;
  return true;
}

// Elements [from, n) of sign_pack, then the fixed summation tree of the eight lanes.
uint32_t sign_pack_tail(const float* x, size_t n, size_t from, uint8_t* bits, double* acc,
                        double* abs_sum) {
  uint32_t bad = 0;
  for (size_t i = from; i < n; ++i) {
    if (i % 8 == 0) bits[i / 8] = 0;
    bits[i / 8] |= static_cast<uint8_t>((std::bit_cast<uint32_t>(x[i]) >> 31) << (i % 8));
    bad |= nonfinite(x[i]);
    acc[i % 8] += std::fabs(x[i]);
  }
  *abs_sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  return bad;
}

#ifdef STARLING_COMPRESS_X86
bool has_avx2_f16c() {
  // F16C through CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports lacks "f16c".
  static const bool kHas = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return kHas;
}

// Lanes that are infinite or NaN: |v| > FLT_MAX, unordered included.
__attribute__((target("avx2,f16c"))) inline __m256 nonfinite_mask(__m256 v) {
  const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
  return _mm256_cmp_ps(abs, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ);
}

__attribute__((target("avx2,f16c"))) uint32_t to_f16_avx2(const float* x, size_t n, uint16_t* out) {
  const __m256 hi = _mm256_set1_ps(kF16Max), lo = _mm256_set1_ps(-kF16Max);
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, nonfinite_mask(v));
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  uint32_t tail = 0;
  for (; i < n; ++i) {
    tail |= nonfinite(x[i]);
    out[i] = float_to_f16(clamp_abs(x[i], kF16Max));
  }
  return tail | static_cast<uint32_t>(_mm256_movemask_ps(bad));
}

__attribute__((target("avx2,f16c"))) uint32_t to_bf16_avx2(const float* x, size_t n,
                                                           uint16_t* out) {
  const __m256 hi = _mm256_set1_ps(kBf16Max), lo = _mm256_set1_ps(-kBf16Max);
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, nonfinite_mask(v));
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, half)), 16);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  uint32_t tail = 0;
  for (; i < n; ++i) {
    tail |= nonfinite(x[i]);
    out[i] = float_to_bf16(clamp_abs(x[i], kBf16Max));
  }
  return tail | static_cast<uint32_t>(_mm256_movemask_ps(bad));
}

__attribute__((target("avx2,f16c"))) bool has_nonfinite_avx2(const float* x, size_t n) {
  __m256 bad = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) bad = _mm256_or_ps(bad, nonfinite_mask(_mm256_loadu_ps(x + i)));
  uint32_t tail = 0;
  for (; i < n; ++i) tail |= nonfinite(x[i]);
  return (tail | static_cast<uint32_t>(_mm256_movemask_ps(bad))) != 0;
}

// The same blocks as quantize_int8_scalar; _mm256_cvtps_epi32 rounds to nearest even (MXCSR's
// default), as round_even does.
__attribute__((target("avx2,f16c"))) bool quantize_int8_avx2(const float* x, size_t n, size_t b,
                                                             int8_t* q, float* scales) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (size_t start = 0, blk = 0; start < n; start += b, ++blk) {
    const size_t end = std::min(n, start + b);
    __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    size_t i = start;
    for (; i + 8 <= end; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      bad = _mm256_or_ps(bad, nonfinite_mask(v));
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    uint32_t mbits = 0;
    for (float l : lanes) mbits = std::max(mbits, abs_bits(l));
    for (size_t t = i; t < end; ++t) mbits = std::max(mbits, abs_bits(x[t]));
    if (_mm256_movemask_ps(bad) != 0) return false;
    float inv = 0.0f;
    if (!finish_block(mbits, &scales[blk], &inv)) return false;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = start; i + 8 <= end; i += 8) {
      const __m256i w = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
      const __m128i p16 =
          _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(p16, p16));
    }
    for (; i < end; ++i) q[i] = static_cast<int8_t>(static_cast<int>(round_even(x[i] * inv)));
  }
  return true;
}

__attribute__((target("avx2,f16c"))) uint32_t sign_pack_avx2(const float* x, size_t n,
                                                             uint8_t* bits, double* abs_sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  __m256 bad = _mm256_setzero_ps();
  const size_t whole = n / 8;
  for (size_t byte = 0; byte < whole; ++byte) {
    const __m256 v = _mm256_loadu_ps(x + byte * 8);
    bad = _mm256_or_ps(bad, nonfinite_mask(v));
    bits[byte] = static_cast<uint8_t>(_mm256_movemask_ps(v));
    const __m256 a = _mm256_andnot_ps(sign, v);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
  }
  alignas(32) double acc[8];
  _mm256_store_pd(acc, lo);
  _mm256_store_pd(acc + 4, hi);
  return static_cast<uint32_t>(_mm256_movemask_ps(bad)) |
         sign_pack_tail(x, n, whole * 8, bits, acc, abs_sum);
}

__attribute__((target("avx2,f16c"))) uint32_t copy_avx2(const float* x, size_t n, float* out) {
  __m256 bad = _mm256_setzero_ps();
  uint32_t tail = 0;
  size_t i = 0;
  // Large copies bypass the cache (no read-for-ownership of `out`) once `out` is 32-byte aligned.
  const bool stream = n * sizeof(float) >= (size_t{1} << 20);
  if (stream) {
    for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 31u) != 0; ++i) {
      tail |= nonfinite(x[i]);
      out[i] = x[i];
    }
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      bad = _mm256_or_ps(bad, nonfinite_mask(v));
      _mm256_stream_ps(out + i, v);
    }
    _mm_sfence();
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, nonfinite_mask(v));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; ++i) {
    tail |= nonfinite(x[i]);
    out[i] = x[i];
  }
  return tail | static_cast<uint32_t>(_mm256_movemask_ps(bad));
}

__attribute__((target("avx2,f16c"))) void add_f32_avx2(const float* v, size_t n, float* dst,
                                                       float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 prod = _mm256_mul_ps(w, _mm256_loadu_ps(v + i));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), prod));
  }
  for (; i < n; ++i) dst[i] += weight * v[i];
}

__attribute__((target("avx2,f16c"))) void add_bf16_avx2(const uint16_t* h, size_t n, float* dst,
                                                        float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(w, v)));
  }
  for (; i < n; ++i) dst[i] += weight * bf16_bits_to_float(h[i]);
}

__attribute__((target("avx2,f16c"))) void add_i8_avx2(const int8_t* q, size_t n, float scale,
                                                      float* dst, float weight) {
  const __m256 w = _mm256_set1_ps(weight), s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), s);
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(w, v)));
  }
  for (; i < n; ++i) dst[i] += weight * (static_cast<float>(q[i]) * scale);
}

__attribute__((target("avx2,f16c"))) void add_sign_avx2(const uint8_t* bits, size_t n, float pos,
                                                        float neg, float* dst) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vp = _mm256_set1_ps(pos), vn = _mm256_set1_ps(neg);
  const size_t whole = n / 8;
  for (size_t byte = 0; byte < whole; ++byte) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(bits[byte]), lane_bit);
    const __m256 is_neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lane_bit));
    const __m256 v = _mm256_blendv_ps(vp, vn, is_neg);
    float* d = dst + byte * 8;
    _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), v));
  }
  for (size_t i = whole * 8; i < n; ++i) dst[i] += ((bits[i / 8] >> (i % 8)) & 1u) ? neg : pos;
}

__attribute__((target("avx2,f16c"))) void add_f16_avx2(const uint16_t* h, size_t n, float* dst,
                                                       float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(w, v)));
  }
  for (; i < n; ++i) dst[i] += weight * half_to_float(h[i]);
}

// The float kernels over bytes at any alignment (unaligned vector loads; a scalar tail through
// memcpy), for arrays read in place from a received payload.
__attribute__((target("avx2,f16c"))) bool has_nonfinite_bytes_avx2(const char* p, size_t n) {
  __m256 bad0 = _mm256_setzero_ps(), bad1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto* f = reinterpret_cast<const float*>(p + 4 * i);
    bad0 = _mm256_or_ps(bad0, nonfinite_mask(_mm256_loadu_ps(f)));
    bad1 = _mm256_or_ps(bad1, nonfinite_mask(_mm256_loadu_ps(f + 8)));
  }
  uint32_t tail = 0;
  for (; i < n; ++i) tail |= nonfinite(load_f32(p + 4 * i));
  return (tail | static_cast<uint32_t>(_mm256_movemask_ps(_mm256_or_ps(bad0, bad1)))) != 0;
}

__attribute__((target("avx2,f16c"))) void add_f32_bytes_avx2(const char* p, size_t n, float* dst,
                                                             float weight) {
  const __m256 w = _mm256_set1_ps(weight);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 4 * i));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(w, v)));
  }
  for (; i < n; ++i) dst[i] += weight * load_f32(p + 4 * i);
}
#endif

#ifdef STARLING_COMPRESS_NEON
// Lanes that are infinite or NaN: not |v| <= FLT_MAX (NaN compares false).
inline uint32x4_t nonfinite_neon(float32x4_t v) {
  return vmvnq_u32(vcleq_f32(vabsq_f32(v), vdupq_n_f32(FLT_MAX)));
}

// fcvtn rounds to nearest even (FPCR's default) and makes subnormal halves, as float_to_f16.
uint32_t to_f16_neon(const float* x, size_t n, uint16_t* out) {
  const float32x4_t hi = vdupq_n_f32(kF16Max), lo = vdupq_n_f32(-kF16Max);
  uint32x4_t bad = vdupq_n_u32(0);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    bad = vorrq_u32(bad, nonfinite_neon(v));
    vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vminq_f32(vmaxq_f32(v, lo), hi))));
  }
  uint32_t tail = 0;
  for (; i < n; ++i) {
    tail |= nonfinite(x[i]);
    out[i] = float_to_f16(clamp_abs(x[i], kF16Max));
  }
  return tail | vmaxvq_u32(bad);
}

// float_to_bf16's rounding on 4 lanes: add 0x7fff plus the kept lowest bit, keep the top half.
uint32_t to_bf16_neon(const float* x, size_t n, uint16_t* out) {
  const float32x4_t hi = vdupq_n_f32(kBf16Max), lo = vdupq_n_f32(-kBf16Max);
  const uint32x4_t one = vdupq_n_u32(1), half = vdupq_n_u32(0x7fff);
  uint32x4_t bad = vdupq_n_u32(0);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    bad = vorrq_u32(bad, nonfinite_neon(v));
    const uint32x4_t u = vreinterpretq_u32_f32(vminq_f32(vmaxq_f32(v, lo), hi));
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), one);
    vst1_u16(out + i, vshrn_n_u32(vaddq_u32(u, vaddq_u32(lsb, half)), 16));
  }
  uint32_t tail = 0;
  for (; i < n; ++i) {
    tail |= nonfinite(x[i]);
    out[i] = float_to_bf16(clamp_abs(x[i], kBf16Max));
  }
  return tail | vmaxvq_u32(bad);
}

bool has_nonfinite_neon(const float* x, size_t n) {
  uint32x4_t bad = vdupq_n_u32(0);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) bad = vorrq_u32(bad, nonfinite_neon(vld1q_f32(x + i)));
  uint32_t tail = 0;
  for (; i < n; ++i) tail |= nonfinite(x[i]);
  return (tail | vmaxvq_u32(bad)) != 0;
}
#endif

}  // namespace

bool quantize_int8_scalar(const float* x, size_t n, size_t b, int8_t* q, float* scales) {
  for (size_t start = 0, blk = 0; start < n; start += b, ++blk) {
    const size_t end = std::min(n, start + b);
    // |x| compared as integer bits: monotone for floats, and inf/NaN land above infinity's.
    uint32_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;
    size_t i = start;
    for (; i + 4 <= end; i += 4) {
      m0 = std::max(m0, abs_bits(x[i]));
      m1 = std::max(m1, abs_bits(x[i + 1]));
      m2 = std::max(m2, abs_bits(x[i + 2]));
      m3 = std::max(m3, abs_bits(x[i + 3]));
    }
    for (; i < end; ++i) m0 = std::max(m0, abs_bits(x[i]));
    float inv = 0.0f;
    if (!finish_block(std::max(std::max(m0, m1), std::max(m2, m3)), &scales[blk], &inv)) {
      return false;
    }
    // |x * inv| <= 127 (1 + 2^-23), which rounds to at most 127.
    for (i = start; i < end; ++i)
      q[i] = static_cast<int8_t>(static_cast<int>(round_even(x[i] * inv)));
  }
  return true;
}

bool has_nonfinite(std::span<const float> x) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return has_nonfinite_avx2(x.data(), x.size());
#elif defined(STARLING_COMPRESS_NEON)
  return has_nonfinite_neon(x.data(), x.size());
#endif
  uint32_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;
  size_t i = 0;
  for (; i + 4 <= x.size(); i += 4) {
    b0 |= nonfinite(x[i]);
    b1 |= nonfinite(x[i + 1]);
    b2 |= nonfinite(x[i + 2]);
    b3 |= nonfinite(x[i + 3]);
  }
  for (; i < x.size(); ++i) b0 |= nonfinite(x[i]);
  return (b0 | b1 | b2 | b3) != 0;
}

uint32_t floats_to_f16(std::span<const float> x, uint16_t* out) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return to_f16_avx2(x.data(), x.size(), out);
#elif defined(STARLING_COMPRESS_NEON)
  return to_f16_neon(x.data(), x.size(), out);
#endif
  uint32_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bad |= nonfinite(x[i]);
    out[i] = float_to_f16(clamp_abs(x[i], kF16Max));
  }
  return bad;
}

uint32_t floats_to_bf16(std::span<const float> x, uint16_t* out) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return to_bf16_avx2(x.data(), x.size(), out);
#elif defined(STARLING_COMPRESS_NEON)
  return to_bf16_neon(x.data(), x.size(), out);
#endif
  uint32_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bad |= nonfinite(x[i]);
    out[i] = float_to_bf16(clamp_abs(x[i], kBf16Max));
  }
  return bad;
}

bool quantize_int8(std::span<const float> x, int block, int8_t* q, float* scales) {
  const size_t b = static_cast<size_t>(block);
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return quantize_int8_avx2(x.data(), x.size(), b, q, scales);
#endif
  return quantize_int8_scalar(x.data(), x.size(), b, q, scales);
}

uint32_t sign_pack(std::span<const float> x, uint8_t* bits, double* abs_sum) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return sign_pack_avx2(x.data(), x.size(), bits, abs_sum);
#endif
  return sign_pack_scalar(x.data(), x.size(), bits, abs_sum);
}

uint32_t sign_pack_scalar(const float* x, size_t n, uint8_t* bits, double* abs_sum) {
  double acc[8] = {};
  uint32_t bad = 0;
  const size_t whole = n / 8;
  for (size_t byte = 0; byte < whole; ++byte) {
    const float* v = x + byte * 8;
    uint32_t b = 0;
    for (int j = 0; j < 8; ++j) {
      b |= (std::bit_cast<uint32_t>(v[j]) >> 31) << j;
      bad |= nonfinite(v[j]);
      acc[j] += std::fabs(v[j]);
    }
    bits[byte] = static_cast<uint8_t>(b);
  }
  return bad | sign_pack_tail(x, n, whole * 8, bits, acc, abs_sum);
}

uint32_t copy_floats(std::span<const float> x, float* out) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return copy_avx2(x.data(), x.size(), out);
#endif
  uint32_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bad |= nonfinite(x[i]);
    out[i] = x[i];
  }
  return bad;
}

bool has_nonfinite_bytes(const char* p, size_t n) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return has_nonfinite_bytes_avx2(p, n);
#endif
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= nonfinite(load_f32(p + 4 * i));
  return bad != 0;
}

void add_f32_bytes(const char* p, size_t n, float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_f32_bytes_avx2(p, n, dst, weight);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] += weight * load_f32(p + 4 * i);
}

void add_f32(std::span<const float> v, float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_f32_avx2(v.data(), v.size(), dst, weight);
#endif
  for (size_t i = 0; i < v.size(); ++i) dst[i] += weight * v[i];
}

void add_bf16(std::span<const uint16_t> h, float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_bf16_avx2(h.data(), h.size(), dst, weight);
#endif
  for (size_t i = 0; i < h.size(); ++i) dst[i] += weight * bf16_bits_to_float(h[i]);
}

void add_i8(std::span<const int8_t> q, float scale, float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_i8_avx2(q.data(), q.size(), scale, dst, weight);
#endif
  for (size_t i = 0; i < q.size(); ++i) dst[i] += weight * (static_cast<float>(q[i]) * scale);
}

void add_sign(std::span<const uint8_t> bits, size_t n, float pos, float neg, float* dst) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_sign_avx2(bits.data(), n, pos, neg, dst);
#endif
  const float both[2] = {pos, neg};
  for (size_t i = 0; i < n; ++i) dst[i] += both[(bits[i / 8] >> (i % 8)) & 1u];
}

void add_f16(std::span<const uint16_t> h, float* dst, float weight) {
#ifdef STARLING_COMPRESS_X86
  if (has_avx2_f16c()) return add_f16_avx2(h.data(), h.size(), dst, weight);
#endif
  for (size_t i = 0; i < h.size(); ++i) dst[i] += weight * half_to_float(h[i]);
}

}  // namespace starling::compress::internal
