#include "tools/device_tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

namespace flashjit::cli {
namespace {

enum Slot { kQ, kK, kV, kO, kLse, kAlibi, kSinks, kMask, kSlots };

} // namespace

Expected<DeviceTensors> DeviceTensors::create(const DeviceInfo &device, const AttentionSpec &spec,
                                              const HostTensors &t) {
  DeviceTensors d(device, spec);
  // The tensors' bytes in their type in memory (f32 with --f32-io).
  const DType io = spec.io_dtype();
  const size_t width = size_t(dtype_bytes(io));
  auto bytes = [&](const std::vector<float> &x) {
    std::vector<uint8_t> out(x.size() * width);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t b = to_bits(io, x[i]);
      std::memcpy(out.data() + i * width, &b, width); // little-endian hosts only
    }
    return out;
  };
  auto f32 = [](const std::vector<float> &x) {
    std::vector<uint8_t> out(x.size() * 4);
    std::memcpy(out.data(), x.data(), out.size());
    return out;
  };
  d.buffers_.resize(kSlots);
  d.buffers_[kQ].host = bytes(t.q);
  d.buffers_[kK].host = bytes(t.k);
  d.buffers_[kV].host = bytes(t.v);
  d.buffers_[kO].host = bytes(std::vector<float>(t.o.size(), std::nanf(""))); // until written
  d.buffers_[kLse].host =
      f32(std::vector<float>(t.lse.size(), std::numeric_limits<float>::quiet_NaN()));
  d.buffers_[kO].output = d.buffers_[kLse].output = true;
  d.buffers_[kAlibi].host = f32(t.alibi_slopes);
  d.buffers_[kSinks].host = f32(t.sinks);
  // 4 bytes per element leave room for any mask type; the kernel reads its own.
  std::vector<uint32_t> mask(t.attn_mask.size());
  mask_storage(spec.mask, t.attn_mask, mask.data());
  d.buffers_[kMask].host.resize(size_t(spec.mask_elements()) * size_t(mask_type_bytes(spec.mask)));
  std::memcpy(d.buffers_[kMask].host.data(), mask.data(), d.buffers_[kMask].host.size());
  if (device.kind == DeviceKind::emulator)
    return d;
  auto driver = runtime::gpu_driver(device.kind);
  if (!driver)
    return driver.status();
  d.driver_ = *driver;
  for (Buffer &b : d.buffers_) {
    if (b.host.empty())
      continue;
    auto m = d.driver_->allocate(device.index, b.host.size());
    if (!m)
      return m.status().with_context(fmt::format("{} bytes on {}", b.host.size(), device.id()));
    b.device = *m;
    FJ_RETURN_IF_ERROR(
        d.driver_->copy_to_device(device.index, b.device, b.host.data(), b.host.size()));
  }
  return d;
}

DeviceTensors::DeviceTensors(DeviceTensors &&other) noexcept
    : device_(other.device_), spec_(other.spec_), driver_(other.driver_),
      buffers_(std::move(other.buffers_)) {
  other.buffers_.clear();
}

DeviceTensors::~DeviceTensors() {
  for (Buffer &b : buffers_)
    if (b.device != nullptr)
      (void)driver_->release(device_.index, b.device);
}

Status DeviceTensors::forward(Attention &attn) {
  AttentionTensors tensors{buffers_[kQ].at(), buffers_[kK].at(), buffers_[kV].at(),
                           buffers_[kO].at(), static_cast<float *>(buffers_[kLse].at())};
  tensors.alibi_slopes = static_cast<const float *>(buffers_[kAlibi].at());
  tensors.sinks = static_cast<const float *>(buffers_[kSinks].at());
  tensors.attn_mask = buffers_[kMask].at();
  return attn.forward(spec_, tensors);
}

Status DeviceTensors::synchronize() {
  return driver_ ? driver_->synchronize(device_.index, nullptr) : Status::ok();
}

Expected<double> DeviceTensors::seconds_per_call(Attention &attn, int iters, int repeats,
                                                 int warmup) {
  for (int i = 0; i < warmup; ++i)
    FJ_RETURN_IF_ERROR(forward(attn));
  FJ_RETURN_IF_ERROR(synchronize());
  std::vector<double> runs;
  for (int r = 0; r < std::max(repeats, 1); ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      FJ_RETURN_IF_ERROR(forward(attn));
    FJ_RETURN_IF_ERROR(synchronize());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    runs.push_back(took.count() / std::max(iters, 1));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

Status DeviceTensors::read_outputs(HostTensors &t) {
  for (Buffer &b : buffers_)
    if (b.output && b.device != nullptr)
      FJ_RETURN_IF_ERROR(
          driver_->copy_to_host(device_.index, b.host.data(), b.device, b.host.size()));
  const DType io = spec_.io_dtype();
  const size_t width = size_t(dtype_bytes(io));
  for (size_t i = 0; i < t.o.size(); ++i) {
    uint32_t b = 0;
    std::memcpy(&b, buffers_[kO].host.data() + i * width, width);
    t.o[i] = from_bits(io, b);
  }
  std::memcpy(t.lse.data(), buffers_[kLse].host.data(), t.lse.size() * 4);
  return Status::ok();
}

} // namespace flashjit::cli
