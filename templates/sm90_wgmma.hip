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
