// The tuned-config database: the configs `flashjit tune` measured fastest on a
// device, one per (target, kernel signature), kept in <cache dir>/tuned.json and
// taken by pipeline::generate for the forward kernel when Options::config is unset.
#pragma once

#include "ir/build.h"
#include "ir/status.h"

#include <string>
#include <string_view>
#include <vector>

namespace flashjit::runtime {

/// One tuned signature: where it was measured and what won.
struct TunedEntry {
  std::string target;        ///< lowering::Target::target_id(), e.g. "sm_90" or "gfx1201"
  std::string signature;     ///< KernelSignature::summary() of the spec
  ir::Config config;         ///< the fastest config that passed the float64 check
  std::string device;        ///< the device's name, e.g. "NVIDIA H100 80GB HBM3"
  std::string shape;         ///< the spec it was timed on (AttentionSpec::summary())
  double micros = 0;         ///< its time there, microseconds per forward
  double default_micros = 0; ///< the rules' default config's time there
};

class TunedConfigs {
public:
  /// <FLASHJIT_CACHE_DIR or its default>/tuned.json.
  static std::string default_path();

  /// Reads `path`; a missing file is an empty database. A file that is not a
  /// database (bad JSON, a field missing or of the wrong type, an invalid
  /// config) is an error naming the file and the fix.
  static Expected<TunedConfigs> load(const std::string &path);

  /// The database at default_path(), read once and again when the file
  /// changes (size or modification time), shared by every thread.
  static Expected<TunedConfigs> current();

  const TunedEntry *find(std::string_view target, std::string_view signature) const;
  /// Adds `entry`, replacing the one of its target and signature.
  void put(TunedEntry entry);
  /// Writes the database atomically (the directory is created 0700).
  Status save(const std::string &path) const;

  const std::vector<TunedEntry> &entries() const { return entries_; }

private:
  std::vector<TunedEntry> entries_;
};

} // namespace flashjit::runtime
