// The debug knobs (STYLE habit 7): every environment variable flashjit reads
// is a row of one table, parsed once, documented once, and printed by
// `flashjit knobs`.
//
//   FLASHJIT_DEBUG=N          what flashjit tells you on stderr; levels add up:
//                             0  nothing (default)
//                             1  one line per kernel request: cache outcome
//                                (memory hit / disk hit / compiled), key, compiler,
//                                time; which compiler `auto` picked and why;
//                                cache files rejected as corrupt
//                             2  also the compile options, the cache paths read
//                                and written, the compiler's warnings
//                             3  also the emitted HIP source of every kernel
//                                that is compiled
//                             4  also the tile IR after every pass (the
//                                highest level: IR after each pass + source)
//   FLASHJIT_DUMP_DIR=DIR     write every emitted source (<kernel>-<key>.hip) and
//                             code object (<kernel>-<key>.co / .cubin) there
//   FLASHJIT_OVERRIDE_DIR=DIR compile <DIR>/<kernel_name>.hip instead of the
//                             generated source, if that file exists; said loudly
//                             on stderr, and its hash goes into the cache key
//   FLASHJIT_CACHE_DIR=DIR    the disk cache (default $XDG_CACHE_HOME/flashjit,
//                             else ~/.cache/flashjit)
//   FLASHJIT_CACHE_MAX_BYTES=N the disk cache's size cap (default 2G = 2 GiB; K, M,
//                             G, T suffixes are powers of 1024; 0 = no cap): past
//                             it, the least recently used entries are removed
//   FLASHJIT_ALWAYS_COMPILE=1 never take a kernel from the cache (still stores it)
//   FLASHJIT_LLVM_PLUGIN=PATH the LLVM plugin to load (llvm_plugin.h)
//   FLASHJIT_DEPENDENT_LAUNCH=0 launch split-KV's combine after the split kernel
//                             completes on sm_90 too (default 1: a programmatic
//                             dependent launch for decode of one token)
//
// The three directories must be private, as ssh asks of ~/.ssh: an existing one
// owned by another user (root aside) or writable by its group or others is
// refused with a message that says how to fix it (check_private_dir).
#pragma once

#include "ir/status.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

/// FLASHJIT_CACHE_MAX_BYTES when unset: 2 GiB (a kernel's entry takes 20 KiB to
/// a few hundred KiB).
constexpr int64_t kDefaultCacheMaxBytes = int64_t(2) << 30;

/// One row of the registry.
struct KnobInfo {
  std::string_view name;     ///< "FLASHJIT_DEBUG"
  std::string_view value;    ///< what it takes, e.g. "0-4", "DIR", "0|1"
  std::string_view fallback; ///< the value when unset, in words
  std::string_view doc;      ///< one paragraph
};

/// Every knob, in the order `flashjit knobs` prints them.
const std::vector<KnobInfo> &knob_table();

/// The parsed values.
struct Knobs {
  int debug = 0;
  std::string dump_dir;     ///< empty: no dumps
  std::string override_dir; ///< empty: no overrides
  /// FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit (if absolute), else
  /// $HOME/.cache/flashjit; empty only when none of those is known.
  std::string cache_dir;
  /// The disk cache's size cap in bytes (FLASHJIT_CACHE_MAX_BYTES); 0: no cap.
  int64_t cache_max_bytes = kDefaultCacheMaxBytes;
  bool always_compile = false;
  /// FLASHJIT_DEPENDENT_LAUNCH: on sm_90 one-token decode's combine starts as the
  /// split kernel's workgroups finish their loop (LaunchGeometry::after_previous).
  bool dependent_launch = true;
  std::string llvm_plugin; ///< empty: look beside libflashjit.so, then in the build
  /// FLASHJIT_PROGRESS: the command line's progress lines on stderr: 1 always,
  /// 0 never, unset (-1) when stderr is a terminal. The library prints none.
  int progress = -1;
};

/// Reads a variable; nullptr when unset.
using Getenv = std::function<const char *(const char *)>;

/// Parses every knob from `getenv` (the process environment when omitted).
/// A bad value is an error naming the variable, the value and what it takes,
/// e.g. "FLASHJIT_DEBUG=abc: expected a level from 0 to 4".
Expected<Knobs> parse_knobs(const Getenv &getenv = {});

/// The process's knobs, parsed on first use (thread-safe). A bad value is
/// reported once on stderr ("flashjit: error: FLASHJIT_DEBUG=abc: ...; ignoring
/// it") and that knob keeps its default: a typo in the environment never stops
/// a program. knobs_status() keeps the complaint for tools that want to fail.
const Knobs &knobs();
const Status &knobs_status();

/// The current value of a knob, for `flashjit knobs` ("" when unset).
std::string knob_value(std::string_view name);

/// Prints "flashjit: <message>" on stderr when FLASHJIT_DEBUG >= level.
template <typename... Args>
void debug_log(int level, fmt::format_string<Args...> format, Args &&...args) {
  if (knobs().debug < level)
    return;
  fmt::print(stderr, "flashjit: {}\n", fmt::format(format, std::forward<Args>(args)...));
}

/// Whether the existing directory `dir`, which the knob `knob` names (e.g.
/// "FLASHJIT_CACHE_DIR"), may be trusted with kernels: it must belong to this
/// user (or to root) and be writable by no one else. Anyone else who can write
/// there could plant a kernel that loads as a valid cache entry (its checksum
/// proves integrity, not authorship), an override source, or a symbolic link
/// where a dump is written. The error names the problem and the fix, e.g.
/// "FLASHJIT_CACHE_DIR directory /srv/c is writable by its group or others
/// (mode 0777), so another user could plant files in it: run chmod go-w /srv/c,
/// or set FLASHJIT_CACHE_DIR to a directory of your own".
Status check_private_dir(const std::string &dir, std::string_view knob);

/// FLASHJIT_DUMP_DIR: writes `bytes` to <dump_dir>/<file_name> (the directory
/// created 0700 if missing, refused unless check_private_dir accepts it); does
/// nothing when the knob is unset. A file name with a '/' or starting with '.'
/// is refused. The file is written whole through a temporary file created
/// O_EXCL | O_NOFOLLOW and renamed into place, so a symbolic link planted under
/// the name is replaced, never written through.
Status dump_file(std::string_view file_name, std::string_view bytes, const Knobs &k = knobs());

/// A hand-edited kernel source found through FLASHJIT_OVERRIDE_DIR.
struct SourceOverride {
  std::string path;   ///< <dir>/<kernel_name>.hip
  std::string source; ///< its text
  /// Lowercase hex SHA-256 of the text: KeyParts::source_hash when it is compiled.
  std::string hash;
};

/// The override for `kernel_name`, or nullopt when the knob is unset or the
/// directory or the file does not exist. The first use of each file (and of
/// each new version of it) is reported on stderr: "flashjit:
/// FLASHJIT_OVERRIDE_DIR: compiling <path> instead of the generated
/// <kernel_name> (sha256 <hash>)".
/// Errors: a directory check_private_dir refuses; a file that is unreadable,
/// empty, not a regular file (a FIFO is never opened for blocking reads) or
/// larger than any kernel source; a kernel name that is not an identifier.
Expected<std::optional<SourceOverride>> source_override(std::string_view kernel_name,
                                                        const Knobs &k = knobs());

/// The part of an override the CPU emulator runs. The emulator runs a kernel's
/// text (lowering::Lowered::kernel_text, the end of the generated source) under
/// its own prelude instead of the target's; this is the override's text from
/// the line that begins the generated kernel text on. The part before that
/// line (the target prelude and the matrix-instruction wrapper) must match the
/// generated one, comments and blank lines aside: the emulator could not run
/// an edit there, so it is an error that says so, as is a missing line.
Expected<std::string> override_kernel_text(const SourceOverride &o,
                                           std::string_view generated_source,
                                           std::string_view generated_kernel_text);

} // namespace flashjit::compiler
