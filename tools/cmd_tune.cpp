// `flashjit tune` and `flashjit bench`: real launches on a device of
// flashjit::Attention, through the library's own path (generate, compile,
// cache, load, forward).
#include "compiler/code_object.h"
#include "lowering/lower.h"
#include "runtime/pipeline.h"
#include "runtime/tuned.h"
#include "tools/commands.h"
#include "tools/device_tensors.h"
#include "tools/spec_flags.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

namespace flashjit::cli {
namespace {

int fail(const Status &s) {
  fmt::print(stderr, "flashjit: error: {}\n", s.message());
  return 1;
}

/// The FLOPs of a forward as FlashAttention counts them: 4 * B * H * Sq * Sk *
/// (Dqk + Dv) / 2, halved under a causal mask.
double forward_flops(const AttentionSpec &s) {
  const double d = double(s.head_dim_qk + s.head_dim_v) / 2;
  return 4.0 * double(s.batch) * double(s.heads) * double(s.seqlen_q) * double(s.seqlen_k) * d /
         (s.causal ? 2 : 1);
}

bool on_gpu(const DeviceInfo &d) { return d.kind != DeviceKind::emulator; }

/// The config's knobs, one candidate per value tried, with the rules'
/// default first: the configs one knob away from the default, then two.
std::vector<ir::Config> candidates(const AttentionSpec &spec, const lowering::Target &target,
                                   size_t most) {
  const ir::Config base = lowering::default_config(spec, target);
  std::vector<ir::Config> out = {base};
  std::set<std::string> seen = {base.summary()};
  auto consider = [&](const ir::Config &c) {
    if (out.size() >= most || !ir::validate(c) || !lowering::check_fits(spec, c, target) ||
        !seen.insert(c.summary()).second)
      return;
    out.push_back(c);
  };
  // Each knob and the values tried (stages 3: the producer warpgroup, NVIDIA only).
  std::vector<std::pair<int64_t ir::Config::*, std::vector<int64_t>>> knobs = {
      {&ir::Config::block_m, {64, 128}},
      {&ir::Config::block_n, {32, 64, 96, 128}},
      {&ir::Config::waves, {4, 8}},
      {&ir::Config::stages, {1, 2}}};
  if (target.is_nvidia())
    knobs.back().second.push_back(3);
  auto each = [&](const ir::Config &c, auto &&visit) {
    for (const auto &[knob, values] : knobs)
      for (int64_t v : values) {
        ir::Config d = c;
        d.*knob = v;
        d.persistent = d.persistent && d.stages == 3; // a producer's knob
        visit(d);
      }
    ir::Config d = c;
    d.q_in_lds = !c.q_in_lds;
    visit(d);
    if (c.stages == 3) {
      d = c;
      d.persistent = !c.persistent;
      visit(d);
    }
  };
  each(base, consider);
  each(base, [&](const ir::Config &one) { each(one, consider); });
  return out;
}

/// A smaller shape of `spec`'s signature for the float64 check: one batch, at
/// most 203 query and 517 key rows (ragged against the blocks).
AttentionSpec check_shape(const AttentionSpec &spec) {
  AttentionSpec s = spec;
  s.batch = 1;
  s.seqlen_q = std::min<int64_t>(spec.seqlen_q, 203);
  s.seqlen_k = std::min<int64_t>(spec.seqlen_k, spec.seqlen_q == spec.seqlen_k ? 203 : 517);
  s.set_layout(spec.layout);
  return s.validate() && spec.matches(s.signature()) ? s : spec;
}

struct Measured {
  ir::Config config;
  std::string check; // "ok <max_abs>" or why it failed
  bool ok = false;
  double seconds = 0;
};

/// One candidate: created on the device, checked against float64 on `small`,
/// then timed on `tensors` (the timing shape).
Measured measure(const ir::Config &config, const AttentionSpec &spec, const AttentionSpec &small,
                 const HostTensors &small_in, const ReferenceResult &small_ref,
                 const DeviceInfo &device, DeviceTensors &tensors, int iters) {
  Measured m{config, "", false, 0};
  Options options;
  options.config = config;
  options.tuned = false; // the candidate itself, whatever the database holds
  options.synchronize = !on_gpu(device);
  auto attn = Attention::create(spec, device.id(), options);
  if (!attn) {
    m.check = attn.status().message();
    return m;
  }
  HostTensors out = small_in;
  auto check = DeviceTensors::create(device, small, small_in);
  Status s = check ? check->forward(*attn) : check.status();
  if (s)
    s = check->synchronize();
  if (s)
    s = check->read_outputs(out);
  if (!s) {
    m.check = s.message();
    return m;
  }
  const ErrorStats err = compare(small, out, small_ref);
  const Tolerance tol = tolerance_for(spec.dtype);
  if (!err.within(tol.abs, tol.rel)) {
    m.check = fmt::format("max_abs {:.2e} rel_l2 {:.2e} nonfinite {} past the tolerance",
                          err.max_abs, err.rel_l2, err.nonfinite);
    return m;
  }
  const bool gpu = on_gpu(device);
  auto seconds = tensors.seconds_per_call(*attn, iters, gpu ? 7 : 1, gpu ? 3 : 1);
  if (!seconds) {
    m.check = seconds.status().message();
    return m;
  }
  m.ok = true;
  m.check = fmt::format("ok {:.1e}", err.max_abs);
  m.seconds = *seconds;
  return m;
}

/// Random inputs for timing: make_random_inputs's tensors with Q, K and V drawn
/// again from a standard normal, as PyTorch's benchmarks (torch.randn) draw
/// them: 4096 values of std::normal_distribution, one picked per element by a
/// xorshift, so that the 200 million elements of a large case take a second,
/// not a minute.
HostTensors timing_inputs(const AttentionSpec &spec, uint64_t seed) {
  HostTensors t = make_random_inputs(spec, seed);
  const DType io = spec.io_dtype();
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal;
  std::vector<float> table(4096);
  for (float &x : table)
    x = from_bits(io, to_bits(io, normal(rng)));
  uint64_t state = rng() | 1;
  for (std::vector<float> *x : {&t.q, &t.k, &t.v})
    for (float &e : *x) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      e = table[state >> 52];
    }
  return t;
}

/// The spec flags' shape, or on a GPU where none is given a shape worth timing:
/// batch 4, 16 heads, 4096 queries and keys.
Expected<AttentionSpec> timing_spec(const Args &a, const DeviceInfo &device) {
  auto spec = spec_from(a);
  if (!spec)
    return spec.status();
  if (on_gpu(device)) {
    if (!a.has("--batch"))
      spec->batch = 4;
    if (!a.has("--heads")) {
      spec->heads = 16;
      if (!a.has("--kv-heads"))
        spec->kv_heads = 16;
    }
    if (!a.has("--seqlen-q")) {
      spec->seqlen_q = 4096;
      if (!a.has("--seqlen-k"))
        spec->seqlen_k = 4096;
    }
    spec->set_layout(spec->layout);
  }
  if (spec->seqs.packed_q || spec->seqs.packed_k || spec->seqs.paged())
    return Status::error("tune times dense specs; a varlen or paged spec uses its dense "
                         "signature's kernel config: tune that one");
  FJ_RETURN_IF_ERROR(spec->validate());
  return spec;
}

int cmd_tune(const Args &a) {
  auto device = find_device(a.get("--device", ""));
  if (!device)
    return fail(device.status().with_context("--device"));
  auto spec = timing_spec(a, *device);
  if (!spec)
    return fail(spec.status());
  auto target = lowering::parse_target(device->arch);
  if (!target)
    return fail(target.status());
  auto most = a.get_int("--max-candidates", 24),
       iters = a.get_int("--iters", on_gpu(*device) ? 10 : 1), seed = a.get_int("--seed", 0);
  for (auto *v : {&most, &iters, &seed})
    if (!*v)
      return fail(v->status());
  if (*most < 1 || *iters < 1)
    return fail(Status::error("--max-candidates and --iters must be at least 1"));
  const std::vector<ir::Config> configs = candidates(*spec, *target, size_t(*most));
  const bool json = a.has("--json");
  if (a.has("--dry-run")) {
    for (const ir::Config &c : configs)
      fmt::print("{}\n", c.summary());
    return 0;
  }
  const AttentionSpec small = check_shape(*spec);
  const HostTensors small_in = make_random_inputs(small, uint64_t(*seed));
  const ReferenceResult small_ref = reference_attention(small, small_in);
  auto tensors = DeviceTensors::create(*device, *spec, timing_inputs(*spec, uint64_t(*seed)));
  if (!tensors)
    return fail(tensors.status());
  if (!json)
    fmt::print("tuning {} on {} ({}, {}): {} candidates, each checked against float64 on {} "
               "first, then timed ({} call{} back to back)\n",
               spec->summary(), device->id(), device->name, device->arch, configs.size(),
               small.summary(), *iters, *iters == 1 ? "" : "s");
  std::vector<Measured> results;
  for (const ir::Config &c : configs) {
    Measured m = measure(c, *spec, small, small_in, small_ref, *device, *tensors, int(*iters));
    const bool is_default = results.empty();
    if (json) {
      nlohmann::json line = {
          {"config", c.summary()}, {"default", is_default}, {"ok", m.ok}, {"check", m.check}};
      if (m.ok)
        line.update({{"us", m.seconds * 1e6}, {"tflops", forward_flops(*spec) / m.seconds / 1e12}});
      fmt::print("{}\n", compiler::json_line(line));
    } else if (m.ok) {
      fmt::print("  {:<62} {:>10} {:>10.1f} us {:>7.4g} TFLOP/s{}\n", c.summary(), m.check,
                 m.seconds * 1e6, forward_flops(*spec) / m.seconds / 1e12,
                 is_default ? "  (default)" : "");
    } else {
      fmt::print("  {:<62} skipped: {}{}\n", c.summary(), m.check, is_default ? " (default)" : "");
    }
    std::fflush(stdout);
    results.push_back(std::move(m));
  }
  const Measured &base = results.front();
  const auto best = std::min_element(results.begin(), results.end(), [](auto &x, auto &y) {
    return x.ok && (!y.ok || x.seconds < y.seconds);
  });
  if (!best->ok)
    return fail(Status::error("no candidate config passed the float64 check on {}: nothing saved",
                              device->id()));
  if (!json)
    fmt::print("best: {} ({:.1f} us{})\n", best->config.summary(), best->seconds * 1e6,
               base.ok ? fmt::format(", {:.2f}x the default's speed", base.seconds / best->seconds)
                       : "; the default did not run");
  if (a.has("--no-save"))
    return 0;
  const std::string path = runtime::TunedConfigs::default_path();
  auto db = runtime::TunedConfigs::load(path);
  if (!db)
    return fail(db.status());
  db->put({target->target_id(), spec->signature().summary(), best->config, device->name,
           spec->summary(), best->seconds * 1e6, base.ok ? base.seconds * 1e6 : 0});
  if (Status s = db->save(path); !s)
    return fail(s);
  if (json)
    fmt::print("{}\n", compiler::json_line(nlohmann::json{{"saved", path},
                                                          {"config", best->config.summary()},
                                                          {"target", target->target_id()}}));
  else
    fmt::print("saved to {}: Attention::create takes it for {} on {}\n", path,
               spec->signature().summary(), target->target_id());
  return 0;
}

/// "64,128" as numbers, each at least 1.
Expected<std::vector<int64_t>> int_list(const Args &a, const std::string &flag,
                                        const std::string &fallback) {
  std::vector<int64_t> out;
  const std::string text = a.get(flag, fallback);
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char *end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1)
      return Status::error("{} {}: '{}' is not a positive integer; give a comma-separated list "
                           "like {}",
                           flag, text, item, fallback);
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

int cmd_bench(const Args &a) {
  for (const char *list : {"--head-dims", "--seqlens"}) // refused before any device is opened
    if (auto l = int_list(a, list, "64"); !l)
      return fail(l.status());
  auto device = find_device(a.get("--device", ""));
  if (!device)
    return fail(device.status().with_context("--device"));
  const bool gpu = on_gpu(*device);
  auto dims = int_list(a, "--head-dims", gpu ? "64,128,256" : "64");
  auto seqlens = int_list(a, "--seqlens", gpu ? "1024,4096,16384" : "64,128");
  auto tokens = a.get_int("--tokens", gpu ? 16384 : 128),
       heads = a.get_int("--heads", gpu ? 16 : 2), iters = a.get_int("--iters", gpu ? 10 : 1);
  for (auto *v : {&tokens, &heads, &iters})
    if (!*v)
      return fail(v->status());
  if (!dims || !seqlens)
    return fail(!dims ? dims.status() : seqlens.status());
  if (*iters < 1 || *heads < 1)
    return fail(Status::error("--iters and --heads must be at least 1"));
  auto dtype = parse_dtype(a.get("--dtype", "bf16"));
  if (!dtype)
    return fail(dtype.status().with_context("--dtype"));
  const bool json = a.has("--json");
  if (!json)
    fmt::print("flashjit bench on {} ({}, {}): forward, {}, batch x seqlen = {} tokens, {} heads; "
               "{} call{} back to back per case\n{:>6} {:>5} {:>7} {:>12} {:>9}  config\n",
               device->id(), device->name, device->arch, dtype_name(*dtype), *tokens, *heads,
               *iters, *iters == 1 ? "" : "s", "seqlen", "dim", "causal", "time", "TFLOP/s");
  for (int64_t d : *dims) {
    for (int64_t s : *seqlens) {
      for (bool causal : {false, true}) {
        AttentionSpec spec =
            make_spec(std::max<int64_t>(1, *tokens / s), *heads, *heads, s, s, d, d, *dtype);
        spec.causal = causal;
        Options options;
        auto attn = Attention::create(spec, device->id(), options);
        if (!attn)
          return fail(attn.status());
        auto tensors = DeviceTensors::create(*device, spec, timing_inputs(spec, 0));
        if (!tensors)
          return fail(tensors.status());
        auto seconds = tensors->seconds_per_call(*attn, int(*iters), gpu ? 7 : 1, gpu ? 3 : 1);
        if (!seconds)
          return fail(seconds.status());
        const double tflops = forward_flops(spec) / *seconds / 1e12;
        const std::string e = attn->explain();
        const size_t at = e.find("config:");
        const std::string config =
            at == std::string::npos ? "" : e.substr(at + 10, e.find('\n', at) - at - 10);
        if (json)
          fmt::print("{}\n", compiler::json_line(nlohmann::json{{"seqlen", s},
                                                                {"head_dim", d},
                                                                {"causal", causal},
                                                                {"batch", spec.batch},
                                                                {"heads", spec.heads},
                                                                {"us", *seconds * 1e6},
                                                                {"tflops", tflops},
                                                                {"config", config}}));
        else
          fmt::print("{:>6} {:>5} {:>7} {:>9.1f} us {:>9.4g}  {}\n", s, d, causal ? "yes" : "no",
                     *seconds * 1e6, tflops, config);
        std::fflush(stdout); // each case as it is measured, also into a pipe
      }
    }
  }
  return 0;
}

std::vector<FlagSpec> with_spec(std::vector<FlagSpec> extra) {
  std::vector<FlagSpec> f = spec_flags();
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

} // namespace

std::vector<Command> tune_commands() {
  const FlagSpec device = {"--device", "NAME",
                           "the device: cuda:N, hip:N, or emulator:ARCH (the emulator's times "
                           "are the CPU's, not a GPU's)",
                           ""};
  const FlagSpec json = {"--json", "", "print one JSON object per line", ""};
  return {
      {"tune",
       "Time the config candidates of a spec's signature on a device (each checked against "
       "float64 first) and save the fastest to the tuned-config database, which the library "
       "then takes for that signature and target. On a GPU the shape timed is batch 4, 16 "
       "heads, 4096 queries and keys, where the flags give none.",
       "--device cuda:N|hip:N|emulator:ARCH [spec flags] [--max-candidates N] [--iters N] "
       "[--dry-run] [--no-save] [--json]",
       with_spec({device,
                  {"--max-candidates", "N",
                   "configs to try: the rules' default, then those one knob away, then two", "24"},
                  {"--iters", "N",
                   "calls per timed run, back to back (on a GPU: 3 untimed calls, then the median "
                   "of 7 runs)",
                   "10 (1 on the emulator)"},
                  {"--seed", "N", "seed of the random inputs", "0"},
                  {"--dry-run", "", "list the candidates and stop", ""},
                  {"--no-save", "", "report only; leave the database as it is", ""},
                  json}),
       cmd_tune},
      {"bench",
       "Time the forward on a device over head dims, sequence lengths, causal and not, "
       "through the library's default (or tuned) configs, and print TFLOP/s.",
       "--device cuda:N|hip:N|emulator:ARCH [--head-dims 64,128] [--seqlens 1024,4096] "
       "[--tokens N] [--heads N] [--dtype bf16|f16] [--iters N] [--json]",
       {device,
        {"--head-dims", "LIST", "head dims (Q, K and V alike)", "64,128,256 (64 on the emulator)"},
        {"--seqlens", "LIST", "sequence lengths (queries = keys)",
         "1024,4096,16384 (64,128 on the emulator)"},
        {"--tokens", "N", "batch x seqlen of every case", "16384 (128 on the emulator)"},
        {"--heads", "N", "heads (Q and K/V)", "16 (2 on the emulator)"},
        {"--dtype", "TYPE", "bf16 or f16", "bf16"},
        {"--iters", "N",
         "calls per timed run, back to back (on a GPU: 3 untimed calls, then the median of 7 "
         "runs)",
         "10 (1 on the emulator)"},
        json},
       cmd_bench},
  };
}

} // namespace flashjit::cli
