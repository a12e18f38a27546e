// LlvmCompiler and the code-object readers on small hand-written kernels: the
// matrix instruction of each family is emitted and counted, resource metadata
// is read, and compile failures (syntax errors, backend fatal errors, the time
// limit) come back as a Status while this process carries on.
#include "compiler/code_object.h"
#include "compiler/llvm_compiler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace flashjit::compiler {
namespace {

// What the generated sources bring themselves instead of HIP headers.
constexpr const char *kPrelude = R"(
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
)";

// One gfx12 WMMA per lane set: D = A * B + C, bf16 inputs, f32 accumulator.
constexpr const char *kWmmaGfx12 = R"(
typedef short v8s __attribute__((ext_vector_type(8)));
typedef __bf16 v8bf __attribute__((ext_vector_type(8)));
typedef float v8f __attribute__((ext_vector_type(8)));

extern "C" __global__ __launch_bounds__(32) void wmma_bf16(const v8bf *a, const v8bf *b, v8f *c) {
  int lane = __builtin_amdgcn_workitem_id_x();
  v8s a_bits = __builtin_bit_cast(v8s, a[lane]);
  v8s b_bits = __builtin_bit_cast(v8s, b[lane]);
  c[lane] = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12(a_bits, b_bits, c[lane]);
}
)";

// One CDNA2 MFMA: 16x16x16 bf16 (the _1k form), f32 accumulator.
constexpr const char *kMfmaGfx90a = R"(
typedef short v4s __attribute__((ext_vector_type(4)));
typedef float v4f __attribute__((ext_vector_type(4)));

extern "C" __global__ __launch_bounds__(64) void mfma_bf16(const v4s *a, const v4s *b, v4f *c) {
  int lane = __builtin_amdgcn_workitem_id_x();
  c[lane] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[lane], b[lane], c[lane], 0, 0, 0);
}
)";

// The gfx11 WMMA builtin passes Sema on gfx1201 but the backend cannot select
// it (amd-matrix-layouts.md section 8): an LLVM fatal error.
constexpr const char *kGfx11BuiltinOnGfx12 = R"(
typedef _Float16 v16h __attribute__((ext_vector_type(16)));
typedef float v8f __attribute__((ext_vector_type(8)));

extern "C" __global__ void wrong_wmma(const v16h *a, const v16h *b, v8f *c) {
  int lane = __builtin_amdgcn_workitem_id_x();
  c[lane] = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a[lane], b[lane], c[lane]);
}
)";

// Hardware figures for occupancy (target/arch.cpp has the same rows).
constexpr int kRdna4VgprFile = 1536, kRdna4MaxWaves = 16, kLds = 64 * 1024;
constexpr int kCdna2VgprFile = 512, kCdna2MaxWaves = 8;

CompileOptions options_for(const std::string &arch, int wave_size = 32) {
  CompileOptions options;
  options.arch = arch;
  options.wave_size = wave_size;
  return options;
}

std::string with_prelude(const char *body) { return std::string(kPrelude) + body; }

/// A source that takes the compiler about a second (hundreds of kernels).
std::string slow_source() {
  std::string source = kPrelude;
  for (int i = 0; i < 300; ++i)
    source += "extern \"C\" __global__ void k" + std::to_string(i) +
              "(float *p) { int t = __builtin_amdgcn_workitem_id_x(); float x = p[t];"
              " for (int j = 0; j < 16; ++j) x = x * x + " +
              std::to_string(i) + ".0f; p[t] = x; }\n";
  return source;
}

bool is_elf(const CodeObject &code) {
  return code.bytes.size() > 4 && code.bytes[0] == 0x7f && code.bytes[1] == 'E' &&
         code.bytes[2] == 'L' && code.bytes[3] == 'F';
}

/// Every test runs with TMPDIR pointing at a fresh directory, so "no files left
/// behind" is checked without racing other processes' use of /tmp.
class LlvmCompilerTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    const char *tmp = std::getenv("TMPDIR");
    saved_tmpdir_ = tmp ? tmp : "";
    std::string pattern =
        (std::filesystem::temp_directory_path() / "llvm_compiler_test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    tmpdir_ = pattern;
    setenv("TMPDIR", tmpdir_.c_str(), 1);
  }
  static void TearDownTestSuite() {
    if (saved_tmpdir_.empty())
      unsetenv("TMPDIR");
    else
      setenv("TMPDIR", saved_tmpdir_.c_str(), 1);
    std::filesystem::remove_all(tmpdir_);
  }
  static std::vector<std::string> tmpdir_listing() {
    std::vector<std::string> names;
    for (const auto &entry : std::filesystem::directory_iterator(tmpdir_))
      names.push_back(entry.path().filename().string());
    return names;
  }

  LlvmCompiler compiler;
  static inline std::string tmpdir_, saved_tmpdir_;
};

TEST_F(LlvmCompilerTest, Identity) {
  EXPECT_EQ(compiler.name(), "llvm");
  EXPECT_EQ(compiler.identity().rfind("llvm 22.", 0), 0u) << compiler.identity();
}

TEST_F(LlvmCompilerTest, DriverArgsFollowTheDocumentedCommand) {
  std::vector<std::string> args = LlvmCompiler::driver_args(options_for("gfx1201"));
  auto has = [&](const std::string &flag) {
    return std::find(args.begin(), args.end(), flag) != args.end();
  };
  EXPECT_TRUE(has("--offload-arch=gfx1201"));
  EXPECT_TRUE(has("--cuda-device-only"));
  EXPECT_TRUE(has("-nogpulib"));
  EXPECT_TRUE(has("-nogpuinc"));
  EXPECT_TRUE(has("-O3"));
  EXPECT_FALSE(has("-mwavefrontsize64"));

  args = LlvmCompiler::driver_args(options_for("gfx1201", 64));
  EXPECT_TRUE(has("-mwavefrontsize64"));
  args = LlvmCompiler::driver_args(options_for("gfx90a", 64)); // CDNA: wave64 needs no flag
  EXPECT_FALSE(has("-mwavefrontsize64"));

  CompileOptions xnack = options_for("gfx90a", 64);
  xnack.features = "xnack-";
  args = LlvmCompiler::driver_args(xnack);
  EXPECT_TRUE(has("--offload-arch=gfx90a:xnack-"));
}

class Gfx12Wmma : public LlvmCompilerTest, public ::testing::WithParamInterface<const char *> {};

TEST_P(Gfx12Wmma, CompilesDisassemblesAndReportsResources) {
  auto start = std::chrono::steady_clock::now();
  auto code = compiler.compile(with_prelude(kWmmaGfx12), options_for(GetParam()));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(code) << code.status().message();
  std::printf("[ compile  ] wmma_bf16 for %s: %.3f s, %zu bytes\n", GetParam(), seconds,
              code->bytes.size());
  EXPECT_TRUE(is_elf(*code));
  EXPECT_EQ(code->arch, GetParam());
  EXPECT_EQ(code->compiler, compiler.identity());

  auto text = disassemble(*code);
  ASSERT_TRUE(text) << text.status().message();
  EXPECT_NE(text->find("<wmma_bf16>:"), std::string::npos) << *text;
  EXPECT_NE(text->find("v_wmma_f32_16x16x16_bf16 v["), std::string::npos) << *text;
  EXPECT_NE(text->find("s_endpgm"), std::string::npos) << *text;

  auto resources = read_resources(*code, kRdna4VgprFile, kRdna4MaxWaves, kLds);
  ASSERT_TRUE(resources) << resources.status().message();
  ASSERT_EQ(resources->size(), 1u);
  const ResourceReport &r = resources->front();
  std::printf("[ resource ] %s\n", r.to_text().c_str());
  EXPECT_EQ(r.kernel, "wmma_bf16");
  EXPECT_EQ(r.symbol, "wmma_bf16.kd");
  EXPECT_EQ(r.wavefront_size, 32);
  EXPECT_GT(r.vgprs, 0);
  EXPECT_GT(r.sgprs, 0);
  EXPECT_FALSE(r.vgpr_spill);
  EXPECT_FALSE(r.sgpr_spill);
  EXPECT_EQ(r.private_segment_bytes, 0);
  EXPECT_EQ(r.group_segment_bytes, 0);
  EXPECT_EQ(r.max_flat_workgroup_size, 32);
  EXPECT_GE(r.matrix_instructions, 1);
  EXPECT_EQ(r.vgpr_alloc_granule, 24); // RDNA4 has 1.5x VGPRs: granule 24 in wave32
  EXPECT_EQ(r.occupancy_waves_per_simd, std::min(kRdna4MaxWaves, kRdna4VgprFile / 24));
  EXPECT_NE(r.to_json().find("\"kernel\": \"wmma_bf16\""), std::string::npos) << r.to_json();
}

INSTANTIATE_TEST_SUITE_P(Rdna4, Gfx12Wmma, ::testing::Values("gfx1201", "gfx1200"));

TEST_F(LlvmCompilerTest, Gfx90aMfmaIsWave64) {
  auto code = compiler.compile(with_prelude(kMfmaGfx90a), options_for("gfx90a", 64));
  ASSERT_TRUE(code) << code.status().message();
  auto text = disassemble(*code);
  ASSERT_TRUE(text) << text.status().message();
  EXPECT_NE(text->find("v_mfma_f32_16x16x16bf16_1k"), std::string::npos) << *text;

  auto resources = read_resources(*code, kCdna2VgprFile, kCdna2MaxWaves, kLds);
  ASSERT_TRUE(resources) << resources.status().message();
  ASSERT_EQ(resources->size(), 1u);
  const ResourceReport &r = resources->front();
  std::printf("[ resource ] %s\n", r.to_text().c_str());
  EXPECT_EQ(r.wavefront_size, 64);
  EXPECT_EQ(r.max_flat_workgroup_size, 64);
  EXPECT_GE(r.matrix_instructions, 1);
  EXPECT_EQ(r.vgpr_alloc_granule, 8);
  EXPECT_GT(r.occupancy_waves_per_simd, 0);
  EXPECT_LE(r.occupancy_waves_per_simd, kCdna2MaxWaves);

  CompileOptions no_xnack = options_for("gfx90a", 64);
  no_xnack.features = "xnack-";
  auto feature_code = compiler.compile(with_prelude(kMfmaGfx90a), no_xnack);
  ASSERT_TRUE(feature_code) << feature_code.status().message();
  EXPECT_TRUE(disassemble(*feature_code));
}

TEST_F(LlvmCompilerTest, Wave32OnCdnaIsRejected) {
  auto code = compiler.compile(with_prelude(kMfmaGfx90a), options_for("gfx90a", 32));
  ASSERT_FALSE(code);
  EXPECT_NE(code.status().message().find("wave64"), std::string::npos) << code.status().message();
}

TEST_F(LlvmCompilerTest, SameSourceSameBytes) {
  auto first = compiler.compile(with_prelude(kWmmaGfx12), options_for("gfx1201"));
  auto second = compiler.compile(with_prelude(kWmmaGfx12), options_for("gfx1201"));
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->bytes, second->bytes);
}

TEST_F(LlvmCompilerTest, InThreadCompileMatchesIsolatedCompile) {
  CompileOptions options = options_for("gfx1201");
  auto isolated = compiler.compile(with_prelude(kWmmaGfx12), options);
  options.isolate = false;
  auto in_thread = compiler.compile(with_prelude(kWmmaGfx12), options);
  ASSERT_TRUE(isolated) << isolated.status().message();
  ASSERT_TRUE(in_thread) << in_thread.status().message();
  EXPECT_EQ(isolated->bytes, in_thread->bytes);
}

TEST_F(LlvmCompilerTest, ConcurrentCompilesFromManyThreads) {
  // Each compile forks its own child; a child must not keep another compile's
  // pipes open, or that compile would wait for it.
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      CompileOptions options = options_for(i % 2 ? "gfx1201" : "gfx1200");
      ok[i] = static_cast<bool>(compiler.compile(with_prelude(kWmmaGfx12), options));
    });
  for (std::thread &t : threads)
    t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

TEST_F(LlvmCompilerTest, SyntaxErrorQuotesTheSourceLine) {
  std::string source = with_prelude("extern \"C\" __global__ void broken(float *p) {\n"
                                    "  float x = 1.0f +;\n"
                                    "  p[0] = x;\n"
                                    "}\n");
  for (bool isolate : {true, false}) {
    CompileOptions options = options_for("gfx1201");
    options.isolate = isolate;
    auto code = compiler.compile(source, options);
    ASSERT_FALSE(code);
    const std::string &message = code.status().message();
    EXPECT_NE(message.find("compile failed for gfx1201"), std::string::npos) << message;
    EXPECT_NE(message.find("kernel.hip:"), std::string::npos) << message;
    EXPECT_NE(message.find("error:"), std::string::npos) << message;
    EXPECT_NE(message.find("float x = 1.0f +;"), std::string::npos) << message;
    EXPECT_NE(message.find('^'), std::string::npos) << message;
  }
}

TEST_F(LlvmCompilerTest, BackendFatalErrorIsAStatusNotACrash) {
  auto code = compiler.compile(with_prelude(kGfx11BuiltinOnGfx12), options_for("gfx1201"));
  ASSERT_FALSE(code);
  const std::string &message = code.status().message();
  std::printf("[ message  ] %s\n", message.c_str());
  EXPECT_NE(message.find("gfx1201"), std::string::npos) << message;
  EXPECT_NE(message.find("Cannot select"), std::string::npos) << message;
  // Still alive, and still compiling.
  EXPECT_TRUE(compiler.compile(with_prelude(kWmmaGfx12), options_for("gfx1201")));
}

TEST_F(LlvmCompilerTest, TimeLimitStopsTheCompile) {
  for (double limit : {0.001, 0.2}) {
    CompileOptions options = options_for("gfx1201");
    options.timeout_seconds = limit;
    auto start = std::chrono::steady_clock::now();
    auto code = compiler.compile(slow_source(), options);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(code) << "compiled within " << limit << " s; make slow_source() slower";
    const std::string &message = code.status().message();
    EXPECT_NE(message.find("time limit"), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("{:g} s", limit)), std::string::npos) << message;
    EXPECT_LT(seconds, limit + 1.0);
  }
}

TEST_F(LlvmCompilerTest, BadOptionsAreRejected) {
  EXPECT_FALSE(compiler.compile("", options_for("sm_90")));
  EXPECT_FALSE(compiler.compile("", options_for("gfx1201", 16)));
  CompileOptions bad_flag = options_for("gfx1201");
  bad_flag.extra_flags = {"-fno-such-flag"};
  auto code = compiler.compile(with_prelude(kWmmaGfx12), bad_flag);
  ASSERT_FALSE(code);
  EXPECT_NE(code.status().message().find("-fno-such-flag"), std::string::npos)
      << code.status().message();
}

TEST_F(LlvmCompilerTest, NotACodeObject) {
  CodeObject junk{"gfx1201", {1, 2, 3, 4}, "none"};
  EXPECT_FALSE(disassemble(junk));
  EXPECT_FALSE(read_resources(junk, kRdna4VgprFile, kRdna4MaxWaves, kLds));
}

// Runs last in this file (gtest keeps declaration order): everything above,
// including the killed and crashed compiles, left TMPDIR as it found it.
TEST_F(LlvmCompilerTest, NoTemporaryFilesLeftBehind) {
  std::vector<std::string> before = tmpdir_listing();
  CompileOptions killed = options_for("gfx1201");
  killed.timeout_seconds = 0.3;
  EXPECT_FALSE(compiler.compile(slow_source(), killed));
  (void)compiler.compile(with_prelude(kGfx11BuiltinOnGfx12), options_for("gfx1201"));
  (void)compiler.compile(with_prelude(kWmmaGfx12), options_for("gfx1201"));
  EXPECT_EQ(tmpdir_listing(), before);
  EXPECT_TRUE(before.empty());
}

} // namespace
} // namespace flashjit::compiler
