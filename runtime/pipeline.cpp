#include "runtime/pipeline.h"

#include "compiler/knobs.h"
#include "compiler/select.h"
#include "compiler/sha256.h"
#include "lowering/resources.h"
#include "runtime/tuned.h"
#include "templates/templates.h"

#include <fmt/ranges.h>

#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <system_error>

namespace flashjit::pipeline {

using detail::failed;

namespace {

/// Everything in CompileOptions that changes the code object, and the rule set
/// that wrote the source, as cache-key text.
std::string compile_options_text(const compiler::CompileOptions &c, const std::string &rules) {
  return fmt::format("{} rules={}", compiler::describe(c), rules);
}

/// Warns once per process about each tuned-config problem: the default config
/// runs instead, and explain() says why.
void warn_once(const std::string &message) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(message).second)
    fmt::print(stderr, "flashjit: {}\n", message);
}

/// The tuned-config database's config for the forward kernel, if it has one
/// that fits (pipeline::generate; Options::config).
void take_tuned(const AttentionSpec &spec, Generated &g) {
  auto db = runtime::TunedConfigs::current();
  if (!db) {
    const std::string why = db.status().message();
    warn_once(why + "; the rules' default configs run meanwhile");
    g.config_source = "default (" + why + ")";
    return;
  }
  const runtime::TunedEntry *e = db->find(g.target.target_id(), g.signature);
  if (e == nullptr)
    return;
  const std::string path = runtime::TunedConfigs::default_path();
  if (Status s = lowering::check_fits(spec, e->config, g.target, g.rules); !s) {
    const std::string why =
        fmt::format("the tuned config {} of {} on {} in {} does not fit: {}", e->config.summary(),
                    g.signature, g.target.target_id(), path, s.message());
    warn_once(why + "; the default config runs; run flashjit tune again for this signature");
    g.config_source = "default (" + why + ")";
    return;
  }
  g.config = e->config;
  g.config_source = fmt::format("tuned on {} ({}: {:.1f} us against the default's {:.1f} at {})",
                                e->device, path, e->micros, e->default_micros, e->shape);
}

} // namespace

compiler::CompileOptions compile_options(const lowering::Target &target, const Options &options,
                                         const lowering::Lowered *kernel) {
  compiler::CompileOptions c;
  c.arch = kernel && !kernel->compile_arch.empty() ? kernel->compile_arch : target.arch;
  c.features = target.features;
  c.wave_size = target.wave_size;
  c.opt_level = options.opt_level;
  c.extra_flags = options.extra_flags;
  return c;
}

std::optional<ir::Config> wide_grouped_config(const AttentionSpec &spec, std::string_view arch,
                                              const Options &options) {
  auto choice = lowering::parse_rules_choice(options.rules);
  auto target = lowering::parse_target(arch);
  if (options.config || !choice || *choice != lowering::RulesChoice::automatic || !target)
    return std::nullopt;
  ir::Config c = lowering::default_config(spec, *target, *choice, options.mma_m, /*producer=*/true);
  if (c.stages != 3 || c.waves != 8)
    return std::nullopt;
  c.persistent = false; // a split's range, or one workgroup per (batch, KV head): no tiles to walk
  if (!lowering::check_fits(spec, c, *target, *choice))
    return std::nullopt;
  return c;
}

Expected<Generated> generate(const AttentionSpec &spec, std::string_view arch,
                             const Options &options, Failure *failure, KernelKind kind) {
  if (Status s = spec.validate(); !s)
    return failed(failure, Failure::spec, s.with_context("invalid attention spec"));
  auto choice = lowering::parse_rules_choice(options.rules);
  if (!choice)
    return failed(failure, Failure::argument, choice.status());
  auto target = lowering::parse_target(arch);
  if (!target)
    return failed(failure, Failure::unsupported, target.status());
  Generated g;
  g.target = *target;
  g.rules = *choice;
  g.signature = spec.signature().summary();
  const bool decode = kind == KernelKind::split_partial || kind == KernelKind::decode;
  g.config = options.config.value_or(
      lowering::default_config(spec, g.target, *choice, options.mma_m, /*producer=*/!decode));
  g.config_source = options.config ? "given" : "default";
  if (!options.config && options.tuned && kind == KernelKind::attention &&
      *choice == lowering::RulesChoice::automatic && options.mma_m == 0)
    take_tuned(spec, g);
  if (Status s = ir::validate(g.config); !s)
    return failed(failure, Failure::argument, s);
  const bool dkdv = kind == KernelKind::backward_dkdv || kind == KernelKind::backward_dkdv_direct;
  const bool backward = kind == KernelKind::backward_preprocess ||
                        kind == KernelKind::backward_dq || dkdv ||
                        kind == KernelKind::backward_reduce || kind == KernelKind::backward_sinks;
  if (backward)
    if (Status s = ir::validate_backward(spec); !s)
      return failed(failure, Failure::unsupported, s);
  if (kind == KernelKind::split_combine || kind == KernelKind::mask_blocks ||
      kind == KernelKind::backward_preprocess || kind == KernelKind::backward_reduce ||
      kind == KernelKind::backward_sinks) {
    // Kernels without tile IR. Named like the attention kernels: what it
    // computes, then a hash of its text.
    auto lowered = kind == KernelKind::split_combine ? lowering::lower_split_combine(spec, g.target)
                   : kind == KernelKind::mask_blocks ? lowering::lower_mask_blocks(spec, g.target)
                   : kind == KernelKind::backward_preprocess
                       ? lowering::lower_backward_preprocess(spec, g.target)
                   : kind == KernelKind::backward_reduce
                       ? lowering::lower_backward_reduce(spec, g.target)
                       : lowering::lower_backward_sinks(spec, g.target);
    if (!lowered)
      return failed(failure, Failure::unsupported, lowered.status());
    const std::string variant =
        compiler::sha256_hex(fmt::format("{}\n{}", lowered->kernel_text, g.target.target_id()));
    g.lowered = lowered.take();
    const std::string name = g.lowered.kernel_name + "_" + variant.substr(0, 8);
    // The name is in the text (the kernel's symbol): rename it there too.
    for (std::string *text : {&g.lowered.kernel_text, &g.lowered.source})
      for (size_t at = text->find(g.lowered.kernel_name); at != std::string::npos;
           at = text->find(g.lowered.kernel_name, at + name.size()))
        text->replace(at, g.lowered.kernel_name.size(), name);
    g.lowered.kernel_name = name;
    g.ir_text = fmt::format("{} kernel (no tile IR)\n{}", g.lowered.rules, g.lowered.kernel_text);
    g.program.name = g.lowered.kernel_name;
    return g;
  }
  if (decode && !options.config) {
    // Decode has few query rows: one wave with one query tile, so the products
    // are no larger than the rows; the splits and the grid supply the parallelism.
    // Grouped rows (GQA-packed decode of several tokens: tokens x group rows per
    // KV head) take four waves of one query tile each, so that a KV head's rows
    // share each K/V tile the workgroup stages.
    // Those four waves copy whole blocks one iteration ahead (prefetch_blocks, where
    // the rules pipeline at all: stages 2): with the tile pipeline each block waited
    // for two copies in turn (V's, then the next K's), which few workgroups per SM
    // did not hide. H200, bf16, D = 128 (bench/results/README.md, session 28): 16
    // tokens 0.69-1.02x the time (B=8, 4096 keys, 8:1: 41.9 -> 28.8 us), one token
    // 0.87-1.06x (B=32, 32768 keys, 32:8: 1071.5 -> 957.0). The one-wave kernel
    // keeps the tile pipeline: its twice-as-large LDS halves the workgroups per SM
    // that hide the copies (B=32, 4096 keys, 32:32: 553.7 -> 690.3 us with it), and
    // so would the four-wave one where the second copies leave one workgroup per SM.
    const int64_t tile = g.config.mma_m ? g.config.mma_m : 16;
    g.config.waves = spec.q_group > 1 ? 4 : 1;
    g.config.block_m = tile * g.config.waves;
    g.config.prefetch_blocks = spec.q_group > 1 && g.config.stages == 2;
    if (g.config.prefetch_blocks) { // else the tile pipeline
      auto e = lowering::estimate_resources(spec, g.config, g.target, *choice,
                                            kind == KernelKind::split_partial);
      g.config.prefetch_blocks = e && g.target.lds_bytes_per_cu >= 2 * e->lds_bytes() &&
                                 lowering::check_fits(spec, g.config, g.target, *choice);
    }
  }
  if (backward && !options.config)
    g.config = lowering::backward_config(spec, g.target, g.config, dkdv);
  if (dkdv && g.config.dkdv_passes == 0) // a given config leaves the passes to the lowering
    g.config.dkdv_passes = lowering::backward_dkdv_passes(spec, g.target, g.config);
  if (!backward)
    if (Status s = lowering::check_fits(spec, g.config, g.target, *choice); !s)
      return failed(failure, Failure::unsupported, s);
  auto program = kind == KernelKind::split_partial   ? ir::build_split_kv(spec, g.config)
                 : kind == KernelKind::backward_dq   ? ir::build_backward_dq(spec, g.config)
                 : kind == KernelKind::backward_dkdv ? ir::build_backward_dkdv(spec, g.config)
                 : kind == KernelKind::backward_dkdv_direct
                     ? ir::build_backward_dkdv_direct(spec, g.config)
                     : ir::build_attention(spec, g.config);
  if (!program)
    return failed(failure, Failure::unsupported, program.status());
  g.program = program.take();
  if (kind == KernelKind::decode)
    g.program.name += "_decode";
  // The kernel name says what it computes and, by a hash of everything that
  // shapes its text, which variant: FLASHJIT_DUMP_DIR and FLASHJIT_OVERRIDE_DIR
  // both name its source <kernel name>.hip.
  const std::string variant =
      compiler::sha256_hex(fmt::format("{}\n{}\n{}", ir::print(g.program), g.target.target_id(),
                                       lowering::rules_choice_name(g.rules)));
  g.program.name += "_" + variant.substr(0, 8);
  g.ir_text = ir::print(g.program);
  compiler::debug_log(4, "tile IR of {} for {} ({}):\n{}", g.program.name, g.target.target_id(),
                      g.config.summary(), g.ir_text);
  auto lowered = lowering::lower(g.program, g.target, *choice);
  if (!lowered)
    return failed(failure, Failure::unsupported, lowered.status());
  g.lowered = lowered.take();
  return g;
}

Expected<std::vector<Compiled>> compile_all(std::span<const Generated *const> gs,
                                            const Options &options, compiler::KernelCache &cache,
                                            Failure *failure) {
  std::vector<Failure> failures(gs.size(), Failure::none);
  auto one = [&](size_t i) { return compile(*gs[i], options, cache, &failures[i]); };
  // Each but the first on a thread; where no thread can be started, here.
  std::vector<std::future<Expected<Compiled>>> rest;
  for (size_t i = 1; i < gs.size(); ++i) {
    try {
      rest.push_back(std::async(std::launch::async, one, i));
    } catch (const std::system_error &) {
      rest.push_back(std::async(std::launch::deferred, one, i));
    }
  }
  std::vector<Expected<Compiled>> done;
  if (!gs.empty())
    done.push_back(one(0));
  for (auto &f : rest)
    done.push_back(f.get());
  std::vector<Compiled> codes;
  for (size_t i = 0; i < done.size(); ++i) {
    if (!done[i]) {
      if (failure)
        *failure = failures[i];
      return done[i].status();
    }
    codes.push_back(done[i].take());
  }
  return codes;
}

Expected<Compiled> compile(const Generated &g, const Options &options, compiler::KernelCache &cache,
                           Failure *failure) {
  auto fail = [&](Status s) {
    return failed(failure, Failure::compile,
                  s.with_context(fmt::format("compiling {} for {}", g.lowered.kernel_name,
                                             g.target.target_id())));
  };
  const auto start = std::chrono::steady_clock::now();
  auto made = compiler::make_compiler(options.compiler, g.target.target_id());
  if (!made)
    return fail(made.status());
  compiler::Compiler &device_compiler = **made;
  const compiler::CompileOptions co = compile_options(g.target, options, &g.lowered);

  Compiled c;
  c.compiler = device_compiler.identity();
  c.options_text = compile_options_text(co, g.lowered.rules);
  std::string_view source = g.lowered.source;
  const std::string &kernel = g.lowered.kernel_name;
  auto override = compiler::source_override(kernel);
  if (!override)
    return fail(override.status());
  if (*override) {
    source = (*override)->source;
    c.override_path = (*override)->path;
  }
  const compiler::KeyParts key{
      g.ir_text, g.target.target_id(), g.config.summary(), c.options_text,
      std::string(templates::bundle_hash), std::string(compiler::flashjit_version()), c.compiler,
      // The text compiled: a change of the emitter (or an override) is a new
      // binary even where the IR, templates and version are the same.
      *override ? (*override)->hash : compiler::sha256_hex(source),
      fmt::format("{} (any shape of {}; {})", kernel, g.signature, g.config.summary())};
  compiler::CacheOutcome outcome = compiler::CacheOutcome::compiled;
  auto code = cache.get_or_compile(
      key,
      [&] {
        compiler::debug_log(3, "source of {} for {}:\n{}", kernel, g.target.target_id(), source);
        return device_compiler.compile(source, co);
      },
      &outcome);
  if (!code)
    return fail(code.status());
  c.code = code.take();
  c.cache_key = key.hash();
  c.cache_outcome = std::string(compiler::outcome_name(outcome));

  // FLASHJIT_DUMP_DIR: the source and the code object, named like the override.
  {
    auto vendor = compiler::target_vendor(g.target.target_id());
    const char *extension = vendor && *vendor == compiler::Vendor::nvidia ? "cubin" : "co";
    // A debugging aid that fails is reported, never fatal.
    for (Status s : {compiler::dump_file(kernel + ".hip", source),
                     compiler::dump_file(fmt::format("{}.{}", kernel, extension),
                                         {reinterpret_cast<const char *>(c.code.bytes.data()),
                                          c.code.bytes.size()})})
      if (!s)
        fmt::print(stderr, "flashjit: FLASHJIT_DUMP_DIR: {}\n", s.message());
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return c;
}

Expected<lowering::Lowered> emulated_kernel(const Generated &g, const compiler::Knobs &knobs) {
  auto override = compiler::source_override(g.lowered.kernel_name, knobs);
  if (!override)
    return override.status();
  if (!*override)
    return g.lowered;
  auto text = compiler::override_kernel_text(**override, g.lowered.source, g.lowered.kernel_text);
  if (!text)
    return text.status();
  lowering::Lowered k = g.lowered;
  k.kernel_text = text.take();
  return k;
}

} // namespace flashjit::pipeline
