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
