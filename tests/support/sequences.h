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
  int64_t page_size;  // 0: not paged
  bool sinks = false; // attention sinks (random logits)
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
  s.sinks = c.sinks;
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

/// The cases every backend runs (tests/varlen_test.cpp, the CUDA tests): ragged
/// lengths with 0 and 1, windows, GQA to MQA, pages of 16, 64 and 256 keys.
inline const std::vector<SeqCase> &seq_cases() {
  constexpr Window kNoWindow{-1, -1};
  constexpr auto bf16 = DType::bf16, f16 = DType::f16;
  static const std::vector<SeqCase> cases = {
      // varlen Q and K, equal lengths per sequence (prefill), empty and 1-token sequences
      {"varlen_causal_gqa4",
       8,
       2,
       64,
       64,
       bf16,
       true,
       kNoWindow,
       true,
       {5, 0, 37, 1},
       {5, 0, 37, 1},
       true,
       true,
       false,
       0},
      // more keys than queries per sequence, a window, MQA, odd head dim
      {"varlen_window_mqa_d80",
       4,
       1,
       80,
       80,
       f16,
       false,
       Window{16, 3},
       true,
       {3, 40, 1},
       {100, 7, 65},
       true,
       true,
       false,
       0},
      // decode over a dense cache of per-batch lengths (cache_seqlens), GQA 8:1
      {"kvcache_decode_gqa8",
       8,
       1,
       128,
       128,
       bf16,
       true,
       kNoWindow,
       false,
       {1, 1, 1, 1},
       {300, 0, 17, 129},
       false,
       false,
       true,
       0},
      // paged cache, 16-key pages, 4 query tokens, causal
      {"paged16_q4_causal",
       8,
       2,
       64,
       64,
       bf16,
       true,
       kNoWindow,
       true,
       {4, 4, 4},
       {50, 3, 0},
       false,
       false,
       true,
       16},
      // 64-key pages, decode, MQA, Dqk != Dv
      {"paged64_decode_mqa",
       4,
       1,
       96,
       64,
       f16,
       false,
       kNoWindow,
       true,
       {1, 1},
       {200, 65},
       false,
       false,
       true,
       64},
      // 256-key pages with varlen queries (chunked prefill over a paged cache)
      {"paged256_varlen_q",
       4,
       4,
       128,
       128,
       bf16,
       true,
       kNoWindow,
       true,
       {1, 16, 4},
       {600, 16, 300},
       true,
       false,
       true,
       256},
      // packed keys with room: seqused_k counts fewer than each sequence holds
      {"varlen_k_seqused",
       4,
       2,
       72,
       72,
       f16,
       true,
       kNoWindow,
       false,
       {2, 2, 2},
       {9, 0, 70},
       false,
       true,
       true,
       0},
  };
  return cases;
}

/// Longer cases for GPUs: ragged prefill up to 1500 tokens, paged decode over
/// 4000 keys (GQA 32:8), 16 query tokens over 256-key pages.
inline const std::vector<SeqCase> &long_seq_cases() {
  constexpr Window kNoWindow{-1, -1};
  static const std::vector<SeqCase> cases = {
      {"long_varlen_prefill",
       16,
       4,
       128,
       128,
       DType::bf16,
       true,
       kNoWindow,
       true,
       {1500, 1, 0, 777, 64},
       {1500, 1, 0, 777, 64},
       true,
       true,
       false,
       0},
      {"long_paged_decode",
       32,
       8,
       128,
       128,
       DType::bf16,
       false,
       kNoWindow,
       true,
       {1, 1, 1},
       {4000, 1, 2049},
       false,
       false,
       true,
       16},
      {"long_paged_q16",
       8,
       1,
       64,
       64,
       DType::f16,
       true,
       kNoWindow,
       false,
       {16, 16},
       {3000, 17},
       false,
       false,
       true,
       256},
  };
  return cases;
}

} // namespace flashjit::test
