// Scalar element types and their exact rounding, shared by the IR, the
// reference, the interpreter and the .npy reader/writer.
#pragma once

#include "ir/status.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace flashjit {

enum class DType { bf16, f16, f32 };

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
  case DType::bf16:
    return "bf16";
  case DType::f16:
    return "f16";
  case DType::f32:
    return "f32";
  }
  return "?";
}
constexpr int dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }
Expected<DType> parse_dtype(std::string_view name);

/// IEEE binary16 and bfloat16 bit conversions, round-to-nearest-even, as the hardware types.
uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(uint16_t bits);
uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t bits);

/// Rounds an f32 value to the nearest value representable in `t`.
float round_to(DType t, float x);
/// Storage bits of an element of type `t` (2 or 4 bytes, little end used).
uint32_t to_bits(DType t, float x);
float from_bits(DType t, uint32_t bits);

} // namespace flashjit
