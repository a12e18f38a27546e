#include "runtime/tuned.h"

#include "compiler/knobs.h"
#include "compiler/safe_file.h"

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <mutex>

namespace flashjit::runtime {
namespace {

constexpr int kVersion = 1;
/// Far more than any database of real entries; a bigger file is not one.
constexpr int64_t kMaxBytes = 16 << 20;

nlohmann::json config_json(const ir::Config &c) {
  return {
      {"block_m", c.block_m}, {"block_n", c.block_n},       {"waves", c.waves},
      {"stages", c.stages},   {"q_in_lds", c.q_in_lds},     {"pad_k", c.pad_k},
      {"mma_m", c.mma_m},     {"persistent", c.persistent}, {"prefetch_blocks", c.prefetch_blocks}};
}

ir::Config config_from(const nlohmann::json &j) {
  ir::Config c;
  c.block_m = j.at("block_m").get<int64_t>();
  c.block_n = j.at("block_n").get<int64_t>();
  c.waves = j.at("waves").get<int64_t>();
  c.stages = j.at("stages").get<int64_t>();
  c.q_in_lds = j.at("q_in_lds").get<bool>();
  c.pad_k = j.at("pad_k").get<int64_t>();
  c.mma_m = j.at("mma_m").get<int64_t>();
  c.persistent = j.value("persistent", false);           // absent before session 20
  c.prefetch_blocks = j.value("prefetch_blocks", false); // absent before session 28
  return c;
}

} // namespace

std::string TunedConfigs::default_path() { return compiler::knobs().cache_dir + "/tuned.json"; }

Expected<TunedConfigs> TunedConfigs::load(const std::string &path) {
  using compiler::FileRead;
  const FileRead file = compiler::read_regular_file(path, kMaxBytes, compiler::Links::follow);
  TunedConfigs db;
  if (file.result == FileRead::Result::missing)
    return db;
  const std::string fix = fmt::format(
      "run flashjit tune again to rewrite it, or remove {} to use the rules' defaults", path);
  if (file.result == FileRead::Result::refused)
    return Status::error("tuned configs: cannot read {}: {}; {}", path, file.why, fix);
  try {
    const nlohmann::json j = nlohmann::json::parse(file.bytes);
    if (j.at("version").get<int>() != kVersion)
      return Status::error("tuned configs: {} is version {}, this library reads version {}; {}",
                           path, j.at("version").dump(), kVersion, fix);
    for (const nlohmann::json &e : j.at("entries")) {
      TunedEntry entry;
      entry.target = e.at("target").get<std::string>();
      entry.signature = e.at("signature").get<std::string>();
      entry.config = config_from(e.at("config"));
      entry.device = e.at("device").get<std::string>();
      entry.shape = e.at("shape").get<std::string>();
      entry.micros = e.at("us").get<double>();
      entry.default_micros = e.at("default_us").get<double>();
      if (Status s = ir::validate(entry.config); !s)
        return Status::error("tuned configs: {}: the entry of {} on {} has an invalid config: "
                             "{}; {}",
                             path, entry.signature, entry.target, s.message(), fix);
      db.put(std::move(entry));
    }
  } catch (const nlohmann::json::exception &e) {
    return Status::error("tuned configs: {} is not a tuned-config database ({}); {}", path,
                         e.what(), fix);
  }
  return db;
}

Expected<TunedConfigs> TunedConfigs::current() {
  // Keyed by the file's identity and modification, so an edit or a new tune
  // is seen by the next create().
  struct Loaded {
    std::string path;
    struct timespec mtime{};
    off_t size = -1;
    ino_t inode = 0;
    TunedConfigs db;
  };
  static std::mutex mutex;
  static Loaded loaded;
  const std::string path = default_path();
  struct stat st{};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  std::lock_guard<std::mutex> lock(mutex);
  const bool same =
      loaded.path == path && loaded.size == (exists ? st.st_size : -1) &&
      (!exists || (loaded.inode == st.st_ino && loaded.mtime.tv_sec == st.st_mtim.tv_sec &&
                   loaded.mtime.tv_nsec == st.st_mtim.tv_nsec));
  if (same)
    return loaded.db;
  auto db = load(path);
  if (!db)
    return db.status();
  loaded = {path, exists ? st.st_mtim : timespec{}, exists ? st.st_size : -1,
            exists ? st.st_ino : 0, *db};
  return loaded.db;
}

const TunedEntry *TunedConfigs::find(std::string_view target, std::string_view signature) const {
  for (const TunedEntry &e : entries_)
    if (e.target == target && e.signature == signature)
      return &e;
  return nullptr;
}

void TunedConfigs::put(TunedEntry entry) {
  for (TunedEntry &e : entries_)
    if (e.target == entry.target && e.signature == entry.signature) {
      e = std::move(entry);
      return;
    }
  entries_.push_back(std::move(entry));
}

Status TunedConfigs::save(const std::string &path) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const TunedEntry &e : entries_)
    entries.push_back({{"target", e.target},
                       {"signature", e.signature},
                       {"config", config_json(e.config)},
                       {"device", e.device},
                       {"shape", e.shape},
                       {"us", e.micros},
                       {"default_us", e.default_micros}});
  const nlohmann::json j = {{"version", kVersion}, {"entries", entries}};
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    std::error_code error;
    if (!std::filesystem::exists(dir, error)) {
      std::filesystem::create_directories(dir, error);
      if (!error)
        std::filesystem::permissions(dir, std::filesystem::perms::owner_all, error);
      if (error)
        return Status::error("tuned configs: cannot create {}: {}", dir, error.message());
    }
    FJ_RETURN_IF_ERROR(compiler::check_private_dir(dir, "FLASHJIT_CACHE_DIR"));
  }
  return compiler::write_file_atomic(path, j.dump(2) + "\n", compiler::Existing::replace)
      .with_context("tuned configs");
}

} // namespace flashjit::runtime
