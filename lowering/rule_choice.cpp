// Which rules lower a program (the family's matrix rules for the dtype and
// query tile, else simt), the default config of a signature, check_fits (on
// the resource model of lowering/resources.h) and the entry points lower() and
// generate().
#include "lowering/emitter.h"
#include "lowering/resources.h"

namespace flashjit::lowering {

namespace {

/// The rules (and their table row) that lower a program with `dt` elements.
struct ChosenRules {
  const Rules *rules = nullptr;
  const MatrixInstr *mi = nullptr; // null for simt
  std::string note;                // Lowered::rules_note
};

/// What the caller asks of the rules' fragments.
struct Want {
  int64_t mma_m = 0; // config mma_m: the query tile asked for; 0: any
  /// A config's shape: the rules' tiles must divide it (the first that do is taken).
  bool fit = false;
  int64_t block_m = 0, block_n = 0, waves = 1, dim_v = 0; // dim_v padded to pad_k
  bool q_in_lds = false, backward = false;
  /// A default config is being chosen: the first rules that prefer this spec.
  const AttentionSpec *spec = nullptr;

  bool fits(const Rules &r) const {
    return block_m % (r.m_tile() * std::max<int64_t>(waves, 1)) == 0 && block_n % r.n_tile() == 0 &&
           dim_v % r.n_tile() == 0 && r.lowers({waves, q_in_lds, backward});
  }
};

Want want_for(const AttentionSpec &spec, const ir::Config &c) {
  return {.mma_m = c.mma_m,
          .fit = true,
          .block_m = c.block_m,
          .block_n = c.block_n,
          .waves = c.waves,
          .dim_v = ir::padded(spec.head_dim_v, c.pad_k),
          .q_in_lds = c.q_in_lds};
}

Want want_for(const ir::Program &p) {
  auto get = [&](const char *k, int64_t otherwise) {
    return p.config.count(k) ? std::get<int64_t>(p.config.at(k)) : otherwise;
  };
  return {.mma_m = get("mma_m", 0),
          .fit = true,
          .block_m = get("block_m", 0),
          .block_n = get("block_n", 0),
          .waves = get("waves", 1),
          .dim_v = ir::padded(p.tensor("V")->dim, get("pad_k", 16)),
          .q_in_lds = get("q_in_lds", 0) != 0,
          .backward = p.tensor("dO") != nullptr};
}

/// Ok, or why the family's matrix rules cannot lower `dt` on `t`. Of its rule
/// sets with a table row that their check() accepts (preferred first), and with
/// the query tile asked for: the first that fits the config, else the last (its
/// emitter then names the misfit); for a default config the first that prefers
/// the spec, else the last.
Status matrix_rules(const Target &t, DType dt, const Want &want, ChosenRules &out) {
  const std::vector<const Rules *> candidates = matrix_rules_for(t);
  if (candidates.empty())
    return Status::error("no matrix rules for {} ({}) yet: families with matrix rules are {}",
                         t.arch, t.family_name(), families_with_rules());
  Status refused = Status::ok();
  std::vector<ChosenRules> usable;
  std::string tiles; // of the usable rules, e.g. "32 or 16"
  for (const Rules *r : candidates) {
    const bool asked = want.mma_m == 0 || want.mma_m == r->m_tile();
    auto mi = find_matrix_instr(t, dt, r->m_tile(), r->n_tile(), r->mma_k());
    Status s = mi ? r->check(**mi, t) : mi.status();
    if (!s) {
      if (asked)
        refused = s; // the last (most general) rules' reason
      continue;
    }
    if (tiles.find(std::to_string(r->m_tile())) == std::string::npos)
      tiles += (tiles.empty() ? "" : " or ") + std::to_string(r->m_tile());
    if (asked)
      usable.push_back({r, *mi, ""});
  }
  if (usable.empty() && refused)
    return Status::error("config mma_m = {}: the {} matrix rules for {} on {} have {}-query "
                         "tiles only",
                         want.mma_m, t.family_name(), dtype_name(dt), t.arch,
                         tiles.empty() ? "no usable" : tiles);
  if (usable.empty())
    return refused;
  out = usable.back();
  for (const ChosenRules &c : usable)
    if ((want.fit && want.fits(*c.rules)) || (want.spec && c.rules->prefers(*want.spec)) ||
        (!want.fit && !want.spec)) {
      out = c;
      break;
    }
  return Status::ok();
}

Expected<ChosenRules> choose_rules(const Target &t, DType dt, RulesChoice choice,
                                   const Want &want) {
  ChosenRules chosen;
  Status refused = Status::ok();
  if (choice != RulesChoice::simt) {
    refused = matrix_rules(t, dt, want, chosen);
    if (refused)
      return chosen;
    if (choice == RulesChoice::matrix)
      return refused;
  }
  ChosenRules simt{simt_rules_for(t), nullptr, ""};
  if (!simt.rules)
    return choice == RulesChoice::simt
               ? Status::error("the simt rules emit code for AMD targets; {} ({}) takes its "
                               "matrix rules (--rules matrix or auto)",
                               t.arch, t.family_name())
               : refused;
  if (want.mma_m != 0 && want.mma_m != simt.rules->m_tile())
    return Status::error("config mma_m = {}: the simt rules use {}-query tiles{}", want.mma_m,
                         simt.rules->m_tile(),
                         choice == RulesChoice::simt ? "" : ", and " + refused.message());
  simt.note = choice == RulesChoice::simt
                  ? std::string("simt rules as asked (no matrix instruction)")
                  : fmt::format("simt rules (no matrix instruction), because the {} matrix rules "
                                "cannot lower this: {}",
                                t.family_name(), refused.message());
  return simt;
}

} // namespace

ir::Config default_config(const AttentionSpec &spec, const Target &target, RulesChoice choice,
                          int64_t mma_m, bool producer) {
  auto chosen = choose_rules(target, spec.dtype, choice, {.mma_m = mma_m, .spec = &spec});
  ir::Config c = !chosen    ? ir::Config{}
                 : producer ? chosen->rules->default_config(spec)
                            : chosen->rules->decode_config(spec);
  if (chosen && producer)
    c = chosen->rules->producer_config(spec).value_or(c);
  if (mma_m)
    c.mma_m = mma_m; // kept, so that generate() takes these rules (or says why not)
  return c;
}

std::string_view rules_choice_name(RulesChoice c) {
  switch (c) {
  case RulesChoice::automatic:
    return "auto";
  case RulesChoice::matrix:
    return "matrix";
  case RulesChoice::simt:
    return "simt";
  }
  return "?";
}

Expected<RulesChoice> parse_rules_choice(std::string_view name) {
  for (RulesChoice c : {RulesChoice::automatic, RulesChoice::matrix, RulesChoice::simt})
    if (rules_choice_name(c) == name)
      return c;
  return Status::error("unknown rules '{}': choose auto, matrix or simt", name);
}

Expected<ResourceEstimate> estimate_resources(const AttentionSpec &spec, const ir::Config &c,
                                              const Target &t, RulesChoice choice,
                                              bool split_partials) {
  auto chosen = choose_rules(t, spec.dtype, choice, want_for(spec, c));
  if (!chosen)
    return chosen.status();
  return estimate_resources(spec, c, *chosen->rules, t, split_partials);
}

Status check_fits(const AttentionSpec &spec, const ir::Config &c, const Target &t,
                  RulesChoice choice) {
  auto e = estimate_resources(spec, c, t, choice);
  if (!e)
    return e.status();
  if (e->lds_bytes() > t.lds_bytes)
    return Status::error(
        "the K and V tiles need {} bytes of LDS (block_n {} x head dims {}/{}) but {} "
        "has {} per workgroup: use a smaller --block-n",
        e->lds_bytes(), c.block_n, e->dim_qk, e->dim_v, t.arch, t.lds_bytes);
  if (c.waves * t.wave_size > t.max_workgroup_size)
    return Status::error("{} waves x {} lanes exceed {}'s workgroup limit of {}", c.waves,
                         t.wave_size, t.arch, t.max_workgroup_size);
  // The registers that live across the KV loop: the O accumulator, the Q
  // fragments (none when Q stays in LDS) and S, per query tile.
  const int64_t budget = register_budget(t);
  if (e->loop_regs() > budget)
    return Status::error(
        "head dims {}/{} need about {} VGPRs per lane for the accumulator, Q and S "
        "tiles (block_m {}, block_n {}, {} rules), over {}'s budget of {}: use a smaller "
        "--block-n or head dim",
        spec.head_dim_qk, spec.head_dim_v, e->loop_regs(), c.block_m, c.block_n, e->rules, t.arch,
        budget);
  return Status::ok();
}

Status check_launch(const Lowered &k, const AttentionSpec &shape) {
  const std::pair<const char *, const Strides *> tensors[] = {
      {"q", &shape.q}, {"k", &shape.k}, {"v", &shape.v}, {"o", &shape.o}};
  for (const auto &[name, strides] : tensors)
    if (strides->seq > k.max_row_stride)
      return Status::error("{} seq stride ({} elements) is past the {} that kernel {} addresses "
                           "within a block of rows (32-bit offsets): use a layout with shorter "
                           "rows, or a smaller block_m / block_n",
                           name, strides->seq, k.max_row_stride, k.kernel_name);
  return Status::ok();
}

Expected<Lowered> lower(const ir::Program &program, const Target &target, RulesChoice choice) {
  FJ_RETURN_IF_ERROR(ir::verify(program));
  auto chosen = choose_rules(target, program.operand_dtype(), choice, want_for(program));
  if (!chosen)
    return chosen.status();
  return emit::KernelEmitter(program, target, *chosen->rules, chosen->mi, chosen->note).run();
}

Expected<Lowered> generate(const AttentionSpec &spec, const ir::Config &config,
                           const Target &target, RulesChoice choice) {
  FJ_RETURN_IF_ERROR(spec.validate());
  FJ_RETURN_IF_ERROR(check_fits(spec, config, target, choice));
  auto p = ir::build_attention(spec, config);
  if (!p)
    return p.status();
  return lower(*p, target, choice);
}

} // namespace flashjit::lowering
