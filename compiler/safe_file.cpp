// Bounded reads and atomic, link-safe writes (see safe_file.h).
#include "compiler/safe_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace flashjit::compiler {
namespace {

std::string errno_text() { return std::strerror(errno); }

/// What a file that is not a regular one is, for messages.
std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  return "a special file";
}

/// Closes `fd` on scope exit unless released.
class FileDescriptor {
public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  FileDescriptor(const FileDescriptor &) = delete;
  FileDescriptor &operator=(const FileDescriptor &) = delete;
  int get() const { return fd_; }
  /// Closes now; the close's own result (NFS and full disks report there).
  int close() {
    int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

private:
  int fd_;
};

/// A name for a new temporary file next to `base` in `dir`: the name cannot
/// be guessed in advance, and O_EXCL makes a clash (or a planted file) a retry.
std::string temp_name(const std::string &dir, std::string_view base) {
  static std::atomic<uint64_t> counter{0};
  uint64_t x = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (uint64_t(::getpid()) << 32) ^ (counter++ * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  // Keep the name within NAME_MAX whatever the length of `base`.
  return fmt::format("{}/.{}.tmp-{:016x}", dir, base.substr(0, 160), x);
}

/// Moves `temp` to `path` unless `path` exists (also as a dangling link):
/// rename without replace where the file system has it, else by claiming the
/// name with an exclusive create first and renaming over that claim.
int rename_no_replace(const std::string &temp, const std::string &path) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0)
    return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EPERM)
    return -1;
  int claim = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (claim < 0)
    return -1;
  ::close(claim);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(path.c_str());
    errno = saved;
    return -1;
  }
  return 0;
}

} // namespace

FileRead read_regular_file(const std::string &path, int64_t max_bytes, Links links) {
  FileRead r;
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (links == Links::refuse ? O_NOFOLLOW : 0);
  FileDescriptor fd(::open(path.c_str(), flags));
  if (fd.get() < 0) {
    if (errno == ENOENT)
      return r; // Result::missing
    r.result = FileRead::Result::refused;
    r.why = errno == ELOOP && links == Links::refuse ? "a symbolic link"
                                                     : "unreadable: " + errno_text();
    return r;
  }
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) {
    r.result = FileRead::Result::refused;
    r.why = "unreadable: " + errno_text();
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.result = FileRead::Result::refused;
    r.why = fmt::format("{}, not a regular file", file_kind(st.st_mode));
    return r;
  }
  if (st.st_size > max_bytes) {
    r.result = FileRead::Result::refused;
    r.why = fmt::format("{} bytes, more than the {} allowed", int64_t(st.st_size), max_bytes);
    return r;
  }
  r.bytes.resize(size_t(st.st_size));
  size_t done = 0;
  while (done < r.bytes.size()) {
    ssize_t n = ::read(fd.get(), r.bytes.data() + done, r.bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      r.result = FileRead::Result::refused;
      r.why = "unreadable: " + errno_text();
      r.bytes.clear();
      return r;
    }
    if (n == 0)
      break;
    done += size_t(n);
  }
  r.bytes.resize(done); // a file that shrank while read: the callers' formats catch it
  r.result = FileRead::Result::ok;
  return r;
}

Status write_file_atomic(const std::string &path, std::string_view bytes, Existing existing) {
  const std::filesystem::path p(path);
  const std::string base = p.filename().string();
  if (base.empty() || base == "." || base == "..")
    return Status::error("cannot write '{}': it names a directory, not a file; give a file name",
                         path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : std::string(".");

  std::string temp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    temp = temp_name(dir, base);
    raw_fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (raw_fd < 0 && errno != EEXIST)
      break;
  }
  if (raw_fd < 0)
    return Status::error("cannot write {}: cannot create a temporary file in {}: {}; check that "
                         "the directory exists and that you may write there",
                         path, dir, errno_text());
  FileDescriptor fd(raw_fd);
  // Every failure from here on removes the temporary file and leaves `path` alone.
  auto fail = [&](std::string_view what) {
    Status s = Status::error("cannot write {}: {}: {}; {} was left as it was (free some space or "
                             "write elsewhere if the disk is full)",
                             path, what, errno_text(), path);
    ::unlink(temp.c_str());
    return s;
  };
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      return fail(fmt::format("writing failed after {} of {} bytes", done, bytes.size()));
    }
    done += size_t(n);
  }
  if (::fsync(fd.get()) != 0)
    return fail("fsync failed");
  if (fd.close() != 0)
    return fail("close failed");

  if (existing == Existing::replace) {
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      Status s = errno == EISDIR
                     ? Status::error("cannot write {}: it is a directory; give a file name", path)
                     : Status::error("cannot write {}: renaming {} to it failed: {}", path, temp,
                                     errno_text());
      ::unlink(temp.c_str());
      return s;
    }
  } else if (rename_no_replace(temp, path) != 0) {
    Status s =
        errno == EEXIST
            ? Status::error("{} already exists and was left as it was: remove it, choose another "
                            "name, or pass --force to replace it",
                            path)
            : Status::error("cannot write {}: renaming {} to it failed: {}", path, temp,
                            errno_text());
    ::unlink(temp.c_str());
    return s;
  }
  // The data survives a crash (fsync above); so does its name, on a best effort.
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

} // namespace flashjit::compiler
