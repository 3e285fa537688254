// CRC32C: the CPU's crc32c instructions where it has them (SSE4.2 on x86-64, the CRC32
// extension on arm64, which every ARMv8.1 core and most ARMv8.0 ones have), else slicing-by-8
// tables built at compile time (reflected polynomial 0x82F63B78). The hardware path runs three
// independent streams and joins them with "shift by N zero bytes" tables (Mark Adler's method),
// since one crc32 chain is limited by the instruction's latency (3 cycles on both).
#include "core/wire/crc32c.h"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#define STARLING_CRC_HW 1
#define STARLING_CRC_TARGET __attribute__((target("sse4.2")))
#elif defined(__aarch64__) && defined(__linux__)
#include <arm_acle.h>
#include <sys/auxv.h>
#define STARLING_CRC_HW 1
#define STARLING_CRC_TARGET __attribute__((target("+crc")))
#endif

namespace starling::wire {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = make_tables();
static_assert(std::endian::native == std::endian::little,
              "slicing-by-8 loads assume little-endian");

// GF(2) operators on the 32-bit CRC register: mat[i] is the image of bit i.
using Gf2Matrix = std::array<uint32_t, 32>;

constexpr uint32_t gf2_times(const Gf2Matrix& mat, uint32_t vec) {
  uint32_t sum = 0;
  for (size_t i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

constexpr Gf2Matrix gf2_square(const Gf2Matrix& mat) {
  Gf2Matrix sq{};
  for (size_t i = 0; i < 32; ++i) sq[i] = gf2_times(mat, mat[i]);
  return sq;
}

// Tables that advance a raw CRC register over `len` zero bytes. REQUIRES: len a power of two.
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;
constexpr ShiftTables make_shift_tables(size_t len) {
  Gf2Matrix op{};  // one zero bit
  op[0] = 0x82F63B78u;
  for (size_t i = 1; i < 32; ++i) op[i] = uint32_t{1} << (i - 1);
  for (size_t bits = 1; bits < len * 8; bits *= 2) op = gf2_square(op);
  ShiftTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t b = 0; b < 4; ++b) t[b][i] = gf2_times(op, i << (8 * b));
  }
  return t;
}

constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;
constexpr ShiftTables kShiftLong = make_shift_tables(kLongBlock);
constexpr ShiftTables kShiftShort = make_shift_tables(kShortBlock);

inline uint64_t shift(const ShiftTables& t, uint64_t crc) {
  return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^
         t[3][(crc >> 24) & 0xFF];
}

#ifdef STARLING_CRC_HW
// One step of the instruction over 8 bytes or over one byte.
STARLING_CRC_TARGET inline uint64_t hw_crc8(uint64_t c, uint64_t v) {
#if defined(__x86_64__)
  return __builtin_ia32_crc32di(c, v);
#else
  return __crc32cd(static_cast<uint32_t>(c), v);
#endif
}

STARLING_CRC_TARGET inline uint32_t hw_crc1(uint32_t c, unsigned char b) {
#if defined(__x86_64__)
  return __builtin_ia32_crc32qi(c, b);
#else
  return __crc32cb(c, b);
#endif
}

STARLING_CRC_TARGET inline uint64_t load_crc8(uint64_t c, const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return hw_crc8(c, v);
}

// Three blocks of `block` bytes in parallel, while at least 3 * block bytes remain.
STARLING_CRC_TARGET inline uint64_t crc_triples(uint64_t c, const unsigned char*& p, size_t& n,
                                                size_t block, const ShiftTables& shift_block) {
  while (n >= 3 * block) {
    uint64_t c1 = 0;
    uint64_t c2 = 0;
    const unsigned char* end = p + block;
    do {
      c = load_crc8(c, p);
      c1 = load_crc8(c1, p + block);
      c2 = load_crc8(c2, p + 2 * block);
      p += 8;
    } while (p < end);
    c = shift(shift_block, c) ^ c1;
    c = shift(shift_block, c) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c;
}

STARLING_CRC_TARGET uint32_t crc32c_hw(uint32_t crc, std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  uint64_t c = static_cast<uint32_t>(~crc);
  // Align to 8 bytes, then parallel blocks, then what is left one chain at a time.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = hw_crc1(static_cast<uint32_t>(c), *p++);
    --n;
  }
  c = crc_triples(c, p, n, kLongBlock, kShiftLong);
  c = crc_triples(c, p, n, kShortBlock, kShiftShort);
  while (n >= 8) {
    c = load_crc8(c, p);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = hw_crc1(c32, *p++);
  return ~c32;
}

const bool kHaveHw = [] {
#if defined(__x86_64__)
  __builtin_cpu_init();  // may run before libgcc's own initializer
  return __builtin_cpu_supports("sse4.2") != 0;
#else
  return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}();
#endif

uint32_t crc32c_table(uint32_t crc, std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo = 0;
    uint32_t hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
        kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

}  // namespace

uint32_t crc32c_extend(uint32_t crc, std::string_view data) {
#ifdef STARLING_CRC_HW
  if (kHaveHw) return crc32c_hw(crc, data);
#endif
  return crc32c_table(crc, data);
}

uint32_t crc32c_extend_portable(uint32_t crc, std::string_view data) {
  return crc32c_table(crc, data);
}

}  // namespace starling::wire
