// CRC32C: the SSE4.2 crc32 instruction where the CPU has it, else slicing-by-8 tables built at
// compile time (reflected polynomial 0x82F63B78).
#include "core/wire/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

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

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t v = 0;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}

const bool kHaveSse42 = [] {
  __builtin_cpu_init();  // may run before libgcc's own initializer
  return __builtin_cpu_supports("sse4.2") != 0;
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
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_sse42(crc, data);
#endif
  return crc32c_table(crc, data);
}

uint32_t crc32c_extend_portable(uint32_t crc, std::string_view data) {
  return crc32c_table(crc, data);
}

}  // namespace starling::wire
