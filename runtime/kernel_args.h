// The argument list of one launch of a generated kernel: the value of each of
// its parameters (lowering::KernelParam) in order, and the array of their
// addresses that cuLaunchKernel, hipModuleLaunchKernel and the emulator's entry
// point take. Tensors are bound by name to pointers, scalars by the program's
// ir::Bindings; nothing is looked up by position.
#pragma once

#include "ir/ir.h"
#include "lowering/lower.h"
#include "runtime/gpu_driver.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace flashjit::runtime {

struct NamedPointer {
  std::string_view name; // the tensor's IR name: Q, K, V, O, LSE
  const void *pointer;
};

class KernelArgs {
public:
  /// The arguments of `params`: each tensor's pointer from `tensors` (null if
  /// absent there), each scalar's value from `scalars`, converted to its type,
  /// each tensor map encoded by `driver` for `device` from its tensor's
  /// pointer and the extents and strides `scalars` give it (an error without a
  /// driver).
  static Expected<KernelArgs> make(std::span<const lowering::KernelParam> params,
                                   const ir::Bindings &scalars,
                                   std::span<const NamedPointer> tensors,
                                   GpuDriver *driver = nullptr, int device = 0);

  KernelArgs(KernelArgs &&) = default;
  KernelArgs &operator=(KernelArgs &&) = default;
  KernelArgs(const KernelArgs &) = delete;
  KernelArgs &operator=(const KernelArgs &) = delete;

  /// The address of each argument's value, in parameter order.
  std::span<void *const> addresses() const { return addresses_; }

private:
  KernelArgs() = default;
  // One 8-byte slot per argument; an int or float sits at its start (little-endian).
  std::vector<uint64_t> values_;
  std::vector<TensorMapBytes> maps_; // the tensor maps, in parameter order
  std::vector<void *> addresses_;
};

} // namespace flashjit::runtime
