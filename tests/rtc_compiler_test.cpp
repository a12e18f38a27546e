// RtcCompiler (hiprtc / nvrtc loaded at run time) and make_compiler(). CUDA's
// nvrtc is installed where CI runs, so NVIDIA compiles are real here; every
// test that needs a library that is absent says so and skips.
#include "compiler/rtc_compiler.h"
#include "compiler/select.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace flashjit::compiler {
namespace {

constexpr const char *kAxpy = R"(
extern "C" __global__ void axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i] + y[i];
}
)";

// Line 3 lacks its semicolon.
constexpr const char *kSyntaxError = R"(
extern "C" __global__ void broken(float *y) {
  y[threadIdx.x] = 1.0f
}
)";

/// ELF e_machine of NVIDIA cubins (EM_CUDA).
constexpr uint16_t kEmCuda = 190;

CompileOptions nvidia(const std::string &arch) {
  CompileOptions o;
  o.arch = arch;
  return o;
}

std::unique_ptr<RtcCompiler> nvrtc_or_null(std::string *why) {
  auto c = RtcCompiler::load(RtcKind::nvrtc);
  if (!c) {
    *why = c.status().message();
    return nullptr;
  }
  return c.take();
}

#define NVRTC_OR_SKIP(var)                                                                         \
  std::string var##_why;                                                                           \
  auto var = nvrtc_or_null(&var##_why);                                                            \
  if (!var)                                                                                        \
  GTEST_SKIP() << "nvrtc is not installed here: " << var##_why

bool contains(const std::vector<uint8_t> &bytes, std::string_view needle) {
  return std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end()) != bytes.end();
}

TEST(Nvrtc, IdentityComesFromTheLibrary) {
  NVRTC_OR_SKIP(nvrtc);
  EXPECT_EQ(nvrtc->name(), "nvrtc");
  const std::string id = nvrtc->identity();
  ASSERT_TRUE(id.starts_with("nvrtc ")) << id;
  // "nvrtc <major>.<minor>"
  EXPECT_NE(id.find('.'), std::string::npos) << id;
  EXPECT_TRUE(std::filesystem::exists(nvrtc->library_path())) << nvrtc->library_path();
}

TEST(Nvrtc, CompilesACubinForSm80AndSm90) {
  NVRTC_OR_SKIP(nvrtc);
  for (const char *arch : {"sm_80", "sm_90", "sm_90a"}) {
    auto code = nvrtc->compile(kAxpy, nvidia(arch));
    ASSERT_TRUE(code) << arch << ": " << code.status().message();
    EXPECT_EQ(code->arch, arch);
    EXPECT_EQ(code->compiler, nvrtc->identity());
    const std::vector<uint8_t> &b = code->bytes;
    ASSERT_GT(b.size(), 64u);
    EXPECT_EQ(std::memcmp(b.data(),
                          "\x7f"
                          "ELF",
                          4),
              0)
        << arch << ": a cubin is an ELF file";
    EXPECT_EQ(uint16_t(b[18] | b[19] << 8), kEmCuda) << arch;
    EXPECT_TRUE(contains(b, std::string_view("axpy\0", 5))) << arch << ": no axpy symbol";
  }
}

TEST(Nvrtc, CompilesPtxForTheVirtualArchitecture) {
  NVRTC_OR_SKIP(nvrtc);
  auto ptx = nvrtc->compile_ptx(kAxpy, nvidia("sm_90"));
  ASSERT_TRUE(ptx) << ptx.status().message();
  EXPECT_NE(ptx->find(".target sm_90"), std::string::npos) << *ptx;
  EXPECT_NE(ptx->find(".entry axpy"), std::string::npos) << *ptx;
  EXPECT_EQ(ptx->find('\0'), std::string::npos);
}

TEST(Nvrtc, SyntaxErrorsComeBackWithTheLogAndTheLine) {
  NVRTC_OR_SKIP(nvrtc);
  auto code = nvrtc->compile(kSyntaxError, nvidia("sm_90"));
  ASSERT_FALSE(code);
  const std::string &m = code.status().message();
  EXPECT_NE(m.find("could not compile"), std::string::npos) << m;
  EXPECT_NE(m.find("sm_90"), std::string::npos) << m;
  EXPECT_NE(m.find("kernel.cu(4)"), std::string::npos) << m; // nvrtc reports the next token's line
  EXPECT_NE(m.find("error"), std::string::npos) << m;
}

TEST(Nvrtc, OptionsAndExtraFlagsPassThrough) {
  NVRTC_OR_SKIP(nvrtc);
  CompileOptions o = nvidia("sm_90");
  o.opt_level = 1;
  o.extra_flags = {"-DSCALE=2.0f"};
  auto code = nvrtc->compile("extern \"C\" __global__ void k(float *y) { y[0] = SCALE; }", o);
  ASSERT_TRUE(code) << code.status().message();
  o.extra_flags = {"--no-such-nvrtc-option"};
  auto bad = nvrtc->compile(kAxpy, o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("no-such-nvrtc-option"), std::string::npos)
      << bad.status().message();
}

TEST(Nvrtc, RefusesAmdTargets) {
  NVRTC_OR_SKIP(nvrtc);
  auto code = nvrtc->compile(kAxpy, nvidia("gfx1201"));
  ASSERT_FALSE(code);
  EXPECT_NE(code.status().message().find("'gfx1201' is not an architecture like sm_80"),
            std::string::npos)
      << code.status().message();
}

TEST(Nvrtc, ThreadsCompileAtOnce) {
  NVRTC_OR_SKIP(nvrtc);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      if (nvrtc->compile(kAxpy, nvidia("sm_90")))
        ++ok;
    });
  for (auto &t : threads)
    t.join();
  EXPECT_EQ(ok.load(), 4);
}

TEST(Nvrtc, TimeLimitIsReported) {
  NVRTC_OR_SKIP(nvrtc);
  CompileOptions o = nvidia("sm_90");
  o.timeout_seconds = 1e-4;
  auto code = nvrtc->compile(kAxpy, o);
  ASSERT_FALSE(code);
  EXPECT_NE(code.status().message().find("still compiling"), std::string::npos)
      << code.status().message();
}

TEST(RtcCompiler, MissingLibraryNamesEveryPathTried) {
  auto c = RtcCompiler::load(RtcKind::nvrtc,
                             {"/nonexistent/lib64/libnvrtc.so", "libnvrtc-not-a-real-name.so"});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.status().message(),
            "nvrtc not found: tried /nonexistent/lib64/libnvrtc.so, libnvrtc-not-a-real-name.so "
            "(loader path); install CUDA or set CUDA_PATH");
}

TEST(RtcCompiler, AFileThatIsNotTheLibraryIsExplained) {
  const std::string fake = ::testing::TempDir() + "/libnvrtc.so";
  FILE *f = std::fopen(fake.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not an ELF file", f);
  std::fclose(f);
  auto c = RtcCompiler::load(RtcKind::nvrtc, {fake});
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find(fake + " (found, but it does not load"), std::string::npos)
      << c.status().message();
  std::remove(fake.c_str());
}

TEST(RtcCompiler, SearchPathsFollowTheRootVariables) {
  const std::string root = ::testing::TempDir() + "/fake-rocm";
  ::setenv("ROCM_PATH", root.c_str(), 1);
  auto hip = RtcCompiler::search_paths(RtcKind::hiprtc);
  ::unsetenv("ROCM_PATH");
  ASSERT_FALSE(hip.empty());
  EXPECT_EQ(hip.front(), root + "/lib/libhiprtc.so");
  EXPECT_NE(std::find(hip.begin(), hip.end(), "/opt/rocm/lib/libhiprtc.so"), hip.end());
  EXPECT_EQ(hip.back().find('/'), std::string::npos) << "the loader path comes last";

  ::setenv("CUDA_PATH", "/somewhere/cuda", 1);
  auto nv = RtcCompiler::search_paths(RtcKind::nvrtc);
  ::unsetenv("CUDA_PATH");
  EXPECT_EQ(nv.front(), "/somewhere/cuda/lib64/libnvrtc.so");
  for (const char *p : {"/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
                        "/usr/local/cuda/lib64/libnvrtc.so.12",
                        "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so", "libnvrtc.so"})
    EXPECT_NE(std::find(nv.begin(), nv.end(), p), nv.end()) << p;
}

TEST(Hiprtc, MissingRocmGivesAClearError) {
  const std::string root = ::testing::TempDir() + "/no-rocm-here";
  ::setenv("ROCM_PATH", root.c_str(), 1);
  auto c = RtcCompiler::load(RtcKind::hiprtc);
  ::unsetenv("ROCM_PATH");
  if (c)
    GTEST_SKIP() << "ROCm is installed here (" << (*c)->library_path() << ")";
  const std::string &m = c.status().message();
  EXPECT_TRUE(m.starts_with("hiprtc not found: tried " + root + "/lib/libhiprtc.so, ")) << m;
  EXPECT_NE(m.find("/opt/rocm/lib/libhiprtc.so"), std::string::npos) << m;
  EXPECT_NE(m.find("libhiprtc.so (loader path)"), std::string::npos) << m;
  EXPECT_TRUE(m.ends_with("install ROCm (the hip-runtime-amd package) or set ROCM_PATH")) << m;
}

TEST(RtcCompiler, CompileArguments) {
  auto nv = RtcCompiler::compile_args(RtcKind::nvrtc, nvidia("sm_90"));
  ASSERT_TRUE(nv) << nv.status().message();
  EXPECT_EQ(
      *nv, (std::vector<std::string>{"--gpu-architecture=sm_90", "-std=c++17", "-default-device"}));
  auto ptx = RtcCompiler::compile_args(RtcKind::nvrtc, nvidia("sm_90a"), /*ptx=*/true);
  ASSERT_TRUE(ptx);
  EXPECT_EQ(ptx->front(), "--gpu-architecture=compute_90a");

  CompileOptions amd;
  amd.arch = "gfx1201";
  auto rdna = RtcCompiler::compile_args(RtcKind::hiprtc, amd);
  ASSERT_TRUE(rdna) << rdna.status().message();
  EXPECT_EQ(*rdna, (std::vector<std::string>{"--offload-arch=gfx1201", "-O3", "-std=c++17"}));
  amd.wave_size = 64;
  amd.extra_flags = {"-mcode-object-version=5"};
  EXPECT_EQ(RtcCompiler::compile_args(RtcKind::hiprtc, amd)->at(3), "-mwavefrontsize64");
  EXPECT_EQ(RtcCompiler::compile_args(RtcKind::hiprtc, amd)->back(), "-mcode-object-version=5");
  amd.arch = "gfx90a";
  amd.features = "sramecc+:xnack-";
  amd.extra_flags.clear();
  EXPECT_EQ(
      *RtcCompiler::compile_args(RtcKind::hiprtc, amd),
      (std::vector<std::string>{"--offload-arch=gfx90a:sramecc+:xnack-", "-O3", "-std=c++17"}));
  amd.wave_size = 32;
  auto wave32 = RtcCompiler::compile_args(RtcKind::hiprtc, amd);
  ASSERT_FALSE(wave32);
  EXPECT_NE(wave32.status().message().find("wave64 only"), std::string::npos);
  // No fast math anywhere: exp2 must keep its exact semantics.
  for (const auto &args : {*nv, *rdna})
    for (const std::string &a : args)
      EXPECT_EQ(a.find("fast"), std::string::npos) << a;
}

TEST(Select, TargetVendors) {
  EXPECT_EQ(*target_vendor("gfx1201"), Vendor::amd);
  EXPECT_EQ(*target_vendor("gfx90a:xnack-"), Vendor::amd);
  EXPECT_EQ(*target_vendor("sm_90a"), Vendor::nvidia);
  auto bad = target_vendor("tpu_v5");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("neither an AMD target"), std::string::npos);
}

TEST(Select, CompilersThatCannotServeTheFamilySaySo) {
  auto a = make_compiler("nvrtc", "gfx1201");
  ASSERT_FALSE(a);
  EXPECT_NE(a.status().message().find("nvrtc compiles for NVIDIA GPUs"), std::string::npos)
      << a.status().message();
  EXPECT_NE(a.status().message().find("gfx1201"), std::string::npos);
  auto b = make_compiler("llvm", "sm_90");
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("AMDGPU code objects only"), std::string::npos);
  auto c = make_compiler("hiprtc", "sm_90");
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find("use --compiler nvrtc"), std::string::npos);
  auto d = make_compiler("gcc", "gfx1201");
  ASSERT_FALSE(d);
  EXPECT_EQ(d.status().message(), "unknown compiler 'gcc': choose auto, llvm, hiprtc or nvrtc");
}

TEST(Select, AutoPicksNvrtcForNvidia) {
  NVRTC_OR_SKIP(nvrtc);
  auto c = make_compiler("auto", "sm_90");
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ((*c)->name(), "nvrtc");
  auto named = make_compiler("nvrtc", "sm_80");
  ASSERT_TRUE(named) << named.status().message();
  EXPECT_EQ((*named)->identity(), nvrtc->identity());
}

TEST(Select, AutoForAmdFallsBackToLlvmWithoutRocm) {
  if (RtcCompiler::load(RtcKind::hiprtc))
    GTEST_SKIP() << "ROCm is installed here: auto may pick hiprtc";
  auto c = make_compiler("auto", "gfx1201");
#ifdef FLASHJIT_HAVE_LLVM
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ((*c)->name(), "llvm");
  auto named = make_compiler("llvm", "gfx90a");
  ASSERT_TRUE(named);
#else
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find("hiprtc not found"), std::string::npos);
  EXPECT_NE(c.status().message().find("built without LLVM 22"), std::string::npos);
#endif
  auto h = make_compiler("hiprtc", "gfx1201");
  ASSERT_FALSE(h);
  EXPECT_NE(h.status().message().find("/opt/rocm/lib/libhiprtc.so"), std::string::npos)
      << h.status().message();
}

} // namespace
} // namespace flashjit::compiler
