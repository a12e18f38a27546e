// KernelCache: an LRU map in memory, one verified file per entry on disk.
//
// Concurrency. Within a process, a mutex per key (handed out by key_lock())
// serializes everything from the memory re-check to the store, so concurrent
// requests for one key compile once and the others find it in memory. The
// shared maps are under one mutex that is never held across a compile or any
// I/O. Between processes nothing is locked: each writes its result to its own
// temporary file and rename()s it into place, which POSIX makes atomic, so the
// last rename wins and every reader opens a complete file (both results are
// the same code anyway). A reader verifies what it opened in full before using
// it, so a file damaged any other way is caught there.
//
// The size cap. After a store, trim() lists the directory, and while the entry
// files add up to more than the limit it removes the one with the oldest
// modification time (after reading its header, as clear() does). Processes
// trimming at once may remove a file twice (the second unlink finds nothing)
// or one more than needed; neither loses more than a recompile.
#include "compiler/kernel_cache.h"

#include "compiler/knobs.h"
#include "compiler/safe_file.h"
#include "compiler/sha256.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <variant>

#ifndef FLASHJIT_VERSION
#error "FLASHJIT_VERSION must be defined by compiler/CMakeLists.txt"
#endif

namespace flashjit::compiler {
namespace {

constexpr char kMagic[8] = {'F', 'J', 'K', 'C', 'A', 'C', 'H', 'E'};
constexpr uint32_t kFormatVersion = 2; // 2 adds the label; 1 is still read
constexpr size_t kKeyChars = 64;
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4 + kKeyChars + 8 + 32;
constexpr std::string_view kSuffix = ".fjk";
constexpr std::string_view kTempPrefix = ".tmp-";
/// A temporary file older than this belongs to a writer that died.
constexpr auto kStaleTemp = std::chrono::seconds(60);
/// No code object comes near this: a larger entry file (a huge sparse file,
/// say) is refused unread and the kernel recompiled.
constexpr int64_t kMaxEntryBytes = int64_t(256) << 20;
/// The failed stores remembered for stored() (a long-running process on a
/// full disk must not grow without bound).
constexpr size_t kMaxStoreFailures = 1024;

bool is_key(std::string_view key) {
  return key.size() == kKeyChars && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

/// The key of an entry file name "<key>.fjk", or empty.
std::string_view entry_key(std::string_view name) {
  if (name.size() != kKeyChars + kSuffix.size() || !name.ends_with(kSuffix))
    return {};
  std::string_view key = name.substr(0, kKeyChars);
  return is_key(key) ? key : std::string_view();
}

bool is_temp_name(std::string_view name) {
  return name.starts_with(kTempPrefix) && name.size() > kTempPrefix.size() + kKeyChars &&
         is_key(name.substr(kTempPrefix.size(), kKeyChars));
}

struct Entry {
  CodeObject code;
  std::string target_id;
  std::string label; // KeyParts::label
  int64_t cost() const {
    return int64_t(code.bytes.size() + code.arch.size() + code.compiler.size() + target_id.size() +
                   label.size());
  }
};

/// The parts of a key in the order KeyParts::hash() takes them.
auto key_fields(const KeyParts &k) {
  return std::array<const std::string *, 8>{
      &k.ir_text,           &k.target_id,      &k.config,
      &k.compile_options,   &k.templates_hash, &k.flashjit_version,
      &k.compiler_identity, &k.source_hash};
}

int64_t key_cost(const KeyParts &k) {
  int64_t n = 0;
  for (const std::string *s : key_fields(k))
    n += int64_t(s->size());
  return n;
}

/// A memory-cache key: the parts themselves (owned by the entry, or the
/// caller's during a lookup) with a fast, non-cryptographic hash of them.
struct MemoryKey {
  const KeyParts *parts;
  size_t hash;
  bool operator==(const MemoryKey &o) const { return hash == o.hash && *parts == *o.parts; }
};
struct MemoryKeyHash {
  size_t operator()(const MemoryKey &k) const { return k.hash; }
};

MemoryKey memory_key(const KeyParts &k) {
  size_t h = 0;
  for (const std::string *s : key_fields(k))
    h = (h ^ (std::hash<std::string_view>()(*s) + s->size())) * 0x9e3779b97f4a7c15ull;
  return {&k, h};
}

// ---- the file format ------------------------------------------------------

void put_u32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out += char(v >> (8 * i));
}
void put_u64(std::string &out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out += char(v >> (8 * i));
}

class Reader {
public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool u32(uint32_t &v) {
    if (in_.size() - pos_ < 4)
      return false;
    v = 0;
    for (int i = 0; i < 4; ++i)
      v |= uint32_t(uint8_t(in_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t &v) {
    if (in_.size() - pos_ < 8)
      return false;
    v = 0;
    for (int i = 0; i < 8; ++i)
      v |= uint64_t(uint8_t(in_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool take(uint64_t n, std::string_view &out) {
    if (in_.size() - pos_ < n)
      return false;
    out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool str32(std::string &out) {
    uint32_t n = 0;
    std::string_view s;
    if (!u32(n) || !take(n, s))
      return false;
    out.assign(s);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

private:
  std::string_view in_;
  size_t pos_ = 0;
};

std::string encode(std::string_view key, const Entry &e) {
  std::string payload;
  put_u32(payload, uint32_t(e.code.arch.size()));
  payload += e.code.arch;
  put_u32(payload, uint32_t(e.code.compiler.size()));
  payload += e.code.compiler;
  put_u32(payload, uint32_t(e.target_id.size()));
  payload += e.target_id;
  put_u32(payload, uint32_t(e.label.size()));
  payload += e.label;
  put_u64(payload, e.code.bytes.size());
  payload.append(reinterpret_cast<const char *>(e.code.bytes.data()), e.code.bytes.size());

  std::string file(kMagic, sizeof(kMagic));
  put_u32(file, kFormatVersion);
  file += key;
  put_u64(file, payload.size());
  Digest digest = sha256(payload);
  file.append(reinterpret_cast<const char *>(digest.data()), digest.size());
  return file + payload;
}

/// The entry in `file`, or why it cannot be used.
std::variant<Entry, std::string> decode(std::string_view file, std::string_view expected_key) {
  if (file.empty())
    return std::string("empty file");
  if (file.size() < kHeaderBytes)
    return fmt::format("truncated: {} bytes, shorter than the {}-byte header", file.size(),
                       kHeaderBytes);
  if (file.substr(0, sizeof(kMagic)) != std::string_view(kMagic, sizeof(kMagic)))
    return std::string("not a flashjit cache file: bad magic");
  Reader r(file.substr(sizeof(kMagic)));
  uint32_t version = 0;
  uint64_t payload_size = 0;
  std::string_view key, digest;
  r.u32(version);
  r.take(kKeyChars, key);
  r.u64(payload_size);
  r.take(32, digest);
  if (version != kFormatVersion && version != 1)
    return fmt::format("format version {}, this flashjit reads 1 and {}", version, kFormatVersion);
  if (!is_key(key))
    return std::string("garbled key in the header");
  if (key != expected_key)
    return fmt::format("it holds the entry of key {}, not {}", key.substr(0, 16),
                       expected_key.substr(0, 16));
  const uint64_t have = file.size() - kHeaderBytes;
  if (have < payload_size)
    return fmt::format("truncated: {} of {} payload bytes", have, payload_size);
  if (have > payload_size)
    return fmt::format("{} stray bytes after the payload", have - payload_size);
  std::string_view payload = file.substr(kHeaderBytes);
  Digest actual = sha256(payload);
  if (std::string_view(reinterpret_cast<const char *>(actual.data()), actual.size()) != digest)
    return std::string("checksum mismatch: the payload was altered");

  Entry e;
  Reader p(payload);
  uint64_t code_size = 0;
  std::string_view code;
  if (!p.str32(e.code.arch) || !p.str32(e.code.compiler) || !p.str32(e.target_id) ||
      (version >= 2 && !p.str32(e.label)) || !p.u64(code_size) || !p.take(code_size, code) ||
      !p.done())
    return std::string("malformed payload");
  e.code.bytes.assign(code.begin(), code.end());
  return e;
}

// ---- files -----------------------------------------------------------------

std::string errno_text() { return std::strerror(errno); }

/// Creates `dir` and any missing parents, each user-only (0700); an existing
/// `dir` must pass check_private_dir.
Status make_private_dirs(const std::string &dir) {
  std::filesystem::path path(dir), partial;
  for (const auto &part : path) {
    partial /= part;
    if (part.empty() || part == "/")
      continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
      return Status::error("cannot create {}: {}", partial.string(), errno_text());
  }
  return check_private_dir(dir, "FLASHJIT_CACHE_DIR");
}

enum class ReadResult { missing, ok, failed };

/// Reads an entry file completely: never through a symbolic link, never a
/// FIFO or device (it could block forever), never more than kMaxEntryBytes.
ReadResult read_file(const std::string &path, std::string &out, std::string &why) {
  FileRead r = read_regular_file(path, kMaxEntryBytes, Links::refuse);
  switch (r.result) {
  case FileRead::Result::missing:
    return ReadResult::missing;
  case FileRead::Result::refused:
    why = std::move(r.why);
    return ReadResult::failed;
  case FileRead::Result::ok:
    break;
  }
  out = std::move(r.bytes);
  return ReadResult::ok;
}

/// The start of a file named like an entry, read only as far as the header:
/// never through a symbolic link, never blocking on a FIFO.
struct Head {
  enum class Result { ok, missing, refused } result = Result::missing;
  std::string bytes; ///< up to kHeaderBytes
  struct stat st{};  ///< of the opened file
  std::string why;   ///< for Result::refused: why it cannot be an entry
};

Head read_head(const std::string &path) {
  Head h;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) { // else removed meanwhile
      h.result = Head::Result::refused;
      h.why = errno == ELOOP ? std::string("a symbolic link, not a cache entry")
                             : "cannot open: " + errno_text();
    }
    return h;
  }
  h.result = Head::Result::refused;
  ssize_t n = -1;
  h.bytes.assign(kHeaderBytes, '\0');
  if (::fstat(fd, &h.st) == 0 && S_ISREG(h.st.st_mode))
    n = ::read(fd, h.bytes.data(), h.bytes.size());
  const int read_errno = errno;
  ::close(fd);
  if (!S_ISREG(h.st.st_mode)) {
    h.why = "not a regular file, so not a cache entry";
  } else if (n < 0) {
    h.why = std::string("cannot read: ") + std::strerror(read_errno);
  } else {
    h.bytes.resize(size_t(n));
    h.result = Head::Result::ok;
  }
  return h;
}

/// Renews the modification time of an entry file: its "last used" for the
/// disk limit. Best effort: a file removed meanwhile needs no renewal.
void touch(const std::string &path) {
  const timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  ::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);
}

/// Why the start of `file`, named for `key`, is not a header this cache wrote
/// (any format version), or empty if it is. A temporary file may hold only the
/// beginning of one (`partial`): its writer died mid-write.
std::string foreign_header(std::string_view file, std::string_view key, bool partial) {
  if (!partial && file.size() < kHeaderBytes)
    return fmt::format("{} bytes, shorter than the {}-byte header", file.size(), kHeaderBytes);
  const std::string_view magic(kMagic, sizeof(kMagic));
  if (file.substr(0, sizeof(kMagic)) != magic.substr(0, std::min(file.size(), sizeof(kMagic))))
    return "bad magic";
  constexpr size_t key_at = sizeof(kMagic) + 4;
  if (file.size() > key_at &&
      file.substr(key_at, kKeyChars) != key.substr(0, std::min(file.size() - key_at, kKeyChars)))
    return "its header names another key";
  return {};
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory, fsync, rename over `path`, fsync of the directory.
Status write_atomic(const std::string &dir, std::string_view key, const std::string &path,
                    std::string_view bytes) {
  std::string temp = dir + "/" + std::string(kTempPrefix) + std::string(key) + "-XXXXXX";
  int fd = ::mkstemp(temp.data()); // mode 0600
  if (fd < 0)
    return Status::error("cannot create a temporary file in {}: {}", dir, errno_text());
  auto fail = [&](const std::string &what) {
    Status s = Status::error("{} {}: {}", what, temp, errno_text());
    ::close(fd);
    ::unlink(temp.c_str());
    return s;
  };
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return fail("cannot write");
    done += size_t(n);
  }
  if (::fsync(fd) != 0)
    return fail("cannot fsync");
  if (::close(fd) != 0) {
    Status s = Status::error("cannot close {}: {}", temp, errno_text());
    ::unlink(temp.c_str());
    return s;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    Status s = Status::error("cannot rename {} to {}: {}", temp, path, errno_text());
    ::unlink(temp.c_str());
    return s;
  }
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd); // the rename itself survives a crash; best effort
    ::close(dfd);
  }
  return Status::ok();
}

/// The names in `dir` (not . and ..), sorted.
Expected<std::vector<std::string>> names_in(const std::string &dir) {
  std::vector<std::string> names;
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return Status::error("cannot read the cache directory {}: {}; fix its permissions or point "
                         "FLASHJIT_CACHE_DIR (or --dir) elsewhere",
                         dir, errno_text());
  while (dirent *e = ::readdir(d)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..")
      names.emplace_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace

// ---- KeyParts --------------------------------------------------------------

std::string KeyParts::hash() const {
  Sha256 h;
  auto part = [&](std::string_view s) {
    std::string size;
    put_u64(size, s.size());
    h.update(size);
    h.update(s);
  };
  part("flashjit kernel key v1");
  for (const std::string *s : key_fields(*this))
    part(*s);
  return to_hex(h.finish());
}

bool KeyParts::operator==(const KeyParts &other) const {
  const auto mine = key_fields(*this), theirs = key_fields(other);
  return std::ranges::equal(mine, theirs,
                            [](const std::string *a, const std::string *b) { return *a == *b; });
}

std::string_view flashjit_version() { return FLASHJIT_VERSION; }

std::string describe(const CompileOptions &o) {
  std::string flags;
  for (const std::string &f : o.extra_flags)
    flags += (flags.empty() ? "" : " ") + f;
  return fmt::format("arch={} features={} wave={} O{} flags=[{}]", o.arch, o.features, o.wave_size,
                     o.opt_level, flags);
}

std::string_view outcome_name(CacheOutcome o) {
  switch (o) {
  case CacheOutcome::memory_hit:
    return "memory hit";
  case CacheOutcome::disk_hit:
    return "disk hit";
  case CacheOutcome::compiled:
    return "compiled";
  }
  return "?";
}

// ---- KernelCache -----------------------------------------------------------

struct KernelCache::Impl {
  std::string dir;
  Status dir_status; // why the directory is unusable, if it is
  int64_t budget = 0;
  bool always_compile = false;

  mutable std::mutex mutex; // everything below
  int64_t disk_limit = kDefaultCacheMaxBytes;
  /// A memory hit renews its entry file's modification time (the disk limit's
  /// "last used") at most this often.
  std::chrono::steady_clock::duration renew_every = std::chrono::seconds(60);
  /// An entry of the memory cache: its key (parts and hash) and code.
  struct Cached {
    KeyParts parts;
    std::string key;
    std::shared_ptr<const Entry> entry;
    /// When its file's modification time was last renewed.
    std::chrono::steady_clock::time_point touched = std::chrono::steady_clock::now();
    int64_t cost() const { return entry->cost() + key_cost(parts); }
  };
  using Lru = std::list<Cached>;
  Lru lru; // most recently used first
  std::unordered_map<MemoryKey, Lru::iterator, MemoryKeyHash> index;
  int64_t memory_bytes = 0;
  int64_t memory_hits = 0, disk_hits = 0, compiles = 0, rejected_files = 0, evicted_files = 0;
  /// Why the entry of a key (hex) could not be stored, until a store succeeds.
  std::unordered_map<std::string, std::string> store_failures;
  std::unordered_map<std::string, std::weak_ptr<std::mutex>> key_locks;
  std::set<std::string> reported;
  std::function<void(const std::string &)> reporter;

  bool disk() const { return !dir.empty() && dir_status.is_ok(); }
  std::string path(std::string_view key) const {
    return dir + "/" + std::string(key) + std::string(kSuffix);
  }

  /// Under `mutex`: the entry of `parts`, now the most recently used. When
  /// its file is due for a renewal (renew_every), `*renew` gets its path.
  std::shared_ptr<const Entry> find(const KeyParts &parts, std::string *renew) {
    auto it = index.find(memory_key(parts));
    if (it == index.end())
      return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    Cached &c = *it->second;
    if (disk()) {
      const auto now = std::chrono::steady_clock::now();
      if (now - c.touched >= renew_every) {
        c.touched = now;
        *renew = path(c.key);
      }
    }
    return c.entry;
  }

  void erase(Lru::iterator it) {
    memory_bytes -= it->cost();
    index.erase(memory_key(it->parts));
    lru.erase(it);
  }

  /// Under `mutex`: stores `e`, evicting the least recently used entries to
  /// stay within the budget (an entry larger than the whole budget is not kept).
  void store(const KeyParts &parts, const std::string &key, std::shared_ptr<const Entry> e) {
    if (auto it = index.find(memory_key(parts)); it != index.end())
      erase(it->second);
    Cached c{parts, key, std::move(e)};
    if (c.cost() > budget)
      return;
    memory_bytes += c.cost();
    lru.push_front(std::move(c));
    index[memory_key(lru.front().parts)] = lru.begin();
    while (memory_bytes > budget && !lru.empty())
      erase(std::prev(lru.end()));
  }

  std::shared_ptr<std::mutex> key_lock(const std::string &key) {
    std::lock_guard<std::mutex> lock(mutex);
    if (key_locks.size() > 64) // forget the locks nobody holds
      std::erase_if(key_locks, [](const auto &kv) { return kv.second.expired(); });
    std::shared_ptr<std::mutex> m = key_locks[key].lock();
    if (!m) {
      m = std::make_shared<std::mutex>();
      key_locks[key] = m;
    }
    return m;
  }

  /// Removes the least recently used entry files until the rest fit
  /// disk_limit; `kept` (the key just stored) stays. Outside `mutex`.
  void trim(std::string_view kept) {
    int64_t limit;
    {
      std::lock_guard<std::mutex> lock(mutex);
      limit = disk_limit;
    }
    if (limit <= 0)
      return;
    auto names = names_in(dir);
    if (!names) {
      report_once("trim", fmt::format("flashjit: cache: {}; the size cap "
                                      "(FLASHJIT_CACHE_MAX_BYTES) cannot be kept",
                                      names.status().message()));
      return;
    }
    struct File {
      std::string name;
      int64_t bytes;
      timespec used;
    };
    std::vector<File> files;
    int64_t total = 0;
    for (std::string &name : *names) {
      struct stat st{};
      if (entry_key(name).empty() || ::lstat((dir + "/" + name).c_str(), &st) != 0 ||
          !S_ISREG(st.st_mode))
        continue;
      total += st.st_size;
      files.push_back({std::move(name), st.st_size, st.st_mtim});
    }
    if (total <= limit)
      return;
    auto older = [](const File &a, const File &b) {
      return std::tie(a.used.tv_sec, a.used.tv_nsec, a.name) <
             std::tie(b.used.tv_sec, b.used.tv_nsec, b.name);
    };
    std::sort(files.begin(), files.end(), older);
    for (const File &f : files) {
      if (total <= limit)
        break;
      const std::string_view key = entry_key(f.name);
      if (key == kept)
        continue;
      const std::string file = dir + "/" + f.name;
      // Only an entry is removed, and only if no hit renewed it meanwhile.
      Head head = read_head(file);
      if (head.result != Head::Result::ok || !foreign_header(head.bytes, key, false).empty() ||
          head.st.st_mtim.tv_sec != f.used.tv_sec || head.st.st_mtim.tv_nsec != f.used.tv_nsec)
        continue;
      if (::unlink(file.c_str()) != 0) {
        if (errno != ENOENT)
          report_once("evict " + file, fmt::format("flashjit: cache: cannot remove {} to keep the "
                                                   "cache within {} bytes: {}",
                                                   file, limit, errno_text()));
        continue;
      }
      total -= f.bytes;
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++evicted_files;
      }
      debug_log(2, "cache: evicted {} ({} bytes, least recently used) to stay within {} bytes",
                file, f.bytes, limit);
    }
  }

  /// Reports `line` unless a line with the same `tag` was reported before.
  void report_once(const std::string &tag, const std::string &line) {
    std::function<void(const std::string &)> sink;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!reported.insert(tag).second)
        return;
      sink = reporter;
    }
    if (sink)
      sink(line);
    else
      fmt::print(stderr, "{}\n", line);
  }
};

KernelCache::KernelCache(std::string dir, int64_t memory_budget_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  while (impl_->dir.size() > 1 && impl_->dir.back() == '/')
    impl_->dir.pop_back();
  impl_->budget = memory_budget_bytes;
  if (!impl_->dir.empty())
    impl_->dir_status = make_private_dirs(impl_->dir);
}

KernelCache::~KernelCache() = default;

KernelCache &KernelCache::global() {
  static KernelCache *cache = [] {
    // Never destroyed: other static objects may compile while the process exits.
    auto *c = new KernelCache(knobs().cache_dir);
    c->set_always_compile(knobs().always_compile);
    c->set_disk_limit(knobs().cache_max_bytes);
    return c;
  }();
  return *cache;
}

void KernelCache::set_always_compile(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->always_compile = on;
}

void KernelCache::set_reporter(std::function<void(const std::string &)> reporter) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->reporter = std::move(reporter);
}

const std::string &KernelCache::directory() const { return impl_->dir; }

const Status &KernelCache::disk_status() const { return impl_->dir_status; }

void KernelCache::set_disk_limit(int64_t max_bytes, std::chrono::seconds renew_every) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->disk_limit = std::max<int64_t>(max_bytes, 0);
  impl_->renew_every = renew_every;
}

int64_t KernelCache::disk_limit() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->disk_limit;
}

Status KernelCache::stored(std::string_view key) const {
  const Impl &m = *impl_;
  if (!is_key(key))
    return Status::error("'{}' is not a cache key (64 lowercase hex digits)", key);
  if (m.dir.empty())
    return Status::error("the cache keeps kernels in memory only (it has no directory): set "
                         "FLASHJIT_CACHE_DIR");
  if (!m.dir_status)
    return m.dir_status;
  const std::string path = m.path(key);
  std::string bytes, why;
  const ReadResult read = read_file(path, bytes, why);
  if (read != ReadResult::ok) { // why this process could not store it, if it tried
    std::lock_guard<std::mutex> lock(m.mutex);
    if (auto it = m.store_failures.find(std::string(key)); it != m.store_failures.end())
      return Status::error("the kernel was compiled but not stored in {}: {}", m.dir, it->second);
  }
  switch (read) {
  case ReadResult::missing:
    return Status::error("{} holds no entry for key {}: it was never stored there, or was removed "
                         "since (by `flashjit cache clear`, or to keep the cache within "
                         "FLASHJIT_CACHE_MAX_BYTES); compile the kernel again",
                         m.dir, key.substr(0, 16));
  case ReadResult::failed:
    return Status::error("the entry {} cannot be read back ({}): remove it, and the kernel will "
                         "be compiled again",
                         path, why);
  case ReadResult::ok:
    break;
  }
  auto decoded = decode(bytes, key);
  if (auto *problem = std::get_if<std::string>(&decoded))
    return Status::error("the entry {} is corrupt ({}): remove it, and the kernel will be compiled "
                         "again",
                         path, *problem);
  return Status::ok();
}

Expected<std::string> KernelCache::path_for(std::string_view key) const {
  if (!is_key(key))
    return Status::error("'{}' is not a cache key (64 lowercase hex digits)", key);
  if (impl_->dir.empty())
    return Status::error("this cache keeps kernels in memory only");
  return impl_->path(key);
}

Expected<CodeObject>
KernelCache::get_or_compile(const KeyParts &parts,
                            const std::function<Expected<CodeObject>()> &compile,
                            CacheOutcome *outcome) {
  Impl &m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  std::string key; // the SHA-256 of `parts`, computed past the memory lookup
  auto done = [&](CacheOutcome o, const Entry &e) -> Expected<CodeObject> {
    if (outcome)
      *outcome = o;
    if (knobs().debug >= 1) {
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      debug_log(1, "cache: {} {} for {} ({}, {} bytes) in {:.3f} ms", outcome_name(o),
                (key.empty() ? parts.hash() : key).substr(0, 16), parts.target_id, e.code.compiler,
                e.code.bytes.size(), ms);
    }
    return e.code;
  };
  bool always;
  std::string renew; // an entry file whose "last used" is due for renewal
  auto memory_hit = [&](const Entry &e) {
    if (!renew.empty())
      touch(renew);
    return done(CacheOutcome::memory_hit, e);
  };
  {
    std::unique_lock<std::mutex> lock(m.mutex);
    always = m.always_compile;
    if (!always)
      if (std::shared_ptr<const Entry> e = m.find(parts, &renew)) {
        ++m.memory_hits;
        lock.unlock();
        return memory_hit(*e);
      }
  }
  key = parts.hash();

  // One compile per key in this process: the others wait here and then find
  // the entry in memory.
  std::shared_ptr<std::mutex> key_mutex = m.key_lock(key);
  std::lock_guard<std::mutex> key_guard(*key_mutex);
  if (!always) {
    std::unique_lock<std::mutex> lock(m.mutex);
    if (std::shared_ptr<const Entry> e = m.find(parts, &renew)) {
      ++m.memory_hits;
      lock.unlock();
      return memory_hit(*e);
    }
  }

  if (!m.dir.empty() && !m.dir_status)
    m.report_once("dir", fmt::format("flashjit: cache: {}; keeping kernels in memory only",
                                     m.dir_status.message()));
  const std::string path = m.disk() ? m.path(key) : std::string();
  if (!always && m.disk()) {
    std::string bytes, why;
    ReadResult r = read_file(path, bytes, why);
    if (r == ReadResult::ok) {
      auto decoded = decode(bytes, key);
      if (auto *e = std::get_if<Entry>(&decoded)) {
        auto entry = std::make_shared<const Entry>(std::move(*e));
        {
          std::lock_guard<std::mutex> lock(m.mutex);
          ++m.disk_hits;
          m.store(parts, key, entry);
        }
        touch(path); // used now: the last to go when the disk limit bites
        debug_log(2, "cache: read {}", path);
        return done(CacheOutcome::disk_hit, *entry);
      }
      why = std::get<std::string>(decoded);
    }
    if (r != ReadResult::missing) {
      {
        std::lock_guard<std::mutex> lock(m.mutex);
        ++m.rejected_files;
      }
      m.report_once(path + "\n" + why,
                    fmt::format("flashjit: cache: {} is corrupt ({}); recompiling", path, why));
    }
  }

  Expected<CodeObject> code = compile();
  if (!code)
    return code.status();
  auto entry = std::make_shared<const Entry>(Entry{code.take(), parts.target_id, parts.label});
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    ++m.compiles;
    m.store(parts, key, entry);
  }
  if (m.disk()) {
    const std::string file = encode(key, *entry);
    const int64_t limit = disk_limit();
    Status s;
    if (int64_t(file.size()) > kMaxEntryBytes)
      s = Status::error("the kernel of key {} takes {} bytes, more than the {} a cache entry may",
                        key.substr(0, 16), file.size(), kMaxEntryBytes);
    else if (limit > 0 && int64_t(file.size()) > limit)
      s = Status::error("the kernel of key {} takes {} bytes, more than the cache's whole limit of "
                        "{} (FLASHJIT_CACHE_MAX_BYTES): raise the limit, or set it to 0 for none",
                        key.substr(0, 16), file.size(), limit);
    else if (s = write_atomic(m.dir, key, path, file); !s)
      s = Status::error("{}; free space in {} or fix its permissions, or point "
                        "FLASHJIT_CACHE_DIR (or --dir) at another directory",
                        s.message(), m.dir);
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      if (s) {
        m.store_failures.erase(key);
      } else {
        if (m.store_failures.size() >= kMaxStoreFailures) // stored() then says less
          m.store_failures.clear();
        m.store_failures[key] = s.message();
      }
    }
    if (!s) {
      m.report_once("write " + path, fmt::format("flashjit: cache: {}; the kernel is kept in "
                                                 "memory only",
                                                 s.message()));
    } else {
      debug_log(2, "cache: wrote {}", path);
      m.trim(key);
    }
  }
  return done(CacheOutcome::compiled, *entry);
}

CacheStats KernelCache::stats() const {
  CacheStats s;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    s.memory_entries = int64_t(impl_->lru.size());
    s.memory_bytes = impl_->memory_bytes;
    s.memory_hits = impl_->memory_hits;
    s.disk_hits = impl_->disk_hits;
    s.compiles = impl_->compiles;
    s.rejected_files = impl_->rejected_files;
    s.evicted_files = impl_->evicted_files;
    s.disk_limit = impl_->disk_limit;
  }
  if (!impl_->disk())
    return s;
  if (auto names = names_in(impl_->dir))
    for (const std::string &name : *names) {
      if (entry_key(name).empty())
        continue;
      struct stat st{};
      if (::lstat((impl_->dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        ++s.disk_entries;
        s.disk_bytes += st.st_size;
      }
    }
  return s;
}

Expected<std::vector<CacheEntryInfo>> KernelCache::list() const {
  std::vector<CacheEntryInfo> out;
  if (impl_->dir.empty())
    return out;
  if (!impl_->dir_status)
    return impl_->dir_status;
  auto names = names_in(impl_->dir);
  if (!names)
    return names.status();
  for (const std::string &name : *names) {
    std::string_view key = entry_key(name);
    if (key.empty())
      continue;
    CacheEntryInfo info;
    info.key = std::string(key);
    info.path = impl_->path(key);
    std::string bytes;
    ReadResult r = read_file(info.path, bytes, info.problem);
    if (r == ReadResult::missing)
      continue; // removed meanwhile
    if (r == ReadResult::ok) {
      info.file_bytes = int64_t(bytes.size());
      auto decoded = decode(bytes, key);
      if (auto *e = std::get_if<Entry>(&decoded)) {
        info.target_id = e->target_id;
        info.label = e->label;
        info.compiler_identity = e->code.compiler;
        info.arch = e->code.arch;
        info.bytes = int64_t(e->code.bytes.size());
      } else {
        info.problem = std::get<std::string>(decoded);
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Expected<ClearResult> KernelCache::clear() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->lru.clear();
    impl_->index.clear();
    impl_->memory_bytes = 0;
  }
  ClearResult result;
  if (impl_->dir.empty())
    return result;
  if (!impl_->dir_status)
    return impl_->dir_status;
  auto names = names_in(impl_->dir);
  if (!names)
    return names.status();
  const auto now = std::chrono::system_clock::now();
  for (const std::string &name : *names) {
    const bool temp = is_temp_name(name);
    const std::string_view key =
        temp ? std::string_view(name).substr(kTempPrefix.size(), kKeyChars) : entry_key(name);
    if (key.empty())
      continue; // not a name this cache gives: someone else's file
    const std::string path = impl_->dir + "/" + name;
    auto leave = [&](std::string_view why) {
      result.problems.push_back(fmt::format("{}: {}; left in place", path, why));
    };
    // Only the header is read: enough to tell an entry from anything else.
    Head head = read_head(path);
    if (head.result == Head::Result::missing)
      continue;
    if (head.result == Head::Result::refused) {
      leave(head.why);
      continue;
    }
    // A fresh temporary file may be another process's write in progress.
    if (temp && now - std::chrono::system_clock::from_time_t(head.st.st_mtime) < kStaleTemp)
      continue;
    if (std::string why = foreign_header(head.bytes, key, temp); !why.empty()) {
      leave(fmt::format("not a flashjit cache entry ({})", why));
      continue;
    }
    if (::unlink(path.c_str()) == 0)
      ++result.removed;
    else if (errno != ENOENT)
      leave("cannot remove it: " + errno_text());
  }
  return result;
}

} // namespace flashjit::compiler
