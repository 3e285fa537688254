// CRC32C (Castagnoli), the checksum of every streamed chunk: the CPU's crc32c instructions
// (SSE4.2, arm64 CRC32) when present, else tables.
#pragma once

#include <cstdint>
#include <string_view>

namespace starling::wire {

// Extends `crc` (the value returned for the preceding bytes, 0 to start) over `data`.
uint32_t crc32c_extend(uint32_t crc, std::string_view data);
inline uint32_t crc32c(std::string_view data) { return crc32c_extend(0, data); }
// The table implementation alone (the oracle of the hardware path in tests).
uint32_t crc32c_extend_portable(uint32_t crc, std::string_view data);

}  // namespace starling::wire
