// Specs and inputs with Sequences (varlen batches, per-batch key counts, paged KV
// caches) for the numeric tests: ragged lengths, packed tensors with spare rows
// past the last sequence, and block tables that hand out the cache's pages in a
// shuffled order.
#pragma once

#include "ir/reference.h"
#include "ir/spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace flashjit::test {

struct SeqCase {
  const char *name;
  int64_t hq, hkv, dqk, dv;
  DType dtype;
  bool causal;
  Window window;
  bool lse;
  std::vector<int32_t> q_lens, k_lens; // per batch; dense Q needs equal lengths
  bool packed_q, packed_k, used_k;
  int64_t page_size; // 0: not paged
};

inline std::string name_of(const SeqCase &c) { return c.name; }
inline void PrintTo(const SeqCase &c, std::ostream *os) { *os << c.name; }

/// The spec of a case and its inputs: random Q/K/V (make_random_inputs), the
/// index arrays, poisoned outputs.
struct SeqInputs {
  AttentionSpec spec;
  HostTensors tensors;
};

inline SeqInputs make_seq_inputs(const SeqCase &c, uint64_t seed, Layout layout = Layout::bshd) {
  const int64_t batch = int64_t(c.q_lens.size());
  const int32_t max_q = std::max(1, *std::max_element(c.q_lens.begin(), c.q_lens.end()));
  const int32_t max_k = std::max(1, *std::max_element(c.k_lens.begin(), c.k_lens.end()));
  AttentionSpec s;
  s.batch = batch;
  s.heads = c.hq;
  s.kv_heads = c.hkv;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  s.dtype = c.dtype;
  s.causal = c.causal;
  s.window = c.window;
  s.lse = c.lse;
  s.seqlen_q = max_q;
  HostTensors idx;
  std::mt19937 rng{uint32_t(seed)};
  auto cumulative = [](const std::vector<int32_t> &lens, int32_t room) {
    std::vector<int32_t> cu{0};
    for (int32_t n : lens)
      cu.push_back(cu.back() + n + room);
    return cu;
  };
  if (c.packed_q) {
    s.seqs.packed_q = true;
    idx.cu_seqlens_q = cumulative(c.q_lens, 0);
    s.seqs.total_q = idx.cu_seqlens_q.back() + 3; // spare rows past the last sequence
  }
  // With used_k, packed and dense K have room past each batch's keys.
  const int32_t room = c.used_k ? 5 : 0;
  s.seqlen_k = max_k + room;
  if (c.packed_k) {
    s.seqs.packed_k = true;
    idx.cu_seqlens_k = cumulative(c.k_lens, room);
    s.seqs.total_k = idx.cu_seqlens_k.back() + 2;
  }
  if (c.used_k) {
    s.seqs.used_k = true;
    idx.seqused_k = c.k_lens;
  }
  if (c.page_size > 0) {
    s.seqs.page_size = c.page_size;
    s.seqs.pages_per_seq = (s.seqlen_k + c.page_size - 1) / c.page_size;
    s.seqs.num_pages = batch * s.seqs.pages_per_seq + 3;
    std::vector<int32_t> pages(size_t(s.seqs.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    idx.block_table.assign(pages.begin(), pages.begin() + batch * s.seqs.pages_per_seq);
  }
  s.set_layout(layout);
  SeqInputs out{s, make_random_inputs(s, seed)};
  out.tensors.cu_seqlens_q = idx.cu_seqlens_q;
  out.tensors.cu_seqlens_k = idx.cu_seqlens_k;
  out.tensors.seqused_k = idx.seqused_k;
  out.tensors.block_table = idx.block_table;
  return out;
}

} // namespace flashjit::test
