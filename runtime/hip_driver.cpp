#include "runtime/hip_driver.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace flashjit::runtime::hip {
namespace {

/// A failed call as a Status: "hipModuleLoadData failed: hipErrorInvalidImage
/// (invalid kernel image), error 200".
Status check(const Api &api, const char *call, hipError_t error) {
  if (error == hipSuccess)
    return Status::ok();
  const char *name = api.hipGetErrorName ? api.hipGetErrorName(error) : nullptr;
  const char *text = api.hipGetErrorString ? api.hipGetErrorString(error) : nullptr;
  return Status::error("{} failed: {} ({}), error {}", call, name ? name : "?",
                       text ? text : "no description", error);
}

#define FJ_HIP_CHECK(api, call, ...) check(api, #call, (api).call(__VA_ARGS__))

/// Runs `body` with `device` as the calling thread's current HIP device, then
/// restores the caller's: the host application's own HIP state is left as found.
template <typename Body> Status on_device(const Api &api, int device, Body &&body) {
  int previous = 0;
  FJ_RETURN_IF_ERROR(FJ_HIP_CHECK(api, hipGetDevice, &previous));
  if (previous != device)
    FJ_RETURN_IF_ERROR(FJ_HIP_CHECK(api, hipSetDevice, device));
  Status status = body();
  if (previous != device) {
    Status restored = FJ_HIP_CHECK(api, hipSetDevice, previous);
    if (status && !restored)
      return restored;
  }
  return status;
}

Expected<Api> load() {
  auto library = SharedLibrary::open("the HIP runtime (libamdhip64.so, ROCm 6 or later)",
                                     library_candidates());
  if (!library)
    return library.status();
  Api api;
  api.path = library->path();
#define FJ_HIP_RESOLVE(name, params) FJ_RETURN_IF_ERROR(library->resolve(#name, api.name));
  FJ_HIP_FUNCTIONS(FJ_HIP_RESOLVE)
#undef FJ_HIP_RESOLVE
  FJ_RETURN_IF_ERROR(library->resolve("hipGetErrorName", api.hipGetErrorName));
  FJ_RETURN_IF_ERROR(library->resolve("hipGetErrorString", api.hipGetErrorString));
  api.init_result = api.hipInit(0);
  if (api.init_result != hipSuccess && api.init_result != hipErrorNoDevice)
    return check(api, "hipInit", api.init_result).with_context(api.path);
  return api;
}

class HipKernel final : public GpuKernel {
public:
  HipKernel(const Api &api, int device, hipModule_t module, hipFunction_t function)
      : api_(api), device_(device), module_(module), function_(function) {}
  ~HipKernel() override {
    // Nothing to report to from a destructor; a failed unload leaks the module.
    (void)on_device(api_, device_, [&] { return FJ_HIP_CHECK(api_, hipModuleUnload, module_); });
  }

  Status launch(const LaunchGeometry &g, std::span<void *const> args, void *stream) override {
    for (int i = 0; i < 3; ++i)
      if (g.grid[i] < 1 || g.grid[i] > UINT_MAX || g.block[i] < 1)
        return Status::error("hipModuleLaunchKernel: grid {}x{}x{} / block {}x{}x{} out of range",
                             g.grid[0], g.grid[1], g.grid[2], g.block[0], g.block[1], g.block[2]);
    return on_device(api_, device_, [&] {
      return FJ_HIP_CHECK(api_, hipModuleLaunchKernel, function_, unsigned(g.grid[0]),
                          unsigned(g.grid[1]), unsigned(g.grid[2]), unsigned(g.block[0]),
                          unsigned(g.block[1]), unsigned(g.block[2]), unsigned(g.dynamic_lds_bytes),
                          static_cast<hipStream_t>(stream), const_cast<void **>(args.data()),
                          nullptr);
    });
  }

  Expected<int> resident_per_unit(const LaunchGeometry &g) override {
    int blocks = 0;
    FJ_RETURN_IF_ERROR(on_device(api_, device_, [&] {
      return FJ_HIP_CHECK(api_, hipModuleOccupancyMaxActiveBlocksPerMultiprocessor, &blocks,
                          function_, g.block[0] * g.block[1] * g.block[2],
                          size_t(g.dynamic_lds_bytes));
    }));
    return blocks;
  }

private:
  const Api &api_;
  int device_;
  hipModule_t module_;
  hipFunction_t function_;
};

class HipDriver final : public GpuDriver {
public:
  explicit HipDriver(const Api &api) : api_(api) {}
  DeviceKind kind() const override { return DeviceKind::hip; }
  const std::string &library_path() const override { return api_.path; }

  Expected<int> device_count() override {
    if (api_.init_result == hipErrorNoDevice)
      return 0;
    int count = 0;
    hipError_t e = api_.hipGetDeviceCount(&count);
    if (e == hipErrorNoDevice)
      return 0;
    FJ_RETURN_IF_ERROR(check(api_, "hipGetDeviceCount", e));
    return count;
  }

  Expected<DeviceInfo> device_info(int device) override {
    FJ_RETURN_IF_ERROR(check_index(device));
    hipDeviceProp_tR0600 props;
    std::memset(&props, 0, sizeof props);
    FJ_RETURN_IF_ERROR(FJ_HIP_CHECK(api_, hipGetDevicePropertiesR0600, &props, device));
    DeviceInfo info;
    info.kind = DeviceKind::hip;
    info.index = device;
    info.name.assign(props.name, strnlen(props.name, sizeof props.name));
    info.arch.assign(props.gcnArchName, strnlen(props.gcnArchName, sizeof props.gcnArchName));
    if (info.name.empty()) {
      char name[256] = {};
      FJ_RETURN_IF_ERROR(FJ_HIP_CHECK(api_, hipDeviceGetName, name, int(sizeof name), device));
      info.name = name;
    }
    if (info.arch.empty())
      return Status::error("hip:{} ({}) reports no gcnArchName", device, info.name);
    // Unknown (0) if the runtime will not say: forward() then splits KV only when asked.
    if (!FJ_HIP_CHECK(api_, hipDeviceGetAttribute, &info.compute_units,
                      kHipAttributeMultiprocessorCount, device))
      info.compute_units = 0;
    return info;
  }

  Expected<std::unique_ptr<GpuKernel>> load_kernel(int device, std::span<const uint8_t> code,
                                                   const std::string &name) override {
    FJ_RETURN_IF_ERROR(check_index(device));
    hipModule_t module = nullptr;
    hipFunction_t function = nullptr;
    FJ_RETURN_IF_ERROR(on_device(api_, device, [&] {
      FJ_RETURN_IF_ERROR(FJ_HIP_CHECK(api_, hipModuleLoadData, &module, code.data()));
      Status found = FJ_HIP_CHECK(api_, hipModuleGetFunction, &function, module, name.c_str());
      if (!found) {
        (void)FJ_HIP_CHECK(api_, hipModuleUnload, module);
        return found.with_context(fmt::format("kernel {}", name));
      }
      return Status::ok();
    }));
    return std::unique_ptr<GpuKernel>(new HipKernel(api_, device, module, function));
  }

  Expected<void *> allocate(int device, size_t bytes) override {
    void *pointer = nullptr;
    FJ_RETURN_IF_ERROR(
        on_device(api_, device, [&] { return FJ_HIP_CHECK(api_, hipMalloc, &pointer, bytes); }));
    return pointer;
  }
  Status release(int device, void *pointer) override {
    return on_device(api_, device, [&] { return FJ_HIP_CHECK(api_, hipFree, pointer); });
  }
  Expected<void *> allocate_async(int device, size_t bytes, void *stream) override {
    void *pointer = nullptr;
    FJ_RETURN_IF_ERROR(on_device(api_, device, [&] {
      return FJ_HIP_CHECK(api_, hipMallocAsync, &pointer, bytes, static_cast<hipStream_t>(stream));
    }));
    return pointer;
  }
  Status release_async(int device, void *pointer, void *stream) override {
    return on_device(api_, device, [&] {
      return FJ_HIP_CHECK(api_, hipFreeAsync, pointer, static_cast<hipStream_t>(stream));
    });
  }
  Status zero_async(int device, void *pointer, size_t bytes, void *stream) override {
    return on_device(api_, device, [&] {
      return FJ_HIP_CHECK(api_, hipMemsetD8Async, pointer, 0, bytes,
                          static_cast<hipStream_t>(stream));
    });
  }
  Status copy_to_device(int device, void *dst, const void *src, size_t bytes) override {
    return on_device(api_, device,
                     [&] { return FJ_HIP_CHECK(api_, hipMemcpyHtoD, dst, src, bytes); });
  }
  Status copy_to_host(int device, void *dst, const void *src, size_t bytes) override {
    return on_device(api_, device, [&] {
      return FJ_HIP_CHECK(api_, hipMemcpyDtoH, dst, const_cast<void *>(src), bytes);
    });
  }
  Status synchronize(int device, void *stream) override {
    return on_device(api_, device, [&] {
      return FJ_HIP_CHECK(api_, hipStreamSynchronize, static_cast<hipStream_t>(stream));
    });
  }

private:
  Status check_index(int device) {
    auto count = device_count();
    if (!count)
      return count.status();
    if (device < 0 || device >= *count)
      return Status::error("hip:{} does not exist: the HIP runtime ({}) reports {} device{}",
                           device, api_.path, *count, *count == 1 ? "" : "s");
    return Status::ok();
  }

  const Api &api_;
};

} // namespace

std::vector<std::string> library_candidates() {
  std::vector<std::string> paths;
  if (const char *rocm = std::getenv("ROCM_PATH"); rocm && *rocm)
    paths.push_back(std::string(rocm) + "/lib/libamdhip64.so");
  for (const char *p :
       {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so"})
    paths.push_back(p);
  return paths;
}

Expected<const Api *> api() {
  static const Expected<Api> loaded = load();
  if (!loaded)
    return loaded.status();
  return &*loaded;
}

Expected<GpuDriver *> driver() {
  auto table = api();
  if (!table)
    return table.status();
  static HipDriver instance(**table);
  return static_cast<GpuDriver *>(&instance);
}

} // namespace flashjit::runtime::hip
