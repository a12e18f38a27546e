// The flashjit command line: emit, run (and, as the backends land, compile, archs).
#include "compiler/code_object.h"
#include "compiler/comgr.h"
#include "compiler/llvm_plugin.h"
#include "compiler/select.h"
#include "ir/build.h"
#include "ir/interpreter.h"
#include "ir/reference.h"
#include "lowering/lower.h"
#include "runtime/attention.h"
#include "runtime/device.h"
#include "runtime/emulator.h"
#include "runtime/gpu_driver.h"
#include "runtime/npy.h"
#include "runtime/pipeline.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/device_tensors.h"
#include "tools/json.h"
#include "tools/run_estimate.h"
#include "tools/safe_write.h"
#include "tools/spec_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

namespace fs = std::filesystem;
using namespace flashjit;

namespace {

int fail(const Status &s) {
  fmt::print(stderr, "flashjit: error: {}\n", s.message());
  return 1;
}

std::vector<cli::FlagSpec> with_spec(std::vector<cli::FlagSpec> extra) {
  std::vector<cli::FlagSpec> f = cli::spec_flags();
  for (auto &c : cli::config_flags())
    f.push_back(c);
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The spec, target and pipeline options from the flags; the config defaults to
// the lowering's choice for the target, and flags override single knobs.
struct Job {
  AttentionSpec spec;
  ir::Config config;
  std::optional<lowering::Target> target;
  lowering::RulesChoice rules = lowering::RulesChoice::automatic;
  Options options; // what runtime/pipeline.h takes: rules, config, compiler
  pipeline::KernelKind kind = pipeline::KernelKind::attention; // --kernel

  Expected<pipeline::Generated> generate() const {
    return pipeline::generate(spec, target->target_id(), options, nullptr, kind);
  }
};

/// --kernel's names, in a plan's launch order (runtime/pipeline.h's KernelKind).
constexpr std::pair<std::string_view, pipeline::KernelKind> kKernelNames[] = {
    {"mask-blocks", pipeline::KernelKind::mask_blocks},
    {"attention", pipeline::KernelKind::attention},
    {"split-partial", pipeline::KernelKind::split_partial},
    {"split-combine", pipeline::KernelKind::split_combine},
    {"decode", pipeline::KernelKind::decode},
    {"backward-preprocess", pipeline::KernelKind::backward_preprocess},
    {"backward-dq", pipeline::KernelKind::backward_dq},
    {"backward-dkdv", pipeline::KernelKind::backward_dkdv},
    {"backward-dkdv-direct", pipeline::KernelKind::backward_dkdv_direct},
    {"backward-reduce", pipeline::KernelKind::backward_reduce},
    {"backward-sinks", pipeline::KernelKind::backward_sinks},
};

std::string kernel_names() {
  std::string all;
  for (auto [name, kind] : kKernelNames)
    all += (all.empty() ? "" : "|") + std::string(name);
  return all;
}

cli::FlagSpec gqa_packed_flag() {
  return {"--gqa-packed", "",
          "the GQA-packed view's kernel, which decode of up to 16 query tokens with GQA runs "
          "(split-partial, split-combine, decode): a KV head's query heads are the rows of its "
          "tiles, grouped by token",
          ""};
}

cli::FlagSpec kernel_flag() {
  return {"--kernel", "KIND",
          "which kernel of the plan: " + kernel_names() +
              " (a mask tensor's plan runs mask-blocks first; split-KV decode runs split-partial "
              "then split-combine, decode with one split the decode kernel alone; the backward "
              "backward-preprocess, backward-dq, then backward-dkdv-direct where each KV head has "
              "one query head and the keys are not packed, else backward-dkdv and "
              "backward-reduce, and backward-sinks with sinks)",
          "attention"};
}

Expected<Job> job_from(const cli::Args &a) {
  Job job;
  auto s = cli::spec_from(a);
  if (!s)
    return s.status();
  job.spec = *s;
  if (a.has("--arch")) {
    auto t = lowering::parse_target(a.get("--arch"));
    if (!t)
      return t.status();
    job.target = *t;
  }
  auto rules = lowering::parse_rules_choice(a.get("--rules", "auto"));
  if (!rules)
    return rules.status().with_context("--rules");
  job.rules = *rules;
  // --mma-m picks the rules whose defaults the other flags then override.
  auto mma_m = a.get_int("--mma-m", 0);
  if (!mma_m)
    return mma_m.status();
  const ir::Config base = job.target
                              ? lowering::default_config(job.spec, *job.target, job.rules, *mma_m)
                              : ir::Config{};
  auto c = cli::config_from(a, base);
  if (!c)
    return c.status();
  job.config = *c;
  job.options.rules = std::string(lowering::rules_choice_name(job.rules));
  const std::string kernel = a.get("--kernel", "attention");
  auto named = std::ranges::find(kKernelNames, kernel, [](auto &p) { return p.first; });
  if (named == std::end(kKernelNames))
    return Status::error("--kernel {}: not a kernel of a plan; the kernels are {}", kernel,
                         kernel_names());
  job.kind = named->second;
  if (a.has("--gqa-packed")) {
    using pipeline::KernelKind;
    if (job.kind != KernelKind::split_partial && job.kind != KernelKind::split_combine &&
        job.kind != KernelKind::decode)
      return Status::error("--gqa-packed with --kernel {}: only decode's kernels run GQA-packed "
                           "(split-partial, split-combine, decode)",
                           kernel);
    auto packed = gqa_packed_decode(job.spec);
    if (!packed)
      return Status::error("--gqa-packed: this spec does not pack ({}); packing needs more query "
                           "heads than KV heads, at most {} query tokens, and none of ALiBi, "
                           "score_mod, mask_mod, dropout, sinks, packed queries, a mask tensor "
                           "with several tokens or with a window",
                           job.spec.summary(), kMaxPackedTokens);
    job.spec = *packed;
  }
  // The attention kernel's config is the flags' (over the rules' default); the
  // other kernels choose their own unless a config flag is given, as the
  // library does (the split kernel is one wave, the backward has its configs).
  const bool config_given = std::ranges::any_of(
      cli::config_flags(), [&](const cli::FlagSpec &f) { return a.has(f.name); });
  if (job.kind == pipeline::KernelKind::attention || config_given)
    job.options.config = job.config;
  job.options.compiler = a.get("--compiler", "auto");
  return job;
}

int cmd_emit(const cli::Args &a) {
  auto job = job_from(a);
  if (!job)
    return fail(job.status());
  if (!a.has("--print-ir") && !job->target)
    return fail(Status::error("nothing to emit: pass --arch ARCH for HIP source and/or --print-ir "
                              "for the tile IR"));
  if (!job->target) { // the IR alone: no target, no kernel name suffix
    if (job->kind != pipeline::KernelKind::attention)
      return fail(Status::error("--kernel {} needs --arch: its config (and, for some kernels, "
                                "its text) is the target's",
                                a.get("--kernel")));
    auto p = ir::build_attention(job->spec, job->config);
    if (!p)
      return fail(p.status());
    fmt::print("{}", ir::print(*p));
    return 0;
  }
  auto g = job->generate();
  if (!g)
    return fail(g.status());
  if (a.has("--print-ir"))
    fmt::print("{}", g->ir_text);
  const lowering::Lowered *k = &g->lowered;
  if (!a.has("-o")) {
    fmt::print("{}", k->source);
    return 0;
  }
  if (Status s = cli::write_output(a.get("-o"), k->source, a.has("--force")); !s)
    return fail(s);
  fmt::print(stderr, "wrote {} ({} for {}, {}; {} threads, {} bytes LDS; any shape of {})\n",
             a.get("-o"), k->kernel_name, job->target->target_id(), g->config.summary(),
             k->block_threads, k->lds_bytes, job->spec.signature().summary());
  return 0;
}

int cmd_compile(const cli::Args &a) {
  auto job = job_from(a);
  if (!job)
    return fail(job.status());
  if (!job->target)
    return fail(Status::error("compile needs --arch (e.g. --arch gfx1201 or --arch sm_90)"));
  const lowering::Target &t = *job->target;
  auto g = job->generate();
  if (!g)
    return fail(g.status());
  const lowering::Lowered *k = &g->lowered;
  auto compiled = pipeline::compile(*g, job->options);
  if (!compiled)
    return fail(compiled.status());
  const compiler::CodeObject *code = &compiled->code;
  if (a.has("-o")) {
    if (Status s = cli::write_output(
            a.get("-o"), {reinterpret_cast<const char *>(code->bytes.data()), code->bytes.size()},
            a.has("--force"));
        !s)
      return fail(s);
    fmt::print(stderr, "wrote {} ({} bytes, {} for {})\n", a.get("-o"), code->bytes.size(),
               code->compiler, t.target_id());
  }
  const bool want_report =
      a.has("--resources") || a.has("--json") || (!a.has("-o") && !a.has("--isa"));
  if (t.is_nvidia()) {
    if (a.has("--isa") || want_report)
      fmt::print(stderr,
                 "flashjit: the ISA and resource report read AMD code objects; for a "
                 "cubin use `cuobjdump -sass` and `nvdisasm` (the code object is {} bytes)\n",
                 code->bytes.size());
    return 0;
  }
  // The LLVM plugin's readers where it loads, else ROCm's comgr (both loaded at
  // run time).
  const bool llvm = bool(compiler::llvm_plugin());
  auto disassemble = [llvm](const compiler::CodeObject &c) {
    return llvm ? compiler::disassemble(c) : compiler::comgr_disassemble(c);
  };
  auto resources = [llvm](const compiler::CodeObject &c, int v, int w, int l) {
    return llvm ? compiler::read_resources(c, v, w, l) : compiler::comgr_read_resources(c, v, w, l);
  };
  if (a.has("--isa")) {
    auto isa = disassemble(*code);
    if (!isa)
      return fail(isa.status());
    fmt::print("{}", *isa);
  }
  if (want_report) {
    auto r = resources(*code, t.vgpr_file_per_simd, t.max_waves_per_simd, t.lds_bytes_per_cu);
    if (!r)
      return fail(r.status());
    for (const auto &report : *r) {
      if (a.has("--json")) {
        // The report, then what made the code: the config and the rules.
        cli::json::Value line = cli::json::Value::parse(report.to_json());
        line["config"] = g->config.summary();
        line["rules"] = k->rules;
        fmt::print("{}\n", compiler::json_line(line));
      } else {
        fmt::print("config: {} ({} rules, {}; cache {})\n{}\n", g->config.summary(), k->rules,
                   code->compiler, compiled->cache_outcome, report.to_text());
      }
    }
  }
  return 0;
}

// Loads q/k/v from DIR (.npy in the spec's layout) into t.
Status load_inputs(const std::string &dir, const AttentionSpec &s, HostTensors &t) {
  struct In {
    const char *file;
    std::vector<float> *buf;
    const Strides *st;
    int64_t h, n, d;
  } ins[] = {{"q.npy", &t.q, &s.q, s.heads, s.seqlen_q, s.head_dim_qk},
             {"k.npy", &t.k, &s.k, s.kv_heads, s.seqlen_k, s.head_dim_qk},
             {"v.npy", &t.v, &s.v, s.kv_heads, s.seqlen_k, s.head_dim_v}};
  for (const In &in : ins) {
    const std::string path = (fs::path(dir) / in.file).string();
    auto arr = npy::read(path);
    if (!arr)
      return arr.status();
    FJ_RETURN_IF_ERROR(npy::scatter(*arr, *in.buf, *in.st, s.layout, s.io_dtype(), s.batch, in.h,
                                    in.n, in.d, path));
  }
  return Status::ok();
}

/// The files `run --save-dir` writes.
std::vector<std::string> saved_files(const AttentionSpec &s) {
  std::vector<std::string> names = {"q.npy", "k.npy", "v.npy", "out.npy"};
  if (s.lse)
    names.push_back("lse.npy");
  return names;
}

Status save_tensors(const std::string &dir, const AttentionSpec &s, const HostTensors &t,
                    bool force) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return Status::error("cannot create --save-dir {}: {}", dir, ec.message());
  struct Out {
    const char *file;
    const std::vector<float> *buf;
    const Strides *st;
    int64_t h, n, d;
  } outs[] = {{"q.npy", &t.q, &s.q, s.heads, s.seqlen_q, s.head_dim_qk},
              {"k.npy", &t.k, &s.k, s.kv_heads, s.seqlen_k, s.head_dim_qk},
              {"v.npy", &t.v, &s.v, s.kv_heads, s.seqlen_k, s.head_dim_v},
              {"out.npy", &t.o, &s.o, s.heads, s.seqlen_q, s.head_dim_v}};
  FJ_RETURN_IF_ERROR(cli::check_outputs_absent(dir, saved_files(s), force));
  for (const Out &o : outs)
    FJ_RETURN_IF_ERROR(npy::write(
        (fs::path(dir) / o.file).string(),
        npy::gather(*o.buf, *o.st, s.layout, s.io_dtype(), s.batch, o.h, o.n, o.d), force));
  if (s.lse) {
    npy::Array lse{{s.batch, s.heads, s.seqlen_q}, "<f4", {t.lse.begin(), t.lse.end()}};
    FJ_RETURN_IF_ERROR(npy::write((fs::path(dir) / "lse.npy").string(), lse, force));
  }
  return Status::ok();
}

/// `run` on a device of flashjit::Attention (emulator:ARCH, hip:N, cuda:N): the
/// library's whole path (generate, compile, cache, load, forward, split-KV when
/// chosen), with the inputs copied to the GPU and the outputs back. Fills t.o and
/// t.lse; `described` gets the device line of the report.
Status run_on_device(const std::string &device, const Job &job, bool config_given, HostTensors &t,
                     std::string *described) {
  auto info = find_device(device);
  if (!info)
    return info.status();
  const AttentionSpec &spec = job.spec;
  Options options = job.options;
  if (!config_given) // the device's own default config, not --arch's
    options.config.reset();
  options.synchronize = true;
  options.progress = cli::emulator_progress();
  auto attn = Attention::create(spec, device, options);
  if (!attn)
    return attn.status();
  auto tensors = cli::DeviceTensors::create(*info, spec, t);
  if (!tensors)
    return tensors.status();
  FJ_RETURN_IF_ERROR(tensors->forward(*attn));
  FJ_RETURN_IF_ERROR(tensors->synchronize());
  FJ_RETURN_IF_ERROR(tensors->read_outputs(t));
  // The device line: the device, then the explain() lines that say what ran.
  std::string lines;
  const std::string e = attn->explain();
  for (const char *key : {"rules:", "config:", "split-kv:", "cache:"}) {
    const size_t at_key = e.find(key);
    if (at_key != std::string::npos)
      lines += "\n  " + e.substr(at_key, e.find('\n', at_key) - at_key);
  }
  *described = fmt::format("{} ({}, {}){}", device, info->name, info->arch, lines);
  return Status::ok();
}

int cmd_run(const cli::Args &a) {
  auto job = job_from(a);
  if (!job)
    return fail(job.status());
  const AttentionSpec &spec = job->spec;
  auto p = ir::build_attention(spec, job->config);
  if (!p)
    return fail(p.status());
  const std::string device = a.get("--device", "interpreter");
  // A device of flashjit::Attention: emulator:ARCH, hip:N, cuda:N.
  const bool attention_device = device.find(':') != std::string::npos;
  if (device != "interpreter" && device != "emulator" && !attention_device)
    return fail(Status::error("--device {} is not known: use interpreter (the IR on the CPU), "
                              "emulator (the emitted AMD kernel on the CPU, needs --arch), or a "
                              "device of the library: hip:N, cuda:N or emulator:ARCH",
                              device));
  std::optional<lowering::Lowered> kernel, combine; // combine: split-KV's second kernel
  if (!attention_device && a.has("--num-splits") && spec.num_splits == 0)
    return fail(Status::error("--num-splits 0 (chosen per call) needs a device with compute "
                              "units (hip:N, cuda:N, emulator:ARCH): give 1 (off) or 2..{} for "
                              "--device {}",
                              kMaxSplits, device));
  if (spec.num_splits > 1 && device == "interpreter")
    return fail(Status::error("--num-splits runs the split-KV kernels, which only --device "
                              "emulator has and the library's devices (hip:N, cuda:N, "
                              "emulator:ARCH); the interpreter runs the attention program"));
  if (attention_device && a.has("--arch"))
    return fail(Status::error("--arch names the target of --device interpreter|emulator; {} "
                              "has its own ({}): drop --arch",
                              device,
                              device.starts_with("emulator:") ? "after the colon" : "the GPU's"));
  if (device == "emulator") {
    if (!job->target || job->target->is_nvidia())
      return fail(Status::error("--device emulator runs an emitted AMD kernel: give an AMD --arch, "
                                "e.g. --arch gfx1201"));
    using pipeline::KernelKind;
    const bool split = spec.num_splits > 1;
    for (auto [kind, out] :
         {std::pair{split ? KernelKind::split_partial : KernelKind::attention, &kernel},
          std::pair{KernelKind::split_combine, &combine}}) {
      if (!split && kind == KernelKind::split_combine)
        break;
      auto g = pipeline::generate(spec, job->target->target_id(), job->options, nullptr, kind);
      if (!g)
        return fail(g.status());
      // FLASHJIT_OVERRIDE_DIR: the override's kernel text, as the GPU would run it.
      auto emulated = pipeline::emulated_kernel(*g);
      if (!emulated)
        return fail(emulated.status());
      *out = emulated.take();
    }
  }
  auto seed = a.get_int("--seed", 0);
  if (!seed)
    return fail(seed.status());
  // The CPU needs hours for long sequences: say so up front, and refuse past
  // kSlowRunSeconds unless asked (tools/run_estimate.h has the rates).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // What runs the kernel: the interpreter, the emulator, or a GPU (whose time
  // is nothing beside the float64 reference's).
  const bool on_gpu = device.starts_with("hip:") || device.starts_with("cuda:");
  const std::string executor = on_gpu ? device : attention_device ? "emulator" : device;
  cli::RunEstimate estimate = cli::estimate_run(spec, job->config, executor == "emulator", cores);
  if (on_gpu)
    estimate.executor_seconds = 0;
  if (Status s = cli::check_run_time(estimate, executor, cores, a.has("--allow-slow")); !s)
    return fail(s);
  if (Status s = cli::check_run_memory(cli::run_host_bytes(spec), cli::physical_memory_bytes()); !s)
    return fail(s);
  if (estimate.seconds() > cli::kAnnounceRunSeconds)
    fmt::print(stderr, "flashjit: run: {}\n", cli::describe(estimate, executor, cores));
  // A --save-dir that does not exist yet is not the --load-dir (the error_code
  // form: the throwing one throws for a missing path on newer libstdc++).
  std::error_code missing;
  if (a.has("--save-dir") && a.has("--load-dir") &&
      fs::equivalent(a.get("--save-dir"), a.get("--load-dir"), missing))
    return fail(
        Status::error("--save-dir and --load-dir name the same folder: saving would overwrite "
                      "your inputs; choose another --save-dir"));
  // Refused before the run rather than after it.
  if (a.has("--save-dir"))
    if (Status s =
            cli::check_outputs_absent(a.get("--save-dir"), saved_files(spec), a.has("--force"));
        !s)
      return fail(s);
  HostTensors t = make_random_inputs(spec, uint64_t(*seed));
  if (a.has("--load-dir"))
    if (Status s = load_inputs(a.get("--load-dir"), spec, t); !s)
      return fail(s);
  std::string on_device;
  // One list (config_flags() returns a new vector each call: begin() and end()
  // of two calls would walk between two allocations).
  const bool config_given = std::ranges::any_of(cli::config_flags(), [&](const cli::FlagSpec &f) {
    return f.name != "--rules" && a.has(f.name);
  });
  runtime::EmulatorOptions emulator;
  emulator.progress = cli::emulator_progress();
  if (Status s = attention_device ? run_on_device(device, *job, config_given, t, &on_device)
                 : combine        ? runtime::emulate_split_kv(*kernel, *combine, *job->target, spec,
                                                              spec.num_splits, t, emulator)
                 : kernel         ? runtime::emulate(*kernel, *job->target, spec, t, emulator)
                                  : ir::interpret(*p, ir::bind_attention(spec), t);
      !s)
    return fail(s);
  const ReferenceResult ref = reference_attention(spec, t);
  const ErrorStats err = compare(spec, t, ref);
  const Tolerance tol = tolerance_for(spec.dtype);
  const bool ok = err.within(tol.abs, tol.rel);
  if (a.has("--json")) {
    // The errors rounded to 7 significant digits; NaN and infinities print as null.
    auto digits7 = [](double x) { return std::strtod(fmt::format("{:.6e}", x).c_str(), nullptr); };
    const cli::json::Value result = {
        {"spec", spec.summary()},
        {"signature", spec.signature().summary()},
        {"device", attention_device ? device
                   : kernel         ? fmt::format("emulator:{}", job->target->target_id())
                                    : device},
        {"max_abs", digits7(err.max_abs)},
        {"rel_l2", digits7(err.rel_l2)},
        {"nonfinite", err.nonfinite},
        {"tolerance", {{"dtype", dtype_name(spec.dtype)}, {"abs", tol.abs}, {"rel", tol.rel}}},
        {"pass", ok}};
    fmt::print("{}\n", compiler::json_line(result));
  } else {
    fmt::print("spec:   {}\ndevice: {}\nerror vs float64 reference: max_abs {:.3e}  rel_l2 {:.3e}  "
               "nonfinite {}  (tolerance {}: abs {:.0e}, rel {:.0e}) -> {}\n",
               spec.summary(),
               attention_device ? on_device
               : kernel ? fmt::format("emulator ({} rules, {}{})", kernel->rules,
                                      job->target->target_id(),
                                      combine ? fmt::format(", split-KV over {} splits then {}",
                                                            spec.num_splits, combine->kernel_name)
                                              : "")
                        : device,
               err.max_abs, err.rel_l2, err.nonfinite, dtype_name(spec.dtype), tol.abs, tol.rel,
               ok ? "PASS" : "FAIL");
  }
  if (a.has("--save-dir")) {
    if (Status s = save_tensors(a.get("--save-dir"), spec, t, a.has("--force")); !s)
      return fail(s);
    fmt::print(a.has("--json") ? stderr : stdout, "saved q.npy k.npy v.npy out.npy{} to {}\n",
               spec.lse ? " lse.npy" : "", a.get("--save-dir"));
  }
  return ok ? 0 : 2;
}

std::vector<cli::Command> commands() {
  std::vector<cli::Command> all = {
      {"emit",
       "Build the tile-IR program for an attention spec; print it and/or the HIP source for an "
       "arch. The kernel takes lengths, batch, heads, strides, window sizes and scale as "
       "arguments: every shape of one signature prints the same text.",
       "[--arch ARCH] [spec flags] [--kernel KIND] [--gqa-packed] [-o k.hip] [--print-ir]",
       with_spec({{"--arch", "ARCH",
                   "target, e.g. gfx1201 or gfx1200:xnack- (see the supported list in errors)", ""},
                  {"-o", "FILE", "write the HIP source to FILE instead of stdout", ""},
                  cli::force_flag(),
                  kernel_flag(),
                  gqa_packed_flag(),
                  {"--print-ir", "", "print the tile IR", ""}}),
       cmd_emit},
      {"compile",
       "Generate the HIP for an arch and compile it (in-process LLVM 22, hiprtc or nvrtc); for "
       "AMD, "
       "print the ISA and the resource report.",
       "--arch ARCH [spec flags] [--kernel KIND] [--gqa-packed] [-o k.co] [--isa] [--resources] "
       "[--json]",
       with_spec({{"--arch", "ARCH", "target, e.g. gfx1201", ""},
                  {"-o", "FILE", "write the code object (ELF) to FILE", ""},
                  cli::force_flag(),
                  kernel_flag(),
                  gqa_packed_flag(),
                  {"--compiler", "NAME", "auto, llvm, hiprtc or nvrtc", "auto"},
                  {"--isa", "", "print the disassembly", ""},
                  {"--resources", "",
                   "print the resource report (default when nothing else is asked)", ""},
                  {"--json", "", "print the resource report as JSON, with the config and the rules",
                   ""}}),
       cmd_compile},
      {"run",
       "Run the kernel for a spec on random (or loaded) inputs, compare with the float64 "
       "reference and print the error; exits 2 past the dtype's tolerance.",
       "--device interpreter|emulator|hip:N|cuda:N|emulator:ARCH [--arch ARCH] [spec flags] "
       "[--seed N] [--save-dir DIR] [--load-dir DIR]",
       with_spec(
           {{"--device", "NAME",
             "interpreter: the IR's own semantics on the CPU; emulator: the kernel emitted "
             "for --arch, run on the CPU with the matrix instructions' exact lane semantics; "
             "hip:N, cuda:N or emulator:ARCH: the library's whole path on that device "
             "(compile, cache, load, forward, split-KV when chosen), the kernel checked on "
             "the silicon",
             "interpreter"},
            {"--arch", "ARCH", "AMD target (emulator; its default config for either device)", ""},
            {"--seed", "N", "seed of the random inputs", "0"},
            {"--json", "",
             "print the result as one JSON object: spec, signature, device, errors, tolerance, "
             "pass",
             ""},
            {"--save-dir", "DIR",
             "write q/k/v/out(/lse).npy in the spec's layout (bf16 widened to f32)", ""},
            {"--load-dir", "DIR", "read q/k/v.npy from DIR instead of random inputs", ""},
            {"--allow-slow", "",
             fmt::format("run even when the estimate (printed past {:.0f} s) is over {:.0f} s: "
                         "the emulator and the interpreter do about {:.1f} and {:.1f} GFLOP/s "
                         "per core, the float64 reference {:.1f} GFLOP/s",
                         cli::kAnnounceRunSeconds, cli::kSlowRunSeconds,
                         cli::kEmulatorFlopsPerCore / 1e9, cli::kInterpreterFlopsPerCore / 1e9,
                         cli::kReferenceFlops / 1e9),
             ""},
            cli::force_flag()}),
       cmd_run},
  };
  for (auto &c : cli::cache_commands())
    all.push_back(std::move(c));
  for (auto &c : cli::archs_commands())
    all.push_back(std::move(c));
  for (auto &c : cli::tune_commands())
    all.push_back(std::move(c));
  return all;
}

void print_main_help(const std::vector<cli::Command> &cmds) {
  fmt::print("flashjit: a JIT FlashAttention kernel generator for AMD (and NVIDIA) GPUs\n\n"
             "usage: flashjit <command> [options]\n\ncommands:\n");
  for (const auto &c : cmds)
    fmt::print("  {:<10} {}\n", c.name, c.summary);
  fmt::print("\nflashjit <command> --help shows a command's options; flashjit --version the "
             "version.\n");
}

} // namespace

int main(int argc, char **argv) {
  const auto cmds = commands();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_main_help(cmds);
    return argc < 2 ? 1 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    fmt::print("flashjit {}\n", flashjit::version());
    return 0;
  }
  for (const auto &c : cmds) {
    if (c.name != argv[1])
      continue;
    auto args = cli::parse_args(c, std::vector<std::string>(argv + 2, argv + argc));
    if (!args)
      return fail(args.status());
    if (args->has("--help")) {
      fmt::print("{}", c.help_text());
      return 0;
    }
    try {
      return c.run(*args);
    } catch (const std::bad_alloc &) { // the memory check above is an estimate
      return fail(Status::error("{}: out of host memory: lower the sizes (--batch, --heads, "
                                "--seqlen-q, --seqlen-k)",
                                argv[1]));
    }
  }
  print_main_help(cmds);
  return fail(Status::error("unknown command '{}'", argv[1]));
}
