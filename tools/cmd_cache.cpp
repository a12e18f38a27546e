// The kernel cache from the command line: inspect it, clear it, fill it ahead
// of time from a manifest; and the table of debug knobs.
//
// The warmup manifest (a JSON list of kernels) is read by tools/manifest.h.
//
// A kernel is reported ready only once its entry is verified on disk: a store
// that failed (a full disk, a read-only directory) or an entry the cache's size
// cap (FLASHJIT_CACHE_MAX_BYTES) removed again before the end is an error.
#include "compiler/code_object.h"
#include "compiler/kernel_cache.h"
#include "compiler/knobs.h"
#include "compiler/select.h"
#include "ir/build.h"
#include "lowering/lower.h"
#include "runtime/pipeline.h"
#include "templates/templates.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace flashjit::cli {
namespace {

int fail(const Status &s) {
  fmt::print(stderr, "flashjit: error: {}\n", s.message());
  return 1;
}

std::string human_bytes(int64_t n) {
  if (n < 1024)
    return fmt::format("{} B", n);
  if (n < 1024 * 1024)
    return fmt::format("{:.1f} KiB", n / 1024.0);
  if (n < int64_t(1) << 30)
    return fmt::format("{:.1f} MiB", n / (1024.0 * 1024.0));
  return fmt::format("{:.1f} GiB", double(n) / double(int64_t(1) << 30));
}

/// The cache directory: --dir, else the knobs' (FLASHJIT_CACHE_DIR, XDG, HOME).
Expected<std::string> cache_dir(const Args &a) {
  std::string dir = a.get("--dir", compiler::knobs().cache_dir);
  if (dir.empty())
    return Status::error("no cache directory: pass --dir DIR or set FLASHJIT_CACHE_DIR (HOME is "
                         "not set either)");
  return dir;
}

// ---- flashjit cache ----------------------------------------------------------

int cmd_cache(const Args &a) {
  const int actions = int(a.has("stats")) + int(a.has("list")) + int(a.has("clear"));
  if (actions != 1)
    return fail(Status::error("say what to do: flashjit cache stats|list|clear (one of them)"));
  auto dir = cache_dir(a);
  if (!dir)
    return fail(dir.status());
  compiler::KernelCache cache(*dir);
  cache.set_disk_limit(compiler::knobs().cache_max_bytes);
  const bool as_json = a.has("--json");

  if (a.has("clear")) {
    auto cleared = cache.clear();
    if (!cleared)
      return fail(cleared.status());
    for (const std::string &problem : cleared->problems)
      fmt::print(stderr, "flashjit: cache clear: {}\n", problem);
    fmt::print("removed {} file{} from {}\n", cleared->removed, cleared->removed == 1 ? "" : "s",
               *dir);
    if (cleared->problems.empty())
      return 0;
    return fail(Status::error("{} file{} named like cache entries {} left in place (see above): "
                              "look at them, and remove them by hand if they are not yours",
                              cleared->problems.size(), cleared->problems.size() == 1 ? "" : "s",
                              cleared->problems.size() == 1 ? "was" : "were"));
  }
  auto entries = cache.list();
  if (!entries)
    return fail(entries.status());
  if (a.has("stats")) {
    int64_t bytes = 0, bad = 0;
    std::map<std::string, int64_t> by_target;
    for (const auto &e : *entries) {
      bytes += e.file_bytes;
      bad += !e.problem.empty();
      if (e.problem.empty())
        ++by_target[e.target_id + " (" + e.compiler_identity + ")"];
    }
    const int64_t limit = cache.disk_limit();
    if (as_json) {
      const json::Value stats = {{"directory", *dir},
                                 {"entries", entries->size()},
                                 {"bytes", bytes},
                                 {"corrupt", bad},
                                 {"max_bytes", limit}};
      fmt::print("{}\n", compiler::json_line(stats));
      return 0;
    }
    fmt::print("cache directory: {}\nentries:         {} ({}){}\nsize limit:      {} "
               "(FLASHJIT_CACHE_MAX_BYTES; least recently used entries go first)\n",
               *dir, entries->size(), human_bytes(bytes),
               bad ? fmt::format(", {} corrupt", bad) : "",
               limit > 0 ? human_bytes(limit) : "none");
    for (const auto &[target, n] : by_target)
      fmt::print("  {:>5}  {}\n", n, target);
    return 0;
  }
  // list
  if (as_json) {
    // An empty kernel label or problem is null.
    auto or_null = [](const std::string &s) { return s.empty() ? json::Value() : json::Value(s); };
    json::Value list = json::Value::array();
    for (const auto &e : *entries)
      list.push_back({{"key", e.key},
                      {"target", e.target_id},
                      {"arch", e.arch},
                      {"compiler", e.compiler_identity},
                      {"bytes", e.bytes},
                      {"file_bytes", e.file_bytes},
                      {"kernel", or_null(e.label)},
                      {"path", e.path},
                      {"problem", or_null(e.problem)}});
    fmt::print("{}", json::print(list));
    return 0;
  }
  if (entries->empty()) {
    fmt::print("{} holds no kernels\n", *dir);
    return 0;
  }
  // The kernel (name, signature, config) closes each line: entries of an older
  // flashjit (cache format 1) do not record it.
  fmt::print("{:<16}  {:<16}  {:<14}  {:>10}  {}\n", "KEY", "TARGET", "COMPILER", "BYTES",
             "KERNEL");
  for (const auto &e : *entries) {
    if (!e.problem.empty())
      fmt::print("{:<16}  corrupt: {}\n", e.key.substr(0, 16), e.problem);
    else
      fmt::print("{:<16}  {:<16}  {:<14}  {:>10}  {}\n", e.key.substr(0, 16), e.target_id,
                 e.compiler_identity, e.bytes, e.label.empty() ? "(not recorded)" : e.label);
  }
  fmt::print("{} entr{} in {}\n", entries->size(), entries->size() == 1 ? "y" : "ies", *dir);
  return 0;
}

// ---- flashjit warmup ---------------------------------------------------------

struct WarmupResult {
  Status status;
  std::string line;
  std::string what; // "<target> <signature> (<config>)"
  std::string key;  // the cache key, once compiled
  // For --json: the parts of `what`, and how the kernel came to be ready.
  std::string target, signature, config, kernel, outcome, compiler;
  double seconds = 0;
  int64_t bytes = 0;
};

/// One item through the pipeline (runtime/pipeline.h), into `cache`: the same
/// generation, key and compile as Attention::create, so a warmed-up kernel is
/// a hit there. The knobs act in the pipeline: FLASHJIT_DEBUG, _OVERRIDE_DIR,
/// _DUMP_DIR.
WarmupResult warm_one(const WarmupItem &w, const std::string &compiler_name,
                      compiler::KernelCache &cache) {
  auto fail_with = [&](const Status &s) {
    WarmupResult r{s, "", "", ""};
    r.target = w.arch;
    r.signature = w.spec.signature().summary();
    return r;
  };
  Options options;
  options.compiler = compiler_name;
  options.mma_m = w.mma_m.value_or(0);
  if (w.block_m || w.block_n || w.waves) {
    auto target = lowering::parse_target(w.arch);
    if (!target)
      return fail_with(target.status());
    ir::Config config =
        lowering::default_config(w.spec, *target, lowering::RulesChoice::automatic, options.mma_m);
    config.block_m = w.block_m.value_or(config.block_m);
    config.block_n = w.block_n.value_or(config.block_n);
    config.waves = w.waves.value_or(config.waves);
    options.config = config;
  }
  auto g = pipeline::generate(w.spec, w.arch, options);
  if (!g)
    return fail_with(g.status());
  auto c = pipeline::compile(*g, options, cache);
  if (!c)
    return fail_with(c.status());
  const std::string what = fmt::format("{} {} ({})", g->target.target_id(),
                                       w.spec.signature().summary(), g->config.summary());
  // The cache keeps a kernel it could not store in memory and says so once;
  // here that is a failure: a later process would not find it.
  if (Status s = cache.stored(c->cache_key); !s)
    return fail_with(s.with_context(what));
  std::string also;
  if (w.spec.mask != MaskType::none) {
    // A mask tensor's plan runs its block summary first (on a GPU; the
    // emulator runs it itself): warmed up beside the attention kernel.
    auto summary =
        pipeline::generate(w.spec, w.arch, options, nullptr, pipeline::KernelKind::mask_blocks);
    if (!summary)
      return fail_with(summary.status().with_context(what + ": the mask's block summary"));
    auto sc = pipeline::compile(*summary, options, cache);
    if (!sc)
      return fail_with(sc.status().with_context(what + ": the mask's block summary"));
    if (Status s = cache.stored(sc->cache_key); !s)
      return fail_with(s.with_context(what + ": the mask's block summary"));
    also = fmt::format("; the mask's block summary {} (key {})", sc->cache_outcome,
                       sc->cache_key.substr(0, 16));
  }
  WarmupResult r{Status::ok(),
                 fmt::format("{}: {} in {:.1f} ms ({}, {} bytes, key {}){}", what, c->cache_outcome,
                             c->seconds * 1e3, c->compiler, c->code.bytes.size(),
                             c->cache_key.substr(0, 16), also),
                 what, c->cache_key};
  r.target = g->target.target_id();
  r.signature = w.spec.signature().summary();
  r.config = g->config.summary();
  r.kernel = g->lowered.kernel_name;
  r.outcome = c->cache_outcome;
  r.compiler = c->compiler;
  r.seconds = c->seconds;
  r.bytes = int64_t(c->code.bytes.size());
  return r;
}

int cmd_warmup(const Args &a) {
  if (!a.has("--manifest") && a.positional.empty())
    return fail(Status::error("warmup needs a manifest: flashjit warmup MANIFEST.json (a JSON list "
                              "of kernels)"));
  auto items = read_manifest(a.positional.empty() ? a.get("--manifest") : a.positional[0]);
  if (!items)
    return fail(items.status());
  auto dir = cache_dir(a);
  if (!dir)
    return fail(dir.status());
  auto jobs = a.get_int("--jobs", 1);
  if (!jobs)
    return fail(jobs.status());
  if (*jobs < 1 || *jobs > 256)
    return fail(Status::error("--jobs {} is out of range: expected 1..256", *jobs));
  compiler::KernelCache cache(*dir);
  cache.set_always_compile(compiler::knobs().always_compile);
  cache.set_disk_limit(compiler::knobs().cache_max_bytes);
  // Warming up a cache that cannot keep anything would report false success.
  if (Status s = cache.disk_status(); !s)
    return fail(s);

  std::vector<WarmupResult> results(items->size());
  std::atomic<size_t> next{0};
  // Progress (FLASHJIT_PROGRESS): a line on stderr as each kernel is ready.
  const bool progress = cli::progress_enabled();
  std::mutex progress_mutex;
  size_t finished = 0;
  auto worker = [&] {
    for (size_t i; (i = next++) < items->size();) {
      const WarmupItem &w = (*items)[i];
      const std::string name = a.has("--compiler") ? a.get("--compiler") : w.compiler;
      results[i] = warm_one(w, name, cache);
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        fmt::print(stderr, "flashjit: warmup: {} of {} done ({}: {})\n", ++finished, items->size(),
                   i + 1, results[i].status ? results[i].line : "failed");
        std::fflush(stderr);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t t = 1; t < std::min<int64_t>(*jobs, int64_t(items->size())); ++t)
    threads.emplace_back(worker);
  worker();
  for (auto &t : threads)
    t.join();

  // A later kernel's store may have trimmed an earlier one away (the size cap).
  for (WarmupResult &r : results)
    if (r.status)
      if (Status s = cache.stored(r.key); !s) {
        const compiler::CacheStats stats = cache.stats();
        r.status = stats.evicted_files > 0
                       ? Status::error("{}: stored, then removed again to keep the cache within "
                                       "its limit of {} bytes (FLASHJIT_CACHE_MAX_BYTES), which "
                                       "the manifest's kernels exceed together: raise the limit "
                                       "(or set it to 0 for none)",
                                       r.what, stats.disk_limit)
                       : s.with_context(r.what);
      }
  int failed = 0;
  if (a.has("--json")) { // one object per item, in the manifest's order
    json::Value kernels = json::Value::array();
    for (const WarmupResult &r : results) {
      failed += !r.status;
      json::Value k = {{"target", r.target}, {"signature", r.signature}, {"ready", bool(r.status)}};
      if (r.status) {
        k["kernel"] = r.kernel;
        k["config"] = r.config;
        k["outcome"] = r.outcome;
        k["seconds"] = std::round(r.seconds * 1e6) / 1e6; // to the microsecond
        k["compiler"] = r.compiler;
        k["bytes"] = r.bytes;
        k["key"] = r.key;
      } else {
        k["error"] = r.status.message();
      }
      kernels.push_back(std::move(k));
    }
    const json::Value doc = {{"directory", *dir},
                             {"kernels", kernels},
                             {"ready", results.size() - size_t(failed)},
                             {"failed", failed}};
    fmt::print("{}", json::print(doc));
    return failed ? 1 : 0;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].status)
      fmt::print("[{}/{}] {}\n", i + 1, results.size(), results[i].line);
    else {
      ++failed;
      fmt::print(stderr, "[{}/{}] error: {}\n", i + 1, results.size(), results[i].status.message());
    }
  }
  fmt::print("warmup: {} of {} kernels ready in {}\n", results.size() - failed, results.size(),
             *dir);
  return failed ? 1 : 0;
}

// ---- flashjit knobs ----------------------------------------------------------

/// `text` wrapped at `width` columns, every line after the first indented.
std::string wrap(std::string_view text, size_t width, size_t indent) {
  std::string out, line;
  std::istringstream words{std::string(text)};
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

int cmd_knobs(const Args &a) {
  for (const compiler::KnobInfo &k : compiler::knob_table()) {
    const std::string value = compiler::knob_value(k.name);
    fmt::print("{}={}\n  default: {}\n  now:     {}\n  {}\n\n", k.name, k.value, k.fallback,
               value.empty() ? "(unset)" : value, wrap(k.doc, 76, 2));
  }
  // Parsed here rather than through knobs(), which would report a bad value a
  // second time.
  auto parsed = compiler::parse_knobs();
  if (!parsed)
    return fail(parsed.status());
  fmt::print("cache directory in effect: {}\n",
             parsed->cache_dir.empty() ? "(none: memory only)" : parsed->cache_dir);
  return 0;
}

} // namespace

std::vector<Command> cache_commands() {
  const FlagSpec dir{"--dir", "DIR", "the cache directory",
                     "FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit"};
  return {
      {"cache",
       "Inspect or empty the kernel cache on disk.",
       "stats|list|clear [--dir DIR] [--json]",
       {{"stats", "", "count the entries and their bytes", ""},
        {"list", "",
         "one line per entry: key, target, compiler, bytes, the kernel (name, signature, config; "
         "and damaged files)",
         ""},
        {"clear", "", "remove every entry (and stale temporary files)", ""},
        dir,
        {"--json", "", "print stats or list as JSON", ""}},
       cmd_cache},
      {"warmup",
       "Compile the kernels a manifest lists into the cache, ahead of their first use (one "
       "per signature: its lengths and batch are only examples).",
       "MANIFEST.json | --manifest FILE [--compiler NAME] [--jobs N] [--dir DIR] [--json]",
       {{"--manifest", "FILE",
         "JSON list of {\"arch\": ..., spec fields..., block_m/block_n/waves/mma_m} (see "
         "tools/cmd_cache.cpp)",
         ""},
        {"--compiler", "NAME", "auto, llvm, hiprtc or nvrtc, for every item",
         "auto, or the item's"},
        {"--jobs", "N", "compile N kernels at once", "1"},
        dir,
        {"--json", "",
         "print one JSON object: each kernel's target, signature, and its key, outcome and "
         "time or its error",
         ""}},
       cmd_warmup,
       /*max_positional=*/1},
      {"knobs",
       "List the FLASHJIT_* environment variables: what each does, its default and its value now.",
       "",
       {},
       cmd_knobs},
  };
}

} // namespace flashjit::cli
