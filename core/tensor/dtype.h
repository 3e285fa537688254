// Element types of a Tensor and conversions between the 16-bit floats and float.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/util/status.h"

namespace starling {

// F64 exists for gradient checks and reference computations; models train in F32/BF16.
enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kI8, kU8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                  // "f32", "bf16", ...
std::string_view dtype_safetensors_name(DType t);      // "F32", "BF16", ...
Result<DType> dtype_from_name(std::string_view name);  // accepts both spellings
bool dtype_is_float(DType t);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kU8;
}

// bfloat16: round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// IEEE half precision, round to nearest even, with subnormals, infinities and NaN.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace starling
