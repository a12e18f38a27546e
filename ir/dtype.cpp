#include "ir/dtype.h"

#include <cstring>

namespace flashjit {

Expected<DType> parse_dtype(std::string_view name) {
  if (name == "bf16")
    return DType::bf16;
  if (name == "f16" || name == "fp16")
    return DType::f16;
  if (name == "f32")
    return DType::f32;
  return Status::error("unknown dtype '{}': expected bf16, f16 or f32", name);
}

uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x))
    return static_cast<uint16_t>((u >> 16) | 0x40); // quiet NaN, sign kept
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_bits_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t f32_to_f16_bits(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t exp = (u >> 23) & 0xff;
  uint32_t man = u & 0x7fffff;
  if (exp == 0xff)
    return static_cast<uint16_t>(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = int(exp) - 127 + 15;
  if (e >= 0x1f)
    return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10)
      return static_cast<uint16_t>(sign);
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rest > half || (rest == half && (r & 1)))
      ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (uint32_t(e) << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (r & 1)))
    ++r; // may carry into the exponent, which is the correct rounding (up to inf)
  return static_cast<uint16_t>(sign | r);
}

float f16_bits_to_f32(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000) << 16;
  uint32_t exp = (bits >> 10) & 0x1f;
  uint32_t man = bits & 0x3ff;
  if (exp == 0) {
    if (man == 0)
      return std::bit_cast<float>(sign);
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 0x1f)
    return std::bit_cast<float>(sign | 0x7f800000 | (man << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

float round_to(DType t, float x) {
  switch (t) {
  case DType::bf16:
    return bf16_bits_to_f32(f32_to_bf16_bits(x));
  case DType::f16:
    return f16_bits_to_f32(f32_to_f16_bits(x));
  case DType::f32:
    return x;
  }
  return x;
}

uint32_t to_bits(DType t, float x) {
  switch (t) {
  case DType::bf16:
    return f32_to_bf16_bits(x);
  case DType::f16:
    return f32_to_f16_bits(x);
  case DType::f32:
    return std::bit_cast<uint32_t>(x);
  }
  return 0;
}

float from_bits(DType t, uint32_t bits) {
  switch (t) {
  case DType::bf16:
    return bf16_bits_to_f32(static_cast<uint16_t>(bits));
  case DType::f16:
    return f16_bits_to_f32(static_cast<uint16_t>(bits));
  case DType::f32:
    return std::bit_cast<float>(bits);
  }
  return 0;
}

} // namespace flashjit
