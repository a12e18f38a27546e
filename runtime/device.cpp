#include "runtime/device.h"

#include "lowering/target.h"
#include "runtime/cuda_driver.h"
#include "runtime/emulator.h"
#include "runtime/gpu_driver.h"
#include "runtime/hip_driver.h"

#include <charconv>

namespace flashjit {

namespace runtime {

GpuKernel::~GpuKernel() = default;
GpuDriver::~GpuDriver() = default;

Expected<GpuDriver *> gpu_driver(DeviceKind kind) {
  switch (kind) {
  case DeviceKind::hip:
    return hip::driver();
  case DeviceKind::cuda:
    return cuda::driver();
  case DeviceKind::emulator:
    break;
  }
  return Status::error("the emulator is not a GPU driver");
}

} // namespace runtime

namespace {

constexpr std::string_view kEmulatorName = "flashjit CPU emulator";
constexpr std::string_view kDeviceForms =
    "expected hip:N, cuda:N or emulator:ARCH (e.g. hip:0, cuda:0, emulator:gfx1201)";

Status emulator_missing() {
  return Status::error("{}; or use a hip: or cuda: device", runtime::emulator_status().message());
}

Expected<DeviceInfo> find_gpu(DeviceKind kind, std::string_view id, std::string_view index_text) {
  int index = 0;
  if (!index_text.empty()) {
    auto [end, error] =
        std::from_chars(index_text.data(), index_text.data() + index_text.size(), index);
    if (error != std::errc() || end != index_text.data() + index_text.size() || index < 0)
      return Status::error("device '{}': the index after '{}:' must be a number >= 0, as in {}:0",
                           id, device_kind_name(kind), device_kind_name(kind));
  }
  auto driver = runtime::gpu_driver(kind);
  if (!driver)
    return driver.status().with_context(fmt::format("device '{}'", id));
  auto info = (*driver)->device_info(index);
  if (!info)
    return info.status().with_context(fmt::format("device '{}'", id));
  return info;
}

/// The GPUs of one driver, or none when its library does not load.
Status append_gpus(DeviceKind kind, std::vector<DeviceInfo> &out) {
  auto driver = runtime::gpu_driver(kind);
  if (!driver)
    return Status::ok();
  auto count = (*driver)->device_count();
  if (!count)
    return count.status();
  for (int i = 0; i < *count; ++i) {
    auto info = (*driver)->device_info(i);
    if (!info)
      return info.status();
    out.push_back(*info);
  }
  return Status::ok();
}

} // namespace

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
  case DeviceKind::hip:
    return "hip";
  case DeviceKind::cuda:
    return "cuda";
  case DeviceKind::emulator:
    return "emulator";
  }
  return "?";
}

std::string DeviceInfo::id() const {
  if (kind == DeviceKind::emulator)
    return fmt::format("emulator:{}", arch.empty() ? "ARCH" : arch);
  return fmt::format("{}:{}", device_kind_name(kind), index);
}

Expected<std::vector<DeviceInfo>> list_devices() {
  std::vector<DeviceInfo> devices;
  FJ_RETURN_IF_ERROR(append_gpus(DeviceKind::hip, devices));
  FJ_RETURN_IF_ERROR(append_gpus(DeviceKind::cuda, devices));
  if (runtime::emulator_available())
    devices.push_back(
        DeviceInfo{DeviceKind::emulator, 0, std::string(kEmulatorName), "", kEmulatorComputeUnits});
  return devices;
}

Expected<DeviceInfo> find_device(std::string_view id) {
  const size_t colon = id.find(':');
  const std::string_view kind = id.substr(0, colon);
  const std::string_view rest = colon == std::string_view::npos ? "" : id.substr(colon + 1);
  if (kind == "hip")
    return find_gpu(DeviceKind::hip, id, rest);
  if (kind == "cuda")
    return find_gpu(DeviceKind::cuda, id, rest);
  if (kind == "emulator") {
    if (rest.empty())
      return Status::error("device '{}': name the AMD arch to emulate, as in emulator:gfx1201", id);
    auto target = lowering::parse_target(rest);
    if (!target)
      return target.status().with_context(fmt::format("device '{}'", id));
    if (target->is_nvidia())
      return Status::error("device '{}': the emulator runs AMD kernels only (gfx...); for {} use "
                           "a cuda: device",
                           id, rest);
    if (!runtime::emulator_available())
      return emulator_missing();
    return DeviceInfo{DeviceKind::emulator, 0, std::string(kEmulatorName), std::string(rest),
                      kEmulatorComputeUnits};
  }
  return Status::error("unknown device '{}': {}", id, kDeviceForms);
}

std::string backends_report() {
  std::string report;
  for (DeviceKind kind : {DeviceKind::hip, DeviceKind::cuda}) {
    auto driver = runtime::gpu_driver(kind);
    if (!driver) {
      report +=
          fmt::format("{}: not available: {}\n", device_kind_name(kind), driver.status().message());
      continue;
    }
    auto count = (*driver)->device_count();
    report += count ? fmt::format("{}: {} ({} device{})\n", device_kind_name(kind),
                                  (*driver)->library_path(), *count, *count == 1 ? "" : "s")
                    : fmt::format("{}: {}: {}\n", device_kind_name(kind), (*driver)->library_path(),
                                  count.status().message());
  }
  const Status emulator = runtime::emulator_status();
  report += emulator ? "emulator: available (any AMD arch: emulator:ARCH, e.g. emulator:gfx1201)\n"
                     : fmt::format("emulator: not available: {}\n", emulator.message());
  return report;
}

} // namespace flashjit
