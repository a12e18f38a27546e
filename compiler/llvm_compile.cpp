// The LLVM plugin's AMDGPU compiler (LlvmCompiler, llvm_compiler.h): Clang's
// cc1 and LLD's ELF driver, run as libraries.
//
// The compile proper (compile_here) is:
//   1. clang::createInvocation runs the clang driver on driver_args() in
//      -fsyntax-only mode, which gives the exact cc1 command the driver would
//      run for a device-only HIP compile without creating any output file; the
//      invocation is then switched to emit an object.
//   2. A CompilerInstance executes EmitObjAction on it. The source is a
//      remapped in-memory buffer named kernel.hip; the object goes to a
//      raw_svector_ostream (CompilerInstance::setOutputStream). Diagnostics are
//      printed by a TextDiagnosticPrinter into a string, source line and caret
//      included.
//   3. lld::lldMain links the object with `-shared` into the code object. LLD
//      reads its inputs from and writes its output to files only, so this one
//      step uses a private directory (mkdtemp, mode 0700) holding kernel.o and
//      kernel.co; the directory is removed when the compile ends, also when the
//      child was killed (the parent owns it).
//
// Isolation (CompileOptions::isolate, the default): compile() fork()s. The
// child runs compile_here with the libraries already loaded in this process
// (no exec), writes one frame to a pipe ('O' + code object, or 'E' +
// diagnostics) and _exit()s. Its stderr goes to a second pipe. The parent
// drains both pipes with poll() until the deadline; past it, the child is
// SIGKILLed and the compile reported as stopped. A child that dies from a
// signal, or from an LLVM fatal error (the handler installed in the child
// prints "LLVM ERROR: ..." and exits with kExitFatal; e.g. the backend's
// "Cannot select"), is reported with the tail of its stderr. The child sets
// PR_SET_PDEATHSIG so it cannot outlive the parent, and no core dumps.
//
// fork() in a multithreaded host copies only the calling thread: a lock held by
// another thread at that moment (inside LLVM, say) stays held in the child. The
// parent's time limit turns such a deadlock into a reported timeout. LLD runs
// with --threads=1 so the child never needs LLVM's thread pool.
#include "compiler/llvm_compiler.h"
#include "compiler/llvm_impl.h"

#include "target/arch.h"

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/CreateInvocationFromArgs.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <lld/Common/Driver.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/ErrorHandling.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/VirtualFileSystem.h>
#include <llvm/Support/raw_ostream.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

LLD_HAS_DRIVER(elf)

namespace flashjit::compiler {
namespace {

/// Frame tags on the child's result pipe.
constexpr char kTagObject = 'O';
constexpr char kTagError = 'E';
/// Exit status of a child stopped by an LLVM fatal error.
constexpr int kExitFatal = 70;
/// How much of the child's stderr a crash report quotes.
constexpr size_t kStderrTailBytes = 4096;

Status check_options(const CompileOptions &options) {
  if (target::vendor_of_name(options.arch) != target::Vendor::amd)
    return Status::error("compile: '{}' is not an AMDGPU processor name like gfx1201",
                         options.arch);
  const target::Arch *arch = target::find_arch(options.arch);
  if (arch == nullptr)
    return Status::error("compile: unknown AMDGPU processor '{}': supported are {}", options.arch,
                         target::arch_list());
  if (options.wave_size != 32 && options.wave_size != 64)
    return Status::error("compile for {}: wave size {} is neither 32 nor 64", options.arch,
                         options.wave_size);
  if (!arch->runs_wave(options.wave_size))
    return Status::error("compile for {}: gfx{} runs wave{} only, not wave{}", options.arch,
                         arch->generation, arch->wave_size(), options.wave_size);
  if (options.opt_level < 0 || options.opt_level > 3)
    return Status::error("compile for {}: optimization level {} is not 0 to 3", options.arch,
                         options.opt_level);
  if (!(options.timeout_seconds > 0))
    return Status::error("compile for {}: the time limit must be positive", options.arch);
  return Status::ok();
}

/// A private directory for LLD's input and output, removed with its contents
/// when this object dies.
class ScratchDir {
public:
  static Expected<ScratchDir> create() {
    const char *tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/flashjit-XXXXXX";
    if (!mkdtemp(pattern.data()))
      return Status::error("cannot create a temporary directory {}: {}", pattern,
                           std::strerror(errno));
    ScratchDir dir;
    dir.path_ = pattern;
    return dir;
  }
  ScratchDir() = default;
  ScratchDir(ScratchDir &&other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir &operator=(ScratchDir &&) = delete;
  ~ScratchDir() {
    if (path_.empty())
      return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

Status write_file(const std::string &path, llvm::StringRef bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out)
    return Status::error("cannot write {}", path);
  return Status::ok();
}

Expected<std::vector<uint8_t>> read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error("cannot read {}", path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

/// Hands `-mllvm` options to LLVM's global option registry, as cc1 does.
Status parse_llvm_args(const std::vector<std::string> &llvm_args) {
  if (llvm_args.empty())
    return Status::ok();
  std::vector<const char *> argv = {"flashjit (LLVM option parsing)"};
  for (const std::string &arg : llvm_args)
    argv.push_back(arg.c_str());
  llvm::cl::ResetAllOptionOccurrences();
  std::string errors;
  llvm::raw_string_ostream errors_os(errors);
  if (!llvm::cl::ParseCommandLineOptions(static_cast<int>(argv.size()), argv.data(), "",
                                         &errors_os))
    return Status::error("bad -mllvm option: {}", errors);
  return Status::ok();
}

/// Clang: source to a relocatable object, in memory.
Expected<llvm::SmallVector<char, 0>> compile_to_object(std::string_view source,
                                                       const CompileOptions &options) {
  std::vector<std::string> args = LlvmCompiler::driver_args(options);
  std::vector<const char *> argv;
  for (const std::string &arg : args)
    argv.push_back(arg.c_str());

  std::string diagnostics;
  llvm::raw_string_ostream diagnostics_os(diagnostics);
  auto failed = [&]() {
    diagnostics_os.flush();
    return Status::error("compile failed for {}:\n{}", options.arch, diagnostics);
  };

  // Driver: the cc1 invocation. Its own diagnostics (bad flags) go to the same text.
  clang::DiagnosticOptions driver_diag_options;
  driver_diag_options.ShowColors = false;
  clang::TextDiagnosticPrinter driver_printer(diagnostics_os, driver_diag_options);
  auto real_fs = llvm::vfs::getRealFileSystem();
  clang::CreateInvocationOptions create_options;
  create_options.Diags = clang::CompilerInstance::createDiagnostics(
      *real_fs, driver_diag_options, &driver_printer, /*ShouldOwnClient=*/false);
  create_options.VFS = real_fs;
  std::shared_ptr<clang::CompilerInvocation> invocation =
      clang::createInvocation(argv, create_options);
  if (!invocation || create_options.Diags->hasErrorOccurred())
    return failed();

  // The driver ran in -fsyntax-only mode; emit an object instead, into memory.
  invocation->getFrontendOpts().ProgramAction = clang::frontend::EmitObj;
  invocation->getFrontendOpts().OutputFile = "-";
  invocation->getFrontendOpts().DisableFree = false;
  invocation->getCodeGenOpts().DisableFree = false;
  invocation->getDiagnosticOpts().ShowColors = false;
  invocation->getPreprocessorOpts().addRemappedFile(
      LlvmCompiler::kSourceName,
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(source.data(), source.size()),
                                           LlvmCompiler::kSourceName)
          .release());
  invocation->getPreprocessorOpts().RetainRemappedFileBuffers = false;
  FJ_RETURN_IF_ERROR(parse_llvm_args(invocation->getFrontendOpts().LLVMArgs));

  clang::CompilerInstance clang(std::move(invocation));
  auto *printer = new clang::TextDiagnosticPrinter(diagnostics_os, clang.getDiagnosticOpts());
  clang.createVirtualFileSystem(real_fs, printer);
  clang.createDiagnostics(printer, /*ShouldOwnClient=*/true);
  clang.setVerboseOutputStream(diagnostics_os); // "1 error generated."

  llvm::SmallVector<char, 0> object;
  clang.setOutputStream(std::make_unique<llvm::raw_svector_ostream>(object));
  clang::EmitObjAction action;
  bool ok = clang.ExecuteAction(action);
  clang.getDiagnosticClient().finish();
  if (!ok || clang.getDiagnostics().hasErrorOccurred() || object.empty())
    return failed();
  return object;
}

/// LLD: the relocatable object to the code object (an ET_DYN ELF).
Expected<std::vector<uint8_t>>
link_code_object(llvm::StringRef object, const CompileOptions &options, const std::string &dir) {
  std::string input = dir + "/kernel.o";
  std::string output = dir + "/kernel.co";
  FJ_RETURN_IF_ERROR(write_file(input, object));
  std::vector<const char *> argv = {"ld.lld",     "-m",          "elf64_amdgpu", "--no-undefined",
                                    "-shared",    "--threads=1", "-o",           output.c_str(),
                                    input.c_str()};
  std::string messages;
  llvm::raw_string_ostream messages_os(messages);
  lld::Result result = lld::lldMain(argv, messages_os, messages_os, {{lld::Gnu, &lld::elf::link}});
  if (result.retCode != 0)
    return Status::error("link failed for {}:\n{}", options.arch, messages);
  return read_file(output);
}

/// The whole compile, in this process and on this thread.
Expected<std::vector<uint8_t>> compile_here(std::string_view source, const CompileOptions &options,
                                            const std::string &scratch_dir) {
  auto object = compile_to_object(source, options);
  if (!object)
    return object.status();
  return link_code_object(llvm::StringRef(object->data(), object->size()), options, scratch_dir);
}

/// compile_here for CompileOptions::isolate == false: one at a time, because
/// Clang's -mllvm options and LLD's state are process-wide.
Expected<std::vector<uint8_t>> compile_on_this_thread(std::string_view source,
                                                      const CompileOptions &options,
                                                      const std::string &scratch_dir) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  return compile_here(source, options, scratch_dir);
}

// ---------------------------------------------------------------------------
// The forked child and its parent.

bool write_all(int fd, const void *data, size_t size) {
  const char *p = static_cast<const char *>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void on_fatal_error_in_child(void *, const char *reason, bool) {
  std::string line = std::string("LLVM ERROR: ") + reason + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
  ::_exit(kExitFatal);
}

[[noreturn]] void run_child(std::string_view source, const CompileOptions &options,
                            const std::string &scratch_dir, pid_t parent, int result_fd,
                            int stderr_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) // the parent died before prctl took effect
    ::_exit(1);
  struct rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  ::signal(SIGPIPE, SIG_DFL);
  // Keep stdin, send stdout and stderr to the parent, the result pipe to fd 3,
  // and close everything else: the child must not hold other compiles' pipes
  // open (their parents wait for end-of-file). The pipes are first moved above
  // fd 3 so the dup2s below cannot overwrite one another.
  constexpr int kResultFd = 3;
  result_fd = ::fcntl(result_fd, F_DUPFD, kResultFd + 1);
  stderr_fd = ::fcntl(stderr_fd, F_DUPFD, kResultFd + 1);
  if (result_fd < 0 || stderr_fd < 0)
    ::_exit(1);
  ::dup2(stderr_fd, STDOUT_FILENO);
  ::dup2(stderr_fd, STDERR_FILENO);
  ::dup2(result_fd, kResultFd);
  result_fd = kResultFd;
  ::close_range(kResultFd + 1, ~0U, 0);
  llvm::remove_fatal_error_handler();
  llvm::install_fatal_error_handler(on_fatal_error_in_child);

  auto result = compile_here(source, options, scratch_dir);
  bool written;
  if (result) {
    written = write_all(result_fd, &kTagObject, 1) &&
              write_all(result_fd, result->data(), result->size());
  } else {
    const std::string &message = result.status().message();
    written =
        write_all(result_fd, &kTagError, 1) && write_all(result_fd, message.data(), message.size());
  }
  ::_exit(written ? 0 : 1);
}

/// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }
};

std::string signal_text(int sig) {
  const char *name = ::strsignal(sig);
  return fmt::format("signal {}{}{}", sig, name ? ": " : "", name ? name : "");
}

std::string tail(const std::string &text) {
  std::string_view t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' '))
    t.remove_suffix(1);
  if (t.size() > kStderrTailBytes)
    return "..." + std::string(t.substr(t.size() - kStderrTailBytes));
  return t.empty() ? std::string("(no output)") : std::string(t);
}

Expected<std::vector<uint8_t>> compile_in_child(std::string_view source,
                                                const CompileOptions &options,
                                                const std::string &scratch_dir) {
  int result_pipe[2], stderr_pipe[2];
  if (::pipe2(result_pipe, O_CLOEXEC) != 0)
    return Status::error("compile for {}: pipe: {}", options.arch, std::strerror(errno));
  Fd result_read{result_pipe[0]}, result_write{result_pipe[1]};
  if (::pipe2(stderr_pipe, O_CLOEXEC) != 0)
    return Status::error("compile for {}: pipe: {}", options.arch, std::strerror(errno));
  Fd stderr_read{stderr_pipe[0]}, stderr_write{stderr_pipe[1]};

  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options.timeout_seconds));
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0)
    return Status::error("compile for {}: fork: {}", options.arch, std::strerror(errno));
  if (pid == 0)
    run_child(source, options, scratch_dir, parent, result_write.fd, stderr_write.fd);
  result_write.reset();
  stderr_write.reset();

  std::string result, child_stderr;
  bool timed_out = false;
  int poll_error = 0;
  while (result_read.fd >= 0 || stderr_read.fd >= 0) {
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      timed_out = true;
      break;
    }
    int wait_ms =
        static_cast<int>(std::ceil(std::chrono::duration<double, std::milli>(left).count()));
    pollfd fds[2] = {{result_read.fd, POLLIN, 0}, {stderr_read.fd, POLLIN, 0}};
    int ready = ::poll(fds, 2, wait_ms);
    if (ready < 0 && errno != EINTR) {
      poll_error = errno;
      break;
    }
    Fd *ends[2] = {&result_read, &stderr_read};
    std::string *sinks[2] = {&result, &child_stderr};
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (ends[i]->fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      char buffer[1 << 16];
      ssize_t n = ::read(ends[i]->fd, buffer, sizeof buffer);
      if (n > 0)
        sinks[i]->append(buffer, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        ends[i]->reset();
      if (child_stderr.size() > 4 * kStderrTailBytes)
        child_stderr.erase(0, child_stderr.size() - kStderrTailBytes);
    }
  }
  if (timed_out || poll_error)
    ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  if (timed_out)
    return Status::error("compile for {} stopped after {:g} s time limit", options.arch,
                         options.timeout_seconds);
  if (poll_error)
    return Status::error("compile for {}: poll: {}", options.arch, std::strerror(poll_error));
  if (WIFSIGNALED(status))
    return Status::error("compile failed for {}: the compiler crashed ({}):\n{}", options.arch,
                         signal_text(WTERMSIG(status)), tail(child_stderr));
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExitFatal)
    return Status::error("compile failed for {}: the compiler crashed (LLVM fatal error):\n{}",
                         options.arch, tail(child_stderr));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || result.empty())
    return Status::error("compile failed for {}: the compiler process exited with status {}:\n{}",
                         options.arch, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                         tail(child_stderr));
  if (result[0] == kTagError)
    return Status::error("{}", std::string_view(result).substr(1));
  return std::vector<uint8_t>(result.begin() + 1, result.end());
}

} // namespace

namespace llvm_impl {

void initialize_targets() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeAMDGPUTargetInfo();
    LLVMInitializeAMDGPUTarget();
    LLVMInitializeAMDGPUTargetMC();
    LLVMInitializeAMDGPUAsmPrinter();
    LLVMInitializeAMDGPUAsmParser();
    LLVMInitializeAMDGPUDisassembler();
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

std::string identity() { return std::string("llvm ") + LLVM_VERSION_STRING; }

Expected<CodeObject> compile(std::string_view source, const CompileOptions &options) {
  FJ_RETURN_IF_ERROR(check_options(options));
  initialize_targets();
  auto scratch = ScratchDir::create();
  if (!scratch)
    return scratch.status().with_context("compile for " + options.arch);

  auto bytes = options.isolate ? compile_in_child(source, options, scratch->path())
                               : compile_on_this_thread(source, options, scratch->path());
  if (!bytes)
    return bytes.status();
  return CodeObject{options.arch, bytes.take(), identity()};
}

} // namespace llvm_impl

} // namespace flashjit::compiler
