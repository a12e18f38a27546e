// The flashjit tool's own pieces, linked from tools/: the command-line parser,
// the spec flags, `flashjit archs`, `cache` and `warmup`, the JSON reader of
// warmup manifests, the writer of output files (-o, --save-dir) and the
// estimate of `run` on the CPU; and, through the built tool (FLASHJIT_CLI),
// what only a whole process shows.
#include "compiler/code_object.h"
#include "compiler/select.h"
#include "runtime/attention.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/manifest.h"
#include "tools/run_estimate.h"
#include "tools/safe_write.h"
#include "tools/spec_flags.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace flashjit::cli {
namespace {

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE(std::string(message).find(text), std::string::npos)                                    \
      << "expected \"" << (text) << "\" in:\n"                                                     \
      << (message)

/// A fresh, empty directory for one test, removed when it ends.
class TempDir : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flashjit_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string &name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// What a command printed, and its exit code.
struct Ran {
  int code = -1;
  std::string out, err;
};

/// Runs the command `name` of `commands` with `argv`, capturing stdout and stderr.
Ran run_both(const std::vector<Command> &commands, const std::string &name,
             const std::vector<std::string> &argv) {
  for (const Command &c : commands)
    if (c.name == name) {
      auto args = parse_args(c, argv);
      EXPECT_TRUE(args) << args.status().message();
      if (!args)
        return {};
      ::testing::internal::CaptureStdout();
      ::testing::internal::CaptureStderr();
      Ran r;
      r.code = c.run(*args);
      r.out = ::testing::internal::GetCapturedStdout();
      r.err = ::testing::internal::GetCapturedStderr();
      return r;
    }
  ADD_FAILURE() << "no command " << name;
  return {};
}

/// Runs the command `name` of `commands` with `argv`; its exit code and stdout.
std::pair<int, std::string> run(const std::vector<Command> &commands, const std::string &name,
                                const std::vector<std::string> &argv) {
  Ran r = run_both(commands, name, argv);
  return {r.code, r.out};
}

/// Runs the built tool through the shell: `env` (assignments) flashjit `args`.
Ran run_tool(const std::string &env, const std::string &args) {
  const std::string base =
      fs::temp_directory_path() / ("flashjit_cli_test_" + std::to_string(::getpid()) + "_out");
  const std::string cmd =
      env + " '" + FLASHJIT_CLI + "' " + args + " > '" + base + ".1' 2> '" + base + ".2'";
  Ran r;
  const int status = std::system(cmd.c_str());
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".1");
  r.err = slurp(base + ".2");
  fs::remove(base + ".1");
  fs::remove(base + ".2");
  return r;
}

/// Args for spec_from / config_from from flag-value pairs.
Args flags(std::map<std::string, std::string> values) {
  Args a;
  a.values_ = std::move(values);
  return a;
}

/// Whether this build compiles AMD kernels in process (FLASHJIT_WITH_LLVM).
bool have_llvm() { return bool(compiler::make_compiler("llvm", "gfx1201")); }

// ---- issue 18 (hardening) ------------------------------------------------------

/// Finding 4: `archs --arch gfx942:sramecc+:xnack-` read the arch through a
/// string_view into a destroyed temporary (a use-after-free ASan reports).
TEST(Archs, Issue18Finding4ArchWithFeaturesOutlivesTheFlagValue) {
  auto [code, out] = run(archs_commands(), "archs", {"--arch", "gfx942:sramecc+:xnack-"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_HAS(out, "\ngfx942 ");
  EXPECT_HAS(out, "builtins: ");
  auto [json_code, json] =
      run(archs_commands(), "archs", {"--arch", "gfx942:sramecc+:xnack-", "--json"});
  EXPECT_EQ(json_code, 0) << json;
  EXPECT_HAS(json, "\"arch\": \"gfx942\"");
  std::string error;
  auto doc = json::parse(json, &error);
  ASSERT_TRUE(doc) << error << "\n" << json;
  ASSERT_EQ(doc->at("archs").size(), 1u) << json;
  EXPECT_EQ(doc->at("archs")[0].at("arch"), "gfx942");
  EXPECT_TRUE(doc->at("archs")[0].at("matrix_instructions").is_array());
  EXPECT_TRUE(doc->contains("compilers") && doc->contains("devices")) << json;
}

/// Finding 5: a manifest nested 100,000 deep overflowed the stack.
TEST(Json, Issue18Finding5NestingIsBounded) {
  std::string error;
  EXPECT_FALSE(json::parse(std::string(100000, '['), &error));
  EXPECT_EQ(error, "JSON error: arrays and objects nested more than 64 deep; flatten the document");
  std::string objects;
  for (int i = 0; i < 100000; ++i)
    objects += "{\"a\":";
  EXPECT_FALSE(json::parse(objects, &error));
  EXPECT_HAS(error, "nested more than 64 deep");
  // 64 levels still parse.
  auto deep = json::parse(std::string(64, '[') + std::string(64, ']'), &error);
  ASSERT_TRUE(deep) << error;
  EXPECT_FALSE(json::parse(std::string(65, '[') + std::string(65, ']')));
}

/// Finding 5: `warmup /dev/zero` aborted reading forever; a FIFO would hang.
TEST_F(TempDir, Issue18Finding5JsonFileReaderRefusesDevicesFifosAndHugeFiles) {
  std::string error;
  EXPECT_FALSE(json::parse_file("/dev/zero", &error));
  EXPECT_EQ(error, "/dev/zero: not a regular file (a FIFO, device or directory); give a JSON file");
  ASSERT_EQ(::mkfifo(path("fifo.json").c_str(), 0600), 0);
  EXPECT_FALSE(json::parse_file(path("fifo.json"), &error));
  EXPECT_HAS(error, "not a regular file");
  EXPECT_FALSE(json::parse_file(dir_.string(), &error));
  EXPECT_HAS(error, "not a regular file");
  std::ofstream(path("m.json")) << "[{\"arch\": \"gfx1201\"}]";
  EXPECT_FALSE(json::parse_file(path("m.json"), &error, 10));
  EXPECT_EQ(error, path("m.json") + ": 21 bytes, more than the 10 a JSON file here may be; give a "
                                    "smaller file");
  auto ok = json::parse_file(path("m.json"), &error);
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(ok->at(0).at("arch"), "gfx1201");
  std::ofstream(path("bad.json")) << "[1,";
  EXPECT_FALSE(json::parse_file(path("bad.json"), &error));
  EXPECT_HAS(error, path("bad.json") + ": JSON parse error at line 1, column 4: ");
  EXPECT_HAS(error, "unexpected end of input");
  EXPECT_FALSE(json::parse_file(path("missing.json"), &error));
  EXPECT_EQ(error, path("missing.json") + ": cannot read it: No such file or directory");
}

/// Findings 3 and 7: `-o` truncated its target on a failed write and wrote
/// through symbolic links; --save-dir overwrote q/k/v/out.npy silently.
TEST_F(TempDir, Issue18Finding3WriteOutputRefusesToOverwriteUnlessForced) {
  ASSERT_TRUE(write_output(path("k.hip"), "first", false));
  Status again = write_output(path("k.hip"), "second", false);
  ASSERT_FALSE(again);
  EXPECT_HAS(again.message(), "pass --force to replace it");
  EXPECT_EQ(slurp(path("k.hip")), "first");
  ASSERT_TRUE(write_output(path("k.hip"), "second", true));
  EXPECT_EQ(slurp(path("k.hip")), "second");
  Status into_dir = write_output(dir_.string() + "/", "x", true);
  ASSERT_FALSE(into_dir);
  EXPECT_HAS(into_dir.message(), "give a file name");
  fs::create_directory(path("sub"));
  EXPECT_FALSE(write_output(path("sub"), "x", true));
  EXPECT_TRUE(fs::is_directory(path("sub")));
}

TEST_F(TempDir, Issue18Finding7WriteOutputNeverFollowsASymbolicLink) {
  std::ofstream(path("precious")) << "do not touch";
  fs::create_symlink(path("precious"), path("k.co"));
  EXPECT_FALSE(write_output(path("k.co"), "code", false));
  ASSERT_TRUE(write_output(path("k.co"), "code", true));
  EXPECT_EQ(slurp(path("precious")), "do not touch");
  EXPECT_FALSE(fs::is_symlink(path("k.co")));
  EXPECT_EQ(slurp(path("k.co")), "code");
}

TEST_F(TempDir, Issue18Finding7SaveDirRefusesExistingFilesBeforeWritingAny) {
  const std::vector<std::string> names = {"q.npy", "k.npy", "v.npy", "out.npy"};
  EXPECT_TRUE(check_outputs_absent(dir_.string(), names, false));
  std::ofstream(path("k.npy")) << "mine";
  fs::create_symlink(path("nowhere"), path("out.npy"));
  Status s = check_outputs_absent(dir_.string(), names, false);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.message(), dir_.string() + " already holds k.npy, out.npy: nothing was written; "
                                         "choose another directory, remove them, or pass --force "
                                         "to replace them");
  EXPECT_TRUE(check_outputs_absent(dir_.string(), names, true));
  EXPECT_TRUE(check_outputs_absent(path("not-yet"), names, false));
}

/// Finding 9: `cache list` on an unusable directory said "holds no kernels"
/// and `cache clear` "removed 0 files", both with exit 0.
TEST_F(TempDir, Issue18Finding9CacheCommandsOnAnUnusableDirectoryFail) {
  std::ofstream(path("file")) << "x";
  const std::string under_file = path("file") + "/cache";
  for (const char *action : {"list", "stats", "clear"}) {
    Ran r = run_both(cache_commands(), "cache", {action, "--dir", under_file});
    EXPECT_EQ(r.code, 1) << action;
    EXPECT_EQ(r.out, "") << action;
    EXPECT_HAS(r.err, "flashjit: error: cannot create " + path("file") + "/cache: Not a directory");
  }
  // A readable, empty one is truly empty.
  Ran empty = run_both(cache_commands(), "cache", {"list", "--dir", path("empty")});
  EXPECT_EQ(empty.code, 0);
  EXPECT_EQ(empty.out, path("empty") + " holds no kernels\n");
}

/// Finding 9: `warmup` said "N of N kernels ready", exit 0, when nothing could
/// be stored: a directory under a regular file, a kernel the store refused.
/// (A full disk: KernelCache's Issue18Finding9StoredReportsAFailedStore; warmup
/// asks the same KernelCache::stored.)
TEST_F(TempDir, Issue18Finding9WarmupReportsKernelsItCouldNotStore) {
  std::ofstream(path("m.json")) << R"([{"arch": "gfx1201", "head_dim": 64, "compiler": "llvm"}])";
  std::ofstream(path("file")) << "x";
  Ran under_file =
      run_both(cache_commands(), "warmup", {path("m.json"), "--dir", path("file") + "/cache"});
  EXPECT_EQ(under_file.code, 1);
  EXPECT_EQ(under_file.err,
            "flashjit: error: cannot create " + path("file") + "/cache: Not a directory\n");
  EXPECT_EQ(under_file.out, "");
  if (!have_llvm())
    GTEST_SKIP() << "warmup compiles with the in-process LLVM here";

  const std::string env = "FLASHJIT_CACHE_DIR='" + path("cache") + "' FLASHJIT_CACHE_MAX_BYTES=";
  Ran refused = run_tool(env + "10K", "warmup '" + path("m.json") + "'");
  EXPECT_EQ(refused.code, 1) << refused.out << refused.err;
  EXPECT_HAS(refused.err, "[1/1] error: gfx1201 bf16 d=64/64 align16 (block_m=64");
  EXPECT_HAS(refused.err, "): the kernel was compiled but not stored in " + path("cache") +
                              ": the kernel of key ");
  EXPECT_HAS(refused.err, "bytes, more than the cache's whole limit of 10240 "
                          "(FLASHJIT_CACHE_MAX_BYTES): raise the limit, or set it to 0 for none");
  EXPECT_EQ(refused.out, "warmup: 0 of 1 kernels ready in " + path("cache") + "\n");

  Ran fine = run_tool(env + "2G", "warmup '" + path("m.json") + "'");
  EXPECT_EQ(fine.code, 0) << fine.err;
  EXPECT_HAS(fine.out, "warmup: 1 of 1 kernels ready in " + path("cache"));
}

/// Findings 9 and 14: a kernel that the size cap removed again before the end
/// of `warmup` is not reported ready.
TEST_F(TempDir, Issue18Finding14WarmupPastTheCacheLimitFails) {
  if (!have_llvm())
    GTEST_SKIP() << "warmup compiles with the in-process LLVM here";
  // Entries of about 17 and 21 KiB: each fits 30 KiB, both do not.
  std::ofstream(path("m.json")) << R"([{"arch": "gfx1201", "head_dim": 64, "compiler": "llvm"},
                                       {"arch": "gfx1201", "head_dim": 128, "compiler": "llvm"}])";
  const std::string env = "FLASHJIT_CACHE_DIR='" + path("cache") + "' FLASHJIT_CACHE_MAX_BYTES=";
  Ran capped = run_tool(env + "30K", "warmup '" + path("m.json") + "'");
  EXPECT_EQ(capped.code, 1) << capped.out << capped.err;
  EXPECT_HAS(capped.err, "[1/2] error: gfx1201 bf16 d=64/64");
  EXPECT_HAS(capped.err, "stored, then removed again to keep the cache within its limit of 30720 "
                         "bytes (FLASHJIT_CACHE_MAX_BYTES), which the manifest's kernels exceed "
                         "together: raise the limit (or set it to 0 for none)");
  EXPECT_HAS(capped.out, "[2/2] gfx1201 bf16 d=128/128");
  EXPECT_HAS(capped.out, "warmup: 1 of 2 kernels ready");
  Ran stats = run_tool(env + "30K", "cache stats");
  EXPECT_EQ(stats.code, 0) << stats.err;
  EXPECT_HAS(stats.out, "entries:         1 (");
  EXPECT_HAS(stats.out, "size limit:      30.0 KiB (FLASHJIT_CACHE_MAX_BYTES");
  Ran unlimited = run_tool(env + "0", "warmup '" + path("m.json") + "'");
  EXPECT_EQ(unlimited.code, 0) << unlimited.err;
  EXPECT_HAS(unlimited.out, "warmup: 2 of 2 kernels ready");
  Ran bad = run_tool(env + "lots", "cache stats");
  EXPECT_HAS(bad.err, "FLASHJIT_CACHE_MAX_BYTES=lots: expected a size in bytes");
}

/// A manifest names masks and score modifiers as the CLI's flags do (flashjit
/// emit --help): each field sets the spec's kind, so a warmed-up kernel is the
/// one Attention::create of the same spec builds.
TEST(Manifest, NamesMasksAndScoreModifiers) {
  auto items = cli::parse_manifest(
      R"([{"arch": "gfx1201", "batch": 2, "heads": 4, "seqlen_q": 100, "seqlen_k": 300,
           "attn_mask": "f16:bk", "softcap": 30, "alibi": "batch-heads", "dropout": 0.1,
           "sinks": true},
          {"arch": "sm_90", "mask_mod": "q_idx >= kv_idx", "score_mod": "score * 0.5",
           "f32_io": true}])",
      "m.json");
  ASSERT_TRUE(items) << items.status().message();
  ASSERT_EQ(items->size(), 2u);
  const AttentionSpec &a = (*items)[0].spec;
  EXPECT_EQ(a.mask, MaskType::f16);
  EXPECT_EQ(a.mask_strides.batch, 300) << "[batch, seqlen_k]: dense over b and k";
  EXPECT_EQ(a.mask_strides.head, 0);
  EXPECT_EQ(a.mask_strides.q, 0);
  EXPECT_EQ(a.mask_strides.k, 1);
  EXPECT_EQ(a.softcap, 30);
  EXPECT_EQ(a.alibi, Alibi::batch_heads);
  EXPECT_EQ(a.dropout_p, 0.1);
  EXPECT_TRUE(a.sinks);
  const AttentionSpec &b = (*items)[1].spec;
  EXPECT_EQ(b.mask_mod, "q_idx >= kv_idx");
  EXPECT_EQ(b.score_mod, "score * 0.5");
  EXPECT_TRUE(b.f32_io);
  EXPECT_EQ(b.mask, MaskType::none);
  EXPECT_EQ(b.alibi, Alibi::none);

  auto error = [](const std::string &item) {
    auto r = cli::parse_manifest("[" + item + "]", "m.json");
    return r ? std::string("accepted") : r.status().message();
  };
  EXPECT_HAS(error(R"({"arch": "gfx1201", "alibi": "rows"})"),
             "'alibi' must be \"heads\" (slopes [heads]) or \"batch-heads\"");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "attn_mask": "int8:bk"})"),
             "'attn_mask': --attn-mask expects TYPE[:AXES] with TYPE bool, f32, f16 or bf16");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "attn_mask": "bool:bx"})"), "'attn_mask'");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "dropout": 1.5})"), "dropout_p (1.5) must be in [0, 1)");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "softcap": -1})"), "softcap (-1) must be 0 (off)");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "softcap": "30"})"), "'softcap' must be a number >= 0");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "mask_mod": 1})"), "'mask_mod' must be a string");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "mask_mod": "q_idx >="})"), "mask_mod");
  EXPECT_HAS(error(R"({"arch": "gfx1201", "sinks": 1})"), "'sinks' must be true or false");
}

/// Finding 13: manifests took hex numbers, NaN and 1e15 as integers.
TEST(Json, Issue18Finding13NumbersFollowJsonsGrammar) {
  for (const char *bad :
       {"0x10", "NaN", "nan", "Infinity", "-inf", "+1", "01", ".5", "1.", "1e", "--1", "1e+"}) {
    std::string error;
    EXPECT_FALSE(json::parse(std::string("[") + bad + "]", &error)) << bad;
    EXPECT_HAS(error, "JSON parse error at line 1, column ");
  }
  for (const char *good : {"0", "-0", "128", "-1", "0.5", "1e15", "1E-3", "2.5e+2"}) {
    std::string error;
    auto v = json::parse(std::string("[") + good + "]", &error);
    ASSERT_TRUE(v) << good << ": " << error;
    EXPECT_EQ(v->at(0).get<double>(), std::strtod(good, nullptr)) << good;
  }
  auto integer = [](const char *text) { return json::integer(*json::parse(text)); };
  EXPECT_EQ(integer("128"), 128);
  EXPECT_EQ(integer("-1"), -1);
  EXPECT_EQ(integer("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(integer("-9223372036854775808"), INT64_MIN);
  for (const char *bad : {"1e15", "2.0", "9223372036854775808", "18446744073709551616",
                          "-9223372036854775809", "\"64\"", "true", "null", "[1]"})
    EXPECT_FALSE(integer(bad)) << bad;
}

/// Finding 13 (seen while writing the manifest fuzzer): "\u 41 ", "\u+041"
/// and "\u00zz" were read with strtoul (the last as a NUL), "\q" as "q".
TEST(Json, Issue18Finding13EscapesFollowJsonsGrammar) {
  for (const char *bad : {R"(["\u 41 "])", R"(["\u+041"])", R"(["\u00zz"])", R"(["\u-001"])",
                          R"(["\u0x41"])", R"(["\u41"])"}) {
    std::string error;
    EXPECT_FALSE(json::parse(bad, &error)) << bad;
    EXPECT_HAS(error, "'\\u' must be followed by 4 hex digits");
  }
  std::string error;
  EXPECT_FALSE(json::parse(R"(["\q"])", &error));
  EXPECT_HAS(error, "forbidden character after backslash");
  // A lone surrogate, a raw control character and bytes that are not UTF-8.
  EXPECT_FALSE(json::parse(R"(["\ud800"])", &error));
  EXPECT_HAS(error, "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF");
  EXPECT_FALSE(json::parse("[\"a\x01\"]", &error));
  EXPECT_HAS(error, "control character U+0001 (SOH) must be escaped");
  EXPECT_FALSE(json::parse("[\"\xff\"]", &error));
  EXPECT_HAS(error, "ill-formed UTF-8 byte");
  auto v = json::parse(R"(["\u0041\u004a\"\\\/\b\f\n\r\t", "\u00e9\ud83d\ude00"])", &error);
  ASSERT_TRUE(v) << error;
  EXPECT_EQ(v->at(0), "AJ\"\\/\b\f\n\r\t");
  EXPECT_EQ(v->at(1), "\xc3\xa9\xf0\x9f\x98\x80"); // UTF-8
}

/// The one-line layout of to_json(), the C API and `run --json`: ", " and ": "
/// between tokens, strings escaped, bytes that are not UTF-8 replaced.
TEST(Json, OneLineLayout) {
  const json::Value v = {{"kernel", "k\"\\\n\x01\xff"},
                         {"vgprs", 64},
                         {"spill", false},
                         {"list", {1, 2.5, nullptr}},
                         {"none", json::Value::array()},
                         {"empty", json::Value::object()},
                         {"nested", {{"a", "b"}}}};
  EXPECT_EQ(compiler::json_line(v),
            R"({"kernel": "k\"\\\n\u0001)"
            "\xef\xbf\xbd" // U+FFFD, in UTF-8
            R"(", "vgprs": 64, "spill": false, )"
            R"("list": [1, 2.5, null], "none": [], "empty": {}, "nested": {"a": "b"}})");
  EXPECT_EQ(json::print(json::Value::array()), "[]\n");
  EXPECT_EQ(json::print({{"a", 1}}), "{\n  \"a\": 1\n}\n");
}

TEST_F(TempDir, Issue18Finding13ManifestIntegerFieldsAreStrict) {
  const std::pair<const char *, const char *> cases[] = {
      {R"("seqlen_q": 1e15)",
       "'seqlen_q' must be an integer written in digits, like 128; got 1e+15"},
      {R"("head_dim": 64.0)",
       "'head_dim' must be an integer written in digits, like 128; got 64.0"},
      {R"("batch": 99999999999999999999)",
       "'batch' must be an integer written in digits, like 128; got 1e+20 (past the 64-bit "
       "range)"},
      {R"("batch": 9223372036854775808)",
       "'batch' must be an integer written in digits, like 128; got 9223372036854775808 (past the "
       "64-bit range)"},
      {R"("block_m": "64")", "'block_m' must be an integer, like 128"},
      {R"("window": [1.5, 0])", "'window[0]' must be an integer written in digits"},
      {R"("seqlen_q": 0x80)", "invalid literal; last read: '0x'"},
      {R"("scale": NaN)", "syntax error while parsing value - invalid literal"},
      {R"("scale": 1e999)", "number overflow parsing '1e999'"},
      {R"("scale": -0.5)", "'scale' must be a finite positive number, like 0.125"},
  };
  for (const auto &[field, why] : cases) {
    std::ofstream(path("m.json"), std::ios::trunc) << R"([{"arch": "gfx1201", )" << field << "}]";
    Ran r = run_both(cache_commands(), "warmup", {path("m.json"), "--dir", path("cache")});
    EXPECT_EQ(r.code, 1) << field;
    EXPECT_HAS(r.err, why);
    EXPECT_FALSE(fs::exists(path("cache"))) << "refused before anything is done: " << field;
  }
}

/// Finding 13: --stages 3..4096 produced the code of --stages 2 under other keys.
/// (3 is now a pipeline of its own: a producer warpgroup, the sm90 forward.)
TEST(SpecFlags, Issue18Finding13StagesPastThreeAreRefused) {
  for (const char *ok : {"1", "2", "3"})
    EXPECT_TRUE(config_from(flags({{"--stages", ok}}))) << ok;
  for (const char *bad : {"0", "4", "4096", "-1"}) {
    auto c = config_from(flags({{"--stages", bad}}));
    ASSERT_FALSE(c) << bad;
    EXPECT_EQ(c.status().message(),
              fmt::format("config stages = {} is not a pipeline the kernels have: expected 1 (no "
                          "pipelining), 2 (each K/V tile's copy issued one step ahead) or 3 (a "
                          "producer warpgroup fills a ring of two K/V copies; the sm90 forward)",
                          bad));
  }
}

/// Finding 16: `--seqlen-q 9223372036854775807` blamed a batch stride the user
/// never set; the error names the flag's field, whatever the layout.
TEST(SpecFlags, Issue18Finding16HugeLengthsNameTheirField) {
  for (const char *layout : {"bshd", "bhsd", "interleaved"})
    for (const auto &[flag, field] :
         {std::pair{"--seqlen-q", "seqlen_q"}, std::pair{"--seqlen-k", "seqlen_k"},
          std::pair{"--batch", "batch"}, std::pair{"--heads", "heads"}}) {
      auto s = spec_from(flags({{flag, "9223372036854775807"}, {"--layout", layout}}));
      ASSERT_FALSE(s) << flag << " " << layout;
      EXPECT_TRUE(s.status().message().starts_with(std::string(field) + " (9223372036854775807)"))
          << s.status().message();
      EXPECT_EQ(s.status().message().find("stride"), std::string::npos) << s.status().message();
    }
  Ran r = run_tool("", "emit --print-ir --seqlen-q 9223372036854775807");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "flashjit: error: seqlen_q (9223372036854775807) is past the 536870912 the "
                   "kernels index with 32-bit integers: split the sequence\n");
}

/// Finding 17: `run --device emulator --seqlen-q 100000` ran for most of an
/// hour without a word. The estimate is printed, and past 60 s the run is
/// refused unless --allow-slow.
/// Finding 5: `run --allow-slow` with tensors past the machine's memory died of
/// std::bad_alloc; it is refused first, with the sizes and the fix.
TEST(RunEstimate, Issue18Finding5RunPastMemoryIsRefused) {
  AttentionSpec spec = make_spec(100000, 64, 64, 100000, 100000, 128, 128, DType::bf16);
  const int64_t bytes = run_host_bytes(spec);
  EXPECT_GT(bytes, int64_t(1) << 50);
  Status s = check_run_memory(bytes, int64_t(24) << 30);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "more than this machine's 25.8 GB");
  EXPECT_HAS(s.message(), "lower --batch or --heads");
  EXPECT_TRUE(check_run_memory(int64_t(1) << 20, int64_t(24) << 30));
  EXPECT_TRUE(check_run_memory(bytes, 0)) << "unknown memory: not checked";
  // A small spec needs little: 2 x 4 x 64 x 64 elements per tensor.
  EXPECT_LT(run_host_bytes(make_spec(2, 4, 4, 64, 64, 64, 64, DType::bf16)), 2 << 20);
  // The tool: a clear error and exit 1, not an abort.
  const Ran r = run_tool("", "run --device emulator --arch gfx1201 --batch 100000 --heads 64 "
                             "--seqlen-q 100000 --head-dim 128 --allow-slow");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "of host memory for its tensors");
}

TEST(RunEstimate, Issue18Finding17SlowCpuRunsAreEstimatedAndRefused) {
  AttentionSpec spec;
  spec.seqlen_q = spec.seqlen_k = 100000;
  spec.set_layout(Layout::bshd);
  ir::Config config; // 64 x 64 blocks
  // 1563 query blocks x 1563 KV blocks of 64 x 64 pairs, 2 * (64 + 64) FLOPs each.
  const RunEstimate e = estimate_run(spec, config, true, 2);
  EXPECT_DOUBLE_EQ(e.flops, 2.0 * 128 * 1563.0 * 1563.0 * 64 * 64);
  EXPECT_DOUBLE_EQ(e.executor_seconds, e.flops / 2e9);
  EXPECT_DOUBLE_EQ(e.reference_seconds, e.flops / 2e9);
  EXPECT_EQ(describe(e, "emulator", 2),
            "about 42.7 min (2.56e+12 FLOP: 21.3 min on the emulator at 1.0 GFLOP/s x 2 cores, "
            "21.3 min for the float64 reference at 2.0 GFLOP/s)");
  Status refused = check_run_time(e, "emulator", 2, false);
  ASSERT_FALSE(refused);
  EXPECT_HAS(refused.message(), "pass --allow-slow to run it anyway");
  EXPECT_TRUE(check_run_time(e, "emulator", 2, true));
  // Causal masks skip the blocks above the diagonal: about half the work.
  spec.causal = true;
  const RunEstimate causal = estimate_run(spec, config, true, 2);
  EXPECT_LT(causal.flops, 0.51 * e.flops);
  EXPECT_GT(causal.flops, 0.49 * e.flops);
  // Small runs start without a word.
  spec.seqlen_q = spec.seqlen_k = 512;
  EXPECT_LT(estimate_run(spec, config, false, 1).seconds(), kAnnounceRunSeconds);

  Ran r = run_tool("", "run --device emulator --arch gfx1201 --seqlen-q 100000");
  EXPECT_EQ(r.code, 1);
  EXPECT_HAS(r.err, "flashjit: error: this run would take about ");
  EXPECT_HAS(r.err, "past the 60 s that `run` starts without asking");
  EXPECT_EQ(r.out, "");
  Ran interpreter = run_tool("", "run --device interpreter --seqlen-q 100000 --heads 2");
  EXPECT_EQ(interpreter.code, 1);
  EXPECT_HAS(interpreter.err, "on the interpreter at 1.0 GFLOP/s");
}

/// `--attn-mask TYPE[:AXES]` and `--dropout P --dropout-seed S` set the spec's mask
/// tensor (dense over the named axes, 0 strides for the rest) and dropout.
TEST(SpecFlags, AttnMaskAndDropout) {
  auto s = spec_from(flags({{"--batch", "2"},
                            {"--heads", "3"},
                            {"--seqlen-q", "5"},
                            {"--seqlen-k", "7"},
                            {"--attn-mask", "f16:bk"},
                            {"--dropout", "0.25"},
                            {"--dropout-seed", "9"}}));
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->mask, MaskType::f16);
  EXPECT_EQ(s->mask_strides, (MaskStrides{7, 0, 0, 1}));
  EXPECT_EQ(s->dropout_p, 0.25);
  EXPECT_EQ(s->dropout_seed, 9u);
  s = spec_from(flags({{"--attn-mask", "bool"}, {"--seqlen-q", "4"}, {"--seqlen-k", "6"}}));
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->mask_strides, (MaskStrides{24, 24, 6, 1}));
  const std::pair<std::map<std::string, std::string>, const char *> bad[] = {
      {{{"--attn-mask", "int8"}}, "--attn-mask expects TYPE[:AXES]"},
      {{{"--attn-mask", "bool:kq"}}, "letters of bhqk in that order"},
      {{{"--dropout", "1"}}, "dropout_p (1) must be in [0, 1)"},
      {{{"--dropout", "0.1"}, {"--dropout-seed", "-2"}}, "--dropout-seed (-2)"}};
  for (const auto &[values, message] : bad) {
    auto refused = spec_from(flags(values));
    ASSERT_FALSE(refused) << message;
    EXPECT_NE(refused.status().message().find(message), std::string::npos)
        << refused.status().message();
  }
}

TEST(Cli, VersionPrintsTheLibraryVersion) {
  Ran r = run_tool("", "--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, fmt::format("flashjit {}\n", flashjit::version()));
}

/// `run --num-splits N`: the split-KV kernels (partial, then combine) on the
/// emulator against the float64 reference; refused where they cannot run.
TEST(SpecFlags, RunTakesNumSplits) {
  auto s = spec_from(flags({{"--num-splits", "4"}}));
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->num_splits, 4);
  s = spec_from(flags({{"--num-splits", "1"}}));
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->num_splits, 1); // off: the attention kernel
  s = spec_from(flags({{"--num-splits", "0"}}));
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->num_splits, 0); // chosen per call by the library
  Ran r = run_tool("", "run --heads 2 --num-splits 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--num-splits 0 (chosen per call) needs a device with compute units"),
            std::string::npos)
      << r.err;
  r = run_tool("", "run --heads 2 --num-splits 3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("only --device emulator has"), std::string::npos) << r.err;
  if (!have_llvm())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  r = run_tool("", "run --device emulator --arch gfx1201 --heads 4 --kv-heads 1 --seqlen-q 2 "
                   "--seqlen-k 700 --causal --lse --dtype f16 --num-splits 5");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("split-KV over 5 splits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
}

/// `emit --gqa-packed`: the kernel GQA-packed decode runs, grouped by token;
/// refused for a kernel that never runs packed and for a spec that does not pack.
TEST(Cli, EmitsTheGqaPackedKernels) {
  Ran r = run_tool("", "emit --arch gfx1201 --heads 32 --kv-heads 8 --seqlen-q 4 --seqlen-k 4096 "
                       "--causal --kernel split-partial --gqa-packed --print-ir");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("_grouped_splitkv"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("grouped = %q_group"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fj_kv_range_grouped(q_block, q_group"), std::string::npos) << r.out;
  r = run_tool("", "emit --arch gfx1201 --heads 32 --kv-heads 8 --seqlen-q 4 --gqa-packed");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("only decode's kernels run GQA-packed"), std::string::npos) << r.err;
  r = run_tool("", "emit --arch gfx1201 --heads 8 --kv-heads 8 --kernel decode --gqa-packed");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("this spec does not pack"), std::string::npos) << r.err;
}

/// --prefetch-blocks on|off: block prefetch in the forward's loop where stages is
/// 2; the default of GQA-packed decode's four-wave kernels on NVIDIA, turned off by
/// the flag; a value that is not on or off, and stages other than 2, refused.
TEST(Cli, PrefetchBlocksIsAConfigKnob) {
  Ran r = run_tool("", "emit --arch sm_90 --head-dim 64 --stages 2 --prefetch-blocks on");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Block prefetch"), std::string::npos);
  r = run_tool("", "emit --arch sm_90 --heads 32 --kv-heads 8 --seqlen-q 4 --kernel decode "
                   "--gqa-packed");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Block prefetch"), std::string::npos);
  // A config flag gives the whole config (here decode's own, without the prefetch).
  r = run_tool("", "emit --arch sm_90 --heads 32 --kv-heads 8 --seqlen-q 4 --kernel decode "
                   "--gqa-packed --block-m 64 --block-n 64 --waves 4 --stages 2 "
                   "--prefetch-blocks off");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("Block prefetch"), std::string::npos);
  r = run_tool("", "emit --arch sm_90 --head-dim 64 --stages 2 --prefetch-blocks maybe");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--prefetch-blocks maybe: expected on or off"), std::string::npos) << r.err;
  r = run_tool("", "emit --arch sm_90 --head-dim 64 --stages 1 --prefetch-blocks on");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("config prefetch_blocks needs stages 2 (got stages 1)"), std::string::npos)
      << r.err;
}

/// `run --device hip:N|cuda:N|emulator:ARCH`: the library's whole path on that
/// device (here the emulator: the same code as on a GPU but for the copies),
/// checked against the float64 reference; a GPU library that does not load, an
/// unknown device and --arch beside a device are errors that say so.
TEST(Cli, RunOnALibraryDevice) {
  Ran r = run_tool("", "run --device emulator:gfx1201 --arch gfx1201");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("drop --arch"), std::string::npos) << r.err;
  r = run_tool("", "run --device tpu:0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown device 'tpu:0'"), std::string::npos) << r.err;
  if (!have_llvm())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  r = run_tool("FLASHJIT_CACHE_DIR=$(mktemp -d)",
               "run --device emulator:gfx942 --head-dim 80 --heads 8 --kv-heads 2 --seqlen-q 1 "
               "--seqlen-k 900 --causal --lse --dtype f16");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("device: emulator:gfx942"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GQA-packed"), std::string::npos) << r.out; // decode went packed
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
  r = run_tool("FLASHJIT_CACHE_DIR=$(mktemp -d)",
               "run --device emulator:gfx942 --heads 8 --kv-heads 2 --seqlen-q 1 --seqlen-k 900 "
               "--num-splits 1");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // 1 splits no keys: the decode kernel alone
  EXPECT_NE(r.out.find("split-kv: 0 of those calls ran the split-KV kernels"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 ran the decode kernel"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
  r = run_tool("", "run --device emulator:gfx1100 --head-dim 48 --heads 2 --seqlen-q 70 "
                   "--seqlen-k 33 --attn-mask bool:bqk --alibi heads --block-n 32");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("block_n=32"), std::string::npos) << r.out; // the config flag reached it
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
}

/// `tune`: every candidate checked against float64 and timed; the fastest goes to
/// <cache dir>/tuned.json, which create() then takes for that signature and target
/// (explain() says so), while another signature keeps the rules' default. A
/// database that is not one is reported, and the default runs.
TEST(Cli, TuneSavesTheFastestConfigAndTheLibraryTakesIt) {
  Ran r = run_tool("", "tune --device tpu:0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown device 'tpu:0'"), std::string::npos) << r.err;
  if (!have_llvm())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const std::string dir =
      fs::temp_directory_path() / ("flashjit_tune_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string env = "FLASHJIT_CACHE_DIR='" + dir + "'";
  const std::string spec = "--head-dim 40 --heads 2 --seqlen-q 33 --seqlen-k 47 --causal";
  r = run_tool(env, "tune --device emulator:gfx1100 --dry-run --max-candidates 3 " + spec);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/tuned.json"));
  r = run_tool(env, "tune --device emulator:gfx1100 --max-candidates 3 --json " + spec);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::istringstream lines(r.out);
  std::string line, best;
  int candidates = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("saved")) {
      best = j.at("config").get<std::string>();
      continue;
    }
    ++candidates;
    EXPECT_TRUE(j.at("ok").get<bool>()) << line;
    EXPECT_EQ(j.at("check").get<std::string>().rfind("ok ", 0), 0u) << line;
    EXPECT_GT(j.at("us").get<double>(), 0) << line;
  }
  EXPECT_EQ(candidates, 3);
  ASSERT_FALSE(best.empty()) << r.out;
  const nlohmann::json db = nlohmann::json::parse(slurp(dir + "/tuned.json"));
  ASSERT_EQ(db.at("entries").size(), 1u);
  EXPECT_EQ(db.at("entries")[0].at("target"), "gfx1100");

  // A config the rules would not choose, written as tune would: run takes it.
  nlohmann::json edited = db;
  edited["entries"][0]["config"]["block_n"] = 16;
  {
    std::ofstream out(dir + "/tuned.json");
    out << edited.dump();
  }
  r = run_tool(env, "run --device emulator:gfx1100 " + spec);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("block_n=16 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(tuned on flashjit CPU emulator"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
  r = run_tool(env, "run --device emulator:gfx1100 --head-dim 48 --heads 2 --seqlen-q 33");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(default)"), std::string::npos) << r.out; // another signature

  {
    std::ofstream out(dir + "/tuned.json");
    out << "{\"version\": 1, \"entries\": [{\"target\": 3}]}";
  }
  r = run_tool(env, "run --device emulator:gfx1100 " + spec);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("is not a tuned-config database"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run flashjit tune again"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("-> PASS"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

/// `bench`: one line per case (head dim x seqlen x causal) with its time and
/// TFLOP/s through the library's config; bad lists are refused by name.
TEST(Cli, BenchTimesEachCase) {
  Ran r = run_tool("", "bench --device emulator:gfx1201 --head-dims 64,x");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--head-dims 64,x: 'x' is not a positive integer"), std::string::npos)
      << r.err;
  if (!have_llvm())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  r = run_tool("FLASHJIT_CACHE_DIR=$(mktemp -d)",
               "bench --device emulator:gfx1201 --head-dims 32 --seqlens 32,48 --tokens 48 "
               "--heads 1 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int cases = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++cases;
    EXPECT_EQ(j.at("head_dim"), 32);
    EXPECT_GT(j.at("us").get<double>(), 0);
    EXPECT_GT(j.at("tflops").get<double>(), 0);
    EXPECT_NE(j.at("config").get<std::string>().find("block_m="), std::string::npos);
  }
  EXPECT_EQ(cases, 4) << r.out; // 2 seqlens x causal and not
}

/// `run --json` and `warmup --json`: one JSON object each, which the project's
/// reader parses, with the fields the text says.
TEST(Cli, RunAndWarmupPrintJson) {
  Ran r = run_tool("", "run --head-dim 40 --heads 2 --seqlen-q 20 --causal --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::string error;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
  auto run = json::parse(r.out, &error);
  ASSERT_TRUE(run) << error << "\n" << r.out;
  ASSERT_TRUE(run->contains("pass") && run->contains("max_abs") && run->contains("tolerance"))
      << r.out;
  EXPECT_EQ(run->at("pass"), true);
  EXPECT_EQ(run->at("device"), "interpreter");
  EXPECT_EQ(run->at("signature"), "bf16 d=40/40 causal align16");
  EXPECT_LT(run->at("max_abs").get<double>(), run->at("tolerance").at("abs").get<double>());

  const fs::path dir = fs::temp_directory_path() / ("fj_cli_json_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream((dir / "m.json").string())
      << R"([{"arch": "gfx9999", "head_dim": 64}, {"arch": "sm_80", "head_dim": 32}])";
  r = run_tool("", "warmup '" + (dir / "m.json").string() + "' --compiler none --dir '" +
                       (dir / "cache").string() + "' --json");
  auto warm = json::parse(r.out, &error);
  ASSERT_TRUE(warm) << error << "\n" << r.out << r.err;
  const json::Value &kernels = warm->at("kernels");
  ASSERT_TRUE(kernels.is_array() && kernels.size() == 2) << r.out;
  EXPECT_EQ(kernels[0].at("ready"), false);
  EXPECT_HAS(kernels[0].at("error").get<std::string>(), "unknown arch 'gfx9999'");
  EXPECT_EQ(kernels[1].at("target"), "sm_80");
  EXPECT_EQ(r.code, 1); // one kernel is not ready
  EXPECT_EQ(warm->at("failed"), kernels[1].at("ready").get<bool>() ? 1 : 2);
  EXPECT_EQ(warm->at("directory"), (dir / "cache").string());
  fs::remove_all(dir);
}

/// `compile --json`: LLVM's resource report as one JSON line, with the config
/// (here the one `--dkdv-passes 2` and the other flags give the dK/dV kernel,
/// or the flags alone, the passes left to the lowering) and the rules that made
/// the code.
TEST(Cli, CompileJsonNamesTheConfig) {
  if (!have_llvm())
    GTEST_SKIP() << "this build has no in-process LLVM (FLASHJIT_WITH_LLVM=OFF)";
  Ran r = run_tool("", "compile --arch gfx1201 --head-dim 64 --kernel backward-dkdv --block-m 64 "
                       "--block-n 16 --waves 4 --q-in-lds --mma-m 16 --dkdv-passes 2 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::string error;
  auto report = json::parse(r.out, &error);
  ASSERT_TRUE(report) << error << "\n" << r.out;
  EXPECT_EQ(report->at("config"),
            "block_m=64 block_n=16 waves=4 stages=1 q_in=lds pad_k=16 mma_m=16 dkdv_passes=2");
  EXPECT_EQ(report->at("rules"), "gfx12");
  EXPECT_EQ(report->at("vgpr_spill_count"), 0);
  for (const char *bad : {"-1", "3"})
    EXPECT_FALSE(config_from(flags({{"--dkdv-passes", bad}}))) << bad;
  // Unset (0), the passes are the lowering's choice for the flags' block, as C's
  // and Python's configs get: two where one loop cannot hold dK and dV (before,
  // a block given without --dkdv-passes ran one loop, which spills there).
  auto unset = config_from(flags({}));
  ASSERT_TRUE(unset) << unset.status().message();
  EXPECT_EQ(unset->dkdv_passes, 0);
  Ran wide = run_tool("", "compile --arch gfx1201 --head-dim 256 --kernel backward-dkdv "
                          "--block-m 16 --block-n 16 --waves 1 --q-in-lds --json");
  ASSERT_EQ(wide.code, 0) << wide.out << wide.err;
  auto chosen = json::parse(wide.out, &error);
  ASSERT_TRUE(chosen) << error << "\n" << wide.out;
  EXPECT_NE(chosen->at("config").get<std::string>().find("dkdv_passes=2"), std::string::npos)
      << wide.out;
}

/// FLASHJIT_PROGRESS=1: warmup says on stderr as each kernel is ready (its
/// stdout is unchanged); 0 says nothing; a bad value is named.
TEST(Cli, WarmupReportsProgressWhenAsked) {
  const fs::path dir =
      fs::temp_directory_path() / ("fj_cli_progress_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream((dir / "m.json").string())
      << R"([{"arch": "gfx9999", "head_dim": 64}, {"arch": "gfx1201", "head_dim": 32}])";
  const std::string args = "warmup '" + (dir / "m.json").string() + "' --compiler none --dir '" +
                           (dir / "cache").string() + "'";
  Ran on = run_tool("FLASHJIT_PROGRESS=1", args);
  EXPECT_HAS(on.err, "flashjit: warmup: 1 of 2 done (");
  EXPECT_HAS(on.err, "flashjit: warmup: 2 of 2 done (");
  EXPECT_HAS(on.err, "(1: failed)");
  Ran off = run_tool("FLASHJIT_PROGRESS=0", args);
  EXPECT_EQ(off.err.find("flashjit: warmup: "), std::string::npos) << off.err;
  EXPECT_EQ(on.out, off.out) << "progress goes to stderr only";
  Ran bad = run_tool("FLASHJIT_PROGRESS=sometimes", args);
  EXPECT_HAS(bad.err, "FLASHJIT_PROGRESS=sometimes: expected 0 or 1");
  fs::remove_all(dir);
}

} // namespace
} // namespace flashjit::cli
