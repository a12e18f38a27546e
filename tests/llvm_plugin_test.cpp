// The LLVM plugin (compiler/llvm_plugin.h): it loads from the build and
// serves all three services; what cannot be a plugin is refused with a message
// that names the file and the problem.
#include "compiler/llvm_compiler.h"
#include "compiler/llvm_plugin.h"

#include <gtest/gtest.h>

#include <string>

namespace flashjit::compiler {
namespace {

#define EXPECT_HAS(text, part)                                                                     \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

TEST(LlvmPlugin, LoadsFromTheBuildAndServesEveryCall) {
  auto loaded = loaded_llvm_plugin();
  ASSERT_TRUE(loaded) << loaded.status().message();
  EXPECT_HAS(loaded->path, kLlvmPluginFile);
  const LlvmPlugin &p = *loaded->table;
  EXPECT_EQ(p.abi, kLlvmPluginAbi);
  EXPECT_EQ(p.size, sizeof(LlvmPlugin));
  EXPECT_EQ(p.identity().rfind("llvm 22.", 0), 0u) << p.identity();
  EXPECT_EQ(LlvmCompiler().identity(), p.identity());
  // One process, one plugin: a second call returns the same table.
  EXPECT_EQ(*llvm_plugin(), &p);

  // The host JIT: a launcher that adds its two arguments.
  auto kernel =
      compile_for_host("",
                       "extern \"C\" void fj_launch(void *const *args) {\n"
                       "  *static_cast<int *>(args[0]) += *static_cast<const int *>(args[1]);\n}\n",
                       {});
  ASSERT_TRUE(kernel) << kernel.status().message();
  int sum = 40, addend = 2;
  void *args[] = {&sum, &addend};
  (*kernel)->entry(args);
  EXPECT_EQ(sum, 42);

  // The compiler and the code-object readers.
  CompileOptions o;
  o.arch = "gfx1201";
  auto code = LlvmCompiler().compile(
      "extern \"C\" __attribute__((global)) void k(int *p) { *p = 7; }\n", o);
  ASSERT_TRUE(code) << code.status().message();
  auto isa = disassemble(*code);
  ASSERT_TRUE(isa) << isa.status().message();
  EXPECT_HAS(*isa, "s_endpgm");
  auto resources = read_resources(*code, 1536, 16, 65536);
  ASSERT_TRUE(resources) << resources.status().message();
  ASSERT_EQ(resources->size(), 1u);
  EXPECT_EQ((*resources)[0].kernel, "k");
}

TEST(LlvmPlugin, AMissingFileIsNamed) {
  auto p = load_llvm_plugin("/nonexistent/libflashjit_llvm.so");
  ASSERT_FALSE(p);
  EXPECT_HAS(p.status().message(), "/nonexistent/libflashjit_llvm.so: cannot be loaded");
}

TEST(LlvmPlugin, ALibraryWithoutTheEntryPointIsRefused) {
  auto p = load_llvm_plugin("libm.so.6");
  ASSERT_FALSE(p);
  EXPECT_HAS(p.status().message(), "libm.so.6: is not a flashjit LLVM plugin (it has no "
                                   "flashjit_llvm_plugin function)");
}

TEST(LlvmPlugin, APluginFromAnotherBuildIsRefused) {
  auto p = load_llvm_plugin(FLASHJIT_OTHER_BUILD_PLUGIN);
  ASSERT_FALSE(p);
  EXPECT_HAS(p.status().message(), "comes from another flashjit build");
  EXPECT_HAS(p.status().message(), "use the plugin built with this library");
}

} // namespace
} // namespace flashjit::compiler
