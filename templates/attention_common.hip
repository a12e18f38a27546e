// ---- attention index math (uses the kernel's named constants above) ----
// Whether query row i may see key j: sequence bounds, the bottom-right causal
// diagonal and the sliding window. Mirrors ir::visible().
FJ_DEVICE bool fj_visible(int i, int j) {
  if (i >= kSeqQ || j >= kSeqK)
    return false;
  const int diag = i + (kSeqK - kSeqQ);
  if (kCausal && j > diag)
    return false;
  if (kWindowLeft >= 0 && j < diag - kWindowLeft)
    return false;
  if (kWindowRight >= 0 && j > diag + kWindowRight)
    return false;
  return true;
}

// The KV blocks holding at least one key visible to q block qb; the loop skips
// the rest instead of masking them. Mirrors ir::kv_block_range().
FJ_DEVICE void fj_kv_range(int qb, int *begin, int *end) {
  const int first = qb * kBlockM;
  const int last = (first + kBlockM < kSeqQ ? first + kBlockM : kSeqQ) - 1;
  const int off = kSeqK - kSeqQ;
  int lo = 0, hi = kSeqK - 1;
  if (kWindowLeft >= 0 && first + off - kWindowLeft > lo)
    lo = first + off - kWindowLeft;
  if (kCausal && last + off < hi)
    hi = last + off;
  if (kWindowRight >= 0 && last + off + kWindowRight < hi)
    hi = last + off + kWindowRight;
  *begin = hi < lo ? 0 : lo / kBlockN;
  *end = hi < lo ? 0 : hi / kBlockN + 1;
}

// True when every (query, key) of the block pair is visible, so the mask can be
// skipped (a wave-uniform test).
FJ_DEVICE bool fj_block_unmasked(int qb, int kb) {
  const int i0 = qb * kBlockM, i1 = i0 + kBlockM - 1;
  const int j0 = kb * kBlockN, j1 = j0 + kBlockN - 1;
  const int off = kSeqK - kSeqQ;
  if (i1 >= kSeqQ || j1 >= kSeqK)
    return false;
  if (kCausal && j1 > i0 + off)
    return false;
  if (kWindowLeft >= 0 && j0 < i1 + off - kWindowLeft)
    return false;
  if (kWindowRight >= 0 && j1 > i0 + off + kWindowRight)
    return false;
  return true;
}
