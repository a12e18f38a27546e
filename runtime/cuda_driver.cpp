#include "runtime/cuda_driver.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace flashjit::runtime::cuda {
namespace {

/// A failed call as a Status: "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE
/// (device kernel image is invalid), error 200".
Status check(const Api &api, const char *call, CUresult error) {
  if (error == CUDA_SUCCESS)
    return Status::ok();
  const char *name = nullptr, *text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(error, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(error, &text) != CUDA_SUCCESS)
    text = nullptr;
  return Status::error("{} failed: {} ({}), error {}", call, name ? name : "?",
                       text ? text : "no description", error);
}

#define FJ_CUDA_CHECK(api, call, ...) check(api, #call, (api).call(__VA_ARGS__))

Expected<Api> load() {
  auto library = SharedLibrary::open("the CUDA driver (libcuda.so.1)", library_candidates());
  if (!library)
    return library.status();
  Api api;
  api.path = library->path();
#define FJ_CUDA_RESOLVE(member, symbol, params)                                                    \
  FJ_RETURN_IF_ERROR(library->resolve(symbol, api.member));
  FJ_CUDA_FUNCTIONS(FJ_CUDA_RESOLVE)
#undef FJ_CUDA_RESOLVE
  if (!library->resolve("cuTensorMapEncodeTiled", api.cuTensorMapEncodeTiled))
    api.cuTensorMapEncodeTiled = nullptr; // before CUDA 12: no TMA
  if (!library->resolve("cuLaunchKernelEx", api.cuLaunchKernelEx))
    api.cuLaunchKernelEx = nullptr; // before CUDA 11.8: no launch attributes
  api.init_result = api.cuInit(0);
  if (api.init_result != CUDA_SUCCESS && api.init_result != CUDA_ERROR_NO_DEVICE)
    return check(api, "cuInit", api.init_result).with_context(api.path);
  return api;
}

class CudaDriver;

class CudaKernel final : public GpuKernel {
public:
  CudaKernel(CudaDriver &driver, int device, CUmodule module, CUfunction function)
      : driver_(driver), device_(device), module_(module), function_(function) {}
  ~CudaKernel() override;
  Status launch(const LaunchGeometry &g, std::span<void *const> args, void *stream) override;
  Expected<int> resident_per_unit(const LaunchGeometry &g) override;

private:
  /// Opts the kernel into `bytes` of dynamic shared memory past the default
  /// (cuFuncSetAttribute); call in the device's context.
  Status allow_dynamic_shared(int bytes);

  CudaDriver &driver_;
  int device_;
  CUmodule module_;
  CUfunction function_;
  int dynamic_shared_limit_ = kDefaultDynamicSharedBytes;
};

class CudaDriver final : public GpuDriver {
public:
  explicit CudaDriver(const Api &api) : api_(api) {}
  DeviceKind kind() const override { return DeviceKind::cuda; }
  const std::string &library_path() const override { return api_.path; }
  const Api &api() const { return api_; }

  Expected<int> device_count() override {
    if (api_.init_result == CUDA_ERROR_NO_DEVICE)
      return 0;
    int count = 0;
    CUresult e = api_.cuDeviceGetCount(&count);
    if (e == CUDA_ERROR_NO_DEVICE)
      return 0;
    FJ_RETURN_IF_ERROR(check(api_, "cuDeviceGetCount", e));
    return count;
  }

  Expected<DeviceInfo> device_info(int index) override {
    auto device = get_device(index);
    if (!device)
      return device.status();
    char name[256] = {};
    int major = 0, minor = 0;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGetName, name, int(sizeof name), *device));
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGetAttribute, &major,
                                     CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, *device));
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGetAttribute, &minor,
                                     CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, *device));
    DeviceInfo info;
    info.kind = DeviceKind::cuda;
    info.index = index;
    info.name = name;
    info.arch = fmt::format("sm_{}{}", major, minor);
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGetAttribute, &info.compute_units,
                                     CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, *device));
    return info;
  }

  Expected<std::unique_ptr<GpuKernel>> load_kernel(int device, std::span<const uint8_t> code,
                                                   const std::string &name) override {
    // cuModuleLoadData reads PTX as NUL-terminated text; CUBIN and fatbin images
    // carry their own sizes, so one trailing NUL serves every format.
    std::vector<uint8_t> image(code.begin(), code.end());
    image.push_back(0);
    CUmodule module = nullptr;
    CUfunction function = nullptr;
    FJ_RETURN_IF_ERROR(in_context(device, [&] {
      FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuModuleLoadData, &module, image.data()));
      Status found = FJ_CUDA_CHECK(api_, cuModuleGetFunction, &function, module, name.c_str());
      if (!found) {
        (void)FJ_CUDA_CHECK(api_, cuModuleUnload, module);
        return found.with_context(fmt::format("kernel {}", name));
      }
      return Status::ok();
    }));
    return std::unique_ptr<GpuKernel>(new CudaKernel(*this, device, module, function));
  }

  Expected<void *> allocate(int device, size_t bytes) override {
    CUdeviceptr pointer = 0;
    FJ_RETURN_IF_ERROR(
        in_context(device, [&] { return FJ_CUDA_CHECK(api_, cuMemAlloc, &pointer, bytes); }));
    return reinterpret_cast<void *>(pointer);
  }
  Status release(int device, void *pointer) override {
    return in_context(device, [&] { return FJ_CUDA_CHECK(api_, cuMemFree, address(pointer)); });
  }
  Expected<void *> allocate_async(int device, size_t bytes, void *stream) override {
    auto pool = memory_pool(device);
    if (!pool)
      return pool.status();
    CUdeviceptr pointer = 0;
    FJ_RETURN_IF_ERROR(in_context(device, [&] {
      return FJ_CUDA_CHECK(api_, cuMemAllocFromPoolAsync, &pointer, bytes, *pool,
                           static_cast<CUstream>(stream));
    }));
    return reinterpret_cast<void *>(pointer);
  }
  Status release_async(int device, void *pointer, void *stream) override {
    return in_context(device, [&] {
      return FJ_CUDA_CHECK(api_, cuMemFreeAsync, address(pointer), static_cast<CUstream>(stream));
    });
  }
  Status zero_async(int device, void *pointer, size_t bytes, void *stream) override {
    return in_context(device, [&] {
      return FJ_CUDA_CHECK(api_, cuMemsetD8Async, address(pointer), 0, bytes,
                           static_cast<CUstream>(stream));
    });
  }
  Status copy_to_device(int device, void *dst, const void *src, size_t bytes) override {
    return in_context(device,
                      [&] { return FJ_CUDA_CHECK(api_, cuMemcpyHtoD, address(dst), src, bytes); });
  }
  Status copy_to_host(int device, void *dst, const void *src, size_t bytes) override {
    return in_context(device,
                      [&] { return FJ_CUDA_CHECK(api_, cuMemcpyDtoH, dst, address(src), bytes); });
  }
  Status synchronize(int device, void *stream) override {
    return in_context(device, [&] {
      return FJ_CUDA_CHECK(api_, cuStreamSynchronize, static_cast<CUstream>(stream));
    });
  }

  Status encode_tensor_map(int device, const TensorMapRequest &r, TensorMapBytes &map) override {
    if (api_.cuTensorMapEncodeTiled == nullptr)
      return Status::error("the CUDA driver {} has no cuTensorMapEncodeTiled (CUDA 12 and later "
                           "have it): update the driver",
                           api_.path);
    // cuda.h: CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6, _BFLOAT16 = 9; INTERLEAVE_NONE = 0;
    // SWIZZLE_128B = 3; L2_PROMOTION_L2_256B = 3; FLOAT_OOB_FILL_NONE = 0 (zeros).
    // The encoder needs a current context (as any driver call).
    const unsigned element_strides[5] = {1, 1, 1, 1, 1};
    return in_context(device, [&] {
      return FJ_CUDA_CHECK(api_, cuTensorMapEncodeTiled, map.bytes, r.bf16 ? 9 : 6,
                           unsigned(r.rank), const_cast<void *>(r.base), r.dims, r.strides, r.box,
                           element_strides, 0, 3, 3, 0);
    });
  }

  Status check_buffer(int device, const void *pointer, size_t bytes,
                      std::string_view name) override {
    if (bytes == 0) // an empty tensor: nothing is read or written (it may be null)
      return Status::ok();
    unsigned memory_type = 0;
    int ordinal = -1;
    CUdeviceptr start = 0;
    size_t size = 0;
    CUpointer_attribute attributes[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[] = {&memory_type, &ordinal, &start, &size};
    // Unlike cuPointerGetAttribute, this succeeds for memory CUDA does not know
    // (type 0) and for pinned host memory (no range).
    FJ_RETURN_IF_ERROR(
        FJ_CUDA_CHECK(api_, cuPointerGetAttributes, 4, attributes, data, address(pointer)));
    if (memory_type == 0) {
      auto pageable = pageable_access(device);
      if (!pageable)
        return pageable.status();
      if (*pageable)
        return Status::ok(); // HMM / ATS: the GPU reads any host memory
      return Status::error("{} ({}) is host memory that cuda:{} cannot read (not allocated by "
                           "CUDA): pass device memory (cuMemAlloc, cudaMalloc, a CUDA torch "
                           "tensor), or run on the emulator, which takes host memory",
                           name, pointer, device);
    }
    if (memory_type != CU_MEMORYTYPE_DEVICE || size == 0)
      return Status::ok(); // pinned host memory, mapped into the device's address space
    if (ordinal != device)
      return Status::error("{} ({}) is memory of cuda:{}, but this call runs on cuda:{}: pass "
                           "memory of cuda:{}",
                           name, pointer, ordinal, device, device);
    const CUdeviceptr at = address(pointer);
    if (at - start > size || bytes > size - (at - start))
      return Status::error(
          "{} ({}) needs {} bytes for the shapes of this call, but its allocation (at 0x{:x}, "
          "{} bytes) ends {} bytes after it: pass a buffer that holds the whole tensor (check "
          "its sizes and strides against the spec)",
          name, pointer, bytes, start, size, size - (at - start));
    return Status::ok();
  }

  Status check_stream(int device, void *stream) override {
    CUstream s = static_cast<CUstream>(stream);
    if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
      return Status::ok();
    auto context = primary_context(device);
    if (!context)
      return context.status();
    CUcontext owner = nullptr;
    if (CUresult e = api_.cuStreamGetCtx(s, &owner); e != CUDA_SUCCESS)
      return check(api_, "cuStreamGetCtx", e)
          .with_context(fmt::format("stream {} is not a CUDA stream: pass a CUstream of cuda:{} "
                                    "(torch.cuda.current_stream().cuda_stream), or NULL for the "
                                    "default stream",
                                    stream, device));
    if (owner != *context)
      return Status::error("stream {} belongs to another CUDA context than cuda:{}'s primary "
                           "context, where flashjit loads its kernels: pass a stream created "
                           "in the primary context (the runtime API's and torch's streams are)",
                           stream, device);
    return Status::ok();
  }

  static CUdeviceptr address(const void *pointer) { return reinterpret_cast<CUdeviceptr>(pointer); }

  /// Runs `body` with the device's primary context current on this thread, then
  /// makes the caller's context current again.
  template <typename Body> Status in_context(int index, Body &&body) {
    auto context = primary_context(index);
    if (!context)
      return context.status();
    CUcontext previous = nullptr;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuCtxGetCurrent, &previous));
    if (previous != *context)
      FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuCtxSetCurrent, *context));
    Status status = body();
    if (previous != *context) {
      Status restored = FJ_CUDA_CHECK(api_, cuCtxSetCurrent, previous);
      if (status && !restored)
        return restored;
    }
    return status;
  }

private:
  /// flashjit's own stream-ordered pool on the device, created on first use. It
  /// keeps what it has allocated (release threshold: unlimited), so a workspace
  /// after a synchronize is a reuse, not a new allocation; the device's default
  /// pool, which other libraries may use, is left as it is.
  Expected<CUmemoryPool> memory_pool(int index) {
    std::lock_guard<std::mutex> lock(pool_mutex_); // in_context takes mutex_
    if (auto it = pools_.find(index); it != pools_.end())
      return it->second;
    CUmemoryPool pool = nullptr;
    FJ_RETURN_IF_ERROR(in_context(index, [&] {
      CUmemPoolProps props{};
      props.alloc_type = 1;
      props.location_type = 1;
      props.location_id = index;
      FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuMemPoolCreate, &pool, &props));
      uint64_t keep = UINT64_MAX;
      return FJ_CUDA_CHECK(api_, cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                           &keep);
    }));
    pools_.emplace(index, pool);
    return pool;
  }

  Expected<CUdevice> get_device(int index) {
    auto count = device_count();
    if (!count)
      return count.status();
    if (index < 0 || index >= *count)
      return Status::error("cuda:{} does not exist: the CUDA driver ({}) reports {} device{}",
                           index, api_.path, *count, *count == 1 ? "" : "s");
    CUdevice device = 0;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGet, &device, index));
    return device;
  }

  /// The device's primary context, retained on first use and kept for the life
  /// of the process (modules loaded into it must outlive every kernel).
  Expected<CUcontext> primary_context(int index) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = contexts_.find(index); it != contexts_.end())
      return it->second;
    auto device = get_device(index);
    if (!device)
      return device.status();
    CUcontext context = nullptr;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDevicePrimaryCtxRetain, &context, *device));
    contexts_.emplace(index, context);
    return context;
  }

  /// Whether the device reads pageable host memory (HMM, ATS), asked once.
  Expected<bool> pageable_access(int index) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = pageable_.find(index); it != pageable_.end())
      return it->second;
    CUdevice device = 0;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGet, &device, index));
    int value = 0;
    FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(api_, cuDeviceGetAttribute, &value,
                                     CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, device));
    pageable_.emplace(index, value != 0);
    return value != 0;
  }

  const Api &api_;
  std::mutex mutex_;
  std::map<int, bool> pageable_;
  std::map<int, CUcontext> contexts_;
  std::mutex pool_mutex_;
  std::map<int, CUmemoryPool> pools_;
};

CudaKernel::~CudaKernel() {
  // Nothing to report to from a destructor; a failed unload leaks the module.
  (void)driver_.in_context(device_,
                           [&] { return FJ_CUDA_CHECK(driver_.api(), cuModuleUnload, module_); });
}

Status CudaKernel::allow_dynamic_shared(int bytes) {
  if (bytes <= dynamic_shared_limit_)
    return Status::ok();
  FJ_RETURN_IF_ERROR(FJ_CUDA_CHECK(driver_.api(), cuFuncSetAttribute, function_,
                                   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
  dynamic_shared_limit_ = bytes;
  return Status::ok();
}

Expected<int> CudaKernel::resident_per_unit(const LaunchGeometry &g) {
  int blocks = 0;
  FJ_RETURN_IF_ERROR(driver_.in_context(device_, [&] {
    FJ_RETURN_IF_ERROR(allow_dynamic_shared(g.dynamic_lds_bytes));
    return FJ_CUDA_CHECK(driver_.api(), cuOccupancyMaxActiveBlocksPerMultiprocessor, &blocks,
                         function_, g.block[0] * g.block[1] * g.block[2],
                         size_t(g.dynamic_lds_bytes));
  }));
  return blocks;
}

Status CudaKernel::launch(const LaunchGeometry &g, std::span<void *const> args, void *stream) {
  const Api &api = driver_.api();
  for (int i = 0; i < 3; ++i)
    if (g.grid[i] < 1 || g.grid[i] > UINT_MAX || g.block[i] < 1)
      return Status::error("cuLaunchKernel: grid {}x{}x{} / block {}x{}x{} out of range", g.grid[0],
                           g.grid[1], g.grid[2], g.block[0], g.block[1], g.block[2]);
  return driver_.in_context(device_, [&] {
    FJ_RETURN_IF_ERROR(allow_dynamic_shared(g.dynamic_lds_bytes));
    void **params = const_cast<void **>(args.data());
    if (g.after_previous && api.cuLaunchKernelEx != nullptr) {
      // A programmatic dependent launch: the kernel may start as the previous
      // one's workgroups finish; it waits for it itself (griddepcontrol.wait).
      CUlaunchAttribute dependent{};
      dependent.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      dependent.value.programmatic_stream_serialization_allowed = 1;
      const CUlaunchConfig config{unsigned(g.grid[0]),
                                  unsigned(g.grid[1]),
                                  unsigned(g.grid[2]),
                                  unsigned(g.block[0]),
                                  unsigned(g.block[1]),
                                  unsigned(g.block[2]),
                                  unsigned(g.dynamic_lds_bytes),
                                  static_cast<CUstream>(stream),
                                  &dependent,
                                  1};
      return FJ_CUDA_CHECK(api, cuLaunchKernelEx, &config, function_, params, nullptr);
    }
    return FJ_CUDA_CHECK(api, cuLaunchKernel, function_, unsigned(g.grid[0]), unsigned(g.grid[1]),
                         unsigned(g.grid[2]), unsigned(g.block[0]), unsigned(g.block[1]),
                         unsigned(g.block[2]), unsigned(g.dynamic_lds_bytes),
                         static_cast<CUstream>(stream), params, nullptr);
  });
}

} // namespace

std::vector<std::string> library_candidates() {
  return {"libcuda.so.1",
          "libcuda.so",
          "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
          "/usr/lib64/libcuda.so.1",
          "/usr/local/nvidia/lib64/libcuda.so.1",
          "/usr/lib/wsl/lib/libcuda.so.1"};
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
  static CudaDriver instance(**table);
  return static_cast<GpuDriver *>(&instance);
}

} // namespace flashjit::runtime::cuda
