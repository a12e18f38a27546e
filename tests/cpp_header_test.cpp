// <flashjit/flashjit.hpp>, the header-only C++ interface over the C ABI: it
// needs nothing but flashjit.h and the standard library (no fmt), owns its
// handle, and turns every error into fj::Error with the C code and message.
#include <flashjit/flashjit.hpp>

#ifdef FMT_VERSION
#error "flashjit.hpp must not pull fmt in"
#endif

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace {

#ifdef FLASHJIT_TEST_WITH_LLVM // the emulator's check: inputs and the float64 reference
uint16_t to_bf16(float x) {    // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937 &rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t &x : v)
    x = to_bf16(d(rng));
  return v;
}

// Causal (bottom-right) GQA attention in float64 over BSHD bf16 tensors.
std::vector<double> reference(const fj_spec &s, const std::vector<uint16_t> &q,
                              const std::vector<uint16_t> &k, const std::vector<uint16_t> &v) {
  const int64_t d = s.head_dim_qk, group = s.heads / s.kv_heads;
  std::vector<double> out(size_t(s.batch * s.seqlen_q * s.heads * d), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t last = i + s.seqlen_k - s.seqlen_q; // the last key row i sees
        std::vector<double> p(size_t(s.seqlen_k), 0.0);
        double m = -INFINITY, l = 0.0;
        for (int64_t j = 0; j <= last && j < s.seqlen_k; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += double(from_bf16(q[size_t(((b * s.seqlen_q + i) * s.heads + h) * d + c)])) *
                   double(from_bf16(
                       k[size_t(((b * s.seqlen_k + j) * s.kv_heads + h / group) * d + c)]));
          p[size_t(j)] = dot / std::sqrt(double(d));
          m = std::max(m, p[size_t(j)]);
        }
        for (int64_t j = 0; j <= last && j < s.seqlen_k; ++j)
          l += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
        for (int64_t j = 0; j <= last && j < s.seqlen_k; ++j)
          for (int64_t c = 0; c < d; ++c)
            out[size_t(((b * s.seqlen_q + i) * s.heads + h) * d + c)] +=
                p[size_t(j)] / l *
                double(
                    from_bf16(v[size_t(((b * s.seqlen_k + j) * s.kv_heads + h / group) * d + c)]));
      }
  return out;
}

double max_error(const std::vector<uint16_t> &out, const std::vector<double> &ref) {
  double e = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double x = from_bf16(out[i]);
    if (!std::isfinite(x))
      return INFINITY;
    e = std::max(e, std::abs(x - ref[i]));
  }
  return e;
}
#endif

TEST(CppHeader, RunsTwoShapesThroughOneHandleAgainstFloat64) {
#ifndef FLASHJIT_TEST_WITH_LLVM
  GTEST_SKIP() << "the emulator's kernels are compiled by LLVM, which this build has not";
#else
  std::mt19937 rng(20261127);
  fj::Spec spec = fj::Spec::bshd(2, 4, 2, 37, 53, 40, 40, FJ_DTYPE_BF16);
  spec.causal = 1;
  spec.validate();
  fj::Attention attention = fj::Attention::create(spec, "emulator:gfx1201");
  EXPECT_NE(attention.explain().find("gfx1201"), std::string::npos);
  EXPECT_NE(attention.source().find("FJ_GLOBAL"), std::string::npos);
  // The handle's spec, then another shape of its signature (fewer queries, more keys).
  fj::Spec other = fj::Spec::bshd(1, 4, 2, 20, 70, 40, 40, FJ_DTYPE_BF16);
  other.causal = 1;
  EXPECT_EQ(other.signature(), spec.signature());
  for (const fj::Spec *s : {&spec, &other}) {
    SCOPED_TRACE(s->seqlen_q);
    const size_t q_n = size_t(s->batch * s->seqlen_q * s->heads * 40),
                 kv_n = size_t(s->batch * s->seqlen_k * s->kv_heads * 40);
    const std::vector<uint16_t> q = random_bf16(q_n, rng), k = random_bf16(kv_n, rng),
                                v = random_bf16(kv_n, rng);
    std::vector<uint16_t> out(q_n, 0x7fc0); // poisoned: NaN
    if (s == &spec)
      attention.forward(q.data(), k.data(), v.data(), out.data());
    else
      attention.forward(*s, q.data(), k.data(), v.data(), out.data());
    EXPECT_LE(max_error(out, reference(*s, q, k, v)), 2e-2) << "bf16 output, f32 accumulation";
  }
  // Moved from: the new owner works, the old one says so.
  fj::Attention moved = std::move(attention);
  EXPECT_NO_THROW((void)moved.get());
  EXPECT_THROW((void)attention.get(), fj::Error);
#endif
}

TEST(CppHeader, ErrorsCarryTheCodeAndTheMessage) {
  fj::Spec spec = fj::Spec::bshd(1, 2, 2, 16, 16, 64, 64, FJ_DTYPE_BF16);
  try {
    fj::Attention::create(spec, "tpu:0");
    FAIL() << "create on tpu:0 succeeded";
  } catch (const fj::Error &e) {
    EXPECT_NE(e.code(), FJ_OK);
    EXPECT_NE(std::string(e.what()).find("tpu:0"), std::string::npos) << e.what();
  }
  spec.head_dim_qk = 0;
  try {
    spec.validate();
    FAIL() << "a head dim of 0 validated";
  } catch (const fj::Error &e) {
    EXPECT_EQ(e.code(), FJ_ERROR_INVALID_SPEC);
    EXPECT_NE(std::string(e.what()).find("FJ_ERROR_INVALID_SPEC: "), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fj::Spec::bshd(1, 2, 2, 16, 16, 64, 64, fj_dtype(99)), fj::Error);
}

TEST(CppHeader, EmitsWithoutADevice) {
  const fj::Spec spec = fj::Spec::bshd(1, 8, 2, 100, 100, 72, 72, FJ_DTYPE_F16);
  const std::string source = fj::emit(spec, "gfx1201");
  EXPECT_NE(source.find("FJ_GLOBAL"), std::string::npos);
  EXPECT_EQ(fj::emit(spec, "gfx1201"), source) << "the same spec, the same text";
  const std::string devices = fj::list_devices();
  EXPECT_EQ(devices.front(), '[') << devices; // a JSON array
#ifdef FLASHJIT_TEST_WITH_LLVM                // the emulator is a device only where LLVM is
  EXPECT_NE(devices.find("emulator"), std::string::npos) << devices;
#endif
  EXPECT_EQ(fj::version(), std::string(fj_version()));
  const fj::Options options;
  EXPECT_EQ(options.struct_size, sizeof(fj_options));
  const fj::Tensors tensors;
  EXPECT_EQ(tensors.q, nullptr);
  EXPECT_EQ(tensors.struct_size, sizeof(fj_tensors));
}

} // namespace
