// ---- flashjit prelude: CPU emulator (host C++20, compiled in process by Clang) ----
// The same fj_* wrappers as amdgcn_prelude.hip, with the hardware's semantics,
// for the kernel text the lowering emits. Each work-item runs as a fiber; the
// fj_emu_* hooks (runtime/emulator.cpp) check every memory access and
// rendezvous the lanes of a wave (fj_mma, fj_shfl_xor) or of the workgroup
// (fj_barrier) before they complete.
#define FJ_GLOBAL extern "C"
#define FJ_DEVICE static inline __attribute__((always_inline))
#define FJ_METHOD inline __attribute__((always_inline)) // a member function
#define FJ_INF __builtin_inff() // +infinity, as a float expression
// The emulator reads the declared size back from the module and checks the launch against it.
#define FJ_WORKGROUP_SIZE(n) __attribute__((annotate("flashjit.workgroup_size=" #n)))
// LDS is per workgroup: every lane gets the same array, in declaration order.
#define FJ_LDS_ARRAY(type, name, count)                                                            \
  type *const name = (type *)fj_emu_lds_alloc(sizeof(type), (unsigned long)(count), #name)

typedef unsigned short fj_bits;                                        // one bf16/f16 element
typedef unsigned short fj_bits4 __attribute__((ext_vector_type(4)));   // 4 elements, 64 bits
typedef unsigned short fj_bits8 __attribute__((ext_vector_type(8)));   // 8 elements, 128 bits
typedef unsigned short fj_bits16 __attribute__((ext_vector_type(16))); // a gfx11 / simt operand
typedef float fj_float4 __attribute__((ext_vector_type(4))); // an MFMA 16x16 accumulator fragment
typedef float fj_float8 __attribute__((ext_vector_type(8))); // a WMMA accumulator fragment
typedef float fj_float16 __attribute__((ext_vector_type(16))); // an MFMA 32x32 accumulator fragment
typedef short fj_short8 __attribute__((ext_vector_type(8)));   // bf16 operand of the builtins
typedef _Float16 fj_half8 __attribute__((ext_vector_type(8))); // f16 operand of the builtins

// ---- the emulator's hooks (runtime/emulator.cpp, bound as absolute symbols) ----
// Collectives are convergent: the optimizer must not make them depend on more
// control flow than the source does, exactly as on the GPU.
extern "C" {
int fj_emu_thread_id(void);
int fj_emu_group_id(int dim);
void *fj_emu_lds_alloc(unsigned long elem_bytes, unsigned long count, const char *name);
__attribute__((convergent)) void fj_emu_barrier(void);
__attribute__((convergent)) float fj_emu_shfl_xor(float x, int lane, int mask);
// a, b: the lane's A and B elements (16-bit), c, d: its C and D elements (f32), as
// many as the table row's lane layout says.
__attribute__((convergent)) void fj_emu_mma(const void *a, const void *b, const void *c, void *d);
// Copies `count` elements of `elem_bytes` each, after checking the access.
void fj_emu_global_load(void *dst, const void *src, int elem_bytes, int count);
void fj_emu_global_store(void *dst, const void *src, int elem_bytes, int count);
void fj_emu_lds_load(void *dst, const void *src, int bytes);
void fj_emu_lds_store(void *dst, const void *src, int bytes);
float fj_emu_exp2(float x);
float fj_emu_log2(float x);
}

// ---- work-item ids (1-D workgroups) ----
FJ_DEVICE int fj_thread_id() { return fj_emu_thread_id(); }
FJ_DEVICE int fj_group_id_x() { return fj_emu_group_id(0); }
FJ_DEVICE int fj_group_id_y() { return fj_emu_group_id(1); }
FJ_DEVICE int fj_group_id_z() { return fj_emu_group_id(2); }

// ---- synchronisation and cross-lane ----
FJ_DEVICE void fj_barrier() { fj_emu_barrier(); }
// x from lane (lane ^ mask) of the same wave (ds_bpermute: every lane of the wave takes part;
// the mask may differ between lanes).
FJ_DEVICE float fj_shfl_xor(float x, int lane, int mask) { return fj_emu_shfl_xor(x, lane, mask); }
// The same exchange for 32 bits of integer data: they travel through the hook
// as a float's bits, which host moves copy unchanged (no arithmetic touches them).
FJ_DEVICE unsigned fj_shfl_xor_u32(unsigned x, int lane, int mask) {
  return __builtin_bit_cast(unsigned, fj_emu_shfl_xor(__builtin_bit_cast(float, x), lane, mask));
}
// x from lane `from` of the same wave; `from` may differ between lanes.
FJ_DEVICE unsigned fj_shfl_u32(unsigned x, int lane, int from) {
  return fj_shfl_xor_u32(x, lane, lane ^ from);
}
// Trailing and leading zero bits of x != 0.
FJ_DEVICE int fj_ctz(unsigned x) { return __builtin_ctz(x); }
FJ_DEVICE int fj_clz(unsigned x) { return __builtin_clz(x); }

// ---- math (the hardware's v_exp_f32 / v_log_f32 / v_rcp_f32 are emulated in f32) ----
FJ_DEVICE float fj_exp2(float x) { return fj_emu_exp2(x); }
FJ_DEVICE float fj_log2(float x) { return fj_emu_log2(x); }
FJ_DEVICE float fj_max(float a, float b) { return __builtin_fmaxf(a, b); }
FJ_DEVICE float fj_fabs(float x) { return __builtin_fabsf(x); }
FJ_DEVICE float fj_rcp(float x) { return 1.0f / x; }
FJ_DEVICE float fj_rcp_approx(float x) { return 1.0f / x; }

// ---- element conversions (round to nearest even, bit-exact with the AMD prelude) ----
FJ_DEVICE float fj_bf16_to_f32(fj_bits b) { return __builtin_bit_cast(float, (unsigned)b << 16); }
FJ_DEVICE fj_bits fj_f32_to_bf16(float x) {
  unsigned u = __builtin_bit_cast(unsigned, x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (fj_bits)((u >> 16) | 0x40); // NaN stays NaN
  return (fj_bits)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// IEEE binary16 in plain integer code (the AMD prelude's (_Float16) casts),
// so the JIT needs no soft-float runtime.
FJ_DEVICE float fj_f16_to_f32(fj_bits b) {
  const unsigned sign = (unsigned)(b & 0x8000u) << 16;
  const unsigned exp = (b >> 10) & 0x1fu, man = b & 0x3ffu;
  if (exp == 0x1f) // inf, or NaN made quiet as v_cvt_f32_f16 does
    return __builtin_bit_cast(float, sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  if (exp == 0) { // zero or subnormal: man * 2^-24, exact in f32
    const float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return __builtin_bit_cast(float, sign | ((exp + 112u) << 23) | (man << 13));
}
FJ_DEVICE fj_bits fj_f32_to_f16(float x) {
  unsigned u = __builtin_bit_cast(unsigned, x);
  const unsigned sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) // NaN: quiet, top payload bits kept
    return (fj_bits)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x47800000u) // >= 2^16: infinity (65520 and up round there below)
    return (fj_bits)(sign | 0x7c00u);
  if (u < 0x38800000u) { // below 2^-14: a subnormal half; the f32 add rounds to nearest even
    const float magic = __builtin_bit_cast(float, 0x3f000000u); // 0.5: ulp 2^-24
    const unsigned r = __builtin_bit_cast(unsigned, __builtin_bit_cast(float, u) + magic);
    return (fj_bits)(sign | (r - 0x3f000000u));
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even
  // (a carry into the exponent is the right rounding, up to infinity).
  u += 0xc8000fffu + ((u >> 13) & 1u); // (15 - 127) << 23, plus the rounding bias
  return (fj_bits)(sign | (u >> 13));
}

// ---- global memory (every access is checked against the launch's buffers) ----
FJ_DEVICE fj_bits8 fj_global_load8(const fj_bits *p) {
  fj_bits8 v;
  fj_emu_global_load(&v, p, 2, 8);
  return v;
}
FJ_DEVICE fj_bits4 fj_global_load4(const fj_bits *p) {
  fj_bits4 v;
  fj_emu_global_load(&v, p, 2, 4);
  return v;
}
FJ_DEVICE fj_bits fj_global_load1(const fj_bits *p) {
  fj_bits v;
  fj_emu_global_load(&v, p, 2, 1);
  return v;
}
FJ_DEVICE void fj_global_store8(fj_bits *p, fj_bits8 v) { fj_emu_global_store(p, &v, 2, 8); }
FJ_DEVICE void fj_global_store4(fj_bits *p, fj_bits4 v) { fj_emu_global_store(p, &v, 2, 4); }
FJ_DEVICE void fj_global_store1(fj_bits *p, fj_bits v) { fj_emu_global_store(p, &v, 2, 1); }
FJ_DEVICE void fj_global_store_f32(float *p, float v) { fj_emu_global_store(p, &v, 4, 1); }
FJ_DEVICE float fj_global_load_f32(const float *p) {
  float v;
  fj_emu_global_load(&v, p, 4, 1);
  return v;
}
FJ_DEVICE fj_float4 fj_global_load_f32x4(const float *p) {
  fj_float4 v;
  fj_emu_global_load(&v, p, 4, 4);
  return v;
}

// ---- LDS (bounds and reads of bytes never written in this workgroup are checked) ----
FJ_DEVICE fj_bits8 fj_lds_load8(const fj_bits *p) {
  fj_bits8 v;
  fj_emu_lds_load(&v, p, 16);
  return v;
}
FJ_DEVICE fj_bits4 fj_lds_load4(const fj_bits *p) {
  fj_bits4 v;
  fj_emu_lds_load(&v, p, 8);
  return v;
}
// Two 128-bit reads, as on the GPU.
FJ_DEVICE fj_bits16 fj_lds_load16(const fj_bits *p) {
  const fj_bits8 lo = fj_lds_load8(p), hi = fj_lds_load8(p + 8);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
FJ_DEVICE void fj_lds_store8(fj_bits *p, fj_bits8 v) { fj_emu_lds_store(p, &v, 16); }
FJ_DEVICE void fj_lds_store1(fj_bits *p, fj_bits v) { fj_emu_lds_store(p, &v, 2); }

// ---- a value pinned where it is computed (the AMDGPU prelude's; nothing to do here) ----
template <typename T> FJ_DEVICE void fj_pin(T &) {}

// ---- operand halves (the CDNA 32x32 rules: 8-element fragments, two runs of 4) ----
FJ_DEVICE fj_bits8 fj_concat4(fj_bits4 lo, fj_bits4 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7);
}
FJ_DEVICE fj_bits4 fj_lo4(fj_bits8 x) { return __builtin_shufflevector(x, x, 0, 1, 2, 3); }
FJ_DEVICE fj_bits4 fj_hi4(fj_bits8 x) { return __builtin_shufflevector(x, x, 4, 5, 6, 7); }
FJ_DEVICE fj_bits8 fj_lo8(fj_bits16 x) {
  return __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7);
}
FJ_DEVICE fj_bits8 fj_hi8(fj_bits16 x) {
  return __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
}

// ---- the matrix instruction: D = A * B + C over the whole wave ----
// One overload per operand shape of the matrix table (gfx12 8/8/8, gfx11 16/16/8,
// CDNA 16x16x16 4/4/4 and 32x32x8 4/4/16, gfx950 8/8/4 and 8/8/16); the hook
// reads as many elements as the kernel's table row (Lowered::mma->layout) says
// and computes D through its lane maps.
#define FJ_EMU_MMA(ab_type, cd_type)                                                               \
  FJ_DEVICE cd_type fj_mma(ab_type a, ab_type b, cd_type c) {                                      \
    cd_type d;                                                                                     \
    fj_emu_mma(&a, &b, &c, &d);                                                                    \
    return d;                                                                                      \
  }
FJ_EMU_MMA(fj_bits8, fj_float8)
FJ_EMU_MMA(fj_bits16, fj_float8)
FJ_EMU_MMA(fj_bits4, fj_float4)
FJ_EMU_MMA(fj_bits4, fj_float16)
FJ_EMU_MMA(fj_bits8, fj_float4)
FJ_EMU_MMA(fj_bits8, fj_float16)
#undef FJ_EMU_MMA
