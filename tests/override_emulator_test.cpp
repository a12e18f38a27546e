// FLASHJIT_OVERRIDE_DIR on the CPU emulator (issue 18, finding 10): the
// override was compiled and announced, but the emulator ran the generated
// kernel. Now flashjit::Attention on "emulator:ARCH" and `flashjit run
// --device emulator` run the override's kernel text, and refuse an edit they
// cannot run (one in the target prelude, which the emulator replaces).
//
// The knobs are read once per process, so this binary sets
// FLASHJIT_OVERRIDE_DIR (and a private FLASHJIT_CACHE_DIR) before main().
#include "compiler/knobs.h"
#include "ir/dtype.h"
#include "ir/reference.h"
#include "runtime/attention.h"
#include "runtime/pipeline.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace flashjit {
namespace {

const fs::path kRoot =
    fs::temp_directory_path() / ("flashjit-override-emulator-test-" + std::to_string(::getpid()));
const fs::path kOverrideDir = kRoot / "override";
const bool kEnvironment = [] {
  ::setenv("FLASHJIT_OVERRIDE_DIR", kOverrideDir.c_str(), 1);
  ::setenv("FLASHJIT_CACHE_DIR", (kRoot / "cache").c_str(), 1);
  return true;
}();

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE(std::string(message).find(text), std::string::npos)                                    \
      << "expected \"" << (text) << "\" in:\n"                                                     \
      << (message)

/// The spec both tests run, and the flags that say it to `flashjit run`.
AttentionSpec test_spec() { return make_spec(1, 2, 2, 40, 56, 64, 64, DType::bf16); }
constexpr const char *kSpecFlags = "--heads 2 --seqlen-q 40 --seqlen-k 56 --head-dim 64";

/// The generated kernel of test_spec() on gfx1201, as Attention and `run` make it.
pipeline::Generated generated() {
  auto g = pipeline::generate(test_spec(), "gfx1201", Options{});
  EXPECT_TRUE(g) << g.status().message();
  return g.take();
}

/// Writes <override dir>/<kernel>.hip: the generated source with `from` replaced by `to`.
std::string write_override(const pipeline::Generated &g, const std::string &from,
                           const std::string &to) {
  fs::create_directories(kOverrideDir);
  fs::permissions(kOverrideDir, fs::perms::owner_all);
  std::string source = g.lowered.source;
  const size_t at = source.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  source.replace(at, from.size(), to);
  const fs::path path = kOverrideDir / (g.lowered.kernel_name + ".hip");
  std::ofstream(path, std::ios::trunc) << source;
  return path.string();
}

/// Every output element becomes 2.0: the kernel's conversion to bf16 returns it.
constexpr const char *kConversion = "return fj_f32_to_bf16(x);";
constexpr const char *kTwo = "return fj_f32_to_bf16(2.0f);";
constexpr uint16_t kTwoBits = 0x4000; // 2.0 in bf16

/// Runs test_spec() through Attention on emulator:gfx1201; the output bits.
Expected<std::vector<uint16_t>> run_attention(const HostTensors &in) {
  const AttentionSpec spec = test_spec();
  auto attn = Attention::create(spec, "emulator:gfx1201");
  if (!attn)
    return attn.status();
  auto bits = [](const std::vector<float> &values) {
    std::vector<uint16_t> out(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      out[i] = f32_to_bf16_bits(values[i]);
    return out;
  };
  std::vector<uint16_t> q = bits(in.q), k = bits(in.k), v = bits(in.v);
  std::vector<uint16_t> o(size_t(spec.o_elements()), 0);
  FJ_RETURN_IF_ERROR(attn->forward(q.data(), k.data(), v.data(), o.data(), nullptr));
  return o;
}

TEST(OverrideEmulator, Issue18Finding10AttentionRunsTheOverride) {
  ASSERT_EQ(compiler::knobs().override_dir, kOverrideDir.string())
      << "the knobs were read before this binary set FLASHJIT_OVERRIDE_DIR";
  const AttentionSpec spec = test_spec();
  const HostTensors in = make_random_inputs(spec, 3);
  const pipeline::Generated g = generated();

  const std::string path = write_override(g, kConversion, kTwo);
  auto with_override = run_attention(in);
  ASSERT_TRUE(with_override) << with_override.status().message();
  for (uint16_t b : *with_override)
    ASSERT_EQ(b, kTwoBits) << "the emulator ran the generated kernel, not " << path;

  // An edit before the kernel text (in the target prelude) cannot run here.
  write_override(g, "// ---- the matrix instruction ----",
                 "#define FJ_EDITED 1\n// ---- the matrix instruction ----");
  auto edited = run_attention(in);
  ASSERT_FALSE(edited);
  EXPECT_HAS(edited.status().message(), path + " changes the code before the line '// ---- the "
                                               "element type (bf16) ----'");

  // Without the override, the generated kernel: the attention of the inputs.
  fs::remove(path);
  auto generated_run = run_attention(in);
  ASSERT_TRUE(generated_run) << generated_run.status().message();
  HostTensors result = in;
  for (size_t i = 0; i < result.o.size(); ++i)
    result.o[i] = bf16_bits_to_f32((*generated_run)[i]);
  const ErrorStats err = compare(spec, result, reference_attention(spec, in));
  EXPECT_TRUE(err.within(3e-2, 2e-2)) << err.max_abs << " " << err.rel_l2;
}

TEST(OverrideEmulator, Issue18Finding10RunCommandRunsTheOverride) {
  const pipeline::Generated g = generated();
  const std::string path = write_override(g, kConversion, kTwo);
  const fs::path out = kRoot / "run.out";
  const std::string cmd = fmt::format("'{}' run --device emulator --arch gfx1201 {} > '{}' 2>&1",
                                      FLASHJIT_CLI, kSpecFlags, out.string());
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  // Every output 2.0 is far from the reference: exit 2, FAIL.
  EXPECT_EQ(WEXITSTATUS(status), 2) << text;
  EXPECT_HAS(text, "FLASHJIT_OVERRIDE_DIR: compiling " + path + " instead of the generated " +
                       g.lowered.kernel_name);
  EXPECT_HAS(text, "-> FAIL");
  fs::remove(path);
}

class Cleanup : public ::testing::Environment {
public:
  void TearDown() override { fs::remove_all(kRoot); }
};
const auto *const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

} // namespace
} // namespace flashjit
