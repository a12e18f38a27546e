#include "tools/spec_flags.h"

namespace flashjit::cli {

std::vector<FlagSpec> spec_flags() {
  return {
      {"--batch", "N", "batch size", "1"},
      {"--heads", "N", "query heads", "1"},
      {"--kv-heads", "N", "key/value heads (heads must be a multiple: GQA/MQA)", "same as --heads"},
      {"--seqlen-q", "N", "query sequence length", "128"},
      {"--seqlen-k", "N", "key/value sequence length", "same as --seqlen-q"},
      {"--head-dim", "N", "head dim of Q and K (1..512)", "64"},
      {"--head-dim-v", "N", "head dim of V and O (1..512)", "same as --head-dim"},
      {"--dtype", "bf16|f16", "element type of Q, K, V and O (f32 accumulation)", "bf16"},
      {"--f32-io", "",
       "Q, K, V and O are f32 in memory: Q, K, V rounded to --dtype in the kernel for the "
       "products, O written as f32",
       ""},
      {"--layout", "bshd|bhsd|interleaved", "memory layout of Q/K/V/O", "bshd"},
      {"--causal", "", "causal mask, bottom-right aligned when seqlen-q != seqlen-k", ""},
      {"--window", "L,R", "sliding window: keys in [i-L, i+R] around the diagonal; -1 = unbounded",
       "-1,-1"},
      {"--scale", "X", "softmax scale", "1/sqrt(head-dim)"},
      {"--lse", "", "also write the log-sum-exp per query row", ""},
      {"--softcap", "X",
       "score = X * tanh(score / X) on the scaled score (FlashAttention's softcap)", "0 (off)"},
      {"--alibi", "heads|batch-heads",
       "ALiBi: score -= slope * |q_idx + seqlen_k - seqlen_q - kv_idx| with slopes [heads] or "
       "[batch, heads] (run draws them at random in [0.05, 1))",
       "none"},
      {"--score-mod", "EXPR",
       "score modifier: an expression of score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k "
       "(C-like: + - * / % < <= == != && || ! ?: min max abs exp log tanh; docs/masks.md)",
       "none"},
      {"--mask-mod", "EXPR",
       "mask: an expression of b, h, q_idx, kv_idx, seqlen_q, seqlen_k; 0 hides the key", "none"},
      {"--attn-mask", "TYPE[:AXES]",
       "a mask tensor (SDPA's attn_mask): TYPE bool (nonzero attends) or f32|f16|bf16 (added to "
       "the scaled score), dense over AXES, the letters of [batch, heads, seqlen_q, seqlen_k] it "
       "has (the others broadcast): bhqk, bqk, hqk, qk, bk (key padding), ... (run draws it at "
       "random)",
       "none"},
      {"--dropout", "P",
       "dropout: drop each attention weight with probability P in [0, 1), scale the kept by "
       "1 / (1 - P) (Philox draws of --dropout-seed)",
       "0 (off)"},
      {"--dropout-seed", "S", "the seed of dropout's draws, below 2^53", "0"},
      {"--num-splits", "N",
       "split-KV (flash-decoding): each query block's keys over N workgroups, merged by LSE; "
       "0 lets the library choose per call (hip:N, cuda:N, emulator:ARCH), 1 is off",
       "0 (chosen per call on a library device, off on interpreter|emulator)"},
  };
}

std::vector<FlagSpec> config_flags() {
  return {
      {"--block-m", "N", "query rows per workgroup", "the target's choice, 64"},
      {"--block-n", "N", "keys per KV block", "the target's choice by head dim"},
      {"--waves", "N", "waves per workgroup", "the target's choice"},
      {"--stages", "1|2|3",
       "K/V pipelining: 1 none, 2 issues each K/V tile's copy one step ahead (the backward's loops "
       "prefetch the next block into a second copy of their LDS tiles), 3 a producer warpgroup "
       "fills a "
       "ring of two K/V copies by TMA (sm_90: the forward, and wide GQA-packed decode)",
       "the target's choice"},
      {"--q-in-lds", "", "keep the Q block in LDS instead of registers", ""},
      {"--prefetch-blocks", "on|off",
       "with --stages 2: the forward's KV loop issues the next block's K and V tiles at the top of "
       "each iteration into a second copy of their LDS buffers (twice their LDS)",
       "the target's choice (on for GQA-packed decode's four-wave kernels)"},
      {"--persistent", "on|off",
       "with --stages 3: a workgroup per SM walks the (query block, head, batch) tiles, the "
       "producer copying the next tile's K/V while the consumers finish the last",
       "the target's choice (sm_90: on from head dim 72 to 128 without a mask_mod block range; "
       "causal tiles from a counter)"},
      {"--mma-m", "16|32",
       "queries per matrix-instruction tile: 32 takes the CDNA 32x32 MFMAs (gfx90a, gfx942: "
       "32x32x8; gfx950: 32x32x16), 16 the 16x16 ones",
       "the target's choice by spec"},
      {"--dkdv-passes", "1|2",
       "the backward's dK/dV kernel: 1 one loop accumulating both, 2 dV's loop then dK's (one "
       "accumulator live at a time)",
       "the lowering's choice by registers"},
      {"--rules", "auto|matrix|simt",
       "lowering rules: the family's matrix instructions, or the portable simt fallback (auto: "
       "matrix, falling back to simt when a spec does not fit, and saying so)",
       "auto"},
  };
}

Status set_attn_mask(const std::string &value, AttentionSpec &s) {
  const size_t colon = value.find(':');
  auto type = parse_mask_type(value.substr(0, colon));
  if (!type || *type == MaskType::none)
    return Status::error("--attn-mask expects TYPE[:AXES] with TYPE bool, f32, f16 or bf16, got "
                         "'{}'",
                         value);
  const std::string axes = colon == std::string::npos ? "bhqk" : value.substr(colon + 1);
  auto strides = dense_mask_strides(axes, s.batch, s.heads, s.seqlen_q, s.seqlen_k);
  if (!strides)
    return strides.status().with_context("--attn-mask");
  s.mask = *type;
  s.mask_strides = *strides;
  return Status::ok();
}

Expected<AttentionSpec> spec_from(const Args &a) {
  AttentionSpec s;
  auto geti = [&](const char *flag, int64_t fallback, int64_t &out) -> Status {
    auto v = a.get_int(flag, fallback);
    if (!v)
      return v.status();
    out = *v;
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(geti("--batch", 1, s.batch));
  FJ_RETURN_IF_ERROR(geti("--heads", 1, s.heads));
  FJ_RETURN_IF_ERROR(geti("--kv-heads", s.heads, s.kv_heads));
  FJ_RETURN_IF_ERROR(geti("--seqlen-q", 128, s.seqlen_q));
  FJ_RETURN_IF_ERROR(geti("--seqlen-k", s.seqlen_q, s.seqlen_k));
  FJ_RETURN_IF_ERROR(geti("--head-dim", 64, s.head_dim_qk));
  FJ_RETURN_IF_ERROR(geti("--head-dim-v", s.head_dim_qk, s.head_dim_v));
  // The library's meaning: 0 chosen per call, 1 off, n > 1 that many splits
  // (AttentionSpec::num_splits); `run` on the interpreter or the emulator has
  // no compute units to choose for and refuses an explicit 0.
  FJ_RETURN_IF_ERROR(geti("--num-splits", 0, s.num_splits));
  auto dt = parse_dtype(a.get("--dtype", "bf16"));
  if (!dt)
    return dt.status().with_context("--dtype");
  s.dtype = *dt;
  auto layout = parse_layout(a.get("--layout", "bshd"));
  if (!layout)
    return layout.status().with_context("--layout");
  s.f32_io = a.has("--f32-io");
  s.causal = a.has("--causal");
  s.lse = a.has("--lse");
  auto scale = a.get_double("--scale", 0.0);
  if (!scale)
    return scale.status();
  s.scale = *scale;
  if (a.has("--scale") && s.scale == 0)
    return Status::error(
        "--scale 0 would make every score 0: give a positive scale or leave it out");
  if (a.has("--window")) {
    const std::string w = a.get("--window");
    const size_t comma = w.find(',');
    Args tmp;
    tmp.values_ = {{"--window left", w.substr(0, comma)},
                   {"--window right", comma == std::string::npos ? "" : w.substr(comma + 1)}};
    auto l = tmp.get_int("--window left", 0), r = tmp.get_int("--window right", 0);
    if (comma == std::string::npos || !l || !r)
      return Status::error("--window expects L,R (two integers, -1 = unbounded), got '{}'", w);
    s.window = Window{*l, *r};
  }
  auto softcap = a.get_double("--softcap", 0.0);
  if (!softcap)
    return softcap.status();
  s.softcap = *softcap;
  if (a.has("--alibi")) {
    const std::string alibi = a.get("--alibi");
    if (alibi != "heads" && alibi != "batch-heads")
      return Status::error("--alibi expects heads (slopes [heads]) or batch-heads ([batch, "
                           "heads]), got '{}'",
                           alibi);
    s.alibi = alibi == "heads" ? Alibi::heads : Alibi::batch_heads;
  }
  s.score_mod = a.get("--score-mod", "");
  s.mask_mod = a.get("--mask-mod", "");
  if (a.has("--attn-mask"))
    FJ_RETURN_IF_ERROR(set_attn_mask(a.get("--attn-mask"), s));
  auto dropout = a.get_double("--dropout", 0.0);
  if (!dropout)
    return dropout.status();
  s.dropout_p = *dropout;
  auto seed = a.get_int("--dropout-seed", 0);
  if (!seed)
    return seed.status();
  if (*seed < 0)
    return Status::error("--dropout-seed ({}) must be in 0..2^53", *seed);
  s.dropout_seed = uint64_t(*seed);
  s.set_layout(*layout);
  FJ_RETURN_IF_ERROR(s.validate());
  return s;
}

Expected<ir::Config> config_from(const Args &a, ir::Config base) {
  ir::Config c = base;
  auto bm = a.get_int("--block-m", c.block_m), bn = a.get_int("--block-n", c.block_n),
       w = a.get_int("--waves", c.waves);
  if (!bm)
    return bm.status();
  if (!bn)
    return bn.status();
  if (!w)
    return w.status();
  auto st = a.get_int("--stages", c.stages);
  if (!st)
    return st.status();
  auto mm = a.get_int("--mma-m", c.mma_m);
  if (!mm)
    return mm.status();
  // Unset: 0, the lowering's choice for the config's block (as C and Python leave it).
  auto passes = a.get_int("--dkdv-passes", 0);
  if (!passes)
    return passes.status();
  c.dkdv_passes = *passes;
  c.mma_m = *mm;
  c.block_m = *bm;
  c.block_n = *bn;
  c.waves = *w;
  c.stages = *st;
  if (a.has("--q-in-lds"))
    c.q_in_lds = true;
  // An on|off knob that belongs to one pipeline: given, it is what it says;
  // otherwise the base config's value where that pipeline runs, else off.
  auto knob = [&](const char *flag, bool &value, int64_t stages) -> Status {
    if (!a.has(flag)) {
      value = value && c.stages == stages;
      return Status::ok();
    }
    const std::string v = a.get(flag);
    if (v != "on" && v != "off")
      return Status::error("{} {}: expected on or off", flag, v);
    value = v == "on";
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(knob("--prefetch-blocks", c.prefetch_blocks, 2));
  FJ_RETURN_IF_ERROR(knob("--persistent", c.persistent, 3));
  FJ_RETURN_IF_ERROR(ir::validate(c));
  return c;
}

} // namespace flashjit::cli
