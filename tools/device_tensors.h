// A spec's tensors on a device of flashjit::Attention (emulator:ARCH, hip:N,
// cuda:N), for the commands that run the library's whole path: run, tune, bench.
#pragma once

#include "ir/reference.h"
#include "runtime/attention.h"
#include "runtime/device.h"
#include "runtime/gpu_driver.h"

#include <string>
#include <vector>

namespace flashjit::cli {

class DeviceTensors {
public:
  /// Copies `host`'s inputs (in the spec's I/O type) to `device`; on the
  /// emulator they stay in host memory. The output starts as NaN (poisoned),
  /// the LSE too.
  static Expected<DeviceTensors> create(const DeviceInfo &device, const AttentionSpec &spec,
                                        const HostTensors &host);
  DeviceTensors(DeviceTensors &&other) noexcept;
  DeviceTensors &operator=(DeviceTensors &&) = delete;
  ~DeviceTensors();

  /// One forward() of `attn` on these tensors (queued on a GPU unless the
  /// Attention synchronizes).
  Status forward(Attention &attn);
  /// Waits for the device's queued work (a no-op on the emulator).
  Status synchronize();
  /// Seconds per forward(): `warmup` calls and a wait, then `repeats` times
  /// `iters` calls back to back, each run timed (host clock) to the end of its
  /// last call; the median run.
  Expected<double> seconds_per_call(Attention &attn, int iters, int repeats = 1, int warmup = 1);
  /// The output and the LSE into t.o and t.lse (after synchronize()).
  Status read_outputs(HostTensors &t);

private:
  struct Buffer {
    std::vector<uint8_t> host; // the bytes in memory; the emulator's buffer
    void *device = nullptr;    // its copy on a GPU
    bool output = false;
    void *at() { return host.empty() ? nullptr : device ? device : host.data(); }
  };
  DeviceTensors(const DeviceInfo &device, const AttentionSpec &spec)
      : device_(device), spec_(spec) {}

  DeviceInfo device_;
  AttentionSpec spec_;
  runtime::GpuDriver *driver_ = nullptr; // null on the emulator
  std::vector<Buffer> buffers_;          // q, k, v, o, lse, alibi, sinks, mask
};

} // namespace flashjit::cli
