// Files in directories a user names (the cache, FLASHJIT_DUMP_DIR and
// FLASHJIT_OVERRIDE_DIR, `--save-dir`, `-o`): what flashjit reads there can
// neither hang it nor exhaust its memory, and what it writes there is whole or
// absent, never written through a symbolic link, and never replaces a file the
// caller did not ask to replace.
#pragma once

#include "ir/status.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace flashjit::compiler {

/// Whether a symbolic link at the final component of a path is followed.
enum class Links { follow, refuse };

/// A file read whole, or why it was not.
struct FileRead {
  enum class Result { ok, missing, refused };
  Result result = Result::missing;
  std::string bytes; ///< the contents, for Result::ok
  /// For Result::refused, the problem in a few words that read well after the
  /// path: "a symbolic link", "a FIFO, not a regular file", "8589934592 bytes,
  /// more than the 268435456 allowed", "unreadable: Permission denied".
  std::string why;
};

/// Reads the regular file at `path` whole. It is opened O_NONBLOCK (a FIFO
/// never blocks the open) and, for Links::refuse, O_NOFOLLOW; then fstat()
/// decides before anything is read or allocated: a FIFO, a socket, a device, a
/// directory or a file larger than `max_bytes` is refused.
FileRead read_regular_file(const std::string &path, int64_t max_bytes, Links links);

/// What write_file_atomic does when `path` exists already.
enum class Existing { refuse, replace };

/// Writes `bytes` to `path` so that a failure loses nothing: into a new
/// temporary file in the same directory (created O_EXCL | O_NOFOLLOW, mode
/// 0666 less the umask), fsync()ed, closed with its error checked, then renamed
/// to `path`. A symbolic link at `path` is never followed: Existing::replace
/// replaces the link itself, Existing::refuse fails on it as on any existing
/// file, atomically (rename without replace). On every error `path` is as it
/// was and the temporary file is gone; the message names the path, the cause
/// (e.g. "No space left on device") and what to do.
Status write_file_atomic(const std::string &path, std::string_view bytes, Existing existing);

} // namespace flashjit::compiler
