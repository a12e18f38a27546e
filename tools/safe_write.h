// Files the flashjit tool writes for its user (`emit -o`, `compile -o`,
// `run --save-dir`): written whole or not at all, never through a symbolic
// link, never over an existing file unless --force asks for it.
#pragma once

#include "tools/cli.h"

#include <string>
#include <string_view>
#include <vector>

namespace flashjit::cli {

/// The --force switch of every command that writes files.
FlagSpec force_flag();

/// Writes `bytes` to `path` (compiler::write_file_atomic): a full disk leaves
/// `path` as it was, a symbolic link there is replaced rather than followed,
/// and an existing `path` is refused unless `force`.
Status write_output(const std::string &path, std::string_view bytes, bool force);

/// Before a command writes the files `names` into `dir` (--save-dir): refuses,
/// unless `force`, when any of them exists already (also as a dangling
/// symbolic link), naming every one, so that a refusal never leaves half of a
/// set written. Writing each file still refuses on its own (write_output,
/// npy::write), so a file created meanwhile is not overwritten either.
Status check_outputs_absent(const std::string &dir, const std::vector<std::string> &names,
                            bool force);

} // namespace flashjit::cli
