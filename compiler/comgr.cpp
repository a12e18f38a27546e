// comgr through a function table filled with dlsym (no amd_comgr.h). Every
// comgr handle type is `struct { uint64_t handle; }` passed by value and every
// enum a C int, so one Handle type and int stand in for all of them.
#include "compiler/comgr.h"

#include "target/arch.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace flashjit::compiler {
namespace {

struct Handle {
  uint64_t handle = 0;
};
using ComgrStatus = int;
constexpr ComgrStatus kSuccess = 0;

// The values of amd_comgr.h that are used here (stable since comgr 2.0).
constexpr int kDataSource = 0x1;            // AMD_COMGR_DATA_KIND_SOURCE
constexpr int kDataLog = 0x5;               // AMD_COMGR_DATA_KIND_LOG
constexpr int kDataExecutable = 0x8;        // AMD_COMGR_DATA_KIND_EXECUTABLE
constexpr int kDisassembleExecutable = 0xC; // AMD_COMGR_ACTION_DISASSEMBLE_EXECUTABLE_TO_SOURCE
constexpr int kMetadataString = 0x1;        // AMD_COMGR_METADATA_KIND_STRING

struct ComgrApi {
  void (*get_version)(size_t *major, size_t *minor);
  ComgrStatus (*status_string)(ComgrStatus status, const char **text);
  ComgrStatus (*get_isa_count)(size_t *count);
  ComgrStatus (*get_isa_name)(size_t index, const char **name);
  ComgrStatus (*create_data)(int kind, Handle *data);
  ComgrStatus (*release_data)(Handle data);
  ComgrStatus (*set_data)(Handle data, size_t size, const char *bytes);
  ComgrStatus (*set_data_name)(Handle data, const char *name);
  ComgrStatus (*get_data)(Handle data, size_t *size, char *bytes);
  ComgrStatus (*get_data_isa_name)(Handle data, size_t *size, char *isa_name);
  ComgrStatus (*create_data_set)(Handle *set);
  ComgrStatus (*destroy_data_set)(Handle set);
  ComgrStatus (*data_set_add)(Handle set, Handle data);
  ComgrStatus (*action_data_count)(Handle set, int kind, size_t *count);
  ComgrStatus (*action_data_get_data)(Handle set, int kind, size_t index, Handle *data);
  ComgrStatus (*create_action_info)(Handle *info);
  ComgrStatus (*destroy_action_info)(Handle info);
  ComgrStatus (*action_info_set_isa_name)(Handle info, const char *isa_name);
  ComgrStatus (*action_info_set_logging)(Handle info, bool logging);
  ComgrStatus (*do_action)(int kind, Handle info, Handle input, Handle result);
  ComgrStatus (*get_data_metadata)(Handle data, Handle *metadata);
  ComgrStatus (*destroy_metadata)(Handle metadata);
  ComgrStatus (*get_metadata_kind)(Handle metadata, int *kind);
  ComgrStatus (*get_metadata_string)(Handle metadata, size_t *size, char *text);
  ComgrStatus (*metadata_lookup)(Handle metadata, const char *key, Handle *value);
  ComgrStatus (*get_metadata_list_size)(Handle metadata, size_t *size);
  ComgrStatus (*index_list_metadata)(Handle metadata, size_t index, Handle *value);
};

struct Comgr {
  ComgrApi api{};
  std::string path;
  std::string version; // "2.4"
  std::vector<std::string> isas;
  std::string describe() const { return fmt::format("comgr {} ({})", version, path); }
};

/// Binds every field; the first missing symbol, or nullptr.
const char *bind(void *handle, ComgrApi &api) {
  const char *missing = nullptr;
  auto one = [&](auto &field, const char *name) {
    void *symbol = dlsym(handle, name);
    if (!symbol && !missing)
      missing = name;
    std::memcpy(&field, &symbol, sizeof(symbol));
  };
  one(api.get_version, "amd_comgr_get_version");
  one(api.status_string, "amd_comgr_status_string");
  one(api.get_isa_count, "amd_comgr_get_isa_count");
  one(api.get_isa_name, "amd_comgr_get_isa_name");
  one(api.create_data, "amd_comgr_create_data");
  one(api.release_data, "amd_comgr_release_data");
  one(api.set_data, "amd_comgr_set_data");
  one(api.set_data_name, "amd_comgr_set_data_name");
  one(api.get_data, "amd_comgr_get_data");
  one(api.get_data_isa_name, "amd_comgr_get_data_isa_name");
  one(api.create_data_set, "amd_comgr_create_data_set");
  one(api.destroy_data_set, "amd_comgr_destroy_data_set");
  one(api.data_set_add, "amd_comgr_data_set_add");
  one(api.action_data_count, "amd_comgr_action_data_count");
  one(api.action_data_get_data, "amd_comgr_action_data_get_data");
  one(api.create_action_info, "amd_comgr_create_action_info");
  one(api.destroy_action_info, "amd_comgr_destroy_action_info");
  one(api.action_info_set_isa_name, "amd_comgr_action_info_set_isa_name");
  one(api.action_info_set_logging, "amd_comgr_action_info_set_logging");
  one(api.do_action, "amd_comgr_do_action");
  one(api.get_data_metadata, "amd_comgr_get_data_metadata");
  one(api.destroy_metadata, "amd_comgr_destroy_metadata");
  one(api.get_metadata_kind, "amd_comgr_get_metadata_kind");
  one(api.get_metadata_string, "amd_comgr_get_metadata_string");
  one(api.metadata_lookup, "amd_comgr_metadata_lookup");
  one(api.get_metadata_list_size, "amd_comgr_get_metadata_list_size");
  one(api.index_list_metadata, "amd_comgr_index_list_metadata");
  return missing;
}

const std::vector<const char *> kFiles = {"libamd_comgr.so", "libamd_comgr.so.3",
                                          "libamd_comgr.so.2"};

/// The library, loaded once per process (never unloaded), or why not.
const Expected<const Comgr *> &comgr() {
  static const Expected<const Comgr *> loaded = []() -> Expected<const Comgr *> {
    std::string tried;
    for (const std::string &candidate : comgr_search_paths()) {
      const bool on_loader_path = candidate.find('/') == std::string::npos;
      tried += (tried.empty() ? "" : ", ") + candidate + (on_loader_path ? " (loader path)" : "");
      void *handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char *e = dlerror();
        std::string why = e ? e : "";
        if (why.find("No such file") == std::string::npos)
          tried += " (found, but it does not load: " + why + ")";
        continue;
      }
      auto *c = new Comgr; // lives as long as the process
      if (const char *missing = bind(handle, c->api)) {
        tried += fmt::format(" (found, but it lacks {})", missing);
        delete c;
        dlclose(handle);
        continue;
      }
      size_t major = 0, minor = 0;
      c->api.get_version(&major, &minor);
      c->version = fmt::format("{}.{}", major, minor);
      Dl_info info{};
      void *address = nullptr;
      std::memcpy(&address, &c->api.get_version, sizeof(address));
      c->path = dladdr(address, &info) && info.dli_fname ? info.dli_fname : candidate;
      size_t count = 0;
      if (c->api.get_isa_count(&count) == kSuccess)
        for (size_t i = 0; i < count; ++i) {
          const char *name = nullptr;
          if (c->api.get_isa_name(i, &name) == kSuccess && name)
            c->isas.emplace_back(name);
        }
      return c;
    }
    return Status::error("comgr (libamd_comgr.so) not found: tried {}; install ROCm, or "
                         "apt-get install libamd-comgr2, or set ROCM_PATH",
                         tried);
  }();
  return loaded;
}

std::string status_text(const Comgr &c, ComgrStatus s) {
  const char *text = nullptr;
  if (c.api.status_string(s, &text) == kSuccess && text)
    return text;
  return fmt::format("comgr status {}", s);
}

/// The processor of an ISA name: "amdgcn-amd-amdhsa--gfx90a:xnack-" -> "gfx90a".
std::string_view processor_of(std::string_view isa) {
  size_t dashes = isa.rfind("--");
  std::string_view p = dashes == std::string_view::npos ? isa : isa.substr(dashes + 2);
  return p.substr(0, p.find(':'));
}

bool knows(const Comgr &c, std::string_view processor) {
  return std::any_of(c.isas.begin(), c.isas.end(),
                     [&](const std::string &isa) { return processor_of(isa) == processor; });
}

// RAII owners of comgr handles.
struct Data {
  const Comgr &c;
  Handle h;
  ~Data() { c.api.release_data(h); }
};
struct DataSet {
  const Comgr &c;
  Handle h;
  ~DataSet() { c.api.destroy_data_set(h); }
};
struct ActionInfo {
  const Comgr &c;
  Handle h;
  ~ActionInfo() { c.api.destroy_action_info(h); }
};
struct Metadata {
  const Comgr &c;
  Handle h;
  ~Metadata() { c.api.destroy_metadata(h); }
};

/// The bytes of a data object.
std::string data_bytes(const Comgr &c, Handle data) {
  size_t size = 0;
  if (c.api.get_data(data, &size, nullptr) != kSuccess)
    return {};
  std::string out(size, '\0');
  if (c.api.get_data(data, &size, out.data()) != kSuccess)
    return {};
  out.resize(size);
  return out;
}

/// The code object loaded into comgr, with the ISA name to act on.
struct Loaded {
  const Comgr *c = nullptr;
  std::unique_ptr<Data> data;
  std::string isa;
};

Expected<Loaded> load_code(const CodeObject &code) {
  const Expected<const Comgr *> &c = comgr();
  if (!c)
    return c.status();
  const Comgr &lib = **c;
  const std::string processor(processor_of(code.arch));
  if (!knows(lib, processor))
    return Status::error("the installed comgr ({}, {}) does not know {}; build with LLVM 22 for "
                         "{} inspection",
                         lib.version, lib.path, processor, processor);
  // comgr's own complaints about other input are cryptic: check the ELF header here.
  constexpr uint16_t kEmAmdgpu = 224;
  const std::vector<uint8_t> &b = code.bytes;
  if (b.size() < 64 || b[0] != 0x7f || b[1] != 'E' || b[2] != 'L' || b[3] != 'F')
    return Status::error("the {} code object is not an ELF file ({} bytes)", code.arch, b.size());
  if (uint16_t(b[18] | b[19] << 8) != kEmAmdgpu)
    return Status::error("the {} code object is not an AMDGPU ELF file (e_machine {})", code.arch,
                         b[18] | b[19] << 8);
  Loaded out;
  out.c = &lib;
  Handle h;
  if (ComgrStatus s = lib.api.create_data(kDataExecutable, &h); s != kSuccess)
    return Status::error("comgr: cannot create a data object: {}", status_text(lib, s));
  out.data.reset(new Data{lib, h});
  if (ComgrStatus s =
          lib.api.set_data(h, code.bytes.size(), reinterpret_cast<const char *>(code.bytes.data()));
      s != kSuccess)
    return Status::error("comgr: cannot take the {} code object: {}", code.arch,
                         status_text(lib, s));
  lib.api.set_data_name(h, "kernel.co");
  // The ISA as the ELF header states it (with features); older comgr cannot
  // read it from newer code object versions, so fall back to the processor.
  size_t size = 0;
  if (lib.api.get_data_isa_name(h, &size, nullptr) == kSuccess && size > 1) {
    std::string isa(size, '\0');
    if (lib.api.get_data_isa_name(h, &size, isa.data()) == kSuccess)
      out.isa = isa.c_str();
  }
  if (out.isa.empty())
    out.isa = "amdgcn-amd-amdhsa--" + code.arch;
  return out;
}

std::string action_log(const Comgr &c, Handle result) {
  size_t count = 0;
  std::string log;
  if (c.api.action_data_count(result, kDataLog, &count) == kSuccess)
    for (size_t i = 0; i < count; ++i) {
      Handle h;
      if (c.api.action_data_get_data(result, kDataLog, i, &h) == kSuccess) {
        Data d{c, h};
        log += data_bytes(c, h);
      }
    }
  return log;
}

// ---- resources (the same rules as code_object.cpp) ------------------------

/// Matrix instructions per function label of a disassembly. comgr labels a
/// function "name:" in the first column (llvm-objdump: "0000000000001000 <name>:").
std::vector<std::pair<std::string, int>> matrix_counts(std::string_view text) {
  std::vector<std::pair<std::string, int>> counts;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty())
      continue;
    if (line[0] != ' ' && line[0] != '\t' && line.ends_with(":") &&
        !line.starts_with("Disassembly of section")) {
      std::string_view name = line.substr(0, line.size() - 1);
      if (size_t open = name.find(" <"); open != std::string_view::npos && name.ends_with(">"))
        name = name.substr(open + 2, name.size() - open - 3);
      counts.emplace_back(std::string(name), 0);
      continue;
    }
    size_t first = line.find_first_not_of(" \t");
    if (first != std::string_view::npos && !counts.empty() &&
        is_matrix_instruction(line.substr(first)))
      ++counts.back().second;
  }
  return counts;
}

/// The string value of `key` in a metadata map ("" when absent).
std::string lookup_string(const Comgr &c, Handle map, const char *key) {
  Handle value;
  if (c.api.metadata_lookup(map, key, &value) != kSuccess)
    return {};
  Metadata owner{c, value};
  int kind = 0;
  size_t size = 0;
  if (c.api.get_metadata_kind(value, &kind) != kSuccess || kind != kMetadataString ||
      c.api.get_metadata_string(value, &size, nullptr) != kSuccess)
    return {};
  std::string out(size, '\0');
  if (c.api.get_metadata_string(value, &size, out.data()) != kSuccess)
    return {};
  return out.c_str(); // drop the terminating NUL
}

int64_t lookup_int(const Comgr &c, Handle map, const char *key) {
  std::string text = lookup_string(c, map, key);
  if (text == "true")
    return 1;
  return text.empty() ? 0 : std::strtoll(text.c_str(), nullptr, 0);
}

} // namespace

std::vector<std::string> comgr_search_paths() {
  std::vector<std::string> dirs;
  if (const char *root = std::getenv("ROCM_PATH"); root && *root)
    dirs.push_back(std::string(root) + "/lib");
  if (std::find(dirs.begin(), dirs.end(), "/opt/rocm/lib") == dirs.end())
    dirs.push_back("/opt/rocm/lib");
  std::vector<std::string> paths;
  for (const std::string &d : dirs)
    for (const char *f : kFiles)
      paths.push_back(d + "/" + f);
  for (const char *f : kFiles)
    paths.push_back(f);
  return paths;
}

Expected<std::string> comgr_identity() {
  const Expected<const Comgr *> &c = comgr();
  if (!c)
    return c.status();
  return (*c)->describe();
}

Expected<bool> comgr_knows(std::string_view processor) {
  const Expected<const Comgr *> &c = comgr();
  if (!c)
    return c.status();
  return knows(**c, processor_of(processor));
}

namespace {

/// Held around every comgr action: older comgr releases share LLVM's global
/// option state between actions.
std::recursive_mutex &action_mutex() {
  static std::recursive_mutex m;
  return m;
}

} // namespace

Expected<std::string> comgr_disassemble(const CodeObject &code) {
  std::lock_guard<std::recursive_mutex> lock(action_mutex());
  auto loaded = load_code(code);
  if (!loaded)
    return loaded.status();
  const Comgr &c = *loaded->c;
  Handle in_h, out_h, info_h;
  if (c.api.create_data_set(&in_h) != kSuccess)
    return Status::error("comgr: cannot create a data set");
  DataSet in{c, in_h};
  if (c.api.create_data_set(&out_h) != kSuccess)
    return Status::error("comgr: cannot create a data set");
  DataSet out{c, out_h};
  if (c.api.create_action_info(&info_h) != kSuccess)
    return Status::error("comgr: cannot create an action info");
  ActionInfo info{c, info_h};
  c.api.data_set_add(in_h, loaded->data->h);
  c.api.action_info_set_isa_name(info_h, loaded->isa.c_str());
  c.api.action_info_set_logging(info_h, true);
  if (ComgrStatus s = c.api.do_action(kDisassembleExecutable, info_h, in_h, out_h); s != kSuccess) {
    std::string log = action_log(c, out_h);
    return Status::error("{} could not disassemble the {} code object ({}, ISA {}){}{}",
                         c.describe(), code.arch, status_text(c, s), loaded->isa,
                         log.empty() ? "" : ":\n", log);
  }
  size_t count = 0;
  Handle source;
  if (c.api.action_data_count(out_h, kDataSource, &count) != kSuccess || count == 0 ||
      c.api.action_data_get_data(out_h, kDataSource, 0, &source) != kSuccess)
    return Status::error("{} gave no disassembly for the {} code object", c.describe(), code.arch);
  Data owner{c, source};
  return data_bytes(c, source);
}

Expected<std::vector<ResourceReport>> comgr_read_resources(const CodeObject &code,
                                                           int vgpr_file_per_simd,
                                                           int max_waves_per_simd,
                                                           int lds_bytes_per_cu_or_wgp) {
  std::lock_guard<std::recursive_mutex> lock(action_mutex());
  auto loaded = load_code(code);
  if (!loaded)
    return loaded.status();
  const Comgr &c = *loaded->c;
  Handle root_h;
  if (ComgrStatus s = c.api.get_data_metadata(loaded->data->h, &root_h); s != kSuccess)
    return Status::error("{} cannot read the metadata of the {} code object ({}, ISA {})",
                         c.describe(), code.arch, status_text(c, s), loaded->isa);
  Metadata root{c, root_h};
  Handle list_h;
  if (c.api.metadata_lookup(root_h, "amdhsa.kernels", &list_h) != kSuccess)
    return Status::error("the {} code object has no amdhsa.kernels metadata (code object v2?)",
                         code.arch);
  Metadata list{c, list_h};
  size_t count = 0;
  c.api.get_metadata_list_size(list_h, &count);

  auto text = comgr_disassemble(code);
  if (!text)
    return text.status();
  const auto counts = matrix_counts(*text);
  // The VGPR granule and the SGPR rule are the processor's row of the arch facts.
  const std::string processor(processor_of(loaded->isa));
  const target::Arch *arch = target::find_arch(processor);
  if (arch == nullptr)
    return Status::error("the {} code object is for processor '{}', which has no arch facts: "
                         "supported are {}",
                         code.arch, processor, target::arch_list());
  const bool sgprs_limit = arch->facts().sgprs_limit_occupancy;

  std::vector<ResourceReport> reports;
  for (size_t i = 0; i < count; ++i) {
    Handle kernel_h;
    if (c.api.index_list_metadata(list_h, i, &kernel_h) != kSuccess)
      continue;
    Metadata kernel{c, kernel_h};
    ResourceReport r;
    r.kernel = lookup_string(c, kernel_h, ".name");
    r.symbol = lookup_string(c, kernel_h, ".symbol");
    r.vgprs = int(lookup_int(c, kernel_h, ".vgpr_count"));
    r.sgprs = int(lookup_int(c, kernel_h, ".sgpr_count"));
    r.agprs = int(lookup_int(c, kernel_h, ".agpr_count"));
    r.vgpr_spill_count = int(lookup_int(c, kernel_h, ".vgpr_spill_count"));
    r.sgpr_spill_count = int(lookup_int(c, kernel_h, ".sgpr_spill_count"));
    r.vgpr_spill = r.vgpr_spill_count > 0;
    r.sgpr_spill = r.sgpr_spill_count > 0;
    r.private_segment_bytes = lookup_int(c, kernel_h, ".private_segment_fixed_size");
    r.group_segment_bytes = lookup_int(c, kernel_h, ".group_segment_fixed_size");
    r.wavefront_size = int(lookup_int(c, kernel_h, ".wavefront_size"));
    r.max_flat_workgroup_size = int(lookup_int(c, kernel_h, ".max_flat_workgroup_size"));
    const std::string function = r.symbol.size() > 3 && r.symbol.ends_with(".kd")
                                     ? r.symbol.substr(0, r.symbol.size() - 3)
                                     : r.kernel;
    for (const auto &[name, n] : counts)
      if (name == function)
        r.matrix_instructions += n;
    r.vgpr_alloc_granule = arch->vgpr_alloc_granule(r.wavefront_size);
    r.occupancy_waves_per_simd =
        occupancy(r, sgprs_limit, vgpr_file_per_simd, max_waves_per_simd, lds_bytes_per_cu_or_wgp);
    reports.push_back(std::move(r));
  }
  return reports;
}

} // namespace flashjit::compiler
