// Code-object inspection through ROCm's comgr, loaded at run time. Debian's
// libamd-comgr2 (ROCm 5.2) is enough: it knows gfx90a, not gfx11/gfx12. The
// code objects come from the in-process LLVM compiler, so those tests need an
// LLVM build; every test skips, saying why, when comgr is not installed.
#include "compiler/comgr.h"
#ifdef FLASHJIT_HAVE_LLVM
#include "compiler/llvm_compiler.h"
#endif

#include <gtest/gtest.h>

#include <string>

namespace flashjit::compiler {
namespace {

#define COMGR_OR_SKIP()                                                                            \
  do {                                                                                             \
    auto id = comgr_identity();                                                                    \
    if (!id)                                                                                       \
      GTEST_SKIP() << "comgr is not installed: " << id.status().message();                         \
  } while (0)

TEST(Comgr, IdentityNamesVersionAndFile) {
  COMGR_OR_SKIP();
  const std::string id = *comgr_identity();
  EXPECT_TRUE(id.starts_with("comgr ")) << id;
  EXPECT_NE(id.find("libamd_comgr.so"), std::string::npos) << id;
  EXPECT_TRUE(*comgr_knows("gfx90a"));
  EXPECT_TRUE(*comgr_knows("gfx90a:xnack-"));
}

TEST(Comgr, AnUnknownTargetIsNamedWithTheWayOut) {
  COMGR_OR_SKIP();
  if (*comgr_knows("gfx1201"))
    GTEST_SKIP() << "this comgr knows gfx1201: " << *comgr_identity();
  CodeObject code;
  code.arch = "gfx1201";
  code.bytes = {0x7f, 'E', 'L', 'F'};
  auto isa = comgr_disassemble(code);
  ASSERT_FALSE(isa);
  const std::string &m = isa.status().message();
  EXPECT_TRUE(m.starts_with("the installed comgr (")) << m;
  EXPECT_NE(m.find("libamd_comgr.so"), std::string::npos) << m;
  EXPECT_TRUE(m.ends_with("does not know gfx1201; build with LLVM 22 for gfx1201 inspection")) << m;
  EXPECT_FALSE(comgr_read_resources(code, 1536, 16, 65536));
}

TEST(Comgr, InputThatIsNotAnAmdgpuElfIsRefusedPlainly) {
  COMGR_OR_SKIP();
  CodeObject code;
  code.arch = "gfx90a";
  code.bytes.assign(100, 0x42);
  auto isa = comgr_disassemble(code);
  ASSERT_FALSE(isa);
  EXPECT_EQ(isa.status().message(), "the gfx90a code object is not an ELF file (100 bytes)");
  code.bytes[0] = 0x7f;
  code.bytes[1] = 'E';
  code.bytes[2] = 'L';
  code.bytes[3] = 'F';
  code.bytes[18] = 190; // EM_CUDA: a cubin
  code.bytes[19] = 0;
  auto resources = comgr_read_resources(code, 512, 8, 65536);
  ASSERT_FALSE(resources);
  EXPECT_NE(resources.status().message().find("not an AMDGPU ELF file (e_machine 190)"),
            std::string::npos)
      << resources.status().message();
}

TEST(Comgr, SearchPaths) {
  auto paths = comgr_search_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/opt/rocm/lib/libamd_comgr.so"), paths.end());
  EXPECT_EQ(paths.back(), "libamd_comgr.so.2");
}

#ifdef FLASHJIT_HAVE_LLVM

// One CDNA2 MFMA (as in llvm_compiler_test.cpp).
constexpr const char *kMfmaGfx90a = R"(
#define __global__ __attribute__((global))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
typedef short v4s __attribute__((ext_vector_type(4)));
typedef float v4f __attribute__((ext_vector_type(4)));

extern "C" __global__ __launch_bounds__(64) void mfma_bf16(const v4s *a, const v4s *b, v4f *c) {
  int lane = __builtin_amdgcn_workitem_id_x();
  c[lane] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a[lane], b[lane], c[lane], 0, 0, 0);
}
)";

constexpr int kCdna2VgprFile = 512, kCdna2MaxWaves = 8, kLds = 64 * 1024;

CodeObject gfx90a_code_object(int code_object_version) {
  CompileOptions o;
  o.arch = "gfx90a";
  o.wave_size = 64;
  if (code_object_version)
    o.extra_flags = {"-mcode-object-version=" + std::to_string(code_object_version)};
  auto code = LlvmCompiler().compile(kMfmaGfx90a, o);
  EXPECT_TRUE(code) << code.status().message();
  return code ? *code : CodeObject{};
}

TEST(Comgr, DisassemblesAnMfmaKernel) {
  COMGR_OR_SKIP();
  auto isa = comgr_disassemble(gfx90a_code_object(4));
  ASSERT_TRUE(isa) << isa.status().message();
  EXPECT_NE(isa->find("\nmfma_bf16:\n"), std::string::npos) << *isa;
  EXPECT_NE(isa->find("v_mfma_f32_16x16x16bf16_1k"), std::string::npos) << *isa;
  EXPECT_NE(isa->find("s_endpgm"), std::string::npos) << *isa;
}

TEST(Comgr, ResourcesMatchTheLlvmReader) {
  COMGR_OR_SKIP();
  const CodeObject code = gfx90a_code_object(4);
  auto via_comgr = comgr_read_resources(code, kCdna2VgprFile, kCdna2MaxWaves, kLds);
  ASSERT_TRUE(via_comgr) << via_comgr.status().message();
  ASSERT_EQ(via_comgr->size(), 1u);
  const ResourceReport &r = via_comgr->front();
  EXPECT_EQ(r.kernel, "mfma_bf16");
  EXPECT_EQ(r.symbol, "mfma_bf16.kd");
  EXPECT_EQ(r.wavefront_size, 64);
  EXPECT_EQ(r.max_flat_workgroup_size, 64);
  EXPECT_EQ(r.matrix_instructions, 1);
  EXPECT_GT(r.vgprs, 0);
  EXPECT_GT(r.occupancy_waves_per_simd, 0);
  // The two readers (and their two copies of the occupancy rules) agree.
  auto via_llvm = read_resources(code, kCdna2VgprFile, kCdna2MaxWaves, kLds);
  ASSERT_TRUE(via_llvm) << via_llvm.status().message();
  ASSERT_EQ(via_llvm->size(), 1u);
  EXPECT_EQ(r.to_json(), via_llvm->front().to_json());
}

TEST(Comgr, NewerCodeObjectVersions) {
  // LLVM 22's default code object version is newer than ROCm 5.2 reads; either
  // it works or the error says what comgr could not do.
  COMGR_OR_SKIP();
  for (int version : {5, 6}) {
    auto isa = comgr_disassemble(gfx90a_code_object(version));
    if (isa) {
      EXPECT_NE(isa->find("v_mfma_f32_16x16x16bf16_1k"), std::string::npos) << version;
      auto r =
          comgr_read_resources(gfx90a_code_object(version), kCdna2VgprFile, kCdna2MaxWaves, kLds);
      EXPECT_TRUE(r) << version << ": " << r.status().message();
    } else
      EXPECT_NE(isa.status().message().find("could not disassemble"), std::string::npos)
          << version << ": " << isa.status().message();
  }
}

#endif // FLASHJIT_HAVE_LLVM

} // namespace
} // namespace flashjit::compiler
