#include "tools/safe_write.h"

#include "compiler/safe_file.h"

#include <sys/stat.h>

#include <filesystem>

namespace flashjit::cli {

FlagSpec force_flag() {
  return {"--force", "", "replace output files that exist already (never through a symbolic link)",
          ""};
}

Status write_output(const std::string &path, std::string_view bytes, bool force) {
  return compiler::write_file_atomic(
      path, bytes, force ? compiler::Existing::replace : compiler::Existing::refuse);
}

Status check_outputs_absent(const std::string &dir, const std::vector<std::string> &names,
                            bool force) {
  if (force)
    return Status::ok();
  std::string existing;
  for (const std::string &name : names) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    struct stat st{};
    if (::lstat(path.c_str(), &st) == 0)
      existing += (existing.empty() ? "" : ", ") + name;
  }
  if (existing.empty())
    return Status::ok();
  return Status::error("{} already holds {}: nothing was written; choose another directory, "
                       "remove them, or pass --force to replace them",
                       dir, existing);
}

} // namespace flashjit::cli
