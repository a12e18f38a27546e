// What the runtime needs from a GPU driver: devices, modules loaded from code
// objects, kernel launches and plain memory copies. The HIP runtime
// (hip_driver.h) and the CUDA driver (cuda_driver.h) implement it over their
// function tables, so the launch path above them is written once.
#pragma once

#include "ir/status.h"
#include "runtime/device.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace flashjit::runtime {

struct LaunchGeometry {
  int64_t grid[3] = {1, 1, 1}; ///< workgroups in x, y, z
  int block[3] = {1, 1, 1};    ///< work-items per workgroup in x, y, z
  /// LDS (shared memory) beyond the kernel's static arrays, in bytes.
  int dynamic_lds_bytes = 0;
  /// The kernel directly follows another kernel of the same call on the stream
  /// and waits for it in its first instruction (lowering::Lowered::
  /// waits_for_previous): CUDA may then start it as the previous kernel's
  /// workgroups finish (a programmatic dependent launch). Drivers without such
  /// launches ignore it.
  bool after_previous = false;
};

/// One kernel of a module loaded on one device. Destroying it unloads the module.
class GpuKernel {
public:
  virtual ~GpuKernel();
  /// Enqueues the kernel on `stream` (nullptr: the device's default stream);
  /// `args` holds the address of each argument's value, in parameter order
  /// (runtime::KernelArgs::addresses()). Returns once the launch is
  /// queued; errors of the execution itself surface at the next synchronize().
  virtual Status launch(const LaunchGeometry &geometry, std::span<void *const> args,
                        void *stream) = 0;
  /// Workgroups of `geometry`'s block and LDS that one compute unit (SM, CU)
  /// holds at once, by the driver's occupancy calculator (the kernel's
  /// registers, LDS and block size).
  virtual Expected<int> resident_per_unit(const LaunchGeometry &geometry) = 0;
};

/// A tensor map (CUDA's CUtensorMap) to make for a launch: a tensor of 16-bit
/// elements with up to 5 dims, innermost first (extents and byte strides), read
/// in boxes of `box` elements through 128-byte swizzled shared memory.
struct TensorMapRequest {
  const void *base = nullptr;
  bool bf16 = true; ///< else f16
  int rank = 0;
  unsigned long long dims[5] = {};
  unsigned long long strides[4] = {}; ///< bytes, of dims 1..rank-1
  unsigned box[5] = {};
};
/// The 128 bytes of an encoded tensor map, aligned as the kernel parameter is.
struct alignas(64) TensorMapBytes {
  unsigned char bytes[128];
};

class GpuDriver {
public:
  virtual ~GpuDriver();
  virtual DeviceKind kind() const = 0;
  /// The file the library was loaded from.
  virtual const std::string &library_path() const = 0;
  virtual Expected<int> device_count() = 0;
  virtual Expected<DeviceInfo> device_info(int device) = 0;
  /// Loads a code object (an AMDGPU ELF for HIP; a CUBIN, fatbin or PTX text for
  /// CUDA) on `device` and finds the kernel `name` in it.
  virtual Expected<std::unique_ptr<GpuKernel>>
  load_kernel(int device, std::span<const uint8_t> code_object, const std::string &name) = 0;
  virtual Expected<void *> allocate(int device, size_t bytes) = 0;
  virtual Status release(int device, void *pointer) = 0;
  /// Stream-ordered allocation (CUDA: from flashjit's own pool, which keeps its
  /// memory across synchronizations; HIP: hipMallocAsync): usable by work queued
  /// on `stream` after this call, and released for reuse by work queued after
  /// release_async. Safe with several streams; cheap once the pool is warm.
  virtual Expected<void *> allocate_async(int device, size_t bytes, void *stream) = 0;
  virtual Status release_async(int device, void *pointer, void *stream) = 0;
  /// Zeroes `bytes` bytes at `pointer`, in stream order.
  virtual Status zero_async(int device, void *pointer, size_t bytes, void *stream) = 0;
  /// Synchronous copies between host memory and device memory.
  virtual Status copy_to_device(int device, void *dst, const void *src, size_t bytes) = 0;
  virtual Status copy_to_host(int device, void *dst, const void *src, size_t bytes) = 0;
  /// Waits for everything queued on `stream` (nullptr: the default stream).
  virtual Status synchronize(int device, void *stream) = 0;

  /// Checks, where the driver can say, that a kernel on `device` may read or
  /// write `bytes` bytes from `pointer`: memory the GPU can reach (not plain
  /// host memory), with its allocation at least that long. `name` (e.g.
  /// "forward: q") starts the message. A driver that cannot tell says ok.
  virtual Status check_buffer(int device, const void *pointer, size_t bytes,
                              std::string_view name) {
    return Status::ok();
  }
  /// Checks, where the driver can say, that `stream` is a stream of `device`
  /// (nullptr, the default stream, always is).
  virtual Status check_stream(int device, void *stream) { return Status::ok(); }
  /// Encodes a tensor map for kernels on `device` that copy tiles with TMA (the
  /// sm90 rules).
  virtual Status encode_tensor_map(int device, const TensorMapRequest &request,
                                   TensorMapBytes &map) {
    return Status::error("{} has no tensor maps (TMA): kernels of the sm90 rules need the CUDA "
                         "driver",
                         library_path());
  }
};

/// The process-wide driver of a GPU kind (hip or cuda), loaded on first use.
Expected<GpuDriver *> gpu_driver(DeviceKind kind);

} // namespace flashjit::runtime
