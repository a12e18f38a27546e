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
  typename fj_word_of<N * int(sizeof(T))>::type word;
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
// Word i of a draw, by selects, not an index, so the words stay in registers.
FJ_DEVICE unsigned fj_pick_word(const fj_draw_words &d, int i) {
  const unsigned lo = (i & 1) ? d.w[1] : d.w[0], hi = (i & 1) ? d.w[3] : d.w[2];
  return (i & 2) ? hi : lo;
}
// Key kv_idx's 16 bits of the word of its draw that holds them (word
// kv_idx % 8 / 2), and its draw in [0, 1).
FJ_DEVICE unsigned fj_word_bits(unsigned word, unsigned kv_idx) {
  return (word >> ((kv_idx & 1u) * 16u)) & 0xFFFFu;
}
FJ_DEVICE float fj_word_slot(unsigned word, unsigned kv_idx) {
  return (float)fj_word_bits(word, kv_idx) * 1.52587890625e-05f; // 2^-16
}
// The same from the draw's four words.
FJ_DEVICE unsigned fj_draw_bits(const fj_draw_words &d, unsigned kv_idx) {
  return fj_word_bits(fj_pick_word(d, int(kv_idx >> 1 & 3u)), kv_idx);
}
FJ_DEVICE float fj_draw_slot(const fj_draw_words &d, unsigned kv_idx) {
  return fj_word_slot(fj_pick_word(d, int(kv_idx >> 1 & 3u)), kv_idx);
}
// Where the lanes pass each other just the word each reads (DrawPlan::
// Share::one_word): the word received in round i.
template <int N> FJ_DEVICE unsigned fj_pick(const unsigned (&v)[N], int i) {
  unsigned r = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k)
    r = i == k ? v[k] : r;
  return r;
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
  for (unsigned s = 0; s < 8; ++s)
    bits |= (unsigned)(fj_draw_bits(d, s) >= threshold) << s;
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
FJ_DEVICE void fj_visible_keys(int i, int seqlen_q, int seqlen_k, int window_left,
                               int window_right, int *lo, int *hi) {
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
FJ_DEVICE void fj_kv_range_grouped(int qb, int q_group, int seqlen_q, int seqlen_k,
                                   int window_left, int window_right, int *begin, int *end) {
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
                          kb * kBlockN, kb * kBlockN + kBlockN - 1, seqlen_q, seqlen_k,
                          window_left, window_right);
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
