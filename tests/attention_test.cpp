// flashjit::Attention, the devices and the GPU drivers.
//
//   * the emulator device: forward() on host buffers of 16-bit bits against the
//     float64 reference, outputs poisoned first, gaps of a padded O untouched;
//   * explain() names the rules, config, compiler, cache outcome and executor;
//   * strict by default: a spec the target cannot fit fails create() with the
//     reason; allow_fallback runs the IR interpreter and says so; every AMD arch
//     is served by a generated kernel or refused at create(); the rules choice;
//   * forward() argument checks: null, misaligned (naming the pointer and the
//     alignment), an LSE buffer the spec does not ask for;
//   * device names, list_devices(); hip/cuda absent: the error names the
//     library paths tried;
//   * where libcuda.so.1 and a GPU exist (the device machine): the CUDA driver
//     loads a PTX kernel, launches it and copies memory; on cuda:0 the generated
//     kernel (once NVIDIA lowering and its compile work; until then the IR
//     interpreter fallback, on request) matches the reference on GPU memory.
#include "runtime/attention.h"

#include "ir/reference.h"
#include "lowering/lower.h"
#include "lowering/target.h"
#include "runtime/attention_detail.h"
#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/emulator.h"
#include "runtime/hip_driver.h"
#include "tests/support/sequences.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

using namespace flashjit;

namespace {

/// A private kernel cache for this process, so results never come from (or
/// land in) the user's cache.
class TempCacheEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    char pattern[] = "/tmp/flashjit-attention-test-XXXXXX";
    const char *dir = mkdtemp(pattern);
    ASSERT_NE(dir, nullptr);
    dir_ = dir;
    setenv("FLASHJIT_CACHE_DIR", dir, 1);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

private:
  std::string dir_;
};
const auto *const kCacheEnvironment = ::testing::AddGlobalTestEnvironment(new TempCacheEnvironment);

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE(std::string(message).find(text), std::string::npos)                                    \
      << "expected \"" << (text) << "\" in:\n"                                                     \
      << (message)

#define SKIP_WITHOUT_EMULATOR()                                                                    \
  if (!runtime::emulator_available())                                                              \
  GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)"

constexpr uint16_t kPoisonBits = 0xffff; // NaN in bf16 and f16
constexpr uint16_t kGapBits = 0x1234;    // a value the kernel must never write

/// 16-bit element bits of host floats; NaN (the gaps) becomes `gap`.
std::vector<uint16_t> to_bits16(const std::vector<float> &values, DType t, uint16_t gap) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = std::isnan(values[i]) ? gap : uint16_t(to_bits(t, values[i]));
  return bits;
}

std::vector<float> from_bits16(const std::vector<uint16_t> &bits, DType t) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    values[i] = from_bits(t, bits[i]);
  return values;
}

/// Device-layout buffers of a spec on the host: random inputs, poisoned outputs.
struct HostBuffers {
  HostTensors in;
  std::vector<uint16_t> q, k, v, o;
  std::vector<float> lse;
  explicit HostBuffers(const AttentionSpec &spec, uint64_t seed = 7)
      : in(make_random_inputs(spec, seed)) {
    q = to_bits16(in.q, spec.dtype, kGapBits);
    k = to_bits16(in.k, spec.dtype, kGapBits);
    v = to_bits16(in.v, spec.dtype, kGapBits);
    o.assign(size_t(spec.o_elements()), kGapBits);
    for_each_o(spec, [&](int64_t i) { o[size_t(i)] = kPoisonBits; });
    lse.assign(spec.lse ? size_t(spec.lse_elements()) : 0, std::nanf(""));
  }
  template <typename F> static void for_each_o(const AttentionSpec &s, F f) {
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seqlen_q; ++i)
          for (int64_t d = 0; d < s.head_dim_v; ++d)
            f(b * s.o.batch + h * s.o.head + i * s.o.seq + d * s.o.dim);
  }
  float *lse_or_null() { return lse.empty() ? nullptr : lse.data(); }
  Status forward(Attention &a) {
    return a.forward(q.data(), k.data(), v.data(), o.data(), lse_or_null());
  }
  /// The same kernel at the shapes of `shape` (run-time arguments).
  Status forward(Attention &a, const AttentionSpec &shape) {
    return a.forward(shape, q.data(), k.data(), v.data(), o.data(), lse_or_null());
  }
  /// The error of the outputs against the float64 reference.
  ErrorStats check(const AttentionSpec &spec) const {
    HostTensors result = in;
    result.o = from_bits16(o, spec.dtype);
    result.lse = lse;
    return compare(spec, result, reference_attention(spec, in));
  }
  int64_t gaps_overwritten(const AttentionSpec &spec) const {
    std::vector<bool> logical(o.size());
    for_each_o(spec, [&](int64_t i) { logical[size_t(i)] = true; });
    int64_t bad = 0;
    for (size_t i = 0; i < o.size(); ++i)
      bad += !logical[i] && o[i] != kGapBits;
    return bad;
  }
};

std::string describe(const ErrorStats &e) {
  return fmt::format("max_abs {} rel_l2 {} nonfinite {}", e.max_abs, e.rel_l2, e.nonfinite);
}

AttentionSpec small_spec(DType t = DType::bf16, Layout layout = Layout::bshd) {
  AttentionSpec s = make_spec(1, 4, 2, 33, 47, 64, 64, t, layout);
  s.causal = true;
  s.lse = true;
  return s;
}

// ---- the emulator device ---------------------------------------------------

struct EmulatorCase {
  const char *name;
  AttentionSpec spec;
};

std::vector<EmulatorCase> emulator_cases() {
  std::vector<EmulatorCase> cases;
  cases.push_back({"bf16_bshd_gqa_causal_lse", small_spec()});
  AttentionSpec f16 = make_spec(2, 2, 1, 19, 19, 80, 48, DType::f16, Layout::bhsd);
  f16.window = {8, 0};
  cases.push_back({"f16_bhsd_mqa_window_dqk80_dv48", f16});
  AttentionSpec inter = make_spec(1, 2, 2, 24, 40, 32, 32, DType::bf16, Layout::interleaved);
  cases.push_back({"bf16_interleaved", inter});
  // O rows padded by 16 elements: the gaps must come back untouched.
  AttentionSpec padded = make_spec(1, 2, 2, 17, 30, 64, 64, DType::bf16, Layout::bshd);
  padded.o.seq = padded.heads * padded.head_dim_v + 16;
  padded.o.batch = padded.seqlen_q * padded.o.seq;
  cases.push_back({"bf16_padded_o_rows", padded});
  return cases;
}

TEST(AttentionEmulator, ForwardMatchesReference) {
  SKIP_WITHOUT_EMULATOR();
  for (const EmulatorCase &c : emulator_cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(c.spec.validate()) << c.spec.validate().message();
    auto attn = Attention::create(c.spec, "emulator:gfx1201");
    ASSERT_TRUE(attn) << attn.status().message();
    EXPECT_FALSE(attn->uses_fallback());
    EXPECT_FALSE(attn->code_object().empty()) << "auto compiles the AMD code object";
    HostBuffers buffers(c.spec);
    Status s = buffers.forward(*attn);
    ASSERT_TRUE(s) << s.message();
    const ErrorStats e = buffers.check(c.spec);
    const Tolerance tol = tolerance_for(c.spec.dtype);
    EXPECT_TRUE(e.within(tol.abs, tol.rel)) << describe(e);
    EXPECT_EQ(buffers.gaps_overwritten(c.spec), 0);
  }
}

TEST(AttentionEmulator, ForwardTwiceGivesTheSameBits) {
  SKIP_WITHOUT_EMULATOR();
  const AttentionSpec spec = small_spec();
  Options options;
  options.compiler = "none";
  auto attn = Attention::create(spec, "emulator:gfx1200", options);
  ASSERT_TRUE(attn) << attn.status().message();
  HostBuffers first(spec), second(spec);
  ASSERT_TRUE(first.forward(*attn));
  ASSERT_TRUE(second.forward(*attn));
  EXPECT_EQ(first.o, second.o);
  EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)));
}

TEST(AttentionEmulator, ExplainNamesEveryDecision) {
  SKIP_WITHOUT_EMULATOR();
  const AttentionSpec spec = small_spec(DType::f16);
  auto first = Attention::create(spec, "emulator:gfx1201");
  ASSERT_TRUE(first) << first.status().message();
  const std::string text = first->explain();
  EXPECT_HAS(text, "spec:");
  EXPECT_HAS(text, spec.summary());
  EXPECT_HAS(text, "device:   emulator:gfx1201");
  EXPECT_HAS(text, "rules:    gfx12");
  auto target = lowering::parse_target("gfx1201");
  ASSERT_TRUE(target);
  EXPECT_HAS(text, "config:   " + lowering::default_config(spec, *target).summary());
  EXPECT_HAS(text, "compiler: llvm");
  EXPECT_HAS(text, "cache:");
  EXPECT_HAS(text, "executor: the generated kernel on the CPU emulator of gfx1201");
  EXPECT_FALSE(first->source().empty());

  // The same spec again: the kernel cache serves it from memory.
  auto second = Attention::create(spec, "emulator:gfx1201");
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_HAS(second->explain(), "cache:    memory hit");
  EXPECT_EQ(first->source(), second->source());
  EXPECT_EQ(first->code_object(), second->code_object());
}

TEST(AttentionEmulator, CompilerNoneSkipsTheCodeObject) {
  SKIP_WITHOUT_EMULATOR();
  Options options;
  options.compiler = "none";
  auto attn = Attention::create(small_spec(), "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  EXPECT_TRUE(attn->code_object().empty());
  EXPECT_HAS(attn->explain(), "compiler: none");
}

TEST(AttentionEmulator, ConfigFromOptionsIsUsed) {
  SKIP_WITHOUT_EMULATOR();
  const AttentionSpec spec = small_spec();
  Options options;
  options.compiler = "none";
  options.config = ir::Config{.block_m = 32, .block_n = 32, .waves = 2};
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  EXPECT_HAS(attn->explain(), "config:   " + options.config->summary());
  HostBuffers buffers(spec);
  ASSERT_TRUE(buffers.forward(*attn));
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(buffers.check(spec).within(tol.abs, tol.rel)) << describe(buffers.check(spec));

  options.config->block_m = 0;
  auto bad = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_FALSE(bad);
  EXPECT_HAS(bad.status().message(), "block_m");
}

// ---- strict by default, fallback on request --------------------------------

TEST(AttentionStrict, SpecTheTargetCannotFitFailsWithTheReason) {
  // Head dims 512: the accumulator, Q and S tiles need more VGPRs than gfx1201 has.
  AttentionSpec spec = make_spec(1, 1, 1, 5, 7, 512, 512, DType::bf16);
  spec.lse = true;
  auto strict = Attention::create(spec, "emulator:gfx1201");
  if (!runtime::emulator_available()) {
    ASSERT_FALSE(strict);
    EXPECT_HAS(strict.status().message(), "without LLVM");
    return;
  }
  ASSERT_FALSE(strict);
  EXPECT_HAS(strict.status().message(), "no generated kernel for " + spec.summary());
  EXPECT_HAS(strict.status().message(), "VGPRs");
  EXPECT_HAS(strict.status().message(), "allow_fallback");

  Options options;
  options.allow_fallback = true;
  auto fallback = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(fallback) << fallback.status().message();
  EXPECT_TRUE(fallback->uses_fallback());
  EXPECT_TRUE(fallback->source().empty());
  EXPECT_HAS(fallback->explain(), "executor: the IR interpreter on the CPU (fallback: ");
  EXPECT_HAS(fallback->explain(), "VGPRs");
  HostBuffers buffers(spec);
  Status s = buffers.forward(*fallback);
  ASSERT_TRUE(s) << s.message();
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(buffers.check(spec).within(tol.abs, tol.rel)) << describe(buffers.check(spec));
}

TEST(AttentionStrict, EveryArchIsServedOrRefusedWithTheReason) {
  // Served by a generated kernel (matrix rules, or the portable simt rules with
  // the reason in explain()), or refused at create() naming the target and the
  // way out; never a kernel that fails later.
  SKIP_WITHOUT_EMULATOR();
  const AttentionSpec spec = small_spec();
  const Tolerance tol = tolerance_for(spec.dtype);
  for (std::string_view arch : lowering::supported_archs()) {
    auto target = lowering::parse_target(arch);
    ASSERT_TRUE(target);
    if (target->is_nvidia())
      continue;
    SCOPED_TRACE(arch);
    const std::string device = fmt::format("emulator:{}", arch);
    Options options;
    options.compiler = "none";
    auto attn = Attention::create(spec, device, options);
    if (!attn) {
      EXPECT_HAS(attn.status().message(), std::string(arch));
      EXPECT_HAS(attn.status().message(), "allow_fallback");
      options.allow_fallback = true;
      attn = Attention::create(spec, device, options);
      ASSERT_TRUE(attn) << attn.status().message();
      EXPECT_TRUE(attn->uses_fallback());
    } else {
      EXPECT_HAS(attn->explain(), "rules:    ");
    }
    HostBuffers buffers(spec);
    Status s = buffers.forward(*attn);
    ASSERT_TRUE(s) << s.message();
    EXPECT_TRUE(buffers.check(spec).within(tol.abs, tol.rel)) << describe(buffers.check(spec));
  }
}

TEST(AttentionStrict, RulesChoiceIsAnOption) {
  SKIP_WITHOUT_EMULATOR();
  const AttentionSpec spec = small_spec();
  Options options;
  options.compiler = "none";
  options.rules = "simt";
  auto simt = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(simt) << simt.status().message();
  EXPECT_HAS(simt->explain(), "rules:    simt (no matrix instruction)");
  HostBuffers buffers(spec);
  ASSERT_TRUE(buffers.forward(*simt));
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(buffers.check(spec).within(tol.abs, tol.rel)) << describe(buffers.check(spec));

  options.rules = "fastest";
  auto bad = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_FALSE(bad);
  EXPECT_HAS(bad.status().message(), "fastest");
}

TEST(AttentionStrict, FallbackNeverHidesABadArgument) {
  Options options;
  options.allow_fallback = true;
  options.config = ir::Config{.block_m = 0};
  auto a = Attention::create(small_spec(), "emulator:gfx1201", options);
  ASSERT_FALSE(a);
  EXPECT_HAS(a.status().message(), runtime::emulator_available() ? "block_m" : "without LLVM");
}

// ---- forward() arguments ---------------------------------------------------

TEST(AttentionForward, RejectsNullMisalignedAndUnaskedLse) {
  SKIP_WITHOUT_EMULATOR();
  AttentionSpec spec = small_spec();
  Options options;
  options.compiler = "none";
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  HostBuffers b(spec);

  Status s = attn->forward(nullptr, b.k.data(), b.v.data(), b.o.data(), b.lse.data());
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "q is null");

  // Dense rows of 64 bf16 elements: 128-bit accesses, so 16-byte pointers.
  EXPECT_HAS(attn->explain(), "pointers aligned to 16 bytes");
  s = attn->forward(b.q.data(), b.k.data() + 1, b.v.data(), b.o.data(), b.lse.data());
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "k (");
  EXPECT_HAS(s.message(), "not aligned to 16 bytes");

  s = attn->forward(b.q.data(), b.k.data(), b.v.data(), b.o.data(), nullptr);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "lse is null");

  spec.lse = false;
  auto no_lse = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(no_lse) << no_lse.status().message();
  s = no_lse->forward(b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data());
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "lse = false");
  // Nothing was written by the failed calls.
  for (uint16_t bits : b.o)
    ASSERT_TRUE(bits == kPoisonBits || bits == kGapBits);
}

TEST(AttentionCreate, InvalidSpecNamesTheField) {
  AttentionSpec spec = small_spec();
  spec.kv_heads = 3;
  auto a = Attention::create(spec, "emulator:gfx1201");
  ASSERT_FALSE(a);
  EXPECT_HAS(a.status().message(), "invalid attention spec");
  EXPECT_HAS(a.status().message(), "kv_heads");
}

// ---- devices ---------------------------------------------------------------

TEST(Devices, NamesAreParsedWithHelpfulErrors) {
  auto unknown = find_device("tpu:0");
  ASSERT_FALSE(unknown);
  EXPECT_HAS(unknown.status().message(), "unknown device 'tpu:0'");
  EXPECT_HAS(unknown.status().message(), "emulator:gfx1201");

  auto no_arch = find_device("emulator");
  ASSERT_FALSE(no_arch);
  EXPECT_HAS(no_arch.status().message(), "emulator:gfx1201");

  auto bad_arch = find_device("emulator:gfx9999");
  ASSERT_FALSE(bad_arch);
  EXPECT_HAS(bad_arch.status().message(), "unknown arch 'gfx9999'");

  auto nvidia = find_device("emulator:sm_90");
  ASSERT_FALSE(nvidia);
  EXPECT_HAS(nvidia.status().message(), "emulator:sm_90");

  auto bad_index = find_device("hip:first");
  ASSERT_FALSE(bad_index);
  EXPECT_HAS(bad_index.status().message(), "must be a number");

  if (runtime::emulator_available()) {
    auto emu = find_device("emulator:gfx1201");
    ASSERT_TRUE(emu) << emu.status().message();
    EXPECT_EQ(emu->kind, DeviceKind::emulator);
    EXPECT_EQ(emu->arch, "gfx1201");
    EXPECT_EQ(emu->id(), "emulator:gfx1201");
  }
}

TEST(Devices, ListHasTheEmulatorAndEveryGpuFound) {
  auto devices = list_devices();
  ASSERT_TRUE(devices) << devices.status().message();
  int emulators = 0;
  for (const DeviceInfo &d : *devices) {
    if (d.kind == DeviceKind::emulator) {
      ++emulators;
      EXPECT_TRUE(d.arch.empty());
      continue;
    }
    EXPECT_FALSE(d.arch.empty()) << d.id();
    auto again = find_device(d.id());
    ASSERT_TRUE(again) << again.status().message();
    EXPECT_EQ(again->name, d.name);
  }
  EXPECT_EQ(emulators, runtime::emulator_available() ? 1 : 0);
  const std::string report = backends_report();
  EXPECT_HAS(report, "hip: ");
  EXPECT_HAS(report, "cuda: ");
  EXPECT_HAS(report, "emulator: ");
}

TEST(Devices, MissingHipRuntimeNamesThePathsTried) {
  if (runtime::hip::api())
    GTEST_SKIP() << "the HIP runtime loads here: " << (*runtime::hip::api())->path;
  auto a = Attention::create(small_spec(), "hip:0");
  ASSERT_FALSE(a);
  const std::string &m = a.status().message();
  EXPECT_HAS(m, "device 'hip:0'");
  EXPECT_HAS(m, "cannot load the HIP runtime");
  for (const std::string &path : runtime::hip::library_candidates())
    EXPECT_HAS(m, path + ": ");
  EXPECT_HAS(backends_report(), "hip: not available");
}

TEST(Devices, MissingCudaDriverNamesThePathsTried) {
  if (runtime::cuda::api())
    GTEST_SKIP() << "the CUDA driver loads here: " << (*runtime::cuda::api())->path;
  auto a = Attention::create(small_spec(), "cuda:0");
  ASSERT_FALSE(a);
  const std::string &m = a.status().message();
  EXPECT_HAS(m, "device 'cuda:0'");
  EXPECT_HAS(m, "cannot load the CUDA driver");
  for (const std::string &path : runtime::cuda::library_candidates())
    EXPECT_HAS(m, path + ": ");
}

// ---- real NVIDIA GPUs (the device machine) ----------------------------------

/// cuda:0 when libcuda.so.1 loads and reports a device.
runtime::GpuDriver *cuda_or_skip_reason(std::string &why) {
  auto driver = runtime::cuda::driver();
  if (!driver) {
    why = driver.status().message();
    return nullptr;
  }
  auto count = (*driver)->device_count();
  if (!count || *count == 0) {
    why = count ? "the CUDA driver reports no device" : count.status().message();
    return nullptr;
  }
  return *driver;
}

// out[i] += 1.0f for i < 256: one block of 256 threads.
constexpr char kAddOnePtx[] = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry fj_add_one(.param .u64 data)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<5>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [data];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  add.f32 %f2, %f1, 0f3F800000;
  st.global.f32 [%rd4], %f2;
  ret;
}
)";

TEST(CudaDriver, LoadsLaunchesAndCopies) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  auto info = cuda->device_info(0);
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->arch.rfind("sm_", 0), 0u) << info->arch;
  std::printf("cuda:0 is %s (%s) via %s\n", info->name.c_str(), info->arch.c_str(),
              cuda->library_path().c_str());

  std::vector<float> host(256);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = float(i);
  auto buffer = cuda->allocate(0, host.size() * sizeof(float));
  ASSERT_TRUE(buffer) << buffer.status().message();
  ASSERT_TRUE(cuda->copy_to_device(0, *buffer, host.data(), host.size() * sizeof(float)));
  const std::string_view ptx = kAddOnePtx;
  auto kernel = cuda->load_kernel(0, {reinterpret_cast<const uint8_t *>(ptx.data()), ptx.size()},
                                  "fj_add_one");
  ASSERT_TRUE(kernel) << kernel.status().message();
  runtime::LaunchGeometry g;
  g.block[0] = 256;
  void *pointer = *buffer;
  void *const args[] = {&pointer}; // the address of each argument's value
  Status s = (*kernel)->launch(g, args, nullptr);
  ASSERT_TRUE(s) << s.message();
  ASSERT_TRUE(cuda->synchronize(0, nullptr));
  std::vector<float> back(host.size());
  ASSERT_TRUE(cuda->copy_to_host(0, back.data(), *buffer, back.size() * sizeof(float)));
  for (size_t i = 0; i < back.size(); ++i)
    ASSERT_EQ(back[i], float(i) + 1.0f) << i;

  auto missing = cuda->load_kernel(0, {reinterpret_cast<const uint8_t *>(ptx.data()), ptx.size()},
                                   "no_such_kernel");
  ASSERT_FALSE(missing);
  EXPECT_HAS(missing.status().message(), "cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND");
  auto garbage = cuda->load_kernel(0, std::vector<uint8_t>{1, 2, 3}, "fj_add_one");
  ASSERT_FALSE(garbage);
  EXPECT_HAS(garbage.status().message(), "cuModuleLoadData failed: CUDA_ERROR_");
  ASSERT_TRUE(cuda->release(0, *buffer));
}

TEST(CudaDriver, IndexPastTheCountIsAnError) {
  std::string why;
  if (!cuda_or_skip_reason(why))
    GTEST_SKIP() << why;
  auto a = find_device("cuda:4096");
  ASSERT_FALSE(a);
  EXPECT_HAS(a.status().message(), "cuda:4096 does not exist");
}

TEST(AttentionCuda, MatchesTheReferenceOnGpuMemory) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  const AttentionSpec spec = small_spec();
  Options options;
  options.synchronize = true;
  auto strict = Attention::create(spec, "cuda:0", options);
  if (!strict) {
    // While NVIDIA lowering or its nvrtc compile is incomplete: strict, with
    // the reason naming the target and the way out.
    EXPECT_HAS(strict.status().message(), "sm_");
    EXPECT_HAS(strict.status().message(), "allow_fallback");
    options.allow_fallback = true;
  }
  auto attn = Attention::create(spec, "cuda:0", options);
  ASSERT_TRUE(attn) << attn.status().message();
  std::printf("%s", attn->explain().c_str());

  HostBuffers host(spec);
  struct Buffer {
    void *device;
    const void *host;
    size_t bytes;
  };
  Buffer buffers[] = {{nullptr, host.q.data(), host.q.size() * 2},
                      {nullptr, host.k.data(), host.k.size() * 2},
                      {nullptr, host.v.data(), host.v.size() * 2},
                      {nullptr, host.o.data(), host.o.size() * 2},
                      {nullptr, host.lse.data(), host.lse.size() * 4}};
  for (Buffer &b : buffers) {
    auto p = cuda->allocate(0, b.bytes);
    ASSERT_TRUE(p) << p.status().message();
    b.device = *p;
    ASSERT_TRUE(cuda->copy_to_device(0, b.device, b.host, b.bytes));
  }
  Status s = attn->forward(buffers[0].device, buffers[1].device, buffers[2].device,
                           buffers[3].device, static_cast<float *>(buffers[4].device));
  ASSERT_TRUE(s) << s.message();
  ASSERT_TRUE(cuda->copy_to_host(0, host.o.data(), buffers[3].device, buffers[3].bytes));
  ASSERT_TRUE(cuda->copy_to_host(0, host.lse.data(), buffers[4].device, buffers[4].bytes));
  const ErrorStats e = host.check(spec);
  const Tolerance tol = tolerance_for(spec.dtype);
  EXPECT_TRUE(e.within(tol.abs, tol.rel)) << describe(e);
  for (Buffer &b : buffers)
    EXPECT_TRUE(cuda->release(0, b.device));
}

// ---- run-time shapes: one kernel per signature -----------------------------

/// Shapes that share the signature of small_spec() (bf16 d64 causal lse, rows
/// 16-byte aligned): other batch, heads, GQA group, lengths (decode, prefill,
/// ragged), layouts and strides, and a scale.
std::vector<AttentionSpec> shapes_of_one_signature() {
  std::vector<AttentionSpec> shapes;
  auto add = [&](int64_t b, int64_t h, int64_t hkv, int64_t sq, int64_t sk, Layout l) {
    AttentionSpec s = make_spec(b, h, hkv, sq, sk, 64, 64, DType::bf16, l);
    s.causal = true;
    s.lse = true;
    shapes.push_back(s);
  };
  add(1, 4, 2, 33, 47, Layout::bshd);
  add(2, 3, 1, 1, 130, Layout::bhsd);          // decode: one query, MQA
  add(1, 2, 2, 129, 129, Layout::interleaved); // prefill past two query blocks
  add(3, 4, 4, 17, 5, Layout::bshd);           // more queries than keys
  shapes.back().scale = 0.3;
  AttentionSpec padded = make_spec(2, 2, 1, 40, 64, 64, 64, DType::bf16);
  padded.causal = padded.lse = true;
  padded.q.seq = padded.o.seq = 2 * 64 + 8; // rows padded by 8 elements
  padded.q.batch = padded.o.batch = 40 * padded.q.seq;
  shapes.push_back(padded);
  return shapes;
}

TEST(RuntimeShapes, EmittedTextIsTheSameForEveryShapeOnEveryArch) {
  for (std::string_view arch : lowering::supported_archs()) {
    SCOPED_TRACE(std::string(arch));
    std::optional<std::string> first;
    for (const AttentionSpec &shape : shapes_of_one_signature()) {
      auto source = emit_source(shape, arch);
      if (!source) { // an arch the default rules refuse is refused for every shape
        EXPECT_FALSE(first) << source.status().message();
        continue;
      }
      if (!first)
        first = *source;
      EXPECT_EQ(*source, *first) << shape.summary();
    }
  }
}

TEST(RuntimeShapes, OneKernelServesEveryShapeOnEveryAmdFamily) {
  SKIP_WITHOUT_EMULATOR();
  // One arch per rule set: gfx12, gfx11, CDNA 16x16 and 32x32 (gfx90a/gfx942), gfx950.
  for (const char *arch : {"gfx1201", "gfx1100", "gfx90a", "gfx942", "gfx950"}) {
    const std::vector<AttentionSpec> shapes = shapes_of_one_signature();
    Options options;
    options.compiler = "none"; // the compile is tested elsewhere; the text runs here
    auto attn = Attention::create(shapes[0], std::string("emulator:") + arch, options);
    ASSERT_TRUE(attn) << attn.status().message();
    for (const AttentionSpec &shape : shapes) {
      SCOPED_TRACE(fmt::format("{} {}", arch, shape.summary()));
      HostBuffers host(shape, 11);
      ASSERT_TRUE(host.forward(*attn, shape));
      const ErrorStats e = host.check(shape);
      const Tolerance tol = tolerance_for(shape.dtype);
      EXPECT_TRUE(e.within(tol.abs, tol.rel))
          << describe(e) << " (tolerance " << tol.abs << ", " << tol.rel << ")";
      EXPECT_EQ(host.gaps_overwritten(shape), 0);
    }
    EXPECT_HAS(attn->explain(), fmt::format("{} forward calls", shapes.size()));
  }
}

// Empty shapes, FlashAttention-2's semantics: queries without keys get output 0
// and LSE -inf (the log of an empty sum), through the attention kernel, the
// decode kernel and split-KV alike; a call without query rows writes nothing.
// An empty tensor may be null, as PyTorch's are. Outputs start poisoned, and
// the gaps between rows must stay as they were.
TEST(RuntimeShapes, EmptyShapesWriteZerosOrNothingOnEveryAmdFamily) {
  SKIP_WITHOUT_EMULATOR();
  for (const char *arch : {"gfx1201", "gfx1100", "gfx942"}) {
    Options options;
    options.compiler = "none";
    auto attn = Attention::create(small_spec(), std::string("emulator:") + arch, options);
    ASSERT_TRUE(attn) << attn.status().message();
    struct Call {
      int64_t b, sq, sk, num_splits;
    };
    for (const Call c : {Call{1, 33, 0, 0},
                         {2, 1, 0, 0},
                         {2, 1, 0, 4},
                         {1, 16, 0, 1},
                         {2, 0, 47, 0},
                         {0, 33, 47, 0},
                         {0, 0, 0, 0}}) {
      AttentionSpec shape = small_spec();
      shape.batch = c.b;
      shape.seqlen_q = c.sq;
      shape.seqlen_k = c.sk;
      shape.num_splits = c.num_splits;
      shape.set_layout(Layout::bshd);
      SCOPED_TRACE(fmt::format("{} {} num_splits {}", arch, shape.summary(), c.num_splits));
      HostBuffers host(shape, 13);
      auto data = [](auto &v) { return v.empty() ? nullptr : v.data(); };
      ASSERT_TRUE(attn->forward(shape, data(host.q), data(host.k), data(host.v), data(host.o),
                                data(host.lse)));
      int64_t zeros = 0;
      HostBuffers::for_each_o(shape, [&](int64_t i) { zeros += host.o[size_t(i)] == 0; });
      EXPECT_EQ(zeros, c.b * shape.heads * c.sq * shape.head_dim_v);
      EXPECT_TRUE(std::all_of(host.lse.begin(), host.lse.end(),
                              [](float x) { return std::isinf(x) && x < 0; }));
      EXPECT_EQ(host.gaps_overwritten(shape), 0);
    }
  }
}

TEST(RuntimeShapes, ForwardRefusesShapesOfAnotherSignature) {
  SKIP_WITHOUT_EMULATOR();
  Options options;
  options.compiler = "none";
  auto attn = Attention::create(small_spec(), "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  AttentionSpec other = small_spec();
  other.head_dim_v = 80;
  other.set_layout(Layout::bshd);
  HostBuffers host(other);
  Status s = host.forward(*attn, other);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "head_dim_v (80) differs from the kernel's (64)");
  other = small_spec();
  other.causal = false;
  EXPECT_HAS(host.forward(*attn, other).message(), "causal");
  other = small_spec();
  other.q.seq += 1; // rows no longer 16-byte aligned
  other.q.batch = other.q.seq * other.seqlen_q;
  EXPECT_HAS(host.forward(*attn, other).message(), "row alignment");
  // A tensor with elements is never null (empty ones may be:
  // EmptyShapesWriteZerosOrNothingOnEveryAmdFamily).
  other = small_spec();
  other.seqlen_k = 0;
  other.set_layout(Layout::bshd);
  HostBuffers empty_keys(other);
  EXPECT_HAS(
      attn->forward(other, nullptr, nullptr, nullptr, empty_keys.o.data(), empty_keys.lse.data())
          .message(),
      "forward: q is null");
  other = small_spec();
  other.seqlen_k = kMaxSeqlen + 1;
  other.set_layout(Layout::bshd);
  EXPECT_HAS(host.forward(*attn, other).message(), "seqlen_k");
}

namespace {

/// `flashjit warmup` of a manifest of `items` (a JSON list) into this process's
/// cache directory (TempCacheEnvironment), which it returns.
std::string warm_up(const std::string &items) {
  const char *dir = std::getenv("FLASHJIT_CACHE_DIR");
  EXPECT_NE(dir, nullptr);
  if (dir == nullptr)
    return "";
  const std::string manifest = std::string(dir) + "/../warmup-manifest.json";
  std::FILE *f = std::fopen(manifest.c_str(), "w");
  EXPECT_NE(f, nullptr) << manifest;
  if (f == nullptr)
    return "";
  std::fputs(items.c_str(), f);
  std::fclose(f);
  const std::string cmd = fmt::format("FLASHJIT_CACHE_DIR='{}' '{}' warmup '{}' > /dev/null", dir,
                                      FLASHJIT_CLI, manifest);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::remove(manifest.c_str());
  return dir;
}

} // namespace

TEST(RuntimeShapes, WarmupThenCreateIsADiskHitAndADamagedEntryRecompiles) {
  SKIP_WITHOUT_EMULATOR();
  // Head dim 48: a signature no other test of this process compiles.
  const std::string dir = warm_up(
      R"([{"arch": "gfx1201", "heads": 4, "kv_heads": 2, "seqlen_q": 512, "head_dim": 48,
           "causal": true, "lse": true, "compiler": "llvm"}])");
  ASSERT_FALSE(HasFailure());
  // Other lengths and batch than the manifest's: the same signature, so the same entry.
  Options options;
  options.compiler = "llvm";
  AttentionSpec spec = make_spec(2, 4, 2, 33, 47, 48, 48, DType::bf16);
  spec.causal = spec.lse = true;
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  EXPECT_HAS(attn->explain(), "disk hit");

  // A damaged entry is never loaded: it is compiled again.
  const std::string key = attn->explain().substr(attn->explain().find("(key ") + 5, 16);
  bool damaged = false;
  for (const auto &entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().starts_with(key)) {
      std::FILE *f = std::fopen(entry.path().c_str(), "r+b");
      ASSERT_NE(f, nullptr);
      std::fseek(f, -1, SEEK_END);
      std::fputc(0x5a, f);
      std::fclose(f);
      damaged = true;
    }
  ASSERT_TRUE(damaged) << "no entry " << key << " in " << dir;
  // A new process would read the file; this one holds the kernel in memory.
  const std::string again = fmt::format(
      "FLASHJIT_CACHE_DIR='{}' '{}' compile --arch gfx1201 --heads 4 --kv-heads 2 --head-dim 48 "
      "--causal --lse --seqlen-q 33 --seqlen-k 47 --compiler llvm --resources 2>&1 | grep -q "
      "'cache compiled'",
      dir, FLASHJIT_CLI);
  EXPECT_EQ(std::system(again.c_str()), 0) << again;
}

TEST(RuntimeShapes, WarmupOfMasksAndModifiersIsADiskHit) {
  SKIP_WITHOUT_EMULATOR();
  // Head dim 40: signatures no other test of this process compiles.
  warm_up(R"([{"arch": "gfx1201", "heads": 4, "seqlen_q": 200, "head_dim": 40,
               "attn_mask": "bool:bk", "compiler": "llvm"},
              {"arch": "gfx1201", "heads": 4, "seqlen_q": 200, "head_dim": 40,
               "mask_mod": "q_idx / 64 == kv_idx / 64", "softcap": 20, "alibi": "heads",
               "compiler": "llvm"}])");
  ASSERT_FALSE(HasFailure());
  Options options;
  options.compiler = "llvm";
  // Other batch, heads and lengths: the same signatures, so the same entries.
  AttentionSpec padded = make_spec(3, 2, 2, 77, 91, 40, 40, DType::bf16);
  padded.mask = MaskType::boolean;
  padded.mask_strides = *dense_mask_strides("bk", 3, 2, 77, 91);
  auto a = Attention::create(padded, "emulator:gfx1201", options);
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_HAS(a->explain(), "disk hit");
  AttentionSpec modified = make_spec(1, 4, 4, 130, 130, 40, 40, DType::bf16);
  modified.mask_mod = "q_idx / 64 == kv_idx / 64";
  modified.softcap = 7.5; // a run-time value: any cap, the same kernel
  modified.alibi = Alibi::heads;
  auto b = Attention::create(modified, "emulator:gfx1201", options);
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_HAS(b->explain(), "disk hit");
}

/// Runs `attn` for `shape` on fresh random inputs in GPU memory (O and LSE
/// poisoned) and checks O, the LSE and the gaps between rows against the float64
/// reference (tolerance_for the dtype).
void forward_on_gpu_matches_reference(runtime::GpuDriver &cuda, Attention &attn,
                                      const AttentionSpec &shape, uint64_t seed) {
  HostBuffers host(shape, seed);
  std::vector<void *> device;
  const std::pair<const void *, size_t> in[] = {{host.q.data(), host.q.size() * 2},
                                                {host.k.data(), host.k.size() * 2},
                                                {host.v.data(), host.v.size() * 2},
                                                {host.o.data(), host.o.size() * 2},
                                                {host.lse.data(), host.lse.size() * 4}};
  for (const auto &[data, bytes] : in) {
    auto p = cuda.allocate(0, bytes);
    ASSERT_TRUE(p) << p.status().message();
    device.push_back(*p);
    ASSERT_TRUE(cuda.copy_to_device(0, *p, data, bytes));
  }
  Status s = attn.forward(shape, device[0], device[1], device[2], device[3],
                          static_cast<float *>(device[4]));
  ASSERT_TRUE(s) << s.message();
  ASSERT_TRUE(cuda.copy_to_host(0, host.o.data(), device[3], in[3].second));
  ASSERT_TRUE(cuda.copy_to_host(0, host.lse.data(), device[4], in[4].second));
  const ErrorStats e = host.check(shape);
  const Tolerance tol = tolerance_for(shape.dtype);
  EXPECT_TRUE(e.within(tol.abs, tol.rel)) << describe(e);
  EXPECT_EQ(host.gaps_overwritten(shape), 0);
  for (void *p : device)
    EXPECT_TRUE(cuda.release(0, p));
}

TEST(AttentionCuda, OneKernelServesManyShapesOnGpuMemory) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  const std::vector<AttentionSpec> shapes = shapes_of_one_signature();
  Options options;
  options.synchronize = true;
  auto attn = Attention::create(shapes[0], "cuda:0", options);
  ASSERT_TRUE(attn) << attn.status().message();
  for (const AttentionSpec &shape : shapes) {
    SCOPED_TRACE(shape.summary());
    forward_on_gpu_matches_reference(*cuda, *attn, shape, 5);
  }
  std::printf("%s", attn->explain().c_str());
}

// Split-KV decode on the GPU: auto (the device's SMs), forced 1..16 and off, GQA
// 4:1, 8:1 and MQA, 1 and 16 query tokens, strided and padded layouts.
TEST(AttentionCuda, SplitKvDecodeMatchesTheReference) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  struct Call {
    int64_t b, hq, hkv, sq, sk, num_splits;
    Layout layout;
  };
  const Call calls[] = {{1, 8, 2, 1, 4000, 0, Layout::bshd},  {2, 8, 1, 1, 3001, 0, Layout::bhsd},
                        {1, 8, 1, 16, 2500, 0, Layout::bshd}, {1, 4, 4, 1, 777, 3, Layout::bshd},
                        {3, 8, 2, 1, 1500, 16, Layout::bshd}, {1, 8, 2, 1, 4000, 1, Layout::bshd},
                        {1, 8, 2, 2, 50, 7, Layout::bshd}};
  for (bool causal : {false, true}) {
    AttentionSpec first = make_spec(1, 8, 2, 1, 64, 128, 128, DType::bf16);
    first.causal = causal;
    first.lse = true;
    Options options;
    options.synchronize = true;
    auto attn = Attention::create(first, "cuda:0", options);
    ASSERT_TRUE(attn) << attn.status().message();
    for (const Call &c : calls) {
      AttentionSpec shape =
          make_spec(c.b, c.hq, c.hkv, c.sq, c.sk, 128, 128, DType::bf16, c.layout);
      shape.causal = causal;
      shape.lse = true;
      shape.num_splits = c.num_splits;
      SCOPED_TRACE(shape.summary());
      forward_on_gpu_matches_reference(*cuda, *attn, shape, 11);
    }
    const std::string explain = attn->explain();
    // Every call but num_splits = 1 takes the split-KV kernels; that one-token
    // call splits no keys and runs the decode kernel alone.
    EXPECT_HAS(explain, "split-kv: 6 of those calls ran the split-KV kernels");
    EXPECT_HAS(explain, "1 ran the decode kernel");
    std::printf("%s", explain.c_str());
  }
}

// Runs `spec` on the GPU over `t` (inputs, index arrays, slopes uploaded; outputs
// poisoned) and compares with the float64 reference.
void gpu_matches_reference(runtime::GpuDriver &cuda, const AttentionSpec &spec, HostTensors &t) {
  Options options;
  options.synchronize = true;
  auto attn = Attention::create(spec, "cuda:0", options);
  ASSERT_TRUE(attn) << attn.status().message();
  std::vector<uint16_t> q(t.q.size()), k(t.k.size()), v(t.v.size()), o(t.o.size(), 0x7fff);
  for (auto [from, to] : {std::pair{&t.q, &q}, std::pair{&t.k, &k}, std::pair{&t.v, &v}})
    for (size_t i = 0; i < from->size(); ++i)
      (*to)[i] = uint16_t(to_bits(spec.dtype, (*from)[i]));
  std::vector<void *> device;
  auto upload = [&](const void *data, size_t bytes) -> void * {
    if (bytes == 0)
      return nullptr;
    auto p = cuda.allocate(0, bytes);
    EXPECT_TRUE(p) << p.status().message();
    if (!p)
      return nullptr;
    device.push_back(*p);
    EXPECT_TRUE(cuda.copy_to_device(0, *p, data, bytes));
    return *p;
  };
  auto upload_ints = [&](const std::vector<int32_t> &a) {
    return static_cast<const int32_t *>(upload(a.data(), a.size() * 4));
  };
  AttentionTensors a;
  a.q = upload(q.data(), q.size() * 2);
  a.k = upload(k.data(), k.size() * 2);
  a.v = upload(v.data(), v.size() * 2);
  a.out = upload(o.data(), o.size() * 2);
  a.lse = static_cast<float *>(upload(t.lse.data(), t.lse.size() * 4));
  a.cu_seqlens_q = upload_ints(t.cu_seqlens_q);
  a.cu_seqlens_k = upload_ints(t.cu_seqlens_k);
  a.seqused_k = upload_ints(t.seqused_k);
  a.block_table = upload_ints(t.block_table);
  a.alibi_slopes =
      static_cast<const float *>(upload(t.alibi_slopes.data(), t.alibi_slopes.size() * 4));
  a.sinks = static_cast<const float *>(upload(t.sinks.data(), t.sinks.size() * 4));
  std::vector<uint32_t> mask(t.attn_mask.size()); // 4 bytes per element: room for any type
  mask_storage(spec.mask, t.attn_mask, mask.data());
  a.attn_mask = upload(mask.data(), t.attn_mask.size() * size_t(mask_type_bytes(spec.mask)));
  Status s = attn->forward(spec, a);
  ASSERT_TRUE(s) << s.message();
  ASSERT_TRUE(cuda.copy_to_host(0, o.data(), a.out, o.size() * 2));
  if (!t.lse.empty()) {
    ASSERT_TRUE(cuda.copy_to_host(0, t.lse.data(), a.lse, t.lse.size() * 4));
  }
  for (size_t i = 0; i < o.size(); ++i)
    t.o[i] = from_bits(spec.dtype, o[i]);
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats e = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(e.within(tol.abs, tol.rel)) << describe(e);
  for (void *p : device)
    EXPECT_TRUE(cuda.release(0, p));
}

// Sequences on the GPU: varlen batches, per-batch key counts and paged caches
// (the emulator's cases, then longer ones: ragged prefill up to 1500 tokens and
// paged decode over 4000 keys through split-KV), against the float64 reference.
TEST(AttentionCuda, SequencesMatchTheReference) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  std::vector<test::SeqCase> cases = test::seq_cases();
  for (const test::SeqCase &c : test::long_seq_cases())
    cases.push_back(c);
  for (const test::SeqCase &c : cases)
    for (int64_t splits : {int64_t{0}, int64_t{1}, int64_t{5}}) {
      test::SeqInputs in = test::make_seq_inputs(c, 77);
      in.spec.num_splits = in.spec.seqs.packed_q ? 1 : splits;
      SCOPED_TRACE(in.spec.summary());
      gpu_matches_reference(*cuda, in.spec, in.tensors);
    }
}

// Score modifiers on the GPU: softcap, ALiBi, score_mod and mask_mod (a document
// mask, a mask hiding whole rows), prefill and split-KV decode.
TEST(AttentionCuda, ScoreModifiersMatchTheReference) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  struct Mod {
    int64_t b, hq, hkv, sq, sk, d;
    bool causal;
    double softcap;
    Alibi alibi;
    const char *score_mod, *mask_mod;
    bool sinks = false;
    MaskType mask = MaskType::none; // a mask tensor, dense over mask_axes of bhqk
    const char *mask_axes = "bhqk";
    double dropout_p = 0; // seed 77
  };
  const Mod mods[] = {
      {2, 8, 2, 300, 300, 128, false, 30.0, Alibi::none, "", ""},
      {1, 8, 8, 200, 513, 64, true, 0, Alibi::heads, "", ""},
      {2, 4, 1, 1, 3000, 128, true, 50.0, Alibi::batch_heads, "", ""},
      {1, 4, 2, 256, 256, 64, false, 0, Alibi::none, "score + 0.5 * (q_idx % 2)",
       "q_idx / 64 == kv_idx / 64"},
      {1, 2, 2, 100, 100, 96, true, 0, Alibi::none, "", "q_idx % 3 != 0"},
      // Block-sparse: holes between visible blocks, blocks wholly inside the mask.
      {1, 4, 2, 512, 640, 128, false, 0, Alibi::none, "score * 0.75",
       "(q_idx / 128 + kv_idx / 128) % 3 != 1 || q_idx / 128 == kv_idx / 128"},
      {2, 8, 2, 1, 3000, 64, false, 0, Alibi::none, "", "kv_idx / 256 % 3 != 1"},
      {2, 8, 1, 1, 2000, 64, true, 0, Alibi::none, "", "", true},
      {1, 8, 2, 300, 300, 128, true, 20.0, Alibi::none, "", "", true},
      {2, 8, 2, 257, 300, 128, false, 0, Alibi::none, "", "", false, MaskType::boolean, "bhqk"},
      {3, 4, 4, 190, 190, 64, true, 0, Alibi::none, "", "", false, MaskType::boolean, "bk"},
      {1, 8, 2, 300, 700, 80, false, 0, Alibi::none, "", "", false, MaskType::f32, "qk"},
      {2, 4, 2, 128, 128, 128, false, 25.0, Alibi::heads, "", "", false, MaskType::bf16, "bqk"},
      {2, 8, 2, 1, 2500, 128, false, 0, Alibi::none, "", "", false, MaskType::f16, "bhqk"},
      {2, 8, 2, 300, 300, 128, true, 0, Alibi::none, "", "", false, MaskType::none, "", 0.2},
      {1, 4, 4, 1, 3000, 64, false, 0, Alibi::none, "", "", false, MaskType::boolean, "bk", 0.5},
  };
  for (const Mod &m : mods) {
    AttentionSpec spec = make_spec(m.b, m.hq, m.hkv, m.sq, m.sk, m.d, m.d, DType::bf16);
    spec.causal = m.causal;
    spec.softcap = m.softcap;
    spec.alibi = m.alibi;
    spec.score_mod = m.score_mod;
    spec.mask_mod = m.mask_mod;
    spec.sinks = m.sinks;
    spec.lse = true;
    if (m.mask != MaskType::none) {
      spec.mask = m.mask;
      spec.mask_strides =
          dense_mask_strides(m.mask_axes, spec.batch, spec.heads, spec.seqlen_q, spec.seqlen_k)
              .value();
    }
    spec.dropout_p = m.dropout_p;
    spec.dropout_seed = 77;
    SCOPED_TRACE(spec.summary());
    HostTensors t = make_random_inputs(spec, 3);
    gpu_matches_reference(*cuda, spec, t);
  }
}

// Issue 18, finding 16: what the CUDA driver can tell about a call's buffers and
// stream is checked before anything is queued, and the context stays usable.
struct CudaCall {
  runtime::GpuDriver &cuda;
  AttentionSpec spec = make_spec(1, 2, 2, 64, 64, 64, 64, DType::bf16);
  HostTensors t = make_random_inputs(spec, 5);
  std::vector<void *> device;
  AttentionTensors a;

  explicit CudaCall(runtime::GpuDriver &c) : cuda(c) {
    for (auto [from, to] : {std::pair{&t.q, &a.q}, std::pair{&t.k, &a.k}, std::pair{&t.v, &a.v}}) {
      std::vector<uint16_t> bits(from->size());
      for (size_t i = 0; i < bits.size(); ++i)
        bits[i] = uint16_t(to_bits(spec.dtype, (*from)[i]));
      *to = upload(bits.data(), bits.size() * 2);
    }
    std::vector<uint16_t> poison(t.o.size(), 0x7fff);
    a.out = upload(poison.data(), poison.size() * 2);
  }
  ~CudaCall() {
    for (void *p : device)
      EXPECT_TRUE(cuda.release(0, p));
  }
  void *upload(const void *data, size_t bytes) {
    auto p = cuda.allocate(0, bytes);
    EXPECT_TRUE(p) << p.status().message();
    if (!p)
      return nullptr;
    device.push_back(*p);
    EXPECT_TRUE(cuda.copy_to_device(0, *p, data, bytes));
    return *p;
  }
  /// The output of a correct call on the same handle matches the reference.
  void still_correct(Attention &attn) {
    Status s = attn.forward(spec, a);
    ASSERT_TRUE(s) << s.message();
    std::vector<uint16_t> o(t.o.size());
    ASSERT_TRUE(cuda.copy_to_host(0, o.data(), a.out, o.size() * 2));
    for (size_t i = 0; i < o.size(); ++i)
      t.o[i] = from_bits(spec.dtype, o[i]);
    const Tolerance tol = tolerance_for(spec.dtype);
    const ErrorStats e = compare(spec, t, reference_attention(spec, t));
    EXPECT_TRUE(e.within(tol.abs, tol.rel)) << describe(e);
  }
};

TEST(AttentionCuda, Issue18Finding16HostPointersAreRefused) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  CudaCall call(*cuda);
  auto attn = Attention::create(call.spec, "cuda:0", Options{});
  ASSERT_TRUE(attn) << attn.status().message();
  std::vector<uint16_t> host_k(call.t.k.size(), 0x3f80);
  AttentionTensors bad = call.a;
  bad.k = host_k.data();
  detail::Failure failure = detail::Failure::none;
  Status s = detail::AttentionAccess::forward(*attn, call.spec, bad, nullptr, &failure);
  ASSERT_FALSE(s);
  EXPECT_EQ(failure, detail::Failure::argument); // FJ_ERROR_INVALID_ARGUMENT in C
  EXPECT_HAS(s.message(), "forward: k (");
  EXPECT_HAS(s.message(), "is host memory that cuda:0 cannot read");
  call.still_correct(*attn);
}

TEST(AttentionCuda, Issue18Finding16BuffersShorterThanTheShapesAreRefused) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  CudaCall call(*cuda);
  auto attn = Attention::create(call.spec, "cuda:0", Options{});
  ASSERT_TRUE(attn) << attn.status().message();
  const size_t q_bytes = call.t.q.size() * 2;
  // A buffer of half the size, and the right size entered 32 bytes late.
  std::vector<uint16_t> half(call.t.q.size() / 2, 0x3f80);
  AttentionTensors bad = call.a;
  bad.q = call.upload(half.data(), half.size() * 2);
  Status s = attn->forward(call.spec, bad);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), fmt::format("forward: q ({}) needs {} bytes", bad.q, q_bytes));
  EXPECT_HAS(s.message(), "pass a buffer that holds the whole tensor");
  bad = call.a;
  bad.out = static_cast<char *>(call.a.out) + 32;
  s = attn->forward(call.spec, bad);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "forward: out (");
  EXPECT_HAS(s.message(), fmt::format("ends {} bytes after it", q_bytes - 32));
  // A longer shape than the buffers were made for.
  AttentionSpec longer = call.spec;
  longer.seqlen_q = longer.seqlen_k = 65;
  longer.set_layout(Layout::bshd);
  s = attn->forward(longer, call.a);
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "forward: q (");
  call.still_correct(*attn);
}

TEST(AttentionCuda, Issue18Finding16StreamsThatAreNotStreamsAreRefused) {
  std::string why;
  runtime::GpuDriver *cuda = cuda_or_skip_reason(why);
  if (!cuda)
    GTEST_SKIP() << why;
  CudaCall call(*cuda);
  auto attn = Attention::create(call.spec, "cuda:0", Options{});
  ASSERT_TRUE(attn) << attn.status().message();
  // Host memory that holds no stream: the driver answers with an error.
  std::vector<uint64_t> not_a_stream(64, 0);
  Status s = attn->forward(call.spec, call.a, not_a_stream.data());
  ASSERT_FALSE(s);
  EXPECT_HAS(s.message(), "is not a CUDA stream: pass a CUstream of cuda:0");
  // The special handles are streams.
  for (uintptr_t special : {uintptr_t(1), uintptr_t(2)}) {
    s = attn->forward(call.spec, call.a, reinterpret_cast<void *>(special));
    EXPECT_TRUE(s) << s.message();
  }
  ASSERT_TRUE(cuda->synchronize(0, nullptr));
  call.still_correct(*attn);
}

} // namespace
