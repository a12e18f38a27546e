// NVIDIA Hopper rules: the products are warpgroup instructions (wgmma.mma_async,
// PTX target sm_90a) instead of warp-wide mma.sync; everything else is the sm80
// rules' (lowering/rules_sm80.h).
//
//   * 4 consecutive warps form a warpgroup; one wgmma m64nNk16 multiplies their
//     four 16-query tiles (A, in registers: per warp exactly the A fragment of
//     mma.sync m16n8k16) by N columns of B at once. Its f32 accumulator is, per
//     warp, N/8 m16n8 C fragments in mma.sync's layout, so the softmax, the masks
//     and the S -> P register re-pack are the sm80 rules' unchanged (check()
//     verifies those maps on the family's m16n8k16 table row).
//   * B is read by the tensor cores straight from shared memory through a matrix
//     descriptor: no ldmatrix, no B registers. The staged K and V tiles lie in
//     128-byte swizzled panels of 64 columns (LdsLayout::swizzled_128b): K as
//     B^T, "K-major" (rows = keys, contiguous head dims), V as B, "MN-major"
//     (rows = keys, contiguous head dims; the instruction's transpose-B bit).
//   * Per product: wgmma.fence, one wgmma per query tile and 16-wide k tile, all
//     in one group, commit, wait. Threads stage the tiles with cp.async (generic
//     proxy), so a proxy fence precedes the barrier that publishes a tile to wgmma.
//
// The layouts follow the PTX ISA ("Asynchronous Warpgroup Level Matrix Shared
// Memory Layout", "Matrix Descriptor Format"): in 16-byte units, a K-major
// 128B-swizzled operand is ((8, n), 2) : ((8, SBO), 1) and an MN-major one
// ((8, n), (8, k)) : ((1, LBO), (8, SBO)); SBO is the 1024-byte step between
// 8-row groups, LBO the step between 64-column panels.
#include "lowering/rules_sm80.h"

namespace flashjit::lowering {

namespace {

class Sm90Rules final : public Sm80Rules {
public:
  std::string_view name() const override { return "sm90"; }

  bool warpgroup_products() const override { return true; }
  LdsLayout lds_layout() const override { return LdsLayout::swizzled_128b; }
  // Q is staged in LDS and read by descriptor, as K is. (With Q as a
  // loop-invariant register operand, ptxas 13.0 reused Q's registers after the
  // first KV block's product: wrong results from the second block on.)
  bool reads_q_from_lds() const override { return true; }
  // Whole warpgroups with the row operands in LDS: the forward's default
  // configs and the backward's (backward_block).
  bool lowers(const ProgramShape &p) const override { return p.waves % 4 == 0 && p.q_in_lds; }
  std::string instruction_name(const MatrixInstr &mi) const override {
    return "wgmma.mma_async m64nNk16, per warp the fragments of " + std::string(mi.mnemonic);
  }
  std::string compile_arch(const Target &t) const override {
    return t.arch == "sm_90" ? "sm_90a" : t.arch;
  }
  // A wave's accumulator fragments stored straight to memory write 16 bytes of
  // each of 8 rows per instruction (4 lanes x 32 bits); through 16 rows of LDS
  // per wave they go out as 512 contiguous bytes of whole rows per instruction.
  // On an H200 (session 35) the head-dim-128 forward at S = 1024 took 260 us,
  // 236 with O's stores skipped (a wrong result, to bound them) and 233 through
  // the rows (bench/results/README.md).
  bool stages_output(int64_t) const override { return true; }
  // Register reallocation (setmaxnreg) and 128-384-thread workgroups: the LDS counts.
  int64_t resident_workgroups() const override { return 0; }

  ir::Config default_config(const AttentionSpec &spec) const override {
    // From a sweep on an H100 (bench/sweep_configs.py --q-in lds; bench/results/
    // sweep_*_sm90.csv, S = 4096, causal and not), 128 query rows per block:
    //   head dim <= 64:   one warpgroup, two 64-row tiles, 128-key blocks;
    //   <= 128:           the same with 64-key blocks;
    //   <= 256:           two warpgroups of one tile each, 128-key blocks;
    //   above (unmeasured): the same with 32-key blocks.
    const int64_t d = padded_head_dim(spec);
    ir::Config c;
    c.stages = 2;
    c.pad_k = 16;
    c.q_in_lds = true;
    c.block_m = 128;
    c.waves = d <= 128 ? 4 : 8;
    c.block_n = d <= 64 ? 128 : d <= 128 ? 64 : d <= 256 ? 128 : 32;
    return c;
  }

  // Decode kernels too take warpgroup products (Q in LDS), not the sm80 rules' one tile.
  ir::Config decode_config(const AttentionSpec &spec) const override {
    return default_config(spec);
  }

  std::optional<ir::Config> producer_config(const AttentionSpec &spec) const override {
    // Where a producer warpgroup can copy every tile: from head dim 72 two
    // consumer warpgroups of one tile each, 128-key blocks up to head dim 128,
    // 96-key blocks up to 192 and 64-key blocks at 256 (the ring's two copies
    // must fit); at 64 default_config's one consumer warpgroup of two tiles
    // and 128-key blocks (two workgroups per SM). H100 (bench/results/README.md,
    // producer_*_H100.log, tune_*_H100.txt): faster than default_config's at
    // S = 1024-16384, causal and not, but for a few cases at S = 1024 within 3%.
    const int64_t d = padded_head_dim(spec);
    if (d < 64 || d > 256 || !producer_fits(spec)) // below 64 unmeasured: a box is 64 columns
      return std::nullopt;
    ir::Config c = default_config(spec);
    c.stages = 3;
    // A 16-bit additive mask tensor (a bias: typically every block mixed) takes
    // two consumer warpgroups at head dim 64 too, whose one query tile per warp
    // lets the mask's loads go before the S product (emit_early_masks; f32 runs
    // are too wide for it). H100, B*S = 16k, a random bf16 [S, S] bias: 1717 ->
    // 1034 us at S = 1024, 7643 -> 3328 at 4096; a key-padding mask (few mixed
    // blocks) 6-13% slower at S = 4096, so bool masks keep the one-warpgroup
    // config (bench/mask_config_probe.py).
    const bool bias = spec.mask == MaskType::bf16 || spec.mask == MaskType::f16;
    // Dropout's draws (Philox rounds, the words lanes share) spilled the one
    // warpgroup of two tiles at head dim 64 (ptxas: 1000 bytes of spill stores)
    // and the 128- and 96-key blocks at 128 and 192 (164 and 120 bytes; 64-key
    // blocks none). H200, S = 4096, dropout 0.1 (bench/results/README.md,
    // session 29): head dim 64 6113 -> 3695 us with two consumer warpgroups
    // (S = 1024: 1551 -> 953), 128 2488 -> 2184 and 192 1780 -> 1587 with
    // 64-key blocks. At 96 every block size spills and 64 keys was slower
    // (2767 -> 3527), so up to 96 the blocks stay 128 keys.
    const bool dropout = spec.dropout_p > 0;
    if (d <= 64 && !bias && !dropout)
      return c;
    c.waves = 8;
    c.block_n = dropout && d > 96 ? 64 : d <= 128 ? 128 : d <= 192 ? 96 : 64;
    // Persistent from head dim 72 to 128, without a mask_mod block range (the
    // producer's scan). H200, S = 1024, B = 16, not causal: +9% at head dim 80,
    // +5% at 128; head dims 64 and 256 within the spread. Causal tiles (uneven
    // work) come from a counter: H100, S = 1024, +13% at head dim 80, +4% at
    // 128; head dims 64 and 256 0-8% slower at S >= 4096 (bench/results/
    // README.md, sessions 20 and 22).
    c.persistent = d >= 72 && d <= 128 && !ir::has_block_range(spec, c);
    return c;
  }

  std::optional<ir::Config> backward_block(const AttentionSpec &spec, bool dkdv) const override {
    // From sweeps on an H100 (B = 4, S = 4096, the backward's time;
    // bench/results/README.md): one warpgroup of 64 rows (two warpgroups of
    // 128 rows were 5-25% slower: one workgroup per SM at their registers);
    // with the next block prefetched (config stages 2, the default), dQ over
    // 128-key blocks at head dim 64 (3% ahead of 64) and 64-key blocks above
    // (10% ahead of 128 at head dims 96 and 128: two workgroups per SM fit);
    // dK/dV over 64-query blocks (32 was 13-33% slower), 32 above head dim
    // 128, where 64 spills. dQ above head dim 128: two warpgroups of 128 rows
    // over 32-key blocks, which share each K and V tile (the same LDS as one
    // warpgroup's 64 rows over 64-key blocks: one workgroup per SM, now of eight
    // warps, each with half the accumulator columns of S and dP). H200, B x S =
    // 16k: the dQ kernel 7-11% faster at head dims 160 and 192 without causal,
    // 0-7% causal, the same at 256 (1641 against 1643 us); ptxas: no spill at
    // 208-256, where one warpgroup spilled 160-244 bytes at 224 and 240
    // (bench/results/README.md, session 33).
    const int64_t d = padded_head_dim(spec);
    ir::Config c;
    c.block_m = 64;
    c.waves = 4;
    c.q_in_lds = true;
    c.block_n = dkdv ? (d <= 128 ? 64 : 32) : (d <= 64 ? 128 : 64);
    if (!dkdv && d > 128 && d <= 256) {
      c.block_m = 128;
      c.waves = 8;
      c.block_n = 32;
    }
    return c;
  }

  std::string_view prelude() const override {
    static const std::string text =
        std::string(templates::cuda_prelude) + "\n" + std::string(templates::sm90_wgmma);
    return text;
  }

  void emit_warpgroup_product(HipWriter &w, const WarpgroupProduct &p,
                              std::map<std::string, std::string> &helpers) const override {
    // K-major B^T (S = Q K^T): k tile k is 32 bytes into panel k / 4; N rows at
    // 128 bytes. MN-major B (O = P V): k tile k is 16 rows (2048 bytes) down;
    // the N columns span panels LBO apart.
    const int64_t panel_bytes = p.b_rows * 128;
    const unsigned lbo = p.b_transposed ? unsigned(panel_bytes) : 16;
    const bool a_lds = !p.a_tile.empty();
    if (p.pin_before) {
      w.line("#pragma unroll");
      w.line("for ({}) fj_wgmma_pin({}[qt], {});", p.tiles, p.acc, p.cols / 8);
    }
    w.line("fj_wgmma_fence();");
    w.line("#pragma unroll");
    w.open("for ({}) {{{}", p.tiles,
           p.group_per_tile ? "" : " // one group: every tile's instructions");
    w.line("const unsigned long long b = fj_wgmma_desc({}, {}, 1024);", p.b_tile, lbo);
    if (a_lds) // K-major, like K: the warpgroup's 64 rows, k tile k 32 bytes into panel k / 4
      w.line("const unsigned long long a = fj_wgmma_desc({} + ({}) * 64, 16, 1024);", p.a_tile,
             p.a_row0);
    const std::string a_step = fmt::format("a + ((k / 4 * {} + k % 4 * 32) >> 4)", p.a_rows * 128);
    // At most 256 columns per instruction.
    for (int64_t n0 = 0; n0 < p.cols; n0 += 256) {
      const int64_t n = std::min<int64_t>(256, p.cols - n0);
      const std::string fn = wrapper(helpers, n, a_lds, p.b_transposed, p.dtype);
      const int64_t chunk = p.b_transposed ? n0 / 64 * panel_bytes : n0 * 128;
      const std::string step =
          p.b_transposed ? fmt::format("{} + k * 2048", chunk)
                         : fmt::format("{} + k / 4 * {} + k % 4 * 32", chunk, panel_bytes);
      w.line("#pragma unroll");
      w.line("for (int k = 0; k < {}; ++k)", p.k_tiles);
      w.line("  {}({}[qt] + {}, {}, b + (({}) >> 4));", fn, p.acc, n0 / 8,
             a_lds ? a_step : p.a + "[qt][k]", step);
    }
    if (p.group_per_tile)
      w.line("fj_wgmma_commit(); // this tile's group");
    w.close();
    if (!p.group_per_tile)
      w.line("fj_wgmma_commit();");
    if (!p.wait)
      return;
    w.line("fj_wgmma_wait_all();");
    w.line("#pragma unroll");
    w.line("for ({}) fj_wgmma_pin({}[qt], {});", p.tiles, p.acc, p.cols / 8);
  }
  void emit_warpgroup_wait(HipWriter &w, int pending,
                           const std::vector<std::pair<std::string, int64_t>> &acc,
                           const std::vector<std::pair<std::string, int64_t>> &a) const override {
    if (pending == 0)
      w.line("fj_wgmma_wait<0>(); // every product is done");
    else
      w.line("fj_wgmma_wait<{}>(); // all but the last {} group{} done (groups finish in order)",
             pending, pending, pending == 1 ? "" : "s");
    for (const auto &[frags, cols] : acc)
      w.line("fj_wgmma_pin({}, {});", frags, cols / 8);
    for (const auto &[frags, k_tiles] : a)
      w.line("fj_wgmma_keep({}, {}); // read by a product until now", frags, k_tiles);
  }

private:
  // Whether a producer warpgroup can copy every tile of the forward with TMA
  // (KernelEmitter::plan_producer, tma_tile): dense tensors with 16-byte aligned
  // rows and a contiguous head dim, read once per block (no split-KV). A
  // mask_mod's block scan runs in the producer too.
  static bool producer_fits(const AttentionSpec &spec) {
    const KernelSignature sig = spec.signature();
    return sig.row_align >= 16 && !sig.f32_io && sig.unit_dim[0] && sig.unit_dim[1] &&
           sig.unit_dim[2] && !sig.packed_q && !sig.packed_k && !sig.used_k && !sig.paged;
  }

  // fj_wgmma_<dtype>_n<N>_<r|s><k|mn>: d (+)= a x b for a 64 x N accumulator
  // (N / 8 fragments of this warp), A in registers (r) or by descriptor (s,
  // K-major), B by descriptor, K-major or MN-major (the transpose-B bit).
  static std::string wrapper(std::map<std::string, std::string> &helpers, int64_t n, bool a_lds,
                             bool mn_major, DType dtype) {
    const std::string type(dtype_name(dtype));
    const std::string fn =
        fmt::format("fj_wgmma_{}_n{}_{}{}", type, n, a_lds ? "s" : "r", mn_major ? "mn" : "k");
    if (helpers.count(fn))
      return fn;
    const int64_t regs = n / 2;
    std::string d, outs;
    for (int64_t i = 0; i < regs; ++i) {
      d += fmt::format("{}%{}", i ? ", " : "", i);
      outs += fmt::format("{}\"+f\"(d[{}][{}])", i ? ", " : "", i / 4, i % 4);
    }
    // Operands after the accumulator: A (4 registers or a descriptor), B, 1.
    const int64_t b_arg = regs + (a_lds ? 1 : 4), one = b_arg + 1;
    HipWriter h;
    h.line("// wgmma m64n{}k16, {} x {} -> f32: this warp's {} fragments of the 64 x {} "
           "accumulator (+)= A ({}) x B ({}-major, by descriptor).",
           n, type, type, n / 8, n, a_lds ? "K-major, by descriptor" : "registers",
           mn_major ? "MN" : "K");
    h.open("FJ_DEVICE void {}(fj_float4 *d, {}, unsigned long long b) {{", fn,
           a_lds ? "unsigned long long a" : "const fj_bits8 &a");
    if (!a_lds)
      h.line("const unsigned *A = reinterpret_cast<const unsigned *>(&a);");
    h.line("asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{}, 0;\\n\"", one);
    h.line("             \"wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} {{{}}}, \"", n, type,
           type, d);
    if (a_lds)
      h.line("             \"%{}, %{}, p, 1, 1, 0, {};\\n}}\"", regs, b_arg, mn_major ? 1 : 0);
    else
      h.line("             \"{{%{}, %{}, %{}, %{}}}, %{}, p, 1, 1, {};\\n}}\"", regs, regs + 1,
             regs + 2, regs + 3, b_arg, mn_major ? 1 : 0);
    h.line("             : {}", outs);
    if (a_lds)
      h.line("             : \"l\"(a), \"l\"(b), \"r\"(1));");
    else
      h.line("             : \"r\"(A[0]), \"r\"(A[1]), \"r\"(A[2]), \"r\"(A[3]), \"l\"(b), "
             "\"r\"(1));");
    h.close();
    helpers[fn] = h.str();
    return fn;
  }
};

} // namespace

const Rules &sm90_rules() {
  static const Sm90Rules rules;
  return rules;
}

} // namespace flashjit::lowering
