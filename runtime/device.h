// The devices flashjit runs kernels on: AMD GPUs through the HIP runtime, NVIDIA
// GPUs through the CUDA driver (both loaded at run time, never linked), and the
// CPU emulator of AMD GPUs (builds with LLVM). A device is named by a string:
//
//   hip:0              the first GPU the HIP runtime reports
//   cuda:1             the second GPU the CUDA driver reports
//   emulator:gfx1201   the CPU emulator, running kernels generated for gfx1201
//
// "hip" and "cuda" alone mean index 0; the emulator always needs its arch.
#pragma once

#include "ir/status.h"

#include <string>
#include <string_view>
#include <vector>

namespace flashjit {

enum class DeviceKind { hip, cuda, emulator };

/// The compute units the emulator stands for when forward() chooses the number
/// of KV splits: a mid-size GPU, so decode on the emulator splits as it would there.
constexpr int kEmulatorComputeUnits = 32;
std::string_view device_kind_name(DeviceKind k);

struct DeviceInfo {
  DeviceKind kind = DeviceKind::emulator;
  int index = 0; ///< the driver's device ordinal (0 for the emulator)
  /// The driver's name, e.g. "AMD Radeon RX 9070 XT" or "NVIDIA H100 80GB HBM3".
  std::string name;
  /// The target the kernels are generated for: the HIP runtime's gcnArchName
  /// (e.g. "gfx1201", "gfx90a:sramecc+:xnack-"), "sm_<major><minor>" for CUDA
  /// (e.g. "sm_90"), the named arch for the emulator. Empty in list_devices()'s
  /// emulator entry, which stands for every AMD arch.
  std::string arch;
  /// Compute units (AMD CUs, NVIDIA SMs): split-KV fills this many. The
  /// emulator has none and reports kEmulatorComputeUnits.
  int compute_units = 0;
  /// The name that selects it: "hip:0", "cuda:1", "emulator:gfx1201".
  std::string id() const;
};

/// Every device this process can reach: the HIP and CUDA GPUs whose libraries
/// load, then (in builds with LLVM) one emulator entry with an empty arch, since
/// the emulator runs whichever AMD arch the device name gives. A missing vendor
/// library is not an error (that backend has no devices; backends_report()
/// says why); a library that loads but fails to initialize for another reason
/// than having no device is.
Expected<std::vector<DeviceInfo>> list_devices();

/// The device a name selects, with its driver loaded and its name and arch
/// queried. Errors name the problem: a malformed name, a library that does not
/// load (with every path tried), an index past the device count, an emulator
/// arch flashjit does not know or a build without the emulator.
Expected<DeviceInfo> find_device(std::string_view id);

/// One line per backend: loaded from which library with how many devices, or
/// why not.
std::string backends_report();

} // namespace flashjit
