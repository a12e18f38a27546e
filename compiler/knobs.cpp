// The knob registry: the table, the parser and the helpers that act on knobs.
#include "compiler/knobs.h"

#include "compiler/safe_file.h"
#include "compiler/sha256.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

namespace flashjit::compiler {
namespace {

constexpr int kMaxDebug = 4;
/// No kernel source comes near this; a larger override file is a mistake.
constexpr int64_t kMaxOverrideBytes = 16 << 20;

const char *process_getenv(const char *name) { return std::getenv(name); }

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

/// "1", "true", "yes", "on" and their opposites, any case.
std::optional<bool> parse_bool(std::string_view text) {
  std::string v = lower(text);
  if (v == "1" || v == "true" || v == "yes" || v == "on")
    return true;
  if (v == "0" || v == "false" || v == "no" || v == "off")
    return false;
  return std::nullopt;
}

/// "123", "512K", "2G" (suffixes K, M, G, T, either case, are powers of 1024)
/// as bytes; nullopt for anything else, negative numbers and overflow.
std::optional<int64_t> parse_bytes(std::string_view text) {
  int shift = 0;
  if (!text.empty()) {
    constexpr std::string_view suffixes = "kmgt";
    if (size_t at = suffixes.find(char(std::tolower(static_cast<unsigned char>(text.back()))));
        at != std::string_view::npos) {
      shift = 10 * int(at + 1);
      text.remove_suffix(1);
    }
  }
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() ||
      n > (std::numeric_limits<int64_t>::max() >> shift))
    return std::nullopt;
  return n << shift;
}

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9'))
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  });
}

} // namespace

const std::vector<KnobInfo> &knob_table() {
  static const std::vector<KnobInfo> table = {
      {"FLASHJIT_DEBUG", "0-4", "0",
       "What flashjit prints on stderr; each level adds to the one below. 1: one line per kernel "
       "request (cache outcome, key, compiler, time), the compiler `auto` picked and why, cache "
       "files rejected as corrupt. 2: also the compile options, the cache paths read and "
       "written, the compiler's warnings. 3: also the emitted HIP source of every kernel "
       "compiled. 4: also the tile IR of every kernel generated (as built: there are no IR passes "
       "yet)."},
      {"FLASHJIT_DUMP_DIR", "DIR", "unset (no dumps)",
       "Write every emitted source (<kernel>-<key>.hip) and code object (<kernel>-<key>.co, "
       ".cubin for NVIDIA) into DIR."},
      {"FLASHJIT_OVERRIDE_DIR", "DIR", "unset",
       "Compile the hand-edited DIR/<kernel_name>.hip instead of the generated source when that "
       "file exists. Reported on stderr; the file's SHA-256 goes into the cache key, so an edit "
       "recompiles."},
      {"FLASHJIT_CACHE_DIR", "DIR", "$XDG_CACHE_HOME/flashjit, else ~/.cache/flashjit",
       "Where compiled kernels are kept across processes (created 0700)."},
      {"FLASHJIT_CACHE_MAX_BYTES", "N[K|M|G|T]", "2G (2 GiB)",
       "The most bytes the disk cache may hold; the suffixes are powers of 1024, 0 means no cap. "
       "After each kernel is stored, the least recently used entries (by modification time, which "
       "every hit renews) are removed until the rest fit; a kernel larger than the cap is kept in "
       "memory only."},
      {"FLASHJIT_ALWAYS_COMPILE", "0|1", "0",
       "1: never take a kernel from the cache (memory or disk); compile every time and store the "
       "result."},
      {"FLASHJIT_DEPENDENT_LAUNCH", "0|1", "1",
       "On NVIDIA sm_90, split-KV decode of one query token launches its combine kernel as a "
       "programmatic dependent launch: the combine's workgroups start as the split kernel's "
       "finish their KV loop and wait for it in their first statement (griddepcontrol.wait), "
       "which hides the launch between the two. 0 launches the combine after the split kernel "
       "completes, as on every other target and call."},
      {"FLASHJIT_PROGRESS", "0|1", "unset (when stderr is a terminal)",
       "The command line's progress on stderr: a line every 2 s of an emulator run (workgroups "
       "done of all) and a line per kernel of a warmup as each is ready. The library itself "
       "never prints progress; C++ callers can pass Options::progress."},
      {"FLASHJIT_LLVM_PLUGIN", "PATH",
       "libflashjit_llvm.so beside libflashjit.so, else the build's",
       "The LLVM plugin (the in-process AMDGPU compiler, the ISA reader and the emulator's JIT) "
       "to load; when set, no other place is tried. It must come from the same flashjit build."},
  };
  return table;
}

Expected<Knobs> parse_knobs(const Getenv &getenv_fn) {
  const Getenv &get = getenv_fn ? getenv_fn : Getenv(process_getenv);
  auto value = [&](const char *name) -> std::string {
    const char *v = get(name);
    return v ? std::string(v) : std::string();
  };
  Knobs k;
  std::vector<std::string> problems;

  if (std::string v = value("FLASHJIT_DEBUG"); !v.empty()) {
    char *end = nullptr;
    errno = 0;
    long level = std::strtol(v.c_str(), &end, 10);
    if (errno != 0 || end != v.c_str() + v.size() || level < 0 || level > kMaxDebug)
      problems.push_back(fmt::format("FLASHJIT_DEBUG={}: expected a level from 0 (silent) to {} "
                                     "(the tile IR and the emitted source)",
                                     v, kMaxDebug));
    else
      k.debug = static_cast<int>(level);
  }
  // A 0|1 knob: its value where set and valid, else none (a problem where invalid).
  auto flag = [&](const char *name) -> std::optional<bool> {
    const std::string v = value(name);
    if (v.empty())
      return std::nullopt;
    auto b = parse_bool(v);
    if (!b)
      problems.push_back(
          fmt::format("{}={}: expected 0 or 1 (or true/false, yes/no, on/off)", name, v));
    return b;
  };
  k.always_compile = flag("FLASHJIT_ALWAYS_COMPILE").value_or(k.always_compile);
  k.dependent_launch = flag("FLASHJIT_DEPENDENT_LAUNCH").value_or(k.dependent_launch);
  if (auto b = flag("FLASHJIT_PROGRESS"))
    k.progress = *b ? 1 : 0;
  if (std::string v = value("FLASHJIT_CACHE_MAX_BYTES"); !v.empty()) {
    if (auto bytes = parse_bytes(v))
      k.cache_max_bytes = *bytes;
    else
      problems.push_back(fmt::format("FLASHJIT_CACHE_MAX_BYTES={}: expected a size in bytes, "
                                     "optionally with a K, M, G or T suffix (powers of 1024), "
                                     "e.g. 2G; 0 for no cap",
                                     v));
  }
  k.dump_dir = value("FLASHJIT_DUMP_DIR");
  k.override_dir = value("FLASHJIT_OVERRIDE_DIR");
  k.llvm_plugin = value("FLASHJIT_LLVM_PLUGIN");

  if (std::string v = value("FLASHJIT_CACHE_DIR"); !v.empty()) {
    k.cache_dir = v;
  } else if (std::string xdg = value("XDG_CACHE_HOME"); !xdg.empty() && xdg[0] == '/') {
    // The XDG spec says to ignore a relative XDG_CACHE_HOME.
    k.cache_dir = xdg + "/flashjit";
  } else if (std::string home = value("HOME"); !home.empty()) {
    k.cache_dir = home + "/.cache/flashjit";
  }

  if (!problems.empty()) {
    std::string message = problems[0];
    for (size_t i = 1; i < problems.size(); ++i)
      message += "; " + problems[i];
    return Status::error("{}", message);
  }
  return k;
}

namespace {

struct Parsed {
  Knobs knobs;
  Status status;
};

const Parsed &parsed() {
  static const Parsed p = [] {
    Parsed out;
    auto k = parse_knobs();
    if (k) {
      out.knobs = *k;
      return out;
    }
    out.status = k.status();
    fmt::print(stderr, "flashjit: error: {}; ignoring the bad value(s)\n", k.status().message());
    // Keep every good knob: parse each variable alone, dropping the bad ones.
    out.knobs = *parse_knobs([bad = k.status().message()](const char *name) -> const char * {
      const char *v = std::getenv(name);
      if (v && bad.find(std::string(name) + "=") != std::string::npos)
        return nullptr;
      return v;
    });
    return out;
  }();
  return p;
}

} // namespace

const Knobs &knobs() { return parsed().knobs; }
const Status &knobs_status() { return parsed().status; }

std::string knob_value(std::string_view name) {
  const char *v = std::getenv(std::string(name).c_str());
  return v ? v : "";
}

Status check_private_dir(const std::string &dir, std::string_view knob) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    return Status::error("{} directory {} cannot be used: {}", knob, dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return Status::error("{} {} is not a directory: set {} to a directory of your own", knob, dir,
                         knob);
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    return Status::error("{} directory {} belongs to uid {}, not to you (uid {}), so its owner "
                         "could plant files in it: set {} to a directory of your own (or chown "
                         "it to yourself)",
                         knob, dir, st.st_uid, me, knob);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return Status::error("{} directory {} is writable by its group or others (mode {:04o}), so "
                         "another user could plant files in it: run chmod go-w {}, or set {} to "
                         "a directory of your own",
                         knob, dir, st.st_mode & 07777, dir, knob);
  return Status::ok();
}

Status dump_file(std::string_view file_name, std::string_view bytes, const Knobs &k) {
  if (k.dump_dir.empty())
    return Status::ok();
  if (file_name.empty() || file_name[0] == '.' || file_name.find('/') != std::string_view::npos)
    return Status::error("FLASHJIT_DUMP_DIR: refusing the file name '{}'", file_name);
  if (::mkdir(k.dump_dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::error("FLASHJIT_DUMP_DIR: cannot create {}: {}", k.dump_dir,
                         std::strerror(errno));
  FJ_RETURN_IF_ERROR(check_private_dir(k.dump_dir, "FLASHJIT_DUMP_DIR"));
  const std::string path = k.dump_dir + "/" + std::string(file_name);
  if (Status s = write_file_atomic(path, bytes, Existing::replace); !s)
    return s.with_context("FLASHJIT_DUMP_DIR");
  debug_log(2, "dumped {} ({} bytes)", path, bytes.size());
  return Status::ok();
}

Expected<std::optional<SourceOverride>> source_override(std::string_view kernel_name,
                                                        const Knobs &k) {
  if (k.override_dir.empty())
    return std::optional<SourceOverride>();
  if (!is_identifier(kernel_name))
    return Status::error("FLASHJIT_OVERRIDE_DIR: '{}' is not a kernel name (an identifier)",
                         kernel_name);
  struct stat dir_stat{};
  if (::stat(k.override_dir.c_str(), &dir_stat) != 0 && errno == ENOENT)
    return std::optional<SourceOverride>(); // no directory, no overrides
  FJ_RETURN_IF_ERROR(check_private_dir(k.override_dir, "FLASHJIT_OVERRIDE_DIR"));
  SourceOverride o;
  o.path = k.override_dir + "/" + std::string(kernel_name) + ".hip";
  FileRead file = read_regular_file(o.path, kMaxOverrideBytes, Links::follow);
  if (file.result == FileRead::Result::missing)
    return std::optional<SourceOverride>();
  if (file.result == FileRead::Result::refused)
    return Status::error("FLASHJIT_OVERRIDE_DIR: cannot use {}: {}; put the hand-edited source of "
                         "{} there as a regular file, or remove it to compile the generated one",
                         o.path, file.why, kernel_name);
  if (file.bytes.empty())
    return Status::error("FLASHJIT_OVERRIDE_DIR: {} is empty; put the hand-edited source of {} "
                         "there, or remove it to compile the generated one",
                         o.path, kernel_name);
  o.source = std::move(file.bytes);
  o.hash = sha256_hex(o.source);

  static std::mutex mutex;
  static std::set<std::string> announced;
  std::lock_guard<std::mutex> lock(mutex);
  if (announced.insert(o.path + "@" + o.hash).second)
    fmt::print(stderr,
               "flashjit: FLASHJIT_OVERRIDE_DIR: compiling {} instead of the generated {} "
               "(sha256 {})\n",
               o.path, kernel_name, o.hash.substr(0, 16));
  return std::optional<SourceOverride>(std::move(o));
}

namespace {

/// `text` without comment-only and blank lines, each line without trailing blanks.
std::string code_lines(std::string_view text) {
  std::string out;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
      line.remove_suffix(1);
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos || line.substr(first).starts_with("//"))
      continue;
    out.append(line);
    out += '\n';
  }
  return out;
}

} // namespace

Expected<std::string> override_kernel_text(const SourceOverride &o,
                                           std::string_view generated_source,
                                           std::string_view generated_kernel_text) {
  if (generated_kernel_text.empty() || !generated_source.ends_with(generated_kernel_text))
    return Status::error("FLASHJIT_OVERRIDE_DIR: the generated source of {} does not end with its "
                         "kernel text, so the emulator cannot run an override of it (a flashjit "
                         "bug: please report it)",
                         o.path);
  const std::string_view head =
      generated_source.substr(0, generated_source.size() - generated_kernel_text.size());
  const std::string_view first_line =
      generated_kernel_text.substr(0, generated_kernel_text.find('\n'));
  // The first line of the override equal to `first_line`.
  size_t at = 0;
  const std::string_view source = o.source;
  while (at < source.size()) {
    const size_t end = std::min(source.find('\n', at), source.size());
    if (source.substr(at, end - at) == first_line)
      break;
    at = end + 1;
  }
  if (at >= source.size())
    return Status::error("FLASHJIT_OVERRIDE_DIR: {} has no line '{}', where the kernel text "
                         "begins; the CPU emulator runs only the kernel text (under its own "
                         "prelude) and finds it by that line: start from the source "
                         "FLASHJIT_DUMP_DIR writes and keep that line",
                         o.path, first_line);
  if (code_lines(source.substr(0, at)) != code_lines(head))
    return Status::error("FLASHJIT_OVERRIDE_DIR: {} changes the code before the line '{}' (the "
                         "target prelude or the matrix-instruction wrapper), which the CPU "
                         "emulator replaces with its own prelude, so the emulator cannot run that "
                         "edit: make it below that line, or run the override on a GPU",
                         o.path, first_line);
  return std::string(source.substr(at));
}

} // namespace flashjit::compiler
