// The LLVM plugin's host JIT (host_jit.h): Clang -> llvm::Module -> ORC LLJIT,
// for the emulator. One process-wide LLJIT;
// each distinct kernel text gets its own JITDylib (kernels share names), with
// the emulator's hooks defined there as absolute symbols, so nothing is looked
// up in the process's dynamic symbol table.
#include "compiler/host_jit.h"
#include "compiler/llvm_impl.h"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/CreateInvocationFromArgs.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <llvm/ExecutionEngine/Orc/AbsoluteSymbols.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/VirtualFileSystem.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Host.h>

#include <chrono>
#include <map>
#include <mutex>

#ifndef FLASHJIT_CLANG_EXECUTABLE
#error "FLASHJIT_CLANG_EXECUTABLE must name clang in the LLVM install (compiler/CMakeLists.txt)"
#endif

namespace flashjit::compiler {
namespace {

/// Name of the source buffer in diagnostics.
constexpr const char *kSourceName = "emulated_kernel.cpp";
constexpr std::string_view kWorkgroupSizeTag = "flashjit.workgroup_size=";

std::string to_string(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

/// The Clang driver line for the host. -O2 keeps lanes' fragment arrays in
/// registers; -ffp-contract=off keeps every f32 operation rounded as written
/// (no FMA contraction that a host CPU might or might not offer), so results do
/// not depend on the machine; -fsanitize=array-bounds checks every index into
/// the kernel's register arrays (the handler is one of the emulator's hooks);
/// -w because the kernel text is generated.
std::vector<std::string> driver_args() {
  return {FLASHJIT_CLANG_EXECUTABLE,
          "--target=" + llvm::sys::getProcessTriple(),
          "-x",
          "c++",
          "-std=c++20",
          "-O2",
          "-ffp-contract=off",
          "-fno-exceptions",
          "-fno-rtti",
          "-fno-stack-protector",
          "-fsanitize=array-bounds",
          "-fno-asynchronous-unwind-tables",
          "-nostdinc",
          "-nostdinc++",
          "-fno-color-diagnostics",
          "-w",
          "-fsyntax-only",
          kSourceName};
}

struct Compiled {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
};

Expected<Compiled> clang_compile(const std::string &source) {
  std::vector<std::string> args = driver_args();
  std::vector<const char *> argv;
  for (const std::string &a : args)
    argv.push_back(a.c_str());

  std::string diagnostics;
  llvm::raw_string_ostream diagnostics_os(diagnostics);
  auto failed = [&] {
    diagnostics_os.flush();
    return Status::error("emulator: the kernel does not compile for the host:\n{}", diagnostics);
  };
  clang::DiagnosticOptions diag_options;
  diag_options.ShowColors = false;
  clang::TextDiagnosticPrinter driver_printer(diagnostics_os, diag_options);
  auto fs = llvm::vfs::getRealFileSystem();
  clang::CreateInvocationOptions create;
  create.Diags = clang::CompilerInstance::createDiagnostics(*fs, diag_options, &driver_printer,
                                                            /*ShouldOwnClient=*/false);
  create.VFS = fs;
  std::shared_ptr<clang::CompilerInvocation> invocation = clang::createInvocation(argv, create);
  if (!invocation || create.Diags->hasErrorOccurred())
    return failed();
  invocation->getFrontendOpts().ProgramAction = clang::frontend::EmitLLVMOnly;
  invocation->getFrontendOpts().DisableFree = false;
  invocation->getCodeGenOpts().DisableFree = false;
  invocation->getDiagnosticOpts().ShowColors = false;
  invocation->getPreprocessorOpts().addRemappedFile(
      kSourceName, llvm::MemoryBuffer::getMemBufferCopy(source, kSourceName).release());
  invocation->getPreprocessorOpts().RetainRemappedFileBuffers = false;

  clang::CompilerInstance clang(std::move(invocation));
  auto *printer = new clang::TextDiagnosticPrinter(diagnostics_os, clang.getDiagnosticOpts());
  clang.createVirtualFileSystem(fs, printer);
  clang.createDiagnostics(printer, /*ShouldOwnClient=*/true);
  clang.setVerboseOutputStream(diagnostics_os);

  Compiled out;
  out.context = std::make_unique<llvm::LLVMContext>();
  clang::EmitLLVMOnlyAction action(out.context.get());
  const bool ok = clang.ExecuteAction(action);
  clang.getDiagnosticClient().finish();
  if (!ok || clang.getDiagnostics().hasErrorOccurred())
    return failed();
  out.module = action.takeModule();
  if (!out.module)
    return failed();
  return out;
}

/// Reads the FJ_WORKGROUP_SIZE(n) of the module's kernel from
/// llvm.global.annotations, then drops the annotations (metadata for us,
/// nothing the JIT should emit).
int take_workgroup_size(llvm::Module &m) {
  llvm::GlobalVariable *annotations = m.getNamedGlobal("llvm.global.annotations");
  if (!annotations)
    return 0;
  int size = 0;
  if (auto *array = llvm::dyn_cast<llvm::ConstantArray>(annotations->getInitializer())) {
    for (const llvm::Use &entry : array->operands()) {
      auto *fields = llvm::dyn_cast<llvm::ConstantStruct>(entry.get());
      if (!fields || fields->getNumOperands() < 2)
        continue;
      auto *f = llvm::dyn_cast<llvm::Function>(fields->getOperand(0)->stripPointerCasts());
      auto *text = llvm::dyn_cast<llvm::GlobalVariable>(fields->getOperand(1)->stripPointerCasts());
      if (!f || !text || !text->hasInitializer())
        continue;
      auto *data = llvm::dyn_cast<llvm::ConstantDataSequential>(text->getInitializer());
      if (!data || !data->isCString())
        continue;
      llvm::StringRef s = data->getAsCString();
      if (s.consume_front(llvm::StringRef(kWorkgroupSizeTag.data(), kWorkgroupSizeTag.size())))
        s.getAsInteger(10, size);
    }
  }
  annotations->eraseFromParent();
  return size;
}

class Jit {
public:
  static Jit &instance() {
    static Jit *jit = new Jit(); // lives until exit: kernels may run to the end
    return *jit;
  }

  Expected<std::shared_ptr<const HostKernel>> get(std::string_view prelude,
                                                  std::string_view kernel_text,
                                                  const std::vector<HostSymbol> &symbols) {
    std::string source;
    source.reserve(prelude.size() + kernel_text.size() + 64);
    // Diagnostics and the bounds checks name lines of the kernel text itself.
    source.append(prelude).append("\n#line 1 \"kernel_text\"\n").append(kernel_text);
    const std::string &key = source;
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end())
      return it->second;
    if (!jit_)
      return Status::error("emulator: cannot start the LLVM JIT: {}", jit_error_);
    auto compiled = compile(source, symbols);
    if (!compiled)
      return compiled.status();
    cache_.emplace(key, *compiled);
    return *compiled;
  }

private:
  Jit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto jit = llvm::orc::LLJITBuilder()
                   .setLinkProcessSymbolsByDefault(false)
                   .setPlatformSetUp(llvm::orc::setUpInactivePlatform)
                   .create();
    if (!jit)
      jit_error_ = to_string(jit.takeError());
    else
      jit_ = std::move(*jit);
  }

  Expected<std::shared_ptr<const HostKernel>> compile(const std::string &source,
                                                      const std::vector<HostSymbol> &symbols) {
    const auto start = std::chrono::steady_clock::now();
    auto compiled = clang_compile(source);
    if (!compiled)
      return compiled.status();
    const llvm::StringRef name(kLauncherName);
    llvm::Function *fn = compiled->module->getFunction(name);
    if (!fn || fn->isDeclaration())
      return Status::error("emulator: the kernel text defines no launcher {}", kLauncherName);
    auto kernel = std::make_shared<HostKernel>();
    kernel->workgroup_size = take_workgroup_size(*compiled->module);
    if (compiled->module->getNamedGlobal("llvm.global_ctors"))
      return Status::error("emulator: the kernel needs dynamic initialization of globals, which "
                           "a GPU kernel cannot have");

    auto dylib = jit_->createJITDylib(fmt::format("flashjit_emulated_{}", ++dylibs_));
    if (!dylib)
      return Status::error("emulator: {}", to_string(dylib.takeError()));
    llvm::orc::SymbolMap map;
    for (const HostSymbol &s : symbols)
      map[jit_->mangleAndIntern(s.name)] = llvm::orc::ExecutorSymbolDef(
          llvm::orc::ExecutorAddr::fromPtr(s.address),
          llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable);
    if (llvm::Error e = dylib->define(llvm::orc::absoluteSymbols(std::move(map))))
      return Status::error("emulator: {}", to_string(std::move(e)));
    if (llvm::Error e =
            jit_->addIRModule(*dylib, llvm::orc::ThreadSafeModule(std::move(compiled->module),
                                                                  std::move(compiled->context))))
      return Status::error("emulator: {}", to_string(std::move(e)));
    auto address = jit_->lookup(*dylib, name);
    if (!address)
      return Status::error("emulator: cannot link the kernel's launcher: {}",
                           to_string(address.takeError()));
    kernel->entry = address->toPtr<KernelEntry>();
    kernel->compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::shared_ptr<const HostKernel>(std::move(kernel));
  }

  std::mutex mutex_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::string jit_error_;
  std::map<std::string, std::shared_ptr<const HostKernel>> cache_;
  int dylibs_ = 0;
};

} // namespace

Expected<std::shared_ptr<const HostKernel>>
llvm_impl::compile_for_host(std::string_view prelude, std::string_view kernel_text,
                            const std::vector<HostSymbol> &symbols) {
  return Jit::instance().get(prelude, kernel_text, symbols);
}

} // namespace flashjit::compiler
