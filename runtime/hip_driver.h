// The HIP runtime (libamdhip64.so, ROCm 6 or later), loaded at run time: one
// function table filled once per process, and the GpuDriver over it.
//
// No HIP header is included. The handful of types and values used are declared
// here with the header they come from (hip/hip_runtime_api.h); every function
// in the table is called through hip_driver.cpp's check(), which turns a failed
// call into a Status naming the call and HIP's own error string.
#pragma once

#include "runtime/gpu_driver.h"
#include "runtime/shared_library.h"

#include <cstddef>

namespace flashjit::runtime::hip {

// hip_runtime_api.h: `typedef enum hipError_t { hipSuccess = 0, ...,
// hipErrorNoDevice = 100, ... }` (an int-sized enum).
using hipError_t = int;
constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorNoDevice = 100;

// Opaque handles (hip_runtime_api.h / amd_hip_runtime_pt_api.h typedefs).
using hipModule_t = struct ihipModule_t *;
using hipFunction_t = struct ihipModuleSymbol_t *;
using hipStream_t = struct ihipStream_t *;
using hipDeviceptr_t = void *;

/// hipDeviceProp_tR0600 (hip_runtime_api.h, ROCm 6.0 and later), which the
/// versioned name freezes: `char name[256]` at byte 0, `char gcnArchName[256]`
/// at byte 1160, 1472 bytes in all on x86-64 (offsets summed over the header's
/// field list). Only those two fields are read.
struct alignas(8) hipDeviceProp_tR0600 {
  char name[256];
  char fields_before_gcn_arch_name[1160 - 256];
  char gcnArchName[256];
  char fields_after_gcn_arch_name[1472 - 1160 - 256];
};
static_assert(sizeof(hipDeviceProp_tR0600) == 1472);
static_assert(offsetof(hipDeviceProp_tR0600, gcnArchName) == 1160);

/// hipDeviceAttributeMultiprocessorCount in ROCm 6's hipDeviceAttribute_t.
constexpr int kHipAttributeMultiprocessorCount = 63;

// X(function, parameters): every HIP function flashjit calls; each returns hipError_t.
#define FJ_HIP_FUNCTIONS(X)                                                                        \
  X(hipInit, (unsigned flags))                                                                     \
  X(hipGetDeviceCount, (int *count))                                                               \
  X(hipGetDevice, (int *device))                                                                   \
  X(hipSetDevice, (int device))                                                                    \
  X(hipDeviceGetName, (char *name, int length, int device))                                        \
  X(hipGetDevicePropertiesR0600, (hipDeviceProp_tR0600 * properties, int device))                  \
  X(hipModuleLoadData, (hipModule_t * module, const void *image))                                  \
  X(hipModuleGetFunction, (hipFunction_t * function, hipModule_t module, const char *name))        \
  X(hipModuleLaunchKernel,                                                                         \
    (hipFunction_t function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,  \
     unsigned block_y, unsigned block_z, unsigned dynamic_lds_bytes, hipStream_t stream,           \
     void **params, void **extra))                                                                 \
  X(hipModuleUnload, (hipModule_t module))                                                         \
  X(hipModuleOccupancyMaxActiveBlocksPerMultiprocessor,                                            \
    (int *blocks, hipFunction_t function, int block_size, size_t dynamic_lds_bytes))               \
  X(hipMalloc, (void **pointer, size_t bytes))                                                     \
  X(hipFree, (void *pointer))                                                                      \
  X(hipMallocAsync, (void **pointer, size_t bytes, hipStream_t stream))                            \
  X(hipFreeAsync, (void *pointer, hipStream_t stream))                                             \
  X(hipMemsetD8Async,                                                                              \
    (hipDeviceptr_t pointer, unsigned char value, size_t bytes, hipStream_t stream))               \
  X(hipDeviceGetAttribute, (int *value, int attribute, int device))                                \
  X(hipMemcpyHtoD, (hipDeviceptr_t dst, const void *src, size_t bytes))                            \
  X(hipMemcpyDtoH, (void *dst, hipDeviceptr_t src, size_t bytes))                                  \
  X(hipStreamSynchronize, (hipStream_t stream))

/// The function table.
struct Api {
#define FJ_HIP_POINTER(name, params) hipError_t(*name) params = nullptr;
  FJ_HIP_FUNCTIONS(FJ_HIP_POINTER)
#undef FJ_HIP_POINTER
  const char *(*hipGetErrorName)(hipError_t) = nullptr;
  const char *(*hipGetErrorString)(hipError_t) = nullptr;
  std::string path; ///< the library file
  /// hipInit's result: hipErrorNoDevice leaves a usable table with no devices.
  hipError_t init_result = hipSuccess;
};

/// The library names and paths tried, in order: $ROCM_PATH/lib first when set,
/// then the loader's search path, then /opt/rocm.
std::vector<std::string> library_candidates();

/// Loads the library, fills the table and calls hipInit(0), once per process.
/// The error names every path tried, or the symbol that is missing.
Expected<const Api *> api();

/// The process-wide HIP GpuDriver.
Expected<GpuDriver *> driver();

} // namespace flashjit::runtime::hip
