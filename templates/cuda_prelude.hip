// ---- flashjit prelude: NVIDIA (CUDA C++ through nvrtc) ----
// The kernel body is the same HIP-dialect text as on AMD; these fj_* wrappers
// map each HIP-side operation onto its CUDA counterpart, as HIP does on NVIDIA.
#define FJ_GLOBAL extern "C" __global__
#define FJ_DEVICE static __device__ __forceinline__
#define FJ_METHOD __device__ __forceinline__ // a member function
#define FJ_INF __int_as_float(0x7f800000) // +infinity, as a float expression
#define FJ_WORKGROUP_SIZE(n) __launch_bounds__(n)
// At least b blocks of n threads resident per SM: ptxas caps the registers to fit.
#define FJ_WORKGROUP_SIZE_MIN_BLOCKS(n, b) __launch_bounds__(n, b)
// The kernel's shared memory is dynamic (static stops at 48 KiB): each array is a
// slice at a 16-byte aligned byte offset; the launch passes the total.
extern __shared__ __align__(1024) unsigned char fj_dynamic_lds[];
// A small static array (at most 48 KiB in all), as the AMD preludes declare LDS.
#define FJ_LDS_ARRAY(type, name, count) __shared__ type name[count]
#define FJ_DYNAMIC_LDS_ARRAY(type, name, count, offset)                                             \
  type *const name = reinterpret_cast<type *>(fj_dynamic_lds + (offset))

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

// ---- programmatic dependent launch (sm_90) ----
// A kernel launched while the one before it on the stream still runs (a
// programmatic dependent launch: the runtime's after_previous) waits in its
// first statement until that kernel has finished and its writes are visible.
// fj_launch_dependents lets the kernel after it launch once every workgroup
// has called it (or exited); that one waits in turn. In a plain launch both
// return at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
FJ_DEVICE void fj_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
FJ_DEVICE void fj_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#endif

// ---- synchronisation and cross-lane ----
FJ_DEVICE void fj_barrier() { __syncthreads(); }
FJ_DEVICE float fj_shfl_xor(float x, int lane, int mask) {
  return __shfl_xor_sync(0xffffffffu, x, mask);
}
FJ_DEVICE unsigned fj_shfl_xor_u32(unsigned x, int lane, int mask) {
  return __shfl_xor_sync(0xffffffffu, x, mask);
}
// x from lane `from` of the same warp; `from` may differ between lanes.
FJ_DEVICE unsigned fj_shfl_u32(unsigned x, int lane, int from) {
  return __shfl_sync(0xffffffffu, x, from);
}
// Trailing and leading zero bits of x != 0.
FJ_DEVICE int fj_ctz(unsigned x) { return __ffs(int(x)) - 1; }
FJ_DEVICE int fj_clz(unsigned x) { return __clz(int(x)); }

// ---- math ----
// ex2.approx: 2 ulp, the instruction FlashAttention's exp2f becomes under --use_fast_math;
// ex2.approx(-inf) = +0.
FJ_DEVICE float fj_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
FJ_DEVICE float fj_log2(float x) { return log2f(x); }
FJ_DEVICE float fj_max(float a, float b) { return fmaxf(a, b); }
FJ_DEVICE float fj_fabs(float x) { return fabsf(x); }
FJ_DEVICE float fj_rcp(float x) { return __frcp_rn(x); }
// rcp.approx: 1 ulp for normal inputs, one instruction (fj_rcp is IEEE, several).
FJ_DEVICE float fj_rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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
FJ_DEVICE void fj_global_store4(fj_bits *p, fj_bits4 v) { *(fj_bits4 *)p = v; } // 8-byte aligned
FJ_DEVICE void fj_global_store2(fj_bits *p, fj_bits a, fj_bits b) { *(fj_bits2 *)p = fj_bits2{a, b}; }
FJ_DEVICE void fj_global_store1(fj_bits *p, fj_bits v) { *p = v; }
FJ_DEVICE void fj_global_store_f32(float *p, float v) { *p = v; }
FJ_DEVICE float fj_global_load_f32(const float *p) { return *p; }
FJ_DEVICE fj_float4 fj_global_load_f32x4(const float *p) { return *(const fj_float4 *)p; } // 16-byte aligned

// ---- shared memory (LDS) ----
FJ_DEVICE fj_bits8 fj_lds_load8(const fj_bits *p) { return *(const fj_bits8 *)p; }
FJ_DEVICE void fj_lds_store8(fj_bits *p, fj_bits8 v) { *(fj_bits8 *)p = v; }
FJ_DEVICE void fj_lds_store1(fj_bits *p, fj_bits v) { *p = v; }
FJ_DEVICE void fj_lds_store2(fj_bits *p, fj_bits a, fj_bits b) { *(fj_bits2 *)p = fj_bits2{a, b}; } // 4-byte aligned
// The lanes of this warp meet here, their LDS writes visible to each other's reads.
FJ_DEVICE void fj_wave_barrier() { __syncwarp(); }
// Two 32-bit reads: elements p0[0..1] and p1[0..1].
FJ_DEVICE fj_bits4 fj_lds_load2x2(const fj_bits *p0, const fj_bits *p1) {
  const fj_bits2 a = *(const fj_bits2 *)p0, b = *(const fj_bits2 *)p1;
  return fj_bits4{a[0], a[1], b[0], b[1]};
}
// ldmatrix: lanes 0-7 give the row addresses of the first 8x8 matrix, lanes 8-15
// of the second; each lane receives two 16-bit elements of each.
FJ_DEVICE fj_bits4 fj_ldmatrix_x2(const fj_bits *p) {
  fj_bits4 r;
  unsigned *R = reinterpret_cast<unsigned *>(&r);
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(R[0]), "=r"(R[1]) : "r"(a));
  return r;
}
FJ_DEVICE fj_bits8 fj_ldmatrix_x4(const fj_bits *p) {
  fj_bits8 r;
  unsigned *R = reinterpret_cast<unsigned *>(&r);
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(R[0]), "=r"(R[1]), "=r"(R[2]), "=r"(R[3])
               : "r"(a));
  return r;
}
FJ_DEVICE fj_bits4 fj_ldmatrix_x2_trans(const fj_bits *p) {
  fj_bits4 r;
  unsigned *R = reinterpret_cast<unsigned *>(&r);
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(R[0]), "=r"(R[1])
               : "r"(a));
  return r;
}

// ---- global -> shared staging with cp.async (16 bytes, zero-filled when !valid) ----
FJ_DEVICE void fj_stage8(fj_bits *lds, const fj_bits *src, bool valid) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(lds));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(valid ? 16 : 0));
}
FJ_DEVICE void fj_stage4(fj_bits *lds, const fj_bits *src, bool valid) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(lds));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(a), "l"(src), "r"(valid ? 8 : 0));
}
FJ_DEVICE void fj_stage_f32(float *lds, const float *src, bool valid) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(lds));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(a), "l"(src), "r"(valid ? 4 : 0));
}
FJ_DEVICE void fj_stage_commit() { asm volatile("cp.async.commit_group;"); }
FJ_DEVICE void fj_stage_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

FJ_DEVICE fj_bits8 fj_cat(fj_bits4 a, fj_bits4 b) {
  return fj_bits8{a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
}
