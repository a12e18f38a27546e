// ---- a mask tensor's block summary (lowering/mask_blocks.cpp) ----
// One byte per (query block, key block) of the mask tensor, written by the
// summary kernel before the attention kernel runs, read by the attention
// kernel's block scan: FJ_MASK_BLOCK_EMPTY, no pair of the block attends (bool
// 0, or -inf added), so the block is skipped; FJ_MASK_BLOCK_FULL, every pair
// attends unchanged (bool nonzero, or 0 added), so the block skips the mask's
// loads; FJ_MASK_BLOCK_MIXED, anything else (NaN included), read per element.
// Only pairs within seqlen_q x seqlen_k count. An axis the mask broadcasts
// (stride 0) has one entry: a key-padding mask [batch, seqlen_k] has one row of
// key blocks per batch.
#define FJ_MASK_BLOCK_EMPTY 0
#define FJ_MASK_BLOCK_MIXED 1
#define FJ_MASK_BLOCK_FULL 2

// The entry of query block qb and key block kb of (batch b, head h), for
// blocks of block_q queries and block_k keys.
FJ_DEVICE long fj_mask_cell(long b, long h, int qb, int kb, int heads, int seqlen_q, int seqlen_k,
                            int block_q, int block_k, long batch_stride, long head_stride,
                            long q_stride) {
  const long k_blocks = (seqlen_k + block_k - 1) / block_k;
  const long q_blocks = q_stride != 0 ? (seqlen_q + block_q - 1) / block_q : 1;
  const long head_cells = head_stride != 0 ? heads : 1;
  const long bh = (batch_stride != 0 ? b : 0) * head_cells + (head_stride != 0 ? h : 0);
  return (bh * q_blocks + (q_stride != 0 ? qb : 0)) * k_blocks + kb;
}
