// runtime::KernelArgs: a launch's argument values in parameter order, and the
// tensor maps (TMA) of sm90 kernels encoded from the tensors' pointers and the
// launch's extents and strides (a driver that records the requests stands in
// for CUDA's).
#include "runtime/kernel_args.h"

#include "ir/build.h"
#include "lowering/lower.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace flashjit {
namespace {

using lowering::KernelParam;

// Records each tensor map request and writes a recognisable 128-byte value.
class RecordingDriver final : public runtime::GpuDriver {
public:
  std::vector<runtime::TensorMapRequest> requests;
  DeviceKind kind() const override { return DeviceKind::cuda; }
  const std::string &library_path() const override { return path_; }
  Expected<int> device_count() override { return 0; }
  Expected<DeviceInfo> device_info(int) override { return unused(); }
  Expected<std::unique_ptr<runtime::GpuKernel>> load_kernel(int, std::span<const uint8_t>,
                                                            const std::string &) override {
    return unused();
  }
  Expected<void *> allocate(int, size_t) override { return unused(); }
  Status release(int, void *) override { return unused(); }
  Expected<void *> allocate_async(int, size_t, void *) override { return unused(); }
  Status release_async(int, void *, void *) override { return unused(); }
  Status zero_async(int, void *, size_t, void *) override { return unused(); }
  Status copy_to_device(int, void *, const void *, size_t) override { return unused(); }
  Status copy_to_host(int, void *, const void *, size_t) override { return unused(); }
  Status synchronize(int, void *) override { return unused(); }
  Status encode_tensor_map(int, const runtime::TensorMapRequest &r,
                           runtime::TensorMapBytes &map) override {
    std::memset(map.bytes, int(requests.size()) + 1, sizeof map.bytes);
    requests.push_back(r);
    return Status::ok();
  }

private:
  static Status unused() { return Status::error("not part of this test"); }
  std::string path_ = "recording driver";
};

struct Kernel {
  AttentionSpec spec;
  lowering::Lowered lowered;
};

Kernel sm90_kernel() {
  // Odd lengths and GQA; BSHD strides (seq stride = heads * dim).
  Kernel k{make_spec(/*batch=*/3, /*heads=*/8, /*kv_heads=*/2, /*seqlen_q=*/77,
                     /*seqlen_k=*/301, /*dqk=*/256, /*dv=*/192, DType::f16),
           {}};
  Expected<lowering::Target> t = lowering::parse_target("sm_90");
  EXPECT_TRUE(t);
  Expected<lowering::Lowered> l =
      lowering::generate(k.spec, lowering::default_config(k.spec, *t), *t);
  EXPECT_TRUE(l) << (l ? "" : l.status().message());
  if (l)
    k.lowered = l.take();
  return k;
}

TEST(KernelArgs, TensorMapsDescribeEachTensorAsTheLaunchSeesIt) {
  const Kernel k = sm90_kernel();
  const ir::Bindings shapes = ir::bind_attention(k.spec);
  std::vector<uint16_t> q(8), kv(8), out(8);
  const runtime::NamedPointer pointers[] = {
      {"Q", q.data()}, {"K", kv.data()}, {"V", kv.data() + 4}, {"O", out.data()}};
  RecordingDriver driver;
  auto args = runtime::KernelArgs::make(k.lowered.params, shapes, pointers, &driver);
  ASSERT_TRUE(args) << args.status().message();
  ASSERT_EQ(args->addresses().size(), k.lowered.params.size());
  ASSERT_EQ(driver.requests.size(), 3u) << "Q, K and V";

  size_t map = 0;
  for (size_t i = 0; i < k.lowered.params.size(); ++i) {
    const KernelParam &p = k.lowered.params[i];
    const void *value = args->addresses()[i];
    if (p.kind == KernelParam::Kind::tensor) {
      const void *pointer = nullptr;
      std::memcpy(&pointer, value, sizeof pointer);
      if (p.name == "K")
        EXPECT_EQ(pointer, kv.data());
      continue;
    }
    if (p.kind != KernelParam::Kind::tensor_map)
      continue;
    SCOPED_TRACE(p.name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(value) % 64, 0u) << "CUtensorMap is 64-byte aligned";
    EXPECT_EQ(static_cast<const unsigned char *>(value)[127], map + 1) << "the driver's bytes";
    const runtime::TensorMapRequest &r = driver.requests[map++];
    const bool kv_tensor = p.map_of->name != "Q";
    const int64_t dim = p.map_of->name == "V" ? 192 : 256;
    const int64_t heads = kv_tensor ? 2 : 8, seq = kv_tensor ? 301 : 77;
    EXPECT_EQ(r.base, p.map_of->name == "Q"   ? static_cast<const void *>(q.data())
                      : p.map_of->name == "K" ? static_cast<const void *>(kv.data())
                                              : static_cast<const void *>(kv.data() + 4));
    EXPECT_FALSE(r.bf16);
    ASSERT_EQ(r.rank, 4);
    // [batch, heads, seq, dim] innermost first; BSHD byte strides.
    EXPECT_EQ(r.dims[0], uint64_t(dim));
    EXPECT_EQ(r.dims[1], uint64_t(seq));
    EXPECT_EQ(r.dims[2], uint64_t(heads));
    EXPECT_EQ(r.dims[3], 3u);
    EXPECT_EQ(r.strides[0], uint64_t(heads * dim * 2));
    EXPECT_EQ(r.strides[1], uint64_t(dim * 2));
    EXPECT_EQ(r.strides[2], uint64_t(seq * heads * dim * 2));
    EXPECT_EQ(r.box[0], 64u);
    EXPECT_EQ(r.box[1], unsigned(p.box_rows));
    EXPECT_EQ(r.box[2], 1u);
    EXPECT_EQ(r.box[3], 1u);
  }
  EXPECT_EQ(map, 3u);
}

TEST(KernelArgs, ATensorMapWithoutADriverIsAnError) {
  const Kernel k = sm90_kernel();
  std::vector<uint16_t> buffer(8);
  const runtime::NamedPointer pointers[] = {
      {"Q", buffer.data()}, {"K", buffer.data()}, {"V", buffer.data()}, {"O", buffer.data()}};
  auto args = runtime::KernelArgs::make(k.lowered.params, ir::bind_attention(k.spec), pointers);
  ASSERT_FALSE(args);
  EXPECT_NE(args.status().message().find("tmap_Q_128"), std::string::npos)
      << args.status().message();
  EXPECT_NE(args.status().message().find("only a CUDA device"), std::string::npos)
      << args.status().message();
}

TEST(KernelArgs, AnExtentOfOneTakesAStrideTheMapAccepts) {
  // Batch 1: the batch stride is never applied, and may be anything the caller
  // passed; the map's is a valid 16.
  Kernel k = sm90_kernel();
  k.spec.batch = 1;
  k.spec.q.batch = 3; // not a multiple of 16 bytes
  const ir::Bindings shapes = ir::bind_attention(k.spec);
  std::vector<uint16_t> buffer(8);
  const runtime::NamedPointer pointers[] = {
      {"Q", buffer.data()}, {"K", buffer.data()}, {"V", buffer.data()}, {"O", buffer.data()}};
  RecordingDriver driver;
  auto args = runtime::KernelArgs::make(k.lowered.params, shapes, pointers, &driver);
  ASSERT_TRUE(args) << args.status().message();
  ASSERT_EQ(driver.requests.size(), 3u);
  EXPECT_EQ(driver.requests[0].dims[3], 1u);
  EXPECT_EQ(driver.requests[0].strides[2], 16u);
}

} // namespace
} // namespace flashjit
