// The emulator's scheduler, hooks and checks (the design is in emulator.h and
// docs/emulator.md).
//
// A Worker runs one workgroup at a time on its own thread. Each lane is a fiber;
// the worker's scheduler loop resumes every runnable lane in order, and a lane
// runs until it reaches a collective (fj_barrier, fj_mma, fj_shfl_xor), where it
// posts pointers to its operands (they stay on its suspended stack) and switches
// back, or until it returns from the kernel. When no lane can run, the
// scheduler completes what is complete:
//   * a wave whose lanes all wait at an fj_mma (the same call site) gets D,
//     computed from every lane's fragments through the table row's lane maps;
//   * a wave whose lanes all wait at an fj_shfl_xor gets the exchanged values;
//   * a workgroup whose lanes all wait at the same fj_barrier is released.
// Anything else (lanes of a wave at different collectives or exited, a barrier
// some lane never reaches) is an error naming the lanes.
//
// Memory: global accesses go through hooks that find the buffer holding the
// bytes. LDS is a per-worker array; per 2-byte element the worker remembers the
// barrier epoch, wave and lane of the last store and which waves loaded it in
// the current epoch, which is enough to report reads of elements never written
// in this workgroup and unordered accesses by different waves (races). A hook
// that finds an error records it and switches to the scheduler for good: the
// workgroup stops there.
#include "runtime/emulator.h"

#include "compiler/host_jit.h"
#include "compiler/llvm_plugin.h"
#include "runtime/emulator_fiber.h"
#include "runtime/kernel_args.h"
#include "templates/templates.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <vector>

namespace flashjit::runtime {
namespace {

using lowering::LaneLayout;
using lowering::MatrixCoord;

/// Where a lane is: runnable, waiting at a collective, or done.
enum class At : uint8_t { ready, barrier, mma, shfl, exited };

std::string_view at_name(At a) {
  switch (a) {
  case At::ready:
    return "running";
  case At::barrier:
    return "fj_barrier";
  case At::mma:
    return "fj_mma";
  case At::shfl:
    return "fj_shfl_xor";
  case At::exited:
    return "returned from the kernel";
  }
  return "?";
}

struct Lane {
  emu::Context context;
  At at = At::ready;
  const void *site = nullptr; // return address of the collective's hook call
  // Operands posted at a collective; they live on the suspended lane's stack.
  const uint16_t *a = nullptr, *b = nullptr;
  const float *c = nullptr;
  float *d = nullptr;
  float shfl_value = 0, shfl_result = 0;
  int shfl_lane = 0, shfl_mask = 0;
  int lds_declared = 0; // FJ_LDS_ARRAYs this lane has passed
};

/// A device buffer the kernel was given.
struct Buffer {
  std::string_view name;
  uint8_t *base = nullptr;
  size_t bytes = 0;
  int elem_bytes = 2;
  bool writable = false;
};

/// LDS is tracked in elements of this many bytes (fj_bits).
constexpr int kGranule = 2;

/// What the race and "never written" checks know about one LDS element.
struct LdsCell {
  uint32_t write_epoch = 0; // barrier epoch of the last store (0: none yet)
  uint32_t write_step = 0;  // the storing wave's step at that store
  uint32_t read_epoch = 0;  // barrier epoch of the loads below
  uint32_t read_waves = 0;  // waves that loaded it in read_epoch, one bit each
  uint32_t read_step = 0;   // the loading wave's step at the last load
  int read_lane = -1;       // lane of the loads in read_epoch; -2: several lanes
  int writer = -1;          // lane of the last store
};

struct LdsArray {
  std::string name;
  size_t offset = 0, bytes = 0, elem_bytes = 1;
};

/// Owns a 64-byte aligned allocation.
struct AlignedBytes {
  uint8_t *data = nullptr;
  AlignedBytes() = default;
  explicit AlignedBytes(size_t n)
      : data(n ? static_cast<uint8_t *>(::operator new(n, std::align_val_t(64))) : nullptr) {}
  AlignedBytes(const AlignedBytes &) = delete;
  AlignedBytes &operator=(const AlignedBytes &) = delete;
  AlignedBytes &operator=(AlignedBytes &&other) noexcept {
    std::swap(data, other.data);
    return *this;
  }
  ~AlignedBytes() {
    if (data)
      ::operator delete(data, std::align_val_t(64));
  }
};

/// Everything the workers share, read-only while they run.
struct Launch {
  std::string_view kernel;
  compiler::KernelEntry entry = nullptr;
  const lowering::Target *target = nullptr;
  const lowering::Lowered *lowered = nullptr;
  const LaneLayout *layout = nullptr;
  int block_threads = 0, wave = 0;
  int64_t grid[3] = {1, 1, 1};
  size_t lane_stack_bytes = 0;
  std::vector<Buffer> buffers; // Q, K, V, O, LSE, workspaces: as the launch names them
  void *const *args = nullptr; // the kernel's arguments (KernelArgs::addresses())
  std::vector<float> decode;   // A/B element bits -> value, per the row's ab_dtype
  // The lane maps, flattened: index of (lane, elem) into row-major A (m x k),
  // B (k x n) and D (m x n).
  std::vector<int> a_index, b_index, d_index;
};

std::string lane_ranges(const std::vector<int> &lanes) {
  std::string out;
  for (size_t i = 0; i < lanes.size();) {
    size_t j = i;
    while (j + 1 < lanes.size() && lanes[j + 1] == lanes[j] + 1)
      ++j;
    if (!out.empty())
      out += ", ";
    out += j == i ? fmt::format("{}", lanes[i]) : fmt::format("{}-{}", lanes[i], lanes[j]);
    i = j + 1;
  }
  return out;
}

class Worker;
thread_local Worker *t_worker = nullptr;

class Worker {
public:
  explicit Worker(const Launch &launch) : launch_(launch) {}

  Status init() {
    auto stacks = emu::StackPool::create(launch_.block_threads, launch_.lane_stack_bytes);
    if (!stacks)
      return stacks.status();
    stacks_ = std::move(*stacks);
    lanes_.resize(size_t(launch_.block_threads));
    lds_.resize(size_t(launch_.target->lds_bytes));
    cells_.resize(lds_.size() / kGranule);
    wave_step_.resize(size_t((launch_.block_threads + launch_.wave - 1) / launch_.wave));
    if (!launch_.layout)
      return Status::ok(); // no matrix instruction
    const LaneLayout &l = *launch_.layout;
    af_.resize(size_t(l.m * l.k));
    bf_.resize(size_t(l.k * l.n));
    d_.resize(size_t(l.m * l.n));
    a_from_.resize(af_.size());
    b_from_.resize(bf_.size());
    a_bits_.resize(af_.size());
    b_bits_.resize(bf_.size());
    return Status::ok();
  }

  /// Runs workgroup number `linear` (x fastest) to its end or its first error.
  Status run_group(int64_t linear) {
    group_[0] = linear % launch_.grid[0];
    group_[1] = linear / launch_.grid[0] % launch_.grid[1];
    group_[2] = linear / (launch_.grid[0] * launch_.grid[1]);
    std::fill(lds_.begin(), lds_.end(), uint8_t(0xff)); // NaN in bf16 and f16
    group_epoch_ = ++epoch_; // cells stored before this epoch belong to earlier workgroups
    arrays_.clear();
    lds_used_ = 0;
    error_.reset();
    const int n = launch_.block_threads;
    for (int i = 0; i < n; ++i) {
      Lane &lane = lanes_[size_t(i)];
      lane.at = At::ready;
      lane.site = nullptr;
      lane.lds_declared = 0;
      emu::make_context(lane.context, stacks_.top(i), launch_.lane_stack_bytes, &lane_main, this);
    }
    for (;;) {
      for (int i = 0; i < n; ++i) {
        if (lanes_[size_t(i)].at != At::ready)
          continue;
        current_ = i;
        emu::switch_context(scheduler_, lanes_[size_t(i)].context);
        if (error_)
          return *error_;
      }
      current_ = -1;
      bool progressed = false;
      for (int w = 0; w * launch_.wave < n; ++w) {
        auto done = complete_wave(w);
        if (!done)
          return done.status();
        progressed = progressed || *done;
      }
      if (progressed)
        continue;
      // Every lane is at a barrier or has returned.
      std::vector<int> waiting, exited;
      for (int i = 0; i < n; ++i)
        (lanes_[size_t(i)].at == At::exited ? exited : waiting).push_back(i);
      if (waiting.empty())
        break;
      if (!exited.empty())
        return group_error(waiting.front(),
                           "a barrier is not reached by every lane: lanes {} returned from the "
                           "kernel while lanes {} wait at fj_barrier",
                           lane_ranges(exited), lane_ranges(waiting));
      FJ_RETURN_IF_ERROR(same_site(waiting, At::barrier, -1));
      for (Lane &lane : lanes_)
        lane.at = At::ready;
      ++epoch_;
    }
    size_t declared = 0;
    for (const LdsArray &a : arrays_)
      declared += a.bytes;
    if (declared != size_t(launch_.lowered->lds_bytes))
      return group_error(-1,
                         "the kernel's FJ_LDS_ARRAYs hold {} bytes but Lowered::lds_bytes says {} "
                         "(occupancy and fit checks use the latter)",
                         declared, launch_.lowered->lds_bytes);
    return Status::ok();
  }

  // ---- the hooks' work (on a lane's fiber) ----

  int thread_id() const { return current_; }
  int group_id(int dim) const { return dim >= 0 && dim < 3 ? int(group_[dim]) : 0; }

  void *lds_alloc(size_t elem_bytes, size_t count, const char *name) {
    Lane &lane = lanes_[size_t(current_)];
    const size_t index = size_t(lane.lds_declared++);
    const size_t bytes = elem_bytes * count;
    if (index < arrays_.size()) {
      const LdsArray &a = arrays_[index];
      if (a.name != name || a.bytes != bytes)
        fail("lanes disagree on LDS array #{}: {} ({} bytes) here, {} ({} bytes) in an earlier "
             "lane",
             index, name, bytes, a.name, a.bytes);
      return lds_.data() + a.offset;
    }
    const size_t offset = (lds_used_ + 15) / 16 * 16;
    if (offset + bytes > lds_.size())
      fail("FJ_LDS_ARRAY({}, {} x {} bytes) takes the workgroup's LDS to {} bytes, over {}'s "
           "{} bytes",
           name, count, elem_bytes, offset + bytes, launch_.target->arch, lds_.size());
    arrays_.push_back({name, offset, bytes, elem_bytes});
    lds_used_ = offset + bytes;
    return lds_.data() + offset;
  }

  void lds_access(void *dst, const void *src, int bytes, bool store) {
    const uint8_t *p = static_cast<const uint8_t *>(store ? dst : src);
    const char *what = store ? "store" : "load";
    const auto off = reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(lds_.data());
    const LdsArray *array = nullptr;
    for (const LdsArray &a : arrays_)
      if (off >= intptr_t(a.offset) && off + bytes <= intptr_t(a.offset + a.bytes))
        array = &a;
    if (!array)
      fail("LDS {} of {} bytes at LDS byte {} is outside every FJ_LDS_ARRAY ({}; the workgroup "
           "has {} bytes)",
           what, bytes, off, lds_map(), lds_.size());
    const size_t elem = (size_t(off) - array->offset) / array->elem_bytes;
    if (bytes % kGranule != 0 || off % kGranule != 0)
      fail("LDS {} of {} bytes at {}[{}] (byte {}) is not in whole 2-byte elements", what, bytes,
           array->name, elem, off);
    if (bytes == 16 && off % 16 != 0)
      fail("128-bit LDS {} at {}[{}] (byte {}) is not 16-byte aligned", what, array->name, elem,
           off);
    const int wave = current_ / launch_.wave;
    const uint32_t wave_bit = 1u << std::min(wave, 31);
    for (int i = 0; i < bytes; i += kGranule) {
      LdsCell &cell = cells_[size_t(off + i) / kGranule];
      auto element = [&] {
        return fmt::format("{}[{}]", array->name,
                           (size_t(off + i) - array->offset) / array->elem_bytes);
      };
      const bool written_now = cell.write_epoch == epoch_;
      const int writer_wave = cell.writer / launch_.wave;
      if (store) {
        if (cell.read_epoch == epoch_ && (cell.read_waves & ~wave_bit))
          fail("LDS race: the store to {} overwrites what other waves (mask 0x{:x}) loaded since "
               "the last barrier; the GPU does not order the two (a barrier is missing before "
               "the overwrite)",
               element(), cell.read_waves & ~wave_bit);
        if (written_now && writer_wave != wave)
          fail("LDS race: lane {} (wave {}) also stored {} since the last barrier; the GPU does "
               "not order the two stores",
               cell.writer, writer_wave, element());
        if (cell.read_epoch == epoch_ && cell.read_lane != current_ &&
            cell.read_step == wave_step_[size_t(wave)])
          fail("{} of wave {} loaded {} and lane {} stores it with no barrier or wave-wide "
               "instruction between: the emulator runs lanes one after another and cannot "
               "reproduce the wave's lockstep order",
               cell.read_lane >= 0 ? fmt::format("lane {}", cell.read_lane % launch_.wave)
                                   : std::string("other lanes"),
               wave, element(), current_ % launch_.wave);
        cell.write_epoch = epoch_;
        cell.write_step = wave_step_[size_t(wave)];
        cell.writer = current_;
        continue;
      }
      if (cell.write_epoch < group_epoch_)
        fail("LDS load of {} bytes at {}[{}] reads {}, never written in this workgroup", bytes,
             array->name, elem, element());
      if (written_now && writer_wave != wave)
        fail("LDS race: the load of {} reads what lane {} (wave {}) stored since the last "
             "barrier; the GPU does not order the two (a barrier is missing between them)",
             element(), cell.writer, writer_wave);
      if (written_now && cell.writer != current_ && cell.write_step == wave_step_[size_t(wave)])
        fail("lanes {} and {} of wave {} exchange {} through LDS with no barrier or wave-wide "
             "instruction between the store and the load: the emulator runs lanes one after "
             "another and cannot reproduce the wave's lockstep order",
             cell.writer % launch_.wave, current_ % launch_.wave, wave, element());
      if (cell.read_epoch != epoch_) {
        cell.read_epoch = epoch_;
        cell.read_waves = 0;
        cell.read_lane = current_;
      } else if (cell.read_lane != current_) {
        cell.read_lane = -2;
      }
      cell.read_waves |= wave_bit;
      cell.read_step = wave_step_[size_t(wave)];
    }
    if (store)
      std::memcpy(lds_.data() + off, src, size_t(bytes));
    else
      std::memcpy(dst, lds_.data() + off, size_t(bytes));
  }

  void global_access(void *dst, const void *src, int elem_bytes, int count, bool store) {
    const uint8_t *p = static_cast<const uint8_t *>(store ? dst : src);
    const size_t bytes = size_t(elem_bytes) * size_t(count);
    const char *what = store ? "store" : "load";
    const Buffer *hit = nullptr;
    for (const Buffer &b : launch_.buffers)
      if (b.bytes && p >= b.base && p + bytes <= b.base + b.bytes)
        hit = &b;
    if (!hit)
      fail("global {} of {} bytes at {} is outside every buffer: {}", what, bytes,
           static_cast<const void *>(p), nearest_buffer(p, bytes));
    const size_t off = size_t(p - hit->base);
    if (elem_bytes != hit->elem_bytes)
      fail("global {} of {}-byte elements at {} byte {} , whose elements have {} bytes", what,
           elem_bytes, hit->name, off, hit->elem_bytes);
    if (store && !hit->writable)
      fail("global store into input {} at element {}", hit->name, off / size_t(elem_bytes));
    if (bytes == 16 && off % 16 != 0)
      fail("128-bit global {} at {} element {} is not 16-byte aligned", what, hit->name,
           off / size_t(elem_bytes));
    std::memcpy(dst, src, bytes);
  }

  /// Posts this lane at a collective and runs the others until it completes.
  void wait_at(At at, const void *site) {
    Lane &lane = lanes_[size_t(current_)];
    lane.at = at;
    lane.site = site;
    emu::switch_context(lane.context, scheduler_);
  }

  Lane &lane() { return lanes_[size_t(current_)]; }

  /// Records an error for the current lane and leaves its fiber for good.
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args &&...args) {
    error_ = group_error(current_, f, std::forward<Args>(args)...);
    emu::switch_context(lanes_[size_t(current_)].context, scheduler_);
    std::abort(); // never resumed
  }

private:
  static void lane_main(void *arg) {
    auto *w = static_cast<Worker *>(arg);
    const Launch &l = w->launch_;
    l.entry(l.args);
    Lane &lane = w->lanes_[size_t(w->current_)];
    lane.at = At::exited;
    emu::switch_context(lane.context, w->scheduler_);
    std::abort(); // never resumed
  }

  template <typename... Args>
  Status group_error(int lane, fmt::format_string<Args...> f, Args &&...args) const {
    std::string where = fmt::format("emulator: kernel {}, workgroup ({},{},{})", launch_.kernel,
                                    group_[0], group_[1], group_[2]);
    if (lane >= 0)
      where += fmt::format(", lane {} (wave {}, lane {} of the wave)", lane, lane / launch_.wave,
                           lane % launch_.wave);
    return Status::error("{}: {}", where, fmt::format(f, std::forward<Args>(args)...));
  }

  std::string lds_map() const {
    std::string s;
    for (const LdsArray &a : arrays_)
      s += fmt::format("{}{}: bytes [{}, {})", s.empty() ? "" : ", ", a.name, a.offset,
                       a.offset + a.bytes);
    return s.empty() ? "none declared" : s;
  }

  std::string nearest_buffer(const uint8_t *p, size_t bytes) const {
    const Buffer *best = nullptr;
    size_t best_distance = SIZE_MAX;
    std::string text;
    for (const Buffer &b : launch_.buffers) {
      if (!b.bytes)
        continue;
      size_t distance;
      std::string t;
      if (p >= b.base && p < b.base + b.bytes) {
        distance = 0;
        t = fmt::format("element {} of {} is inside, but the access ends {} bytes past the end "
                        "of {} ({} bytes)",
                        size_t(p - b.base) / size_t(b.elem_bytes), b.name,
                        size_t(p + bytes - (b.base + b.bytes)), b.name, b.bytes);
      } else if (p >= b.base + b.bytes) {
        distance = size_t(p - (b.base + b.bytes));
        t = fmt::format("{} bytes past the end of {} ({} bytes, element {} of {})", distance,
                        b.name, b.bytes, size_t(p - b.base) / size_t(b.elem_bytes), b.name);
      } else {
        distance = size_t(b.base - p);
        t = fmt::format("{} bytes before the start of {}", distance, b.name);
      }
      if (distance < best_distance) {
        best_distance = distance;
        best = &b;
        text = t;
      }
    }
    return best ? text : "the kernel has no buffers";
  }

  /// Checks that `lanes` wait at one call of their collective (`wave` < 0: the
  /// workgroup's barrier).
  Status same_site(const std::vector<int> &lanes, At at, int wave) {
    std::map<const void *, std::vector<int>> sites;
    for (int i : lanes)
      sites[lanes_[size_t(i)].site].push_back(wave < 0 ? i : i % launch_.wave);
    if (sites.size() == 1)
      return Status::ok();
    std::vector<std::vector<int>> groups; // in order of their first lane
    for (auto &[site, group] : sites)
      groups.push_back(std::move(group));
    std::sort(groups.begin(), groups.end());
    std::string parts;
    for (const std::vector<int> &group : groups)
      parts += fmt::format("{}lanes {} at {} {} call", parts.empty() ? "" : ", ",
                           lane_ranges(group), parts.empty() ? "one" : "another", at_name(at));
    if (wave < 0)
      return group_error(lanes.front(), "a barrier is not reached by every lane: {}", parts);
    return group_error(lanes.front(),
                       "{} issued by wave {} with inactive lanes: {} (the collective sits in "
                       "divergent control flow)",
                       at_name(at), wave, parts);
  }

  /// Completes wave w's collective if all its lanes wait at one; true if it did.
  Expected<bool> complete_wave(int w) {
    const int first = w * launch_.wave;
    const int last = std::min(first + launch_.wave, launch_.block_threads);
    int count[5] = {};
    for (int i = first; i < last; ++i)
      ++count[int(lanes_[size_t(i)].at)];
    const int mma = count[int(At::mma)], shfl = count[int(At::shfl)];
    if (mma + shfl == 0)
      return false;
    const At at = mma ? At::mma : At::shfl;
    if (count[int(at)] != launch_.wave) {
      std::string parts;
      for (At other : {At::mma, At::shfl, At::barrier, At::exited}) {
        std::vector<int> in;
        for (int i = first; i < last; ++i)
          if (lanes_[size_t(i)].at == other)
            in.push_back(i - first);
        if (!in.empty())
          parts += fmt::format("{}lanes {} {}", parts.empty() ? "" : "; ", lane_ranges(in),
                               other == At::exited ? "returned from the kernel"
                                                   : "at " + std::string(at_name(other)));
      }
      if (last - first < launch_.wave)
        parts += fmt::format("; lanes {}-{} do not exist (the workgroup has {} work-items)",
                             last - first, launch_.wave - 1, launch_.block_threads);
      int culprit = first;
      while (culprit < last && lanes_[size_t(culprit)].at == at)
        ++culprit;
      return group_error(culprit < last ? culprit : first,
                         "{} issued by wave {} with inactive lanes ({}): every lane of the wave "
                         "must take part",
                         at_name(at), w, parts);
    }
    std::vector<int> lanes;
    for (int i = first; i < last; ++i)
      lanes.push_back(i);
    FJ_RETURN_IF_ERROR(same_site(lanes, at, w));
    if (at == At::mma && !launch_.layout)
      return group_error(first,
                         "fj_mma issued by wave {}, but the kernel names no matrix "
                         "instruction (Lowered::mma is null)",
                         w);
    if (at == At::mma)
      FJ_RETURN_IF_ERROR(matrix_multiply(first));
    else
      shuffle(first);
    for (int i = first; i < last; ++i)
      lanes_[size_t(i)].at = At::ready;
    ++wave_step_[size_t(w)];
    return true;
  }

  /// D = A * B + C for the wave starting at lane `first`, through the lane maps.
  Status matrix_multiply(int first) {
    const LaneLayout &l = *launch_.layout;
    // Gather A and B from every lane's fragment, decoded. With replicated rows
    // (gfx11) the second copy of an entry must have the same bits as the first.
    auto gather = [&](std::vector<float> &values, std::vector<int> &from,
                      std::vector<uint16_t> &first_bits, const std::vector<int> &index, int elems,
                      const uint16_t *Lane::*operand, char name, int cols) -> Status {
      const bool replicated = l.ab_replication > 1;
      if (replicated)
        std::fill(from.begin(), from.end(), -1);
      for (int lane = 0; lane < launch_.wave; ++lane) {
        const uint16_t *v = lanes_[size_t(first + lane)].*operand;
        const int *at = index.data() + size_t(lane * elems);
        for (int e = 0; e < elems; ++e) {
          const size_t i = size_t(at[e]);
          if (replicated && from[i] >= 0) {
            if (first_bits[i] != v[e])
              return group_error(first + lane,
                                 "fj_mma: {} entry ({}, {}) is 0x{:04x} in lane {} but 0x{:04x} "
                                 "in lane {}; {} needs the replicas equal",
                                 name, at[e] / cols, at[e] % cols, first_bits[i], from[i], v[e],
                                 lane, l.name);
            continue;
          }
          if (replicated) {
            from[i] = lane;
            first_bits[i] = v[e];
          }
          values[i] = launch_.decode[v[e]];
        }
      }
      return Status::ok();
    };
    // Products of two bf16/f16 values are exact in f32.
    FJ_RETURN_IF_ERROR(
        gather(af_, a_from_, a_bits_, launch_.a_index, l.a_elems, &Lane::a, 'A', l.k));
    FJ_RETURN_IF_ERROR(
        gather(bf_, b_from_, b_bits_, launch_.b_index, l.b_elems, &Lane::b, 'B', l.n));
    for (int lane = 0; lane < launch_.wave; ++lane)
      for (int e = 0; e < l.cd_elems; ++e)
        d_[size_t(launch_.d_index[size_t(lane * l.cd_elems + e)])] =
            lanes_[size_t(first + lane)].c[e];
    // Row by row, k outer, four columns at a time: each D entry still sums C,
    // then k = 0, 1, ... in order (no fused multiply-add).
    typedef float f32x4 __attribute__((vector_size(16)));
    for (int m = 0; m < l.m; ++m) {
      float *row = d_.data() + size_t(m * l.n);
      int n = 0;
      for (; n + 4 <= l.n; n += 4) {
        f32x4 acc;
        std::memcpy(&acc, row + n, sizeof acc);
        for (int k = 0; k < l.k; ++k) {
          f32x4 b;
          std::memcpy(&b, bf_.data() + size_t(k * l.n + n), sizeof b);
          acc += af_[size_t(m * l.k + k)] * b;
        }
        std::memcpy(row + n, &acc, sizeof acc);
      }
      for (; n < l.n; ++n)
        for (int k = 0; k < l.k; ++k)
          row[n] += af_[size_t(m * l.k + k)] * bf_[size_t(k * l.n + n)];
    }
    for (int lane = 0; lane < launch_.wave; ++lane)
      for (int e = 0; e < l.cd_elems; ++e)
        lanes_[size_t(first + lane)].d[e] =
            d_[size_t(launch_.d_index[size_t(lane * l.cd_elems + e)])];
    return Status::ok();
  }

  /// ds_bpermute: each lane reads the value of lane (its lane argument ^ mask),
  /// the index wrapping at the wave size as the hardware's address bits do.
  void shuffle(int first) {
    for (int lane = 0; lane < launch_.wave; ++lane) {
      Lane &me = lanes_[size_t(first + lane)];
      const int src = (me.shfl_lane ^ me.shfl_mask) & (launch_.wave - 1);
      me.shfl_result = lanes_[size_t(first + src)].shfl_value;
    }
  }

  const Launch &launch_;
  emu::StackPool stacks_;
  std::vector<Lane> lanes_;
  emu::Context scheduler_;
  std::vector<uint8_t> lds_;
  // LDS bookkeeping per 2-byte element. Epochs count barriers over the worker's
  // life (never reset, so a new workgroup only moves group_epoch_); a wave's step
  // counts its completed wave-wide instructions.
  std::vector<LdsCell> cells_;
  uint32_t epoch_ = 0, group_epoch_ = 0;
  std::vector<uint32_t> wave_step_;
  std::vector<LdsArray> arrays_;
  size_t lds_used_ = 0;
  int64_t group_[3] = {0, 0, 0};
  int current_ = -1;
  std::optional<Status> error_;
  // Scratch of the matrix instruction.
  // gfx11: the lane holding each A/B entry's first copy, and its bits.
  std::vector<int> a_from_, b_from_;
  std::vector<uint16_t> a_bits_, b_bits_;
  std::vector<float> af_, bf_, d_;
};

// ---- the hooks the JIT'd kernel calls (bound as absolute symbols) ----

__attribute__((noinline)) int hook_thread_id() { return t_worker->thread_id(); }
__attribute__((noinline)) int hook_group_id(int dim) { return t_worker->group_id(dim); }
__attribute__((noinline)) void *hook_lds_alloc(unsigned long elem_bytes, unsigned long count,
                                               const char *name) {
  return t_worker->lds_alloc(elem_bytes, count, name);
}
__attribute__((noinline)) void hook_barrier() {
  t_worker->wait_at(At::barrier, __builtin_return_address(0));
}
__attribute__((noinline)) float hook_shfl_xor(float x, int lane, int mask) {
  Lane &me = t_worker->lane();
  me.shfl_value = x;
  me.shfl_lane = lane;
  me.shfl_mask = mask;
  t_worker->wait_at(At::shfl, __builtin_return_address(0));
  return t_worker->lane().shfl_result;
}
__attribute__((noinline)) void hook_mma(const void *a, const void *b, const void *c, void *d) {
  Lane &me = t_worker->lane();
  me.a = static_cast<const uint16_t *>(a);
  me.b = static_cast<const uint16_t *>(b);
  me.c = static_cast<const float *>(c);
  me.d = static_cast<float *>(d);
  t_worker->wait_at(At::mma, __builtin_return_address(0));
}
__attribute__((noinline)) void hook_global_load(void *dst, const void *src, int elem_bytes,
                                                int count) {
  t_worker->global_access(dst, src, elem_bytes, count, false);
}
__attribute__((noinline)) void hook_global_store(void *dst, const void *src, int elem_bytes,
                                                 int count) {
  t_worker->global_access(dst, src, elem_bytes, count, true);
}
__attribute__((noinline)) void hook_lds_load(void *dst, const void *src, int bytes) {
  t_worker->lds_access(dst, src, bytes, false);
}
__attribute__((noinline)) void hook_lds_store(void *dst, const void *src, int bytes) {
  t_worker->lds_access(dst, src, bytes, true);
}
// UBSan's out-of-bounds report (-fsanitize=array-bounds in the JIT's compile):
// its data layout is the sanitizer runtime's stable ABI.
struct UbsanSourceLocation {
  const char *file;
  uint32_t line, column;
};
struct UbsanTypeDescriptor {
  uint16_t kind, info; // integers: info = log2(bits) << 1 | signed
  char name[1];
};
struct UbsanOutOfBounds {
  UbsanSourceLocation location;
  const UbsanTypeDescriptor *array_type, *index_type;
};
__attribute__((noinline)) void hook_out_of_bounds(void *data, uintptr_t index) {
  const auto *d = static_cast<const UbsanOutOfBounds *>(data);
  long long value = static_cast<long long>(index);
  const unsigned bits = 1u << (d->index_type->info >> 1);
  if ((d->index_type->info & 1) && bits < 64)
    value = static_cast<long long>(index << (64 - bits)) >> (64 - bits);
  t_worker->fail("index {} is out of bounds for the array of type {} at {}:{}:{}", value,
                 d->array_type->name, d->location.file, d->location.line, d->location.column);
}

float hook_exp2(float x) { return std::exp2(x); }
float hook_log2(float x) { return std::log2(x); }

const std::vector<compiler::HostSymbol> &host_symbols() {
  static const std::vector<compiler::HostSymbol> symbols = {
      {"fj_emu_thread_id", reinterpret_cast<void *>(&hook_thread_id)},
      {"fj_emu_group_id", reinterpret_cast<void *>(&hook_group_id)},
      {"fj_emu_lds_alloc", reinterpret_cast<void *>(&hook_lds_alloc)},
      {"fj_emu_barrier", reinterpret_cast<void *>(&hook_barrier)},
      {"fj_emu_shfl_xor", reinterpret_cast<void *>(&hook_shfl_xor)},
      {"fj_emu_mma", reinterpret_cast<void *>(&hook_mma)},
      {"fj_emu_global_load", reinterpret_cast<void *>(&hook_global_load)},
      {"fj_emu_global_store", reinterpret_cast<void *>(&hook_global_store)},
      {"fj_emu_lds_load", reinterpret_cast<void *>(&hook_lds_load)},
      {"fj_emu_lds_store", reinterpret_cast<void *>(&hook_lds_store)},
      {"fj_emu_exp2", reinterpret_cast<void *>(&hook_exp2)},
      {"fj_emu_log2", reinterpret_cast<void *>(&hook_log2)},
      {"__ubsan_handle_out_of_bounds", reinterpret_cast<void *>(&hook_out_of_bounds)},
      {"__ubsan_handle_out_of_bounds_abort", reinterpret_cast<void *>(&hook_out_of_bounds)},
      // What the optimizer may turn array copies and zeroing into.
      {"memcpy", reinterpret_cast<void *>(&::memcpy)},
      {"memmove", reinterpret_cast<void *>(&::memmove)},
      {"memset", reinterpret_cast<void *>(&::memset)},
  };
  return symbols;
}

/// Flattens and checks a layout's lane maps: every A and B entry held by
/// exactly ab_replication (lane, element) slots, every D entry by one.
Status flatten_lane_maps(const LaneLayout &l, int wave, Launch &out) {
  if (l.wave_size != wave)
    return Status::error("emulator: {} is a wave{} layout but the target runs wave{}", l.name,
                         l.wave_size, wave);
  if (l.a_elems > 16 || l.b_elems > 16 || l.cd_elems > 16)
    return Status::error("emulator: {} takes {}/{}/{} elements per lane for A/B/C, but the "
                         "emulation prelude's fj_mma passes at most 16",
                         l.name, l.a_elems, l.b_elems, l.cd_elems);
  auto flatten = [&](const char *what, lowering::LaneMap map, int elems, int rows, int cols,
                     int copies, std::vector<int> &index) -> Status {
    std::vector<int> seen(size_t(rows * cols), 0);
    index.assign(size_t(wave * elems), 0);
    for (int lane = 0; lane < wave; ++lane)
      for (int e = 0; e < elems; ++e) {
        const MatrixCoord c = map(lane, e);
        if (c.row < 0 || c.row >= rows || c.col < 0 || c.col >= cols)
          return Status::error("emulator: {} lane map {}({}, {}) = ({}, {}) is outside {}x{}",
                               l.name, what, lane, e, c.row, c.col, rows, cols);
        index[size_t(lane * elems + e)] = c.row * cols + c.col;
        ++seen[size_t(c.row * cols + c.col)];
      }
    for (int i = 0; i < rows * cols; ++i)
      if (seen[size_t(i)] != copies)
        return Status::error("emulator: {} lane map {} holds entry ({}, {}) in {} slots, not {}",
                             l.name, what, i / cols, i % cols, seen[size_t(i)], copies);
    return Status::ok();
  };
  FJ_RETURN_IF_ERROR(flatten("a", l.a, l.a_elems, l.m, l.k, l.ab_replication, out.a_index));
  FJ_RETURN_IF_ERROR(flatten("b", l.b, l.b_elems, l.k, l.n, l.ab_replication, out.b_index));
  FJ_RETURN_IF_ERROR(flatten("d", l.d, l.cd_elems, l.m, l.n, 1, out.d_index));
  return Status::ok();
}

/// Host floats -> 16-bit device elements, checking each is representable.
Status to_device(std::string_view name, const std::vector<float> &in, DType t, uint8_t *out) {
  if (t == DType::f32) { // f32 tensors (f32_io): the floats as they are, NaN poison included
    std::memcpy(out, in.data(), in.size() * sizeof(float));
    return Status::ok();
  }
  auto *bits = reinterpret_cast<uint16_t *>(out);
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    if (!std::isnan(x) && round_to(t, x) != x)
      return Status::error("emulator: {}[{}] = {} is not representable in {}", name, i, x,
                           dtype_name(t));
    bits[i] = std::isnan(x) ? uint16_t(0x7fff) : uint16_t(to_bits(t, x));
  }
  return Status::ok();
}

} // namespace

Status emulator_status() {
  auto plugin = compiler::llvm_plugin();
  return plugin ? Status::ok() : plugin.status().with_context("the CPU emulator");
}

bool emulator_available() { return emulator_status().is_ok(); }

namespace {

/// The entry point the emulator calls: unpacks the launch's argument addresses
/// (KernelArgs) into the kernel's parameters.
std::string launcher_text(const lowering::Lowered &k) {
  std::string call;
  for (size_t i = 0; i < k.params.size(); ++i)
    call += fmt::format("{}*static_cast<{} *>(args[{}])", i ? ", " : "", k.params[i].c_type, i);
  return fmt::format("\nextern \"C\" void {}(void *const *args) {{ {}({}); }}\n",
                     compiler::kLauncherName, k.kernel_name, call);
}

} // namespace

Status emulate_kernel(const lowering::Lowered &k, const lowering::Target &target,
                      const ir::Bindings &shapes, std::span<const EmulatorBuffer> buffers,
                      const EmulatorOptions &options) {
  // Lowered::mma is null for kernels without a matrix instruction (simt rules).
  if (k.mma && !k.mma->layout)
    return Status::error("emulator: kernel {}'s matrix instruction {} has no lane layout",
                         k.kernel_name, k.mma->mnemonic);
  if (target.wave_size <= 0 || (target.wave_size & (target.wave_size - 1)))
    return Status::error("emulator: wave size {} of {} is not a power of two", target.wave_size,
                         target.arch);
  if (k.block_threads <= 0 || k.block_threads > target.max_workgroup_size)
    return Status::error("emulator: kernel {} launches {} work-items per workgroup; {} allows 1 "
                         "to {}",
                         k.kernel_name, k.block_threads, target.arch, target.max_workgroup_size);
  auto grid = ir::grid_size(k.grid, shapes);
  if (!grid)
    return grid.status();
  if ((*grid)[0] <= 0 || (*grid)[1] <= 0 || (*grid)[2] <= 0)
    return Status::ok(); // nothing to compute (no query rows, or keys), as on a GPU

  Launch launch;
  launch.kernel = k.kernel_name;
  launch.target = &target;
  launch.lowered = &k;
  launch.layout = k.mma ? k.mma->layout : nullptr;
  launch.block_threads = k.block_threads;
  launch.wave = target.wave_size;
  launch.lane_stack_bytes = options.lane_stack_bytes;
  std::copy(grid->begin(), grid->end(), launch.grid);
  if (k.mma) {
    FJ_RETURN_IF_ERROR(flatten_lane_maps(*launch.layout, target.wave_size, launch));
    launch.decode.resize(65536);
    for (uint32_t b = 0; b < 65536; ++b)
      launch.decode[b] = from_bits(k.mma->ab_dtype, b);
  }

  auto compiled = compiler::compile_for_host(templates::emulator_prelude,
                                             k.kernel_text + launcher_text(k), host_symbols());
  if (!compiled)
    return compiled.status();
  launch.entry = (*compiled)->entry;
  if ((*compiled)->workgroup_size != 0 && (*compiled)->workgroup_size != k.block_threads)
    return Status::error("emulator: kernel {} declares FJ_WORKGROUP_SIZE({}) but is launched with "
                         "{} work-items per workgroup",
                         k.kernel_name, (*compiled)->workgroup_size, k.block_threads);

  std::vector<NamedPointer> pointers;
  for (const EmulatorBuffer &b : buffers) {
    launch.buffers.push_back(
        {b.name, static_cast<uint8_t *>(b.data), b.bytes, b.elem_bytes, b.writable});
    pointers.push_back({b.name, b.data});
  }
  auto args = KernelArgs::make(k.params, shapes, pointers);
  if (!args)
    return args.status().with_context(fmt::format("emulator: kernel {}", k.kernel_name));
  launch.args = args->addresses().data();

  // Workgroups in parallel; the reported error is the lowest-numbered failing
  // workgroup's, which every run reaches (only higher numbers are skipped).
  const int64_t groups = launch.grid[0] * launch.grid[1] * launch.grid[2];
  int threads =
      options.threads > 0 ? options.threads : std::max(1, int(std::thread::hardware_concurrency()));
  threads = int(std::min<int64_t>(threads, groups));
  std::atomic<int64_t> next{0}, first_failed{INT64_MAX}, done{0};
  std::mutex errors_mutex;
  std::map<int64_t, Status> errors;
  // Progress (EmulatorOptions::progress): a thread that reports every interval
  // until the workgroups are done.
  std::mutex progress_mutex;
  std::condition_variable progress_cv;
  bool finished = false;
  std::thread reporter;
  if (options.progress)
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lock(progress_mutex);
      while (!progress_cv.wait_for(lock, options.progress_every, [&] { return finished; }))
        options.progress(done.load(), groups);
    });
  auto work = [&] {
    Worker worker(launch);
    Worker *saved = t_worker;
    t_worker = &worker;
    Status init = worker.init();
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= groups || i > first_failed.load())
        break;
      Status s = init ? worker.run_group(i) : init;
      ++done;
      if (!s) {
        std::lock_guard<std::mutex> lock(errors_mutex);
        errors.emplace(i, s);
        int64_t seen = first_failed.load();
        while (i < seen && !first_failed.compare_exchange_weak(seen, i)) {
        }
      }
    }
    t_worker = saved;
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i)
    pool.emplace_back(work);
  work();
  for (std::thread &th : pool)
    th.join();
  if (reporter.joinable()) {
    {
      std::lock_guard<std::mutex> lock(progress_mutex);
      finished = true;
    }
    progress_cv.notify_all();
    reporter.join();
  }
  if (!errors.empty())
    return errors.begin()->second;
  return Status::ok();
}

namespace {

/// The attention tensors as device buffers: 16-bit Q, K, V and O (poisoned),
/// f32 LSE (poisoned) when the spec has one.
struct DeviceTensors {
  AlignedBytes q, k, v, o, lse, mask;
  std::vector<uint8_t> mask_blocks; // the mask tensor's block summary, for kernels that read it
  std::vector<EmulatorBuffer> buffers;
};

/// Kernel `k` reads a mask tensor's block summary: the summary kernel writes it
/// into d.mask_blocks from the attn_mask buffer, and the buffer joins d.buffers.
Status add_mask_blocks(const lowering::Lowered &k, const lowering::Target &target,
                       const AttentionSpec &spec, DeviceTensors &d,
                       const EmulatorOptions &options) {
  if (k.mask_blocks.block_q == 0)
    return Status::ok();
  auto mask = std::find_if(d.buffers.begin(), d.buffers.end(),
                           [](const EmulatorBuffer &b) { return b.name == "attn_mask"; });
  if (mask == d.buffers.end())
    return Status::error("emulator: kernel {} reads a mask tensor's block summary, but the spec "
                         "has no mask tensor",
                         k.kernel_name);
  FJ_RETURN_IF_ERROR(emulate_mask_blocks(k, target, spec, *mask, d.mask_blocks, options));
  d.buffers.push_back({"attn_mask_blocks", d.mask_blocks.data(), d.mask_blocks.size(), 1, false});
  return Status::ok();
}

Status check_attention(const lowering::Lowered &k, const AttentionSpec &spec,
                       const HostTensors &tensors) {
  FJ_RETURN_IF_ERROR(lowering::check_launch(k, spec));
  if (spec.dtype != DType::bf16 && spec.dtype != DType::f16)
    return Status::error("emulator: the kernels take bf16 or f16 tensors, not {}",
                         dtype_name(spec.dtype));
  if (k.mma && k.mma->ab_dtype != spec.dtype)
    return Status::error("emulator: kernel {} multiplies {} but the spec's tensors are {}",
                         k.kernel_name, dtype_name(k.mma->ab_dtype), dtype_name(spec.dtype));
  const std::pair<const char *, std::pair<size_t, int64_t>> sizes[] = {
      {"Q", {tensors.q.size(), spec.q_elements()}},
      {"K", {tensors.k.size(), spec.k_elements()}},
      {"V", {tensors.v.size(), spec.v_elements()}},
      {"O", {tensors.o.size(), spec.o_elements()}},
      {"LSE", {tensors.lse.size(), spec.lse ? spec.lse_elements() : int64_t(tensors.lse.size())}},
  };
  for (const auto &[name, n] : sizes)
    if (int64_t(n.first) != n.second)
      return Status::error("emulator: host tensor {} holds {} elements; the spec needs {}", name,
                           n.first, n.second);
  const size_t slopes = spec.alibi == Alibi::none    ? 0
                        : spec.alibi == Alibi::heads ? size_t(spec.heads)
                                                     : size_t(spec.batch * spec.heads);
  if (tensors.alibi_slopes.size() != slopes)
    return Status::error("emulator: host alibi_slopes holds {} values; the spec needs {}",
                         tensors.alibi_slopes.size(), slopes);
  // One per query head: a KV head's q_group with grouped rows (GQA-packed decode).
  const int64_t sinks = spec.sinks ? spec.heads * spec.q_group : 0;
  if (int64_t(tensors.sinks.size()) != sinks)
    return Status::error("emulator: host sinks holds {} values; the spec needs {}",
                         tensors.sinks.size(), sinks);
  if (int64_t(tensors.attn_mask.size()) != spec.mask_elements())
    return Status::error("emulator: host attn_mask holds {} values; the spec's mask needs {}",
                         tensors.attn_mask.size(), spec.mask_elements());
  return check_sequences(spec, tensors).with_context("emulator");
}

Status to_device_tensors(const AttentionSpec &spec, const HostTensors &tensors, DeviceTensors &d) {
  // Device buffers: 16-bit elements (f32 for LSE, and for Q/K/V/O with f32_io),
  // poison wherever the host has NaN.
  const DType t = spec.io_dtype();
  const size_t e = size_t(dtype_bytes(t));
  d.q = AlignedBytes(tensors.q.size() * e);
  d.k = AlignedBytes(tensors.k.size() * e);
  d.v = AlignedBytes(tensors.v.size() * e);
  d.o = AlignedBytes(tensors.o.size() * e);
  d.lse = AlignedBytes(spec.lse ? tensors.lse.size() * 4 : 0);
  FJ_RETURN_IF_ERROR(to_device("Q", tensors.q, t, d.q.data));
  FJ_RETURN_IF_ERROR(to_device("K", tensors.k, t, d.k.data));
  FJ_RETURN_IF_ERROR(to_device("V", tensors.v, t, d.v.data));
  if (t == DType::f32)
    std::fill_n(reinterpret_cast<float *>(d.o.data), tensors.o.size(),
                std::numeric_limits<float>::quiet_NaN());
  else
    std::fill_n(reinterpret_cast<uint16_t *>(d.o.data), tensors.o.size(), uint16_t(0x7fff));
  std::fill_n(reinterpret_cast<float *>(d.lse.data), spec.lse ? tensors.lse.size() : 0,
              std::numeric_limits<float>::quiet_NaN());
  d.buffers = {{"Q", d.q.data, tensors.q.size() * e, int(e), false},
               {"K", d.k.data, tensors.k.size() * e, int(e), false},
               {"V", d.v.data, tensors.v.size() * e, int(e), false},
               {"O", d.o.data, tensors.o.size() * e, int(e), true},
               {"LSE", d.lse.data, spec.lse ? tensors.lse.size() * 4 : 0, 4, true}};
  // The index arrays (Sequences), read as they are; after the five tensors.
  for (const auto &[name, array] : {std::pair{"cu_seqlens_q", &tensors.cu_seqlens_q},
                                    {"cu_seqlens_k", &tensors.cu_seqlens_k},
                                    {"seqused_k", &tensors.seqused_k},
                                    {"block_table", &tensors.block_table}})
    if (!array->empty())
      d.buffers.push_back(
          {name, const_cast<int32_t *>(array->data()), array->size() * 4, 4, false});
  if (!tensors.sinks.empty())
    d.buffers.push_back(
        {"sinks", const_cast<float *>(tensors.sinks.data()), tensors.sinks.size() * 4, 4, false});
  if (!tensors.alibi_slopes.empty())
    d.buffers.push_back({"alibi_slopes", const_cast<float *>(tensors.alibi_slopes.data()),
                         tensors.alibi_slopes.size() * 4, 4, false});
  if (spec.mask != MaskType::none) { // in its own element type, as a GPU reads it
    const int bytes = mask_type_bytes(spec.mask);
    const size_t size = tensors.attn_mask.size() * size_t(bytes);
    d.mask = AlignedBytes(size);
    mask_storage(spec.mask, tensors.attn_mask, d.mask.data);
    d.buffers.push_back({"attn_mask", d.mask.data, size, bytes, false});
  }
  return Status::ok();
}

void from_device_tensors(const AttentionSpec &spec, const DeviceTensors &d, HostTensors &tensors) {
  if (spec.f32_io)
    std::copy_n(reinterpret_cast<const float *>(d.o.data), tensors.o.size(), tensors.o.begin());
  else
    for (size_t i = 0; i < tensors.o.size(); ++i)
      tensors.o[i] = from_bits(spec.dtype, reinterpret_cast<const uint16_t *>(d.o.data)[i]);
  if (spec.lse)
    std::copy_n(reinterpret_cast<const float *>(d.lse.data), tensors.lse.size(),
                tensors.lse.begin());
}

} // namespace

Status emulate(const lowering::Lowered &k, const lowering::Target &target,
               const AttentionSpec &spec, HostTensors &tensors, const EmulatorOptions &options) {
  FJ_RETURN_IF_ERROR(check_attention(k, spec, tensors));
  DeviceTensors d;
  FJ_RETURN_IF_ERROR(to_device_tensors(spec, tensors, d));
  FJ_RETURN_IF_ERROR(add_mask_blocks(k, target, spec, d, options));
  FJ_RETURN_IF_ERROR(emulate_kernel(k, target, ir::bind_attention(spec), d.buffers, options));
  from_device_tensors(spec, d, tensors);
  return Status::ok();
}

Status emulate_split_kv(const lowering::Lowered &partial, const lowering::Lowered &combine,
                        const lowering::Target &target, const AttentionSpec &spec, int64_t splits,
                        HostTensors &tensors, const EmulatorOptions &options) {
  FJ_RETURN_IF_ERROR(check_attention(partial, spec, tensors));
  DeviceTensors d;
  FJ_RETURN_IF_ERROR(to_device_tensors(spec, tensors, d));
  FJ_RETURN_IF_ERROR(add_mask_blocks(partial, target, spec, d, options));
  // The workspace, poisoned: every element the combine reads must have been written.
  const ir::SplitWorkspace ws = ir::split_workspace(spec, splits);
  AlignedBytes o_partial(size_t(ws.o_elements) * 4), lse_partial(size_t(ws.lse_elements) * 4);
  std::fill_n(reinterpret_cast<float *>(o_partial.data), ws.o_elements,
              std::numeric_limits<float>::quiet_NaN());
  std::fill_n(reinterpret_cast<float *>(lse_partial.data), ws.lse_elements,
              std::numeric_limits<float>::quiet_NaN());
  std::vector<EmulatorBuffer> first = {
      d.buffers[0],
      d.buffers[1],
      d.buffers[2],
      {"O", o_partial.data, size_t(ws.o_elements) * 4, 4, true},
      {"LSE", lse_partial.data, size_t(ws.lse_elements) * 4, 4, true}};
  first.insert(first.end(), d.buffers.begin() + 5, d.buffers.end()); // the index arrays
  FJ_RETURN_IF_ERROR(
      emulate_kernel(partial, target, ir::bind_split_kv(spec, splits), first, options));
  std::vector<EmulatorBuffer> second = {
      {"O_partial", o_partial.data, size_t(ws.o_elements) * 4, 4, false},
      {"LSE_partial", lse_partial.data, size_t(ws.lse_elements) * 4, 4, false},
      d.buffers[3],
      d.buffers[4]};
  for (const EmulatorBuffer &b : d.buffers) // attention sinks are the combine's
    if (b.name == "sinks")
      second.push_back(b);
  FJ_RETURN_IF_ERROR(
      emulate_kernel(combine, target, lowering::bind_split_combine(spec, splits), second, options));
  from_device_tensors(spec, d, tensors);
  return Status::ok();
}

Status emulate_mask_blocks(const lowering::Lowered &k, const lowering::Target &target,
                           const AttentionSpec &spec, const EmulatorBuffer &mask,
                           std::vector<uint8_t> &blocks, const EmulatorOptions &options) {
  // Poisoned with "empty": an entry the summary kernel misses hides its block,
  // which a test against the reference sees.
  blocks.assign(size_t(lowering::mask_blocks_bytes(spec, k.mask_blocks)), 0);
  if (blocks.empty())
    return Status::ok();
  auto summary = lowering::lower_mask_blocks(spec, target);
  if (!summary)
    return summary.status();
  const EmulatorBuffer buffers[] = {mask,
                                    {"attn_mask_blocks", blocks.data(), blocks.size(), 1, true}};
  return emulate_kernel(*summary, target, lowering::bind_mask_blocks(spec, k.mask_blocks), buffers,
                        options);
}

} // namespace flashjit::runtime
