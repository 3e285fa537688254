// DType names and IEEE half conversions.
#include "core/tensor/dtype.h"

#include <string>

namespace starling {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

Result<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kI8, DType::kU8}) {
    if (name == dtype_name(t) || name == dtype_safetensors_name(t)) return t;
  }
  return invalid_argument("unknown dtype '" + std::string(name) + "'");
}

bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

uint16_t float_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // subnormal half (or zero)
    // value = abs as float; half subnormal unit is 2^-24.
    const float v = std::bit_cast<float>(abs);
    const float scaled = v * 16777216.0f;  // 2^24
    // Round to nearest even using the float unit.
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | h);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1.0p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

}  // namespace starling
