// flashjit kernel fa_bwd_dkdv_direct_bf16_d64_64_07ac4dd6 for sm_90 (sm90 rules, wave32, wgmma.mma_async m64nNk16, per warp the fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32)
// Generated from the tile IR; `flashjit emit --print-ir` prints the program.
// Each block below names the IR op it implements.

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

// ---- Hopper warpgroup products (the sm90 rules; PTX target sm_90a) ----
// A warpgroup is 4 consecutive warps (128 threads). wgmma.mma_async multiplies a
// 64-row A (16 rows per warp: in registers, the A fragment of mma.sync m16n8k16)
// by an N-column B read from shared memory through a matrix descriptor, into an
// f32 accumulator whose per-warp layout is N/8 mma.sync m16n8 C fragments.

// Element (r, d) of a staged tile of `rows` rows: 64-column panels, each row of a
// panel 128 bytes whose eight 16-byte chunks are permuted by (r % 8) -- the
// 128-byte swizzle a wgmma descriptor reads (the panel's 8-row groups are 1024-byte
// atoms; the tile starts 1024-byte aligned). Chunk-wise writes of a row land in
// different banks for the 8 rows of an atom.
FJ_DEVICE int fj_swizzle128(int r, int d, int rows) {
  return ((d >> 6) * rows + r) * 64 + ((((d >> 3) & 7) ^ (r & 7)) << 3) + (d & 7);
}

// A shared-memory matrix descriptor: start address, leading and stride byte
// offsets (all in 16-byte units, 14 bits each), 128-byte swizzle (bits 62-63 = 1).
FJ_DEVICE unsigned long long fj_wgmma_desc(const fj_bits *tile, unsigned lbo, unsigned sbo) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// Copies made by threads (cp.async, st.shared) are visible to wgmma's reads (the
// async proxy) after this fence and a barrier.
FJ_DEVICE void fj_fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The accumulator registers, pinned: neither read nor written across this point.
FJ_DEVICE void fj_wgmma_pin(fj_float4 *d, int n) {
#pragma unroll
  for (int i = 0; i < n; ++i)
    asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}
// Before the first wgmma of a group: prior register writes are visible to it.
FJ_DEVICE void fj_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FJ_DEVICE void fj_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until every committed group is done: its accumulators are readable.
FJ_DEVICE void fj_wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Waits until at most N committed groups are in flight (groups finish in order).
template <int N> __device__ __forceinline__ void fj_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Register A operands stay live (unmodified) to this point: a product in flight reads them.
FJ_DEVICE void fj_wgmma_keep(const fj_bits8 *a, int n) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const unsigned *r = reinterpret_cast<const unsigned *>(&a[i]);
    asm volatile("" ::"r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
  }
}

// ---- tensor memory access (TMA): whole tiles copied by the copy engine ----
// A tensor map (CUtensorMap, 128 bytes) made on the host per launch
// (runtime/kernel_args.cpp): the tensor's [batch, heads, seq, dim] extents and
// strides, a box of 64 columns x the tile's rows, 128-byte swizzle -- the layout
// of fj_swizzle128's panels. Passed by value as a __grid_constant__ parameter.
struct alignas(64) fj_tensor_map {
  unsigned long long bits[16];
};

// Barriers of `count` arrivals; thread 0 initialises them (fj_tma_init's fence
// and barrier publish them). A ring copy's free barrier (config stages 3) counts
// every consumer thread.
FJ_DEVICE void fj_mbar_init(unsigned long long *bars, int n, int count) {
  if (fj_thread_id() == 0)
    for (int i = 0; i < n; ++i) {
      const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&bars[i]));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
    }
}

// Transaction barriers (mbarrier) of one arrival, at the start of the kernel.
// The fence and barrier publish them (and any fj_mbar_init before) to every
// thread and to the copy engine.
FJ_DEVICE void fj_tma_init(unsigned long long *bars, int n) {
  fj_mbar_init(bars, n, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
}

// This thread's arrival on barrier `bar` (after its last read of the copy it guards).
FJ_DEVICE void fj_mbar_arrive(unsigned long long *bar) {
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
// The workgroups of the launch (x): a persistent kernel's stride over its tiles.
FJ_DEVICE int fj_group_count_x() { return gridDim.x; }

// A barrier of the first `threads` threads only (named barrier 1): the consumers
// of a kernel whose producer warpgroup has left.
FJ_DEVICE void fj_named_barrier(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// Register reallocation between warpgroups (setmaxnreg, sm_90a): the calling
// warpgroup's registers per thread become N. The producer warpgroup gives its
// registers up, the consumers take them.
template <int N> __device__ __forceinline__ void fj_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void fj_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// One thread: copies rows [row0, row0 + rows) of (head, batch) into `panels`
// 64-column panels of `lds`, completing on `bar`. Columns past the head dim and
// rows past the sequence arrive as zeros (the map's bounds), as fj_stage8 fills.
FJ_DEVICE void fj_tma_tile(const fj_tensor_map &map, fj_bits *lds, unsigned long long *bar,
                           int panels, int rows, int row0, int head, int batch) {
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
               "r"(panels * rows * 128)
               : "memory");
  for (int p = 0; p < panels; ++p) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(lds + p * rows * 64));
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
                 "l"(reinterpret_cast<unsigned long long>(&map)), "r"(p * 64), "r"(row0),
                 "r"(head), "r"(batch), "r"(b)
                 : "memory");
  }
}

// Every thread: waits for the fill of barrier i that `phase` (bit i) expects,
// then expects the next one. A barrier's fills are waited for in order. (Any
// mbarrier: the producer warpgroup waits on the ring's free barriers this way too.)
FJ_DEVICE void fj_tma_wait(unsigned long long *bars, int i, unsigned &phase) {
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&bars[i]));
  const unsigned parity = (phase >> i) & 1u;
  unsigned done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(b), "r"(parity)
                 : "memory");
  } while (!done);
  phase ^= 1u << i;
}

// ---- the matrix instruction ----
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A * B + C, 16x8x16; A 8 x __nv_bfloat16, B 4 x __nv_bfloat16, C/D 4 x f32 per lane.
FJ_DEVICE fj_float4 fj_mma(fj_bits8 a, fj_bits4 b, fj_float4 c) {
  const unsigned *A = reinterpret_cast<const unsigned *>(&a);
  const unsigned *B = reinterpret_cast<const unsigned *>(&b);
  fj_float4 d;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  return d;
}
// wgmma m64n64k16, bf16 x bf16 -> f32: this warp's 8 fragments of the 64 x 64 accumulator (+)= A (registers) x B (MN-major, by descriptor).
FJ_DEVICE void fj_wgmma_bf16_n64_rmn(fj_float4 *d, const fj_bits8 &a, unsigned long long b) {
  const unsigned *A = reinterpret_cast<const unsigned *>(&a);
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "l"(b), "r"(1));
}
// wgmma m64n64k16, bf16 x bf16 -> f32: this warp's 8 fragments of the 64 x 64 accumulator (+)= A (K-major, by descriptor) x B (K-major, by descriptor).
FJ_DEVICE void fj_wgmma_bf16_n64_sk(fj_float4 *d, unsigned long long a, unsigned long long b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "%32, %33, p, 1, 1, 0, 0;\n}"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "l"(a), "l"(b), "r"(1));
}

// ---- the element type (bf16) ----
FJ_DEVICE float fj_to_f32(fj_bits x) { return fj_bf16_to_f32(x); }
FJ_DEVICE fj_bits fj_from_f32(float x) { return fj_f32_to_bf16(x); }

// ---- the spec and config, as named constants ----
constexpr int kWave = 32; // lanes per wave
constexpr int kWaves = 4; // waves per workgroup; each owns kQTiles x 16 queries
constexpr int kThreads = 128; // work-items per workgroup
constexpr int kBlockM = 64; // queries per workgroup
constexpr int kBlockN = 64; // keys per KV block
constexpr int kQTiles = 1; // 16-query tiles per wave
constexpr int kNTile = 8; // columns of an accumulator fragment
constexpr int kAccElems = 4; // accumulator elements per lane and fragment
constexpr int kRowSlots = 2; // query rows per lane and 16-row fragment
constexpr int kDimQK = 64; // head_dim_qk (padded to 16 in registers only)
constexpr int kDimV = 64; // head_dim_v (padded to 16 in registers only)
constexpr bool kCausal = false; // bottom-right aligned when seqlen_q != seqlen_k
constexpr bool kVec4Loads = true; // rows are 8-byte aligned runs: 64-bit copies into LDS
constexpr bool kVecLoads = true; // rows are 16-byte aligned runs: 128-bit global loads and stores

// ---- mask tensor elements ----
// f16 and bf16 elements of a mask tensor (kernel parameters `const
// fj_f16_elem *attn_mask`): each reads as a float where a score expression uses it.
struct fj_f16_elem {
  fj_bits bits;
  FJ_METHOD operator float() const { return fj_f16_to_f32(bits); }
};
struct fj_bf16_elem {
  fj_bits bits;
  FJ_METHOD operator float() const { return fj_bf16_to_f32(bits); }
};

// A run of N consecutive elements of a mask tensor's row as floats, in loads of
// up to 16 bytes; the caller checks that `p` is aligned to min(N elements, 16
// bytes) (lowering's emit_mask_elements: the row's key stride is 1).
struct alignas(8) fj_word8 {
  unsigned w[2];
};
struct alignas(16) fj_word16 {
  unsigned w[4];
};
template <int kBytes> struct fj_word_of;
template <> struct fj_word_of<2> {
  using type = unsigned short;
};
template <> struct fj_word_of<4> {
  using type = unsigned;
};
template <> struct fj_word_of<8> {
  using type = fj_word8;
};
template <> struct fj_word_of<16> {
  using type = fj_word16;
};
// A run of N mask elements of at most 8 bytes kept as their bits (one word),
// loaded whole where `whole`, else element by element (the first `valid` of
// them, the rest 0): the loads issued before a block's S product.
template <int N, class T> union fj_mask_bits {
  typename fj_word_of<N *int(sizeof(T))>::type word;
  T elems[N];
};
template <int N, class T>
FJ_DEVICE fj_mask_bits<N, T> fj_mask_fetch(const T *row, int col, bool whole, int valid,
                                           long stride) {
  fj_mask_bits<N, T> b;
  if (whole) {
    b.word = *reinterpret_cast<const decltype(b.word) *>(row + col);
    return b;
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    b.elems[i] = i < valid ? row[(long)(col + i) * stride] : T{};
  return b;
}
template <int N, class T> FJ_DEVICE void fj_mask_unpack(const fj_mask_bits<N, T> &b, float *out) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    out[i] = float(b.elems[i]);
}
template <int N, class T> FJ_DEVICE void fj_mask_run(const T *p, float *out) {
  constexpr int kBytes = N * int(sizeof(T));
  constexpr int kChunk = kBytes < 16 ? kBytes : 16, kPer = kChunk / int(sizeof(T));
  using W = typename fj_word_of<kChunk>::type;
#pragma unroll
  for (int i = 0; i < N; i += kPer) {
    union {
      W word;
      T elems[kPer];
    } run;
    run.word = *reinterpret_cast<const W *>(p + i);
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      out[i + j] = float(run.elems[j]);
  }
}

// ---- uniform draws (dropout) ----
// Philox-4x32 as ir::philox_uniform computes it on the host, bit for bit: the
// key is Philox-4x32-10 of (seed, offset) under a fixed key (the same for every
// element of a kernel: fj_philox_key, hoisted), and one 7-round draw
// (ir::kDrawRounds) of the counter
// (kv_idx / 8, q_idx, h, b) under it gives 8 aligned keys of the query 16 bits
// each (fj_draw). Where a lane holds several keys of one draw, lowering
// draws once and takes each key's bits from the words (fj_draw_slot).
FJ_DEVICE void fj_philox(unsigned c[4], unsigned k0, unsigned k1, int rounds) {
#pragma unroll
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];
    const unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n1 = (unsigned)p1;
    const unsigned n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1, n3 = (unsigned)p0;
    c[0] = n0;
    c[1] = n1;
    c[2] = n2;
    c[3] = n3;
  }
}
struct fj_draw_key {
  unsigned k0, k1;
};
FJ_DEVICE fj_draw_key fj_philox_key(unsigned long long seed, unsigned long long offset) {
  unsigned key[4] = {(unsigned)seed, (unsigned)(seed >> 32), (unsigned)offset,
                     (unsigned)(offset >> 32)};
  fj_philox(key, 0x2545F491u, 0x9E3779B9u, 10);
  return {key[0], key[1]};
}
// The 4 words of the draw that holds key kv_idx of query q_idx.
struct fj_draw_words {
  unsigned w[4];
};
FJ_DEVICE fj_draw_words fj_draw(fj_draw_key key, unsigned b, unsigned h, unsigned q_idx,
                                unsigned kv_idx) {
  fj_draw_words d = {{kv_idx >> 3, q_idx, h, b}};
  fj_philox(d.w, key.k0, key.k1, 7); // ir::kDrawRounds
  return d;
}
// Key kv_idx's 16 bits of its draw's words: half kv_idx % 2 of word
// kv_idx % 8 / 2. Selects, not an index, so the words stay in registers.
FJ_DEVICE unsigned fj_draw_bits(const fj_draw_words &d, unsigned kv_idx) {
  const unsigned lo = (kv_idx & 2u) ? d.w[1] : d.w[0], hi = (kv_idx & 2u) ? d.w[3] : d.w[2];
  const unsigned word = (kv_idx & 4u) ? hi : lo;
  return (word >> ((kv_idx & 1u) * 16u)) & 0xFFFFu;
}
// Key kv_idx's draw in [0, 1).
FJ_DEVICE float fj_draw_slot(const fj_draw_words &d, unsigned kv_idx) {
  return (float)fj_draw_bits(d, kv_idx) * 1.52587890625e-05f; // 2^-16
}
// Where the lanes pass each other just the word each reads (DrawPlan::
// Share::one_word): word i of a draw, and one of the words received, by
// selects.
FJ_DEVICE unsigned fj_pick_word(const fj_draw_words &d, int i) {
  const unsigned lo = (i & 1) ? d.w[1] : d.w[0], hi = (i & 1) ? d.w[3] : d.w[2];
  return (i & 2) ? hi : lo;
}
template <int N> FJ_DEVICE unsigned fj_pick(const unsigned (&v)[N], int i) {
  unsigned r = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k)
    r = i == k ? v[k] : r;
  return r;
}
// Key kv_idx's 16 bits of the word of its draw that holds them, and its draw.
FJ_DEVICE unsigned fj_word_bits(unsigned word, unsigned kv_idx) {
  return (word >> ((kv_idx & 1u) * 16u)) & 0xFFFFu;
}
FJ_DEVICE float fj_word_slot(unsigned word, unsigned kv_idx) {
  return (float)fj_word_bits(word, kv_idx) * 1.52587890625e-05f; // 2^-16
}
// Where a draw is only compared, u >= x, it is compared as an integer:
// u = bits * 2^-16 >= x exactly when bits >= ceil(x * 2^16) (a NaN x keeps
// nothing, as the comparison). Keep bits: lanes that share a draw can pass 8
// bits per draw instead of its words.
FJ_DEVICE unsigned fj_draw_threshold(float x) {
  if (!(x > 0.0f))
    return x == x ? 0u : 0x10000u;
  const float y = (x < 1.0f ? x : 1.0f) * 65536.0f; // exact: a power of two
  const unsigned t = (unsigned)y;
  return (float)t < y ? t + 1u : t;
}
// Bit s of the result: key s of the draw (16-bit half s % 2 of word s / 2) is
// kept.
FJ_DEVICE unsigned fj_keep_bits(const fj_draw_words &d, unsigned threshold) {
  unsigned bits = 0;
#pragma unroll
  for (int s = 0; s < 8; ++s)
    bits |= (unsigned)(((d.w[s >> 1] >> ((s & 1) * 16)) & 0xFFFFu) >= threshold) << s;
  return bits;
}
// Whether key kv_idx is kept: its bit of the draw's 8 at `base` of `word`.
FJ_DEVICE unsigned fj_keep_bit(unsigned word, int base, unsigned kv_idx) {
  return (word >> (base + (int)(kv_idx & 7u))) & 1u;
}
FJ_DEVICE float fj_uniform(unsigned long long seed, unsigned long long offset, unsigned b,
                           unsigned h, unsigned q_idx, unsigned kv_idx) {
  return fj_draw_slot(fj_draw(fj_philox_key(seed, offset), b, h, q_idx, kv_idx), kv_idx);
}

// ---- attention index math ----
// The run-time shapes come in as arguments: the sequence lengths and the
// sliding window's sizes (-1: unbounded on that side). kCausal, kBlockM and
// kBlockN are the kernel's named constants above.

// Whether query row i may see key j: sequence bounds, the bottom-right causal
// diagonal and the sliding window. Mirrors ir::visible().
FJ_DEVICE bool fj_visible(int i, int j, int seqlen_q, int seqlen_k, int window_left,
                          int window_right) {
  if (i >= seqlen_q || j >= seqlen_k)
    return false;
  const int diag = i + (seqlen_k - seqlen_q);
  if (kCausal && j > diag)
    return false;
  if (window_left >= 0 && j < diag - window_left)
    return false;
  if (window_right >= 0 && j > diag + window_right)
    return false;
  return true;
}

// fj_visible as a range: the keys query row i sees are [*lo, *hi] (none when
// *lo > *hi), so a masked block compares each key with its row's two bounds
// instead of evaluating fj_visible per score. (Per score, the run-time window
// sizes' tests kept the sm90 forward's mixed blocks past its registers.)
FJ_DEVICE void fj_visible_keys(int i, int seqlen_q, int seqlen_k, int window_left, int window_right,
                               int *lo, int *hi) {
  const int diag = i + (seqlen_k - seqlen_q);
  int first = 0, last = i < seqlen_q ? seqlen_k - 1 : -1;
  if (kCausal && diag < last)
    last = diag;
  if (window_left >= 0 && diag > window_left) // else every key from 0 (no overflow)
    first = diag - window_left;
  if (window_right >= 0 && last - diag > window_right)
    last = diag + window_right;
  *lo = first;
  *hi = last;
}

// The KV blocks holding at least one key visible to a query of positions
// [first, last] (seqlen_q of them); the loop skips the rest instead of masking them.
FJ_DEVICE void fj_kv_span(int first, int last, int seqlen_q, int seqlen_k, int window_left,
                          int window_right, int *begin, int *end) {
  const int off = seqlen_k - seqlen_q;
  int lo = 0, hi = seqlen_k - 1;
  if (window_left >= 0 && first + off - window_left > lo)
    lo = first + off - window_left;
  if (kCausal && last + off < hi)
    hi = last + off;
  if (window_right >= 0 && last + off + window_right < hi)
    hi = last + off + window_right;
  *begin = hi < lo ? 0 : lo / kBlockN;
  *end = hi < lo ? 0 : hi / kBlockN + 1;
}

// The KV blocks visible to q block qb. Mirrors ir::kv_block_range().
FJ_DEVICE void fj_kv_range(int qb, int seqlen_q, int seqlen_k, int window_left, int window_right,
                           int *begin, int *end) {
  const int first = qb * kBlockM;
  const int last = (first + kBlockM < seqlen_q ? first + kBlockM : seqlen_q) - 1;
  fj_kv_span(first, last, seqlen_q, seqlen_k, window_left, window_right, begin, end);
}

// fj_kv_range for grouped rows (q_group rows per query position, seqlen_q
// positions): the positions q block qb's rows hold.
FJ_DEVICE void fj_kv_range_grouped(int qb, int q_group, int seqlen_q, int seqlen_k, int window_left,
                                   int window_right, int *begin, int *end) {
  const int first = qb * kBlockM, rows = seqlen_q * q_group;
  const int last = (first + kBlockM < rows ? first + kBlockM : rows) - 1;
  fj_kv_span(first / q_group, last / q_group, seqlen_q, seqlen_k, window_left, window_right, begin,
             end);
}

// The transposed range of the backward's dK/dV loop: the query blocks (kBlockN
// queries) holding a query that sees a key of KV block kb (kBlockM keys).
// Mirrors ir::q_block_range().
FJ_DEVICE void fj_q_range(int kb, int seqlen_q, int seqlen_k, int window_left, int window_right,
                          int *begin, int *end) {
  const int first = kb * kBlockM;
  const int last = (first + kBlockM < seqlen_k ? first + kBlockM : seqlen_k) - 1;
  const int off = seqlen_k - seqlen_q;
  int lo = 0, hi = seqlen_q - 1;
  if (kCausal && first - off > lo)
    lo = first - off;
  if (window_right >= 0 && first - off - window_right > lo)
    lo = first - off - window_right;
  if (window_left >= 0 && last - off + window_left < hi)
    hi = last - off + window_left;
  const bool empty = last < first || hi < lo;
  *begin = empty ? 0 : lo / kBlockN;
  *end = empty ? 0 : hi / kBlockN + 1;
}

// Split `split` of `splits` of the block range [*begin, *end): runs of
// ceil(n / splits) blocks, the last ones possibly empty. Mirrors ir::split_range().
FJ_DEVICE void fj_split_range(int split, int splits, int *begin, int *end) {
  const int chunk = (*end - *begin + splits - 1) / splits;
  const int first = *begin + split * chunk < *end ? *begin + split * chunk : *end;
  *begin = first;
  *end = first + chunk < *end ? first + chunk : *end;
}

// True when every (query, key) of queries [i0, i1] and keys [j0, j1] is
// visible, so the mask can be skipped (a wave-uniform test).
FJ_DEVICE bool fj_span_unmasked(int i0, int i1, int j0, int j1, int seqlen_q, int seqlen_k,
                                int window_left, int window_right) {
  const int off = seqlen_k - seqlen_q;
  if (i1 >= seqlen_q || j1 >= seqlen_k)
    return false;
  if (kCausal && j1 > i0 + off)
    return false;
  if (window_left >= 0 && j0 < i1 + off - window_left)
    return false;
  if (window_right >= 0 && j1 > i0 + off + window_right)
    return false;
  return true;
}

// Of q block qb against KV block kb.
FJ_DEVICE bool fj_block_unmasked(int qb, int kb, int seqlen_q, int seqlen_k, int window_left,
                                 int window_right) {
  return fj_span_unmasked(qb * kBlockM, qb * kBlockM + kBlockM - 1, kb * kBlockN,
                          kb * kBlockN + kBlockN - 1, seqlen_q, seqlen_k, window_left,
                          window_right);
}

// Of grouped rows (q_group per position, seqlen_q positions): the positions q
// block qb's rows hold.
FJ_DEVICE bool fj_block_unmasked_grouped(int qb, int kb, int q_group, int seqlen_q, int seqlen_k,
                                         int window_left, int window_right) {
  return fj_span_unmasked(qb * kBlockM / q_group, (qb * kBlockM + kBlockM - 1) / q_group,
                          kb * kBlockN, kb * kBlockN + kBlockN - 1, seqlen_q, seqlen_k, window_left,
                          window_right);
}

// For the transposed tiles of the backward's dK/dV loop: KV block kb of
// kBlockM keys (the rows) against query block qb of kBlockN queries.
FJ_DEVICE bool fj_block_unmasked_t(int kb, int qb, int seqlen_q, int seqlen_k, int window_left,
                                   int window_right) {
  return fj_span_unmasked(qb * kBlockN, qb * kBlockN + kBlockN - 1, kb * kBlockM,
                          kb * kBlockM + kBlockM - 1, seqlen_q, seqlen_k, window_left,
                          window_right);
}

FJ_DEVICE int fj_clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

// The offset of key row `row` of a paged KV cache from its head's base: row
// row % page_size of page table[row / page_size]. A row past the table's row or
// a page outside [0, pages) reads page 0, so no table content reaches outside
// the cache (rows past the sequence's end are never used). Mirrors the
// interpreter's ir::TensorParam::Pages addressing.
FJ_DEVICE long fj_page_row(const int *table, int row, int table_stride, int page_size, int pages,
                           long page_stride, int seq_stride) {
  const int slot = row / page_size;
  int page = slot < table_stride ? table[slot] : 0;
  page = unsigned(page) < unsigned(pages) ? page : 0;
  return long(page) * page_stride + long(row - slot * page_size) * seq_stride;
}

// ---- score expressions (ir/expr.h's emit_c) ----
FJ_DEVICE int fj_min_int(int a, int b) { return a < b ? a : b; }
FJ_DEVICE int fj_max_int(int a, int b) { return a > b ? a : b; }
FJ_DEVICE float fj_min_float(float a, float b) { return a < b ? a : b; }
FJ_DEVICE float fj_max_float(float a, float b) { return a > b ? a : b; }
FJ_DEVICE int fj_abs_int(int a) { return a < 0 ? -a : a; }
// |a| as the sign bit cleared (each prelude's fj_fabs): on NVIDIA a modifier of
// the instruction that reads it, where a compare and select took two.
FJ_DEVICE float fj_abs_float(float a) { return fj_fabs(a); }
// Integer / and % as C has them, with 0 for a zero divisor (never a trap).
FJ_DEVICE int fj_int_div(int a, int b) { return b == 0 ? 0 : a / b; }
FJ_DEVICE int fj_int_mod(int a, int b) { return b == 0 ? 0 : a % b; }
FJ_DEVICE float fj_exp(float x) { return fj_exp2(x * 1.44269504f); }
FJ_DEVICE float fj_log(float x) { return fj_log2(x) * 0.693147181f; }
// tanh from exp2: (1 - e) / (1 + e) with e = exp(-2|x|), odd; within a few ulp
// (1 + e is in [1, 2], where the approximate reciprocal is within 1 ulp).
FJ_DEVICE float fj_tanh(float x) {
  const float e = fj_exp2(-2.88539008f * fj_abs_float(x));
  const float t = (1.0f - e) * fj_rcp_approx(1.0f + e);
  return x < 0 ? -t : t;
}

FJ_GLOBAL FJ_WORKGROUP_SIZE_MIN_BLOCKS(128, 3)
void fa_bwd_dkdv_direct_bf16_d64_64_07ac4dd6(
    const fj_bits *__restrict__ Q,
    const fj_bits *__restrict__ K,
    const fj_bits *__restrict__ V,
    const fj_bits *__restrict__ dO,
    const float *__restrict__ L,
    const float *__restrict__ D,
    fj_bits *__restrict__ dK,
    fj_bits *__restrict__ dV,
    int batches,
    int heads,
    int kv_heads,
    int group,
    int seqlen_q,
    int seqlen_k,
    float scale_log2,
    float scale,
    long q_batch_stride,
    long q_head_stride,
    int q_seq_stride,
    long k_batch_stride,
    long k_head_stride,
    int k_seq_stride,
    long v_batch_stride,
    long v_head_stride,
    int v_seq_stride,
    long do_batch_stride,
    long do_head_stride,
    int do_seq_stride,
    long l_batch_stride,
    long l_head_stride,
    long d_batch_stride,
    long d_head_stride,
    long dk_batch_stride,
    long dk_head_stride,
    int dk_seq_stride,
    long dv_batch_stride,
    long dv_head_stride,
    int dv_seq_stride,
    float dropout_p,
    float dropout_scale,
    long dropout_seed,
    long dropout_offset,
    const __grid_constant__ fj_tensor_map tmap_K_64,
    const __grid_constant__ fj_tensor_map tmap_V_64,
    const __grid_constant__ fj_tensor_map tmap_Q_64,
    const __grid_constant__ fj_tensor_map tmap_dO_64) {
  FJ_DYNAMIC_LDS_ARRAY(fj_bits, lds_k, 4096, 0); // K tile 64x64 in 128-byte swizzled panels of 64 columns
  FJ_DYNAMIC_LDS_ARRAY(fj_bits, lds_v, 4096, 8192); // V tile 64x64 in 128-byte swizzled panels of 64 columns
  FJ_DYNAMIC_LDS_ARRAY(fj_bits, lds_q_x2, 8192, 16384); // Q tile 64x64 in 128-byte swizzled panels of 64 columns (2 copies)
  fj_bits *const lds_q = lds_q_x2; // copy 0
  FJ_DYNAMIC_LDS_ARRAY(float, lds_l_cols_x2, 128, 32768); // @L: 64 f32, one per column (2 copies)
  float *const lds_l_cols = lds_l_cols_x2; // copy 0
  FJ_DYNAMIC_LDS_ARRAY(fj_bits, lds_do_x2, 8192, 33792); // dO tile 64x64 in 128-byte swizzled panels of 64 columns (2 copies)
  fj_bits *const lds_do = lds_do_x2; // copy 0
  FJ_DYNAMIC_LDS_ARRAY(float, lds_d_cols_x2, 128, 50176); // @D: 64 f32, one per column (2 copies)
  float *const lds_d_cols = lds_d_cols_x2; // copy 0
  FJ_DYNAMIC_LDS_ARRAY(unsigned long long, fj_tma_bar, 6, 50688); // the TMA copies' transaction barriers, one per buffer copy
  unsigned fj_tma_phase = 0; // bit i: the parity of barrier i's next fill
  fj_tma_init(fj_tma_bar, 6);
  const int lane = fj_thread_id() % kWave;
  const int wave = fj_thread_id() / kWave;
  const int g = lane / 4; // this lane's query rows: g and g + 8 of every 16-row tile
  const int t = lane % 4; // this lane's column pair: 2t, 2t + 1 of every 8-column tile
  const int kv_block = fj_group_id_x();
  const int head = fj_group_id_y();
  const int batch = fj_group_id_z();
  // The query at row r (0..15) of this wave's 16-query tile qt: its row in the
  // workgroup's block (local_row) and in the sequence (query_row).
  auto local_row = [&](int qt, int r) { return ((wave / 4 * kQTiles + qt) * 4 + wave % 4) * 16 + r; };
  auto query_row = [&](int qt, int r) { return kv_block * kBlockM + local_row(qt, r); };
  // IR: %0 = load %kv_block {tensor = @K}
  // IR: stage block kv_block of @K into lds_k: TMA, 1 panel of 64 columns x 64 rows
  if (fj_thread_id() == 0)
    fj_tma_tile(tmap_K_64, lds_k, &fj_tma_bar[0], 1, 64, (kv_block) * kBlockM, head / group, batch);
  fj_tma_wait(fj_tma_bar, 0, fj_tma_phase); // this thread sees the K tile
  fj_barrier(); // the K tile is complete before any wave reads it
  // IR: %1 = load %kv_block {tensor = @V}
  // IR: stage block kv_block of @V into lds_v: TMA, 1 panel of 64 columns x 64 rows
  if (fj_thread_id() == 0)
    fj_tma_tile(tmap_V_64, lds_v, &fj_tma_bar[1], 1, 64, (kv_block) * kBlockM, head / group, batch);
  fj_tma_wait(fj_tma_bar, 1, fj_tma_phase); // this thread sees the V tile
  fj_barrier(); // the V tile is complete before any wave reads it
  // IR: %2 = fill {value = 0}
  fj_float4 t2[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        t2[qt][c][e] = 0.0f;
      }
    }
  }
  // IR: %3 = fill {value = 0}
  fj_float4 t3[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        t3[qt][c][e] = 0.0f;
      }
    }
  }
  // IR: %grad, %dv = for %qb over the query blocks that see a key of %kv_block
  fj_float4 grad_i[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        grad_i[qt][c][e] = t2[qt][c][e];
      }
    }
  }
  fj_float4 dv_i[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        dv_i[qt][c][e] = t3[qt][c][e];
      }
    }
  }
  { // the loop's range, in a scope of its own (a program may have several loops)
    int kv_begin, kv_end;
    fj_q_range(kv_block, seqlen_q, seqlen_k, -1, -1, &kv_begin, &kv_end);
    // Block prefetch: the first block's tiles are in flight before the loop starts;
    // each iteration starts the next block's into the other copy of the buffers.
    if (kv_begin < kv_end) { // into copy 0
      fj_bits *const lds_q = lds_q_x2 + 0 * 4096;
      float *const lds_l_cols = lds_l_cols_x2 + 0 * 64;
      fj_bits *const lds_do = lds_do_x2 + 0 * 4096;
      float *const lds_d_cols = lds_d_cols_x2 + 0 * 64;
      // IR: stage block kv_begin of @Q into lds_q: TMA, 1 panel of 64 columns x 64 rows
      if (fj_thread_id() == 0)
        fj_tma_tile(tmap_Q_64, lds_q, &fj_tma_bar[2], 1, 64, (kv_begin) * kBlockN, head, batch);
      // IR: stage block kv_begin of @L into lds_l_cols
      {
        const float *src = L + long(batch) * l_batch_stride + long(head) * l_head_stride + long((kv_begin) * kBlockN) * 1;
        for (int i = fj_thread_id(); i < kBlockN; i += kThreads) {
          const int row = (kv_begin) * kBlockN + i;
          fj_stage_f32(&lds_l_cols[i], src + unsigned(i), row < seqlen_q); // 0 past the last row
        }
        fj_stage_commit();
      }
      // IR: stage block kv_begin of @dO into lds_do: TMA, 1 panel of 64 columns x 64 rows
      if (fj_thread_id() == 0)
        fj_tma_tile(tmap_dO_64, lds_do, &fj_tma_bar[4], 1, 64, (kv_begin) * kBlockN, head, batch);
      // IR: stage block kv_begin of @D into lds_d_cols
      {
        const float *src = D + long(batch) * d_batch_stride + long(head) * d_head_stride + long((kv_begin) * kBlockN) * 1;
        for (int i = fj_thread_id(); i < kBlockN; i += kThreads) {
          const int row = (kv_begin) * kBlockN + i;
          fj_stage_f32(&lds_d_cols[i], src + unsigned(i), row < seqlen_q); // 0 past the last row
        }
        fj_stage_commit();
      }
    }
    int fj_copy = 0; // the copy that holds this iteration's block
    for (int qb = kv_begin; qb < kv_end; ++qb) {
      fj_bits *const lds_q = lds_q_x2 + fj_copy * 4096;
      float *const lds_l_cols = lds_l_cols_x2 + fj_copy * 64;
      fj_bits *const lds_do = lds_do_x2 + fj_copy * 4096;
      float *const lds_d_cols = lds_d_cols_x2 + fj_copy * 64;
      fj_tma_wait(fj_tma_bar, 2 + (fj_copy), fj_tma_phase); // this thread sees the Q tile
      fj_tma_wait(fj_tma_bar, 4 + (fj_copy), fj_tma_phase); // this thread sees the dO tile
      fj_stage_wait();
      fj_barrier(); // this block's tiles are complete; every wave is done with the other copy
      if (qb + 1 < kv_end) { // the next block, into the other copy
        fj_bits *const lds_q = lds_q_x2 + (fj_copy ^ 1) * 4096;
        float *const lds_l_cols = lds_l_cols_x2 + (fj_copy ^ 1) * 64;
        fj_bits *const lds_do = lds_do_x2 + (fj_copy ^ 1) * 4096;
        float *const lds_d_cols = lds_d_cols_x2 + (fj_copy ^ 1) * 64;
        // IR: stage block qb + 1 of @Q into lds_q: TMA, 1 panel of 64 columns x 64 rows
        if (fj_thread_id() == 0)
          fj_tma_tile(tmap_Q_64, lds_q, &fj_tma_bar[2 + (fj_copy ^ 1)], 1, 64, (qb + 1) * kBlockN, head, batch);
        // IR: stage block qb + 1 of @L into lds_l_cols
        {
          const float *src = L + long(batch) * l_batch_stride + long(head) * l_head_stride + long((qb + 1) * kBlockN) * 1;
          for (int i = fj_thread_id(); i < kBlockN; i += kThreads) {
            const int row = (qb + 1) * kBlockN + i;
            fj_stage_f32(&lds_l_cols[i], src + unsigned(i), row < seqlen_q); // 0 past the last row
          }
          fj_stage_commit();
        }
        // IR: stage block qb + 1 of @dO into lds_do: TMA, 1 panel of 64 columns x 64 rows
        if (fj_thread_id() == 0)
          fj_tma_tile(tmap_dO_64, lds_do, &fj_tma_bar[4 + (fj_copy ^ 1)], 1, 64, (qb + 1) * kBlockN, head, batch);
        // IR: stage block qb + 1 of @D into lds_d_cols
        {
          const float *src = D + long(batch) * d_batch_stride + long(head) * d_head_stride + long((qb + 1) * kBlockN) * 1;
          for (int i = fj_thread_id(); i < kBlockN; i += kThreads) {
            const int row = (qb + 1) * kBlockN + i;
            fj_stage_f32(&lds_d_cols[i], src + unsigned(i), row < seqlen_q); // 0 past the last row
          }
          fj_stage_commit();
        }
      }
      // IR: %4 = load %qb {tensor = @Q}
      // IR: block qb of @Q is in lds_q (prefetched)
      // IR: %5 = fill {value = 0}
      fj_float4 t5[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t5[qt][c][e] = 0.0f;
          }
        }
      }
      // IR: %6 = mma_abt %0, %4, %5
      fj_float4 t6[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
        for (int c = 0; c < 8; ++c) t6[qt][c] = t5[qt][c];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t6[qt], 8);
      fj_wgmma_fence();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) { // one group: every tile's instructions
        const unsigned long long b = fj_wgmma_desc(lds_q, 16, 1024);
        const unsigned long long a = fj_wgmma_desc(lds_k + ((wave / 4 * kQTiles + qt) * 64) * 64, 16, 1024);
        #pragma unroll
        for (int k = 0; k < 4; ++k)
          fj_wgmma_bf16_n64_sk(t6[qt] + 0, a + ((k / 4 * 8192 + k % 4 * 32) >> 4), b + ((0 + k / 4 * 8192 + k % 4 * 32) >> 4));
      }
      fj_wgmma_commit();
      fj_wgmma_wait_all();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t6[qt], 8);
      // IR: %7 = mask %6, %kv_block, %qb
      fj_float4 t7[kQTiles][8];
      if (fj_block_unmasked_t(kv_block, qb, seqlen_q, seqlen_k, -1, -1)) { // every pair of the block is visible
        #pragma unroll
        for (int qt = 0; qt < kQTiles; ++qt) {
          #pragma unroll
          for (int c = 0; c < 8; ++c) {
            #pragma unroll
            for (int e = 0; e < kAccElems; ++e) {
              t7[qt][c][e] = t6[qt][c][e];
            }
          }
        }
      } else {
        #pragma unroll
        for (int qt = 0; qt < kQTiles; ++qt) {
          #pragma unroll
          for (int c = 0; c < 8; ++c) {
            #pragma unroll
            for (int e = 0; e < kAccElems; ++e) {
              const int query = qb * kBlockN + c * kNTile + 2 * t + e % 2;
              t7[qt][c][e] = fj_visible(query, query_row(qt, g + 8 * (e / 2)), seqlen_q, seqlen_k, -1, -1) ? t6[qt][c][e] : -FJ_INF;
            }
          }
        }
      }
      // IR: %8 = scale %7
      fj_float4 t8[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t8[qt][c][e] = t7[qt][c][e] * scale_log2;
          }
        }
      }
      // IR: %9 = load %qb {tensor = @L}
      // IR: block qb of @L is in lds_l_cols (prefetched)
      // IR: %10 = sub_col %8, %9
      fj_float4 t10[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t10[qt][c][e] = t8[qt][c][e] - lds_l_cols[c * kNTile + 2 * t + e % 2];
          }
        }
      }
      // IR: %11 = exp2 %10
      fj_float4 t11[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t11[qt][c][e] = fj_exp2(t10[qt][c][e]);
          }
        }
      }
      // IR: %12 = load %qb {tensor = @dO}
      // IR: block qb of @dO is in lds_do (prefetched)
      // IR: %13 = fill {value = 0}
      fj_float4 t13[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t13[qt][c][e] = 0.0f;
          }
        }
      }
      // IR: %14 = mma_abt %1, %12, %13
      fj_float4 t14[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
        for (int c = 0; c < 8; ++c) t14[qt][c] = t13[qt][c];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t14[qt], 8);
      fj_wgmma_fence();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) { // one group: every tile's instructions
        const unsigned long long b = fj_wgmma_desc(lds_do, 16, 1024);
        const unsigned long long a = fj_wgmma_desc(lds_v + ((wave / 4 * kQTiles + qt) * 64) * 64, 16, 1024);
        #pragma unroll
        for (int k = 0; k < 4; ++k)
          fj_wgmma_bf16_n64_sk(t14[qt] + 0, a + ((k / 4 * 8192 + k % 4 * 32) >> 4), b + ((0 + k / 4 * 8192 + k % 4 * 32) >> 4));
      }
      fj_wgmma_commit();
      fj_wgmma_wait_all();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t14[qt], 8);
      // IR: %15 = load %qb {tensor = @D}
      // IR: block qb of @D is in lds_d_cols (prefetched)
      // IR: %16 = score_mod %11, %kv_block, %qb
      fj_float4 t16[kQTiles][8];
      // ((uniform(dropout_seed, dropout_offset, b, h, q_idx, kv_idx) >= dropout_p) ? (score * dropout_scale) : 0.0)
      { // 1 draw(s) per query and 8 aligned keys; lanes differing in bits 0x1c hold the same 8 draws: each lane draws 1, makes each draw 8 keep bits, and they OR their bits together
        const fj_draw_key fj_key0 = fj_philox_key((unsigned long long)(dropout_seed), (unsigned long long)(dropout_offset));
        const unsigned fj_threshold0 = fj_draw_threshold(dropout_p);
        const int fj_rank = (lane >> 2) & 7; // this lane's index among those sharing its draws
        #pragma unroll
        for (int qt = 0; qt < kQTiles; ++qt) {
          #pragma unroll
          for (int c0 = 0; c0 < 8; c0 += 2) {
            unsigned fj_keep0_0[2];
            {
              int fj_q = 0, fj_k = 0;
              { const int c = c0 + 0, e = 0; if (fj_rank == 0) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 0, e = 1; if (fj_rank == 1) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 0, e = 2; if (fj_rank == 2) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 0, e = 3; if (fj_rank == 3) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 1, e = 0; if (fj_rank == 4) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 1, e = 1; if (fj_rank == 5) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 1, e = 2; if (fj_rank == 6) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              { const int c = c0 + 1, e = 3; if (fj_rank == 7) { fj_q = qb * kBlockN + c * kNTile + 2 * t + e % 2; fj_k = kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)); } }
              unsigned fj_mine = fj_keep_bits(fj_draw(fj_key0, batch, head, fj_q, fj_k), fj_threshold0) << (8 * (fj_rank % 4));
              fj_mine |= fj_shfl_u32(fj_mine, lane, lane ^ 0x4);
              fj_mine |= fj_shfl_u32(fj_mine, lane, lane ^ 0x8);
              fj_keep0_0[0] = fj_shfl_u32(fj_mine, lane, (lane & ~0x1c) | 0x0);
              fj_keep0_0[1] = fj_shfl_u32(fj_mine, lane, (lane & ~0x1c) | 0x10);
            }
            { // draw 0 of the round: elements (c, e) (0, 0)
              const unsigned fj_keepword0 = fj_keep0_0[0];
              const int fj_keepbase0 = 0;
              { const int c = c0 + 0, e = 0; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 1 of the round: elements (c, e) (0, 1)
              const unsigned fj_keepword0 = fj_keep0_0[0];
              const int fj_keepbase0 = 8;
              { const int c = c0 + 0, e = 1; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 2 of the round: elements (c, e) (0, 2)
              const unsigned fj_keepword0 = fj_keep0_0[0];
              const int fj_keepbase0 = 16;
              { const int c = c0 + 0, e = 2; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 3 of the round: elements (c, e) (0, 3)
              const unsigned fj_keepword0 = fj_keep0_0[0];
              const int fj_keepbase0 = 24;
              { const int c = c0 + 0, e = 3; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 4 of the round: elements (c, e) (1, 0)
              const unsigned fj_keepword0 = fj_keep0_0[1];
              const int fj_keepbase0 = 0;
              { const int c = c0 + 1, e = 0; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 5 of the round: elements (c, e) (1, 1)
              const unsigned fj_keepword0 = fj_keep0_0[1];
              const int fj_keepbase0 = 8;
              { const int c = c0 + 1, e = 1; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 6 of the round: elements (c, e) (1, 2)
              const unsigned fj_keepword0 = fj_keep0_0[1];
              const int fj_keepbase0 = 16;
              { const int c = c0 + 1, e = 2; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
            { // draw 7 of the round: elements (c, e) (1, 3)
              const unsigned fj_keepword0 = fj_keep0_0[1];
              const int fj_keepbase0 = 24;
              { const int c = c0 + 1, e = 3; t16[qt][c][e] = ((fj_keep_bit(fj_keepword0, fj_keepbase0, kv_block * kBlockM + local_row(qt, g + 8 * (e / 2)))) ? float(((t11[qt][c][e]) * dropout_scale)) : float(0.0f)); }
            }
          }
        }
      }
      // IR: %17 = fill {value = 0}
      fj_float4 t17[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t17[qt][c][e] = 0.0f;
          }
        }
      }
      // IR: %18 = sub_col %17, %15
      fj_float4 t18[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t18[qt][c][e] = t17[qt][c][e] - lds_d_cols[c * kNTile + 2 * t + e % 2];
          }
        }
      }
      // IR: %19 = mul %16, %14
      fj_float4 t19[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t19[qt][c][e] = t16[qt][c][e] * t14[qt][c][e];
          }
        }
      }
      // IR: %20 = mul %11, %18
      fj_float4 t20[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t20[qt][c][e] = t11[qt][c][e] * t18[qt][c][e];
          }
        }
      }
      // IR: %21 = add %19, %20
      fj_float4 t21[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t21[qt][c][e] = t19[qt][c][e] + t20[qt][c][e];
          }
        }
      }
      // IR: %22 = load %qb {tensor = @dO}
      // IR: block qb of @dO is in lds_do (prefetched)
      // IR: %23 = convert %16
      fj_bits4 t23[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t23[qt][c][e] = fj_from_f32(t16[qt][c][e]);
          }
        }
      }
      // IR: %24 = convert_layout %23
      // The S fragments of key tiles 2k and 2k + 1 are the A fragment of key tile k.
      fj_bits8 t24[kQTiles][4];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int k = 0; k < 4; ++k) t24[qt][k] = fj_cat(t23[qt][2 * k], t23[qt][2 * k + 1]);
      }
      // IR: %25 = mma_ab %24, %22, %dv_i
      fj_float4 t25[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
        for (int c = 0; c < 8; ++c) t25[qt][c] = dv_i[qt][c];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t25[qt], 8);
      fj_wgmma_fence();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) { // one group: every tile's instructions
        const unsigned long long b = fj_wgmma_desc(lds_do, 8192, 1024);
        #pragma unroll
        for (int k = 0; k < 4; ++k)
          fj_wgmma_bf16_n64_rmn(t25[qt] + 0, t24[qt][k], b + ((0 + k * 2048) >> 4));
      }
      fj_wgmma_commit();
      fj_wgmma_wait_all();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t25[qt], 8);
      // IR: %26 = load %qb {tensor = @Q}
      // IR: block qb of @Q is in lds_q (prefetched)
      // IR: %27 = convert %21
      fj_bits4 t27[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            t27[qt][c][e] = fj_from_f32(t21[qt][c][e]);
          }
        }
      }
      // IR: %28 = convert_layout %27
      // The S fragments of key tiles 2k and 2k + 1 are the A fragment of key tile k.
      fj_bits8 t28[kQTiles][4];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int k = 0; k < 4; ++k) t28[qt][k] = fj_cat(t27[qt][2 * k], t27[qt][2 * k + 1]);
      }
      // IR: %29 = mma_ab %28, %26, %grad_i
      fj_float4 t29[kQTiles][8];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt)
        for (int c = 0; c < 8; ++c) t29[qt][c] = grad_i[qt][c];
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t29[qt], 8);
      fj_wgmma_fence();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) { // one group: every tile's instructions
        const unsigned long long b = fj_wgmma_desc(lds_q, 8192, 1024);
        #pragma unroll
        for (int k = 0; k < 4; ++k)
          fj_wgmma_bf16_n64_rmn(t29[qt] + 0, t28[qt][k], b + ((0 + k * 2048) >> 4));
      }
      fj_wgmma_commit();
      fj_wgmma_wait_all();
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) fj_wgmma_pin(t29[qt], 8);
      fj_copy ^= 1;
      // IR: yield
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            grad_i[qt][c][e] = t29[qt][c][e];
          }
        }
      }
      #pragma unroll
      for (int qt = 0; qt < kQTiles; ++qt) {
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
          #pragma unroll
          for (int e = 0; e < kAccElems; ++e) {
            dv_i[qt][c][e] = t25[qt][c][e];
          }
        }
      }
    }
  }
  fj_float4 (&grad)[kQTiles][8] = grad_i;
  fj_float4 (&dv)[kQTiles][8] = dv_i;
  // IR: %30 = scale %grad
  fj_float4 t30[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        t30[qt][c][e] = grad[qt][c][e] * scale;
      }
    }
  }
  // IR: %31 = convert %30
  fj_bits4 t31[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        t31[qt][c][e] = fj_from_f32(t30[qt][c][e]);
      }
    }
  }
  // IR: store %31, %kv_block {tensor = @dK}
  fj_bits *t31_dst = dK + long(batch) * dk_batch_stride + long(head) * dk_head_stride + long(kv_block * kBlockM) * dk_seq_stride;
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      {
        const int row = query_row(qt, g);
        const int d0 = c * kNTile + 2 * t;
        fj_bits *dst = t31_dst + unsigned(local_row(qt, g)) * unsigned(dk_seq_stride);
        if (row < seqlen_k) {
          if (kVecLoads && d0 + 2 <= kDimQK)
            fj_global_store2(dst + d0, t31[qt][c][0], t31[qt][c][1]);
          else
            for (int i = 0; i < 2; ++i)
              if (d0 + i < kDimQK) fj_global_store1(dst + long(d0 + i), t31[qt][c][i]);
        }
      }
      {
        const int row = query_row(qt, g + 8);
        const int d0 = c * kNTile + 2 * t;
        fj_bits *dst = t31_dst + unsigned(local_row(qt, g + 8)) * unsigned(dk_seq_stride);
        if (row < seqlen_k) {
          if (kVecLoads && d0 + 2 <= kDimQK)
            fj_global_store2(dst + d0, t31[qt][c][2], t31[qt][c][3]);
          else
            for (int i = 0; i < 2; ++i)
              if (d0 + i < kDimQK) fj_global_store1(dst + long(d0 + i), t31[qt][c][2 + i]);
        }
      }
    }
  }
  // IR: %32 = convert %dv
  fj_bits4 t32[kQTiles][8];
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      #pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        t32[qt][c][e] = fj_from_f32(dv[qt][c][e]);
      }
    }
  }
  // IR: store %32, %kv_block {tensor = @dV}
  fj_bits *t32_dst = dV + long(batch) * dv_batch_stride + long(head) * dv_head_stride + long(kv_block * kBlockM) * dv_seq_stride;
  #pragma unroll
  for (int qt = 0; qt < kQTiles; ++qt) {
    #pragma unroll
    for (int c = 0; c < 8; ++c) {
      {
        const int row = query_row(qt, g);
        const int d0 = c * kNTile + 2 * t;
        fj_bits *dst = t32_dst + unsigned(local_row(qt, g)) * unsigned(dv_seq_stride);
        if (row < seqlen_k) {
          if (kVecLoads && d0 + 2 <= kDimV)
            fj_global_store2(dst + d0, t32[qt][c][0], t32[qt][c][1]);
          else
            for (int i = 0; i < 2; ++i)
              if (d0 + i < kDimV) fj_global_store1(dst + long(d0 + i), t32[qt][c][i]);
        }
      }
      {
        const int row = query_row(qt, g + 8);
        const int d0 = c * kNTile + 2 * t;
        fj_bits *dst = t32_dst + unsigned(local_row(qt, g + 8)) * unsigned(dv_seq_stride);
        if (row < seqlen_k) {
          if (kVecLoads && d0 + 2 <= kDimV)
            fj_global_store2(dst + d0, t32[qt][c][2], t32[qt][c][3]);
          else
            for (int i = 0; i < 2; ++i)
              if (d0 + i < kDimV) fj_global_store1(dst + long(d0 + i), t32[qt][c][2 + i]);
        }
      }
    }
  }
}
