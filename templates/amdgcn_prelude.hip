// ---- flashjit prelude: AMDGPU (hip-clang device code, no HIP headers) ----
// Every builtin the kernel body uses goes through one of the fj_* wrappers
// below; the CPU emulator provides the same wrappers with exact semantics.
#define FJ_GLOBAL extern "C" __attribute__((global))
#define FJ_DEVICE static inline __attribute__((device, always_inline))
#define FJ_METHOD inline __attribute__((device, always_inline)) // a member function
#define FJ_INF __builtin_inff() // +infinity, as a float expression
#define FJ_WORKGROUP_SIZE(n) __attribute__((amdgpu_flat_work_group_size(n, n)))
#define FJ_LDS_ARRAY(type, name, count) __attribute__((shared)) type name[count]

typedef unsigned short fj_bits;                                   // one bf16/f16 element
typedef unsigned short fj_bits4 __attribute__((ext_vector_type(4)));   // 4 elements, 64 bits
typedef unsigned short fj_bits8 __attribute__((ext_vector_type(8)));   // 8 elements, 128 bits
typedef unsigned short fj_bits16 __attribute__((ext_vector_type(16))); // a gfx11 / simt operand
typedef float fj_float4 __attribute__((ext_vector_type(4))); // an MFMA 16x16 accumulator fragment
typedef float fj_float8 __attribute__((ext_vector_type(8))); // a WMMA accumulator fragment
typedef float fj_float16 __attribute__((ext_vector_type(16))); // an MFMA 32x32 accumulator fragment
// The builtins' A/B vector types (bf16 travels as short bits, or __bf16 on gfx950's K32/K16).
typedef short fj_short4 __attribute__((ext_vector_type(4)));
typedef short fj_short8 __attribute__((ext_vector_type(8)));
typedef short fj_short16 __attribute__((ext_vector_type(16)));
typedef _Float16 fj_half4 __attribute__((ext_vector_type(4)));
typedef _Float16 fj_half8 __attribute__((ext_vector_type(8)));
typedef _Float16 fj_half16 __attribute__((ext_vector_type(16)));
typedef __bf16 fj_bfloat8 __attribute__((ext_vector_type(8)));

// ---- work-item ids (1-D workgroups) ----
FJ_DEVICE int fj_thread_id() { return __builtin_amdgcn_workitem_id_x(); }
FJ_DEVICE int fj_group_id_x() { return __builtin_amdgcn_workgroup_id_x(); }
FJ_DEVICE int fj_group_id_y() { return __builtin_amdgcn_workgroup_id_y(); }
FJ_DEVICE int fj_group_id_z() { return __builtin_amdgcn_workgroup_id_z(); }

// ---- synchronisation and cross-lane ----
FJ_DEVICE void fj_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// x from lane (lane ^ mask) of the same wave; the mask may differ between lanes.
FJ_DEVICE unsigned fj_shfl_xor_u32(unsigned x, int lane, int mask) {
  return (unsigned)__builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, (int)x);
}
// x from lane `from` of the same wave; `from` may differ between lanes.
FJ_DEVICE unsigned fj_shfl_u32(unsigned x, int lane, int from) {
  return (unsigned)__builtin_amdgcn_ds_bpermute(from << 2, (int)x);
}
FJ_DEVICE float fj_shfl_xor(float x, int lane, int mask) {
  return __builtin_bit_cast(float, fj_shfl_xor_u32(__builtin_bit_cast(unsigned, x), lane, mask));
}
// Trailing and leading zero bits of x != 0.
FJ_DEVICE int fj_ctz(unsigned x) { return __builtin_ctz(x); }
FJ_DEVICE int fj_clz(unsigned x) { return __builtin_clz(x); }

// ---- math ----
FJ_DEVICE float fj_exp2(float x) { return __builtin_amdgcn_exp2f(x); }
FJ_DEVICE float fj_log2(float x) { return __builtin_amdgcn_logf(x); }
FJ_DEVICE float fj_max(float a, float b) { return __builtin_fmaxf(a, b); }
FJ_DEVICE float fj_fabs(float x) { return __builtin_fabsf(x); }
FJ_DEVICE float fj_rcp(float x) { return __builtin_amdgcn_rcpf(x); }
FJ_DEVICE float fj_rcp_approx(float x) { return __builtin_amdgcn_rcpf(x); }

// ---- element conversions (round to nearest even, as the hardware types) ----
FJ_DEVICE float fj_bf16_to_f32(fj_bits b) { return __builtin_bit_cast(float, (unsigned)b << 16); }
FJ_DEVICE fj_bits fj_f32_to_bf16(float x) {
  unsigned u = __builtin_bit_cast(unsigned, x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (fj_bits)((u >> 16) | 0x40); // NaN stays NaN
  return (fj_bits)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
FJ_DEVICE float fj_f16_to_f32(fj_bits b) { return (float)__builtin_bit_cast(_Float16, b); }
FJ_DEVICE fj_bits fj_f32_to_f16(float x) { return __builtin_bit_cast(fj_bits, (_Float16)x); }

// ---- global memory (the emulator checks every access against the buffers) ----
FJ_DEVICE fj_bits8 fj_global_load8(const fj_bits *p) { return *(const fj_bits8 *)p; }
FJ_DEVICE fj_bits4 fj_global_load4(const fj_bits *p) { return *(const fj_bits4 *)p; }
FJ_DEVICE fj_bits fj_global_load1(const fj_bits *p) { return *p; }
FJ_DEVICE void fj_global_store8(fj_bits *p, fj_bits8 v) { *(fj_bits8 *)p = v; }
FJ_DEVICE void fj_global_store4(fj_bits *p, fj_bits4 v) { *(fj_bits4 *)p = v; }
FJ_DEVICE void fj_global_store1(fj_bits *p, fj_bits v) { *p = v; }
FJ_DEVICE void fj_global_store_f32(float *p, float v) { *p = v; }
FJ_DEVICE float fj_global_load_f32(const float *p) { return *p; }
FJ_DEVICE fj_float4 fj_global_load_f32x4(const float *p) { return *(const fj_float4 *)p; } // 16-byte aligned

// ---- LDS (the emulator checks bounds and reads of bytes never written) ----
FJ_DEVICE fj_bits8 fj_lds_load8(const fj_bits *p) { return *(const fj_bits8 *)p; }
FJ_DEVICE fj_bits4 fj_lds_load4(const fj_bits *p) { return *(const fj_bits4 *)p; }
// Two 128-bit reads (p is 16-byte aligned, not necessarily 32).
FJ_DEVICE fj_bits16 fj_lds_load16(const fj_bits *p) {
  const fj_bits8 lo = fj_lds_load8(p), hi = fj_lds_load8(p + 8);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
FJ_DEVICE void fj_lds_store8(fj_bits *p, fj_bits8 v) { *(fj_bits8 *)p = v; }
FJ_DEVICE void fj_lds_store1(fj_bits *p, fj_bits v) { *p = v; }

// ---- a value pinned where it is computed ----
// An empty asm that reads and rewrites x: LLVM's MachineSink leaves it where it is,
// so the ops computing x (a product's matrix instructions) are not sunk past the
// code that follows to x's next use (KernelEmitter::keep_live_values).
template <typename T> FJ_DEVICE void fj_pin(T &x) { asm("" : "+v"(x)); }

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
