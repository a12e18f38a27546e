// ---- flashjit prelude: NVIDIA (CUDA C++ through nvrtc) ----
// The kernel body is the same HIP-dialect text as on AMD; these fj_* wrappers
// map each HIP-side operation onto its CUDA counterpart, as HIP does on NVIDIA.
#define FJ_GLOBAL extern "C" __global__
#define FJ_DEVICE static __device__ __forceinline__
#define FJ_WORKGROUP_SIZE(n) __launch_bounds__(n)
#define FJ_LDS_ARRAY(type, name, count) __shared__ __align__(16) type name[count]

typedef unsigned short fj_bits; // one bf16/f16 element

// Small vectors (nvrtc has no ext_vector_type): element access and brace init.
template <typename T, int N> struct alignas(sizeof(T) * N) fj_vec {
  T v[N];
  __device__ T &operator[](int i) { return v[i]; }
  __device__ const T &operator[](int i) const { return v[i]; }
};
typedef fj_vec<fj_bits, 2> fj_bits2;
typedef fj_vec<fj_bits, 4> fj_bits4;  // an mma B fragment or a converted accumulator
typedef fj_vec<fj_bits, 8> fj_bits8;  // an mma A fragment; 128 bits of a row
typedef fj_vec<float, 4> fj_float4;   // an mma C/D fragment

// ---- work-item ids (1-D workgroups) ----
FJ_DEVICE int fj_thread_id() { return threadIdx.x; }
FJ_DEVICE int fj_group_id_x() { return blockIdx.x; }
FJ_DEVICE int fj_group_id_y() { return blockIdx.y; }
FJ_DEVICE int fj_group_id_z() { return blockIdx.z; }

// ---- synchronisation and cross-lane ----
FJ_DEVICE void fj_barrier() { __syncthreads(); }
FJ_DEVICE float fj_shfl_xor(float x, int lane, int mask) {
  return __shfl_xor_sync(0xffffffffu, x, mask);
}

// ---- math ----
FJ_DEVICE float fj_exp2(float x) { return exp2f(x); }
FJ_DEVICE float fj_log2(float x) { return log2f(x); }
FJ_DEVICE float fj_max(float a, float b) { return fmaxf(a, b); }
FJ_DEVICE float fj_rcp(float x) { return __frcp_rn(x); }

// ---- element conversions (round to nearest even) ----
FJ_DEVICE float fj_bf16_to_f32(fj_bits b) { return __uint_as_float((unsigned)b << 16); }
FJ_DEVICE fj_bits fj_f32_to_bf16(float x) {
  fj_bits h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
FJ_DEVICE float fj_f16_to_f32(fj_bits b) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
  return f;
}
FJ_DEVICE fj_bits fj_f32_to_f16(float x) {
  fj_bits h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// ---- global memory ----
FJ_DEVICE fj_bits8 fj_global_load8(const fj_bits *p) { return *(const fj_bits8 *)p; }
FJ_DEVICE fj_bits2 fj_global_load2(const fj_bits *p) { return *(const fj_bits2 *)p; }
FJ_DEVICE fj_bits fj_global_load1(const fj_bits *p) { return *p; }
FJ_DEVICE void fj_global_store8(fj_bits *p, fj_bits8 v) { *(fj_bits8 *)p = v; }
FJ_DEVICE void fj_global_store2(fj_bits *p, fj_bits a, fj_bits b) { *(fj_bits2 *)p = fj_bits2{a, b}; }
FJ_DEVICE void fj_global_store1(fj_bits *p, fj_bits v) { *p = v; }
FJ_DEVICE void fj_global_store_f32(float *p, float v) { *p = v; }

// ---- shared memory (LDS) ----
FJ_DEVICE fj_bits8 fj_lds_load8(const fj_bits *p) { return *(const fj_bits8 *)p; }
FJ_DEVICE void fj_lds_store8(fj_bits *p, fj_bits8 v) { *(fj_bits8 *)p = v; }
FJ_DEVICE void fj_lds_store1(fj_bits *p, fj_bits v) { *p = v; }
// Two 32-bit reads: elements p0[0..1] and p1[0..1].
FJ_DEVICE fj_bits4 fj_lds_load2x2(const fj_bits *p0, const fj_bits *p1) {
  const fj_bits2 a = *(const fj_bits2 *)p0, b = *(const fj_bits2 *)p1;
  return fj_bits4{a[0], a[1], b[0], b[1]};
}
FJ_DEVICE fj_bits8 fj_cat(fj_bits4 a, fj_bits4 b) {
  return fj_bits8{a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
}
