// The CUDA driver (libcuda.so.1), loaded at run time: one function table filled
// once per process, and the GpuDriver over it.
//
// No CUDA header is included. The handful of types and values used are
// declared here with the header they come from (cuda.h); every function in the
// table is called through cuda_driver.cpp's check(), which turns a failed call
// into a Status naming the call and the driver's own error string.
//
// Work runs in each device's primary context (the one the CUDA runtime, and so
// PyTorch, uses): it is made current around each call and the caller's current
// context restored afterwards.
#pragma once

#include "runtime/gpu_driver.h"
#include "runtime/shared_library.h"

#include <cstddef>

namespace flashjit::runtime::cuda {

// cuda.h: `typedef enum cudaError_enum { CUDA_SUCCESS = 0, ...,
// CUDA_ERROR_NO_DEVICE = 100, ... } CUresult;` (an int-sized enum).
using CUresult = int;
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;

// cuda.h: `typedef int CUdevice_v1; typedef CUdevice_v1 CUdevice;`,
// `typedef unsigned long long CUdeviceptr_v2; typedef CUdeviceptr_v2 CUdeviceptr;`
// and the opaque handles.
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = struct CUstream_st *;

using CUmemoryPool = struct CUmemPoolHandle_st *;

// cuda.h, CUmemPoolProps (v1): allocType, handleTypes, location {type, id},
// win32SecurityAttributes, maxSize, usage, reserved: 88 bytes on x86-64.
struct CUmemPoolProps {
  int alloc_type;    // CU_MEM_ALLOCATION_TYPE_PINNED = 1
  int handle_types;  // CU_MEM_HANDLE_TYPE_NONE = 0
  int location_type; // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int location_id;   // the device ordinal
  void *win32_security_attributes;
  size_t max_size; // 0: the device's memory
  unsigned short usage;
  unsigned char reserved[54];
};
static_assert(sizeof(CUmemPoolProps) == 88);
// cuda.h, enum CUmemPool_attribute.
constexpr int CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4;

// cuda.h, enum CUdevice_attribute.
using CUdevice_attribute = int;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;

constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = 88;

// cuda.h, enum CUpointer_attribute, and what each writes.
using CUpointer_attribute = int;
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;       // unsigned (CUmemorytype)
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;    // int
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11; // CUdeviceptr
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;       // size_t
// cuda.h, enum CUmemorytype (0: memory CUDA does not know, e.g. malloc's).
constexpr unsigned CU_MEMORYTYPE_HOST = 1;
constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;

// cuda.h, the special stream handles.
inline CUstream const CU_STREAM_LEGACY = reinterpret_cast<CUstream>(0x1);
inline CUstream const CU_STREAM_PER_THREAD = reinterpret_cast<CUstream>(0x2);

// cuda.h, enum CUfunction_attribute.
using CUfunction_attribute = int;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

// cuda.h, CUlaunchAttribute (an id, padding to 8 bytes, a 64-byte union of
// values) and CUlaunchConfig, for cuLaunchKernelEx; of the attributes only
// programmatic stream serialization (the union's int
// programmaticStreamSerializationAllowed) is used.
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    void *align; // the union holds pointers: 8-byte aligned
    int programmatic_stream_serialization_allowed;
  } value;
};
static_assert(sizeof(CUlaunchAttribute) == 72);
struct CUlaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, dynamic_shared_bytes;
  CUstream stream;
  CUlaunchAttribute *attributes;
  unsigned attribute_count;
};
static_assert(sizeof(CUlaunchConfig) == 56);

/// Dynamic shared memory a kernel may use without opting in (cuFuncSetAttribute).
constexpr int kDefaultDynamicSharedBytes = 48 * 1024;

// X(member, exported symbol, parameters): every driver function flashjit calls;
// each returns CUresult. cuda.h maps several names to versioned symbols
// (`#define cuMemAlloc cuMemAlloc_v2`); dlsym needs the versioned ones.
#define FJ_CUDA_FUNCTIONS(X)                                                                       \
  X(cuInit, "cuInit", (unsigned flags))                                                            \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                            \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice * device, int ordinal))                                  \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute",                                                  \
    (int *value, CUdevice_attribute attribute, CUdevice device))                                   \
  X(cuDeviceGetName, "cuDeviceGetName", (char *name, int length, CUdevice device))                 \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * context, CUdevice device))  \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext * context))                                     \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext context))                                       \
  X(cuModuleLoadData, "cuModuleLoadData", (CUmodule * module, const void *image))                  \
  X(cuModuleGetFunction, "cuModuleGetFunction",                                                    \
    (CUfunction * function, CUmodule module, const char *name))                                    \
  X(cuModuleUnload, "cuModuleUnload", (CUmodule module))                                           \
  X(cuFuncSetAttribute, "cuFuncSetAttribute",                                                      \
    (CUfunction function, CUfunction_attribute attribute, int value))                              \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor",    \
    (int *blocks, CUfunction function, int block_size, size_t dynamic_shared_bytes))               \
  X(cuLaunchKernel, "cuLaunchKernel",                                                              \
    (CUfunction function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,     \
     unsigned block_y, unsigned block_z, unsigned dynamic_shared_bytes, CUstream stream,           \
     void **params, void **extra))                                                                 \
  X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * pointer, size_t bytes))                            \
  X(cuMemFree, "cuMemFree_v2", (CUdeviceptr pointer))                                              \
  X(cuMemPoolCreate, "cuMemPoolCreate", (CUmemoryPool * pool, const CUmemPoolProps *props))        \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute",                                                \
    (CUmemoryPool pool, int attribute, void *value))                                               \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync",                                            \
    (CUdeviceptr * pointer, size_t bytes, CUmemoryPool pool, CUstream stream))                     \
  X(cuMemFreeAsync, "cuMemFreeAsync", (CUdeviceptr pointer, CUstream stream))                      \
  X(cuMemsetD8Async, "cuMemsetD8Async",                                                            \
    (CUdeviceptr pointer, unsigned char value, size_t bytes, CUstream stream))                     \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void *src, size_t bytes))             \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, CUdeviceptr src, size_t bytes))                   \
  X(cuStreamSynchronize, "cuStreamSynchronize", (CUstream stream))                                 \
  X(cuStreamGetCtx, "cuStreamGetCtx", (CUstream stream, CUcontext * context))                      \
  X(cuPointerGetAttributes, "cuPointerGetAttributes",                                              \
    (unsigned count, CUpointer_attribute *attributes, void **data, CUdeviceptr pointer))           \
  X(cuGetErrorName, "cuGetErrorName", (CUresult error, const char **name))                         \
  X(cuGetErrorString, "cuGetErrorString", (CUresult error, const char **text))

/// The function table.
struct Api {
#define FJ_CUDA_POINTER(member, symbol, params) CUresult(*member) params = nullptr;
  FJ_CUDA_FUNCTIONS(FJ_CUDA_POINTER)
#undef FJ_CUDA_POINTER
  /// CUDA 11.8+: null where the driver has none (every launch is then cuLaunchKernel's).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *config, CUfunction function, void **params,
                               void **extra) = nullptr;
  /// CUDA 12+: null where the driver has no tensor maps (encode_tensor_map says so).
  CUresult (*cuTensorMapEncodeTiled)(void *map, int type, unsigned rank, void *base,
                                     const unsigned long long *dims,
                                     const unsigned long long *strides, const unsigned *box,
                                     const unsigned *element_strides, int interleave, int swizzle,
                                     int l2_promotion, int oob_fill) = nullptr;
  std::string path; ///< the library file
  /// cuInit's result: CUDA_ERROR_NO_DEVICE leaves a usable table with no devices.
  CUresult init_result = CUDA_SUCCESS;
};

/// The library names and paths tried, in order.
std::vector<std::string> library_candidates();

/// Loads the library, fills the table and calls cuInit(0), once per process.
/// The error names every path tried, or the symbol that is missing.
Expected<const Api *> api();

/// The process-wide CUDA GpuDriver.
Expected<GpuDriver *> driver();

} // namespace flashjit::runtime::cuda
