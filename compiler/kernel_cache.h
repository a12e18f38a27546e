// The kernel cache: code objects by everything that changes them, in memory
// (thread-safe, bounded) and on disk (atomic writes, verified reads).
//
// Disk layout: one file per entry, <dir>/<key>.fjk, where <key> is the 64-digit
// lowercase hex KeyParts::hash(); nothing else names a file, so no key can
// reach outside the directory. A file is
//   header   "FJKCACHE" | u32 format version | key (64 ASCII hex) |
//            u64 payload size | SHA-256 of the payload (32 bytes)
//   payload  u32 size + CodeObject::arch | u32 size + CodeObject::compiler |
//            u32 size + target id | u32 size + label | u64 size + CodeObject::bytes
// (format version 2; version 1, without the label, is still read)
// (integers little-endian). It is written to a temporary file in the same
// directory (.tmp-<key>-XXXXXX, mode 0600), fsync()ed and rename()d over the
// entry, so a reader sees the old file or the new one, never half of one.
// Every read checks the whole header and the checksum: a truncated, corrupted
// or foreign file (or a symbolic link, a FIFO, a device, a file larger than
// 256 MiB, none of which is opened for a blocking read) is reported on stderr
// ("flashjit: cache: <path> is corrupt (<why>); recompiling", once per cache
// object, path and reason) and replaced by a fresh compile, never loaded.
// Between processes nothing is locked: concurrent compiles of one key each
// rename their own complete file into place and the last one wins.
//
// The directory is capped (set_disk_limit; the process-wide cache takes
// FLASHJIT_CACHE_MAX_BYTES, 2 GiB by default): after each store, while the
// entry files add up to more than the cap, the least recently used one goes.
// "Used" is the file's modification time: a store sets it, and every hit
// renews it (a disk hit always, a memory hit at most once a minute), so an
// entry any process keeps using stays. Only regular files named and headed as
// entries are counted and removed, never the one just stored; a kernel larger
// than the whole cap is not stored at all (kept in memory, reported once).
//
// The checksum proves integrity, not authorship: anyone who can write to the
// directory can plant another kernel under a key. So an existing directory
// must belong to the user (or root) and be writable by no one else, as ssh
// asks of ~/.ssh (knobs.h, check_private_dir); otherwise the cache keeps
// kernels in memory only and says once, on stderr, how to fix the directory.
//
// In memory, entries are found by their KeyParts themselves (a fast hash, then
// equality), so a memory hit costs no SHA-256; the hash is computed on a miss.
#pragma once

#include "compiler/compiler.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::compiler {

/// Everything that changes the generated code (STYLE habit 6). The key is a
/// hash over all of it; a key never names a path outside the cache directory.
struct KeyParts {
  std::string ir_text;           // the printed IR (it carries the spec and config)
  std::string target_id;         // arch with features, e.g. "gfx1201" or "sm_90"
  std::string config;            // the tuning config summary
  std::string compile_options;   // flags, opt level, wave size
  std::string templates_hash;    // templates::bundle_hash
  std::string flashjit_version;  // FLASHJIT_VERSION
  std::string compiler_identity; // Compiler::identity(), e.g. "llvm 22.1.8" / "nvrtc 13.0"
  std::string source_hash; // SHA-256 of the source compiled (generated or FLASHJIT_OVERRIDE_DIR)
  /// What the kernel is, for `cache list` (e.g. its name and signature). Not a
  /// part of the key: derived from the parts above, neither hashed nor compared.
  std::string label;
  /// Lowercase hex SHA-256 over the parts (length-prefixed, in this order).
  std::string hash() const;
  /// The parts compared (not the label).
  bool operator==(const KeyParts &other) const;
};

/// The version every key carries (the project version, from CMake).
std::string_view flashjit_version();

/// The options as one line for KeyParts::compile_options, e.g.
/// "arch=gfx1201 features= wave=32 O3 flags=[-mcode-object-version=4]".
std::string describe(const CompileOptions &options);

enum class CacheOutcome { memory_hit, disk_hit, compiled };
std::string_view outcome_name(CacheOutcome o);

struct CacheStats {
  int64_t memory_entries = 0, memory_bytes = 0;
  int64_t disk_entries = 0, disk_bytes = 0;
  int64_t disk_limit = 0; ///< the cap on disk_bytes; 0: none
  int64_t memory_hits = 0, disk_hits = 0, compiles = 0, rejected_files = 0;
  int64_t evicted_files = 0; ///< removed by this cache to stay within disk_limit
};

struct CacheEntryInfo {
  std::string key; // hex hash (the file name stem)
  std::string target_id;
  std::string compiler_identity;
  int64_t bytes = 0; // of the code object
  std::string path;
  std::string label;      // KeyParts::label: what the kernel is (empty in version-1 files)
  std::string arch;       // CodeObject::arch
  int64_t file_bytes = 0; // of the file, header included
  std::string problem;    // why the file is unusable (it would be recompiled); empty if fine
};

/// What KernelCache::clear() did.
struct ClearResult {
  int64_t removed = 0; ///< files removed
  /// Files named like entries that were left in place, one line each: the
  /// path, why ("not a flashjit cache entry (bad magic)", "cannot remove it:
  /// Permission denied", "not a regular file, ...") and "left in place".
  std::vector<std::string> problems;
};

class KernelCache {
public:
  /// `dir` empty: memory only. The directory is created user-only (0700); an
  /// existing one that check_private_dir refuses leaves the cache memory-only.
  /// The disk limit starts at kDefaultCacheMaxBytes (knobs.h).
  explicit KernelCache(std::string dir, int64_t memory_budget_bytes = 256 << 20);
  ~KernelCache();
  /// The process-wide cache at FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit,
  /// else ~/.cache/flashjit, capped at FLASHJIT_CACHE_MAX_BYTES;
  /// FLASHJIT_ALWAYS_COMPILE=1 bypasses lookups.
  static KernelCache &global();

  /// Returns the code object for `key`, compiling it with `compile` on a miss.
  /// Concurrent calls for one key (threads or processes) compile at most once per
  /// process and never read a half-written file.
  Expected<CodeObject> get_or_compile(const KeyParts &key,
                                      const std::function<Expected<CodeObject>()> &compile,
                                      CacheOutcome *outcome = nullptr);

  CacheStats stats() const;
  /// Every entry file in the directory, by key; unusable ones carry `problem`.
  Expected<std::vector<CacheEntryInfo>> list() const;
  /// Removes every entry (memory and disk) and stale temporary files. Only
  /// regular files named as entries whose header is this cache's are removed:
  /// nothing else is opened for more than its header, no directory is entered,
  /// and a file that cannot be removed does not stop the others. An error only
  /// when the directory itself is unusable or unreadable.
  Expected<ClearResult> clear();
  const std::string &directory() const;
  /// Why the directory cannot hold kernels (it could not be created, or
  /// check_private_dir refused it), so that the cache keeps them in memory
  /// only; ok when it can, or for a memory-only cache. For callers that must
  /// not report kernels as stored when they were not (`flashjit warmup`).
  const Status &disk_status() const;

  /// Whether the directory holds a whole, verified entry for `key` (64 hex
  /// digits), so that another process will find it: ok, or an error that says
  /// why not and what to do (the store failed: "No space left on device", the
  /// directory is unusable, the cache is memory-only, the kernel is larger
  /// than the disk limit). For callers that report kernels as stored
  /// (`flashjit warmup`), since get_or_compile succeeds when only the store
  /// fails (the kernel is still in memory).
  Status stored(std::string_view key) const;

  /// The file of `key` (64 lowercase hex digits); an error for anything else,
  /// and for a memory-only cache.
  Expected<std::string> path_for(std::string_view key) const;
  /// The most bytes the entry files may take together; 0: no cap. Enforced
  /// after each store (the least recently used entries are removed). A memory
  /// hit renews its entry file's "last used" at most every `renew_every`.
  void set_disk_limit(int64_t max_bytes,
                      std::chrono::seconds renew_every = std::chrono::seconds(60));
  int64_t disk_limit() const;
  /// Whether lookups are skipped (FLASHJIT_ALWAYS_COMPILE for global()).
  void set_always_compile(bool on);
  /// Where the one-line reports of rejected files go; stderr by default.
  void set_reporter(std::function<void(const std::string &line)> reporter);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace flashjit::compiler
