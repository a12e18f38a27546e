// .npy files: what flashjit writes NumPy reads (checked against the format's
// header rules), and what it reads back is what it wrote, in every layout.
#include "ir/reference.h"
#include "runtime/npy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace flashjit;

namespace {

std::string temp_path(const std::string &name) {
  return (std::filesystem::temp_directory_path() / ("flashjit_npy_test_" + name)).string();
}

TEST(Npy, HeaderFollowsTheFormat) {
  const std::string path = temp_path("header.npy");
  ASSERT_TRUE(npy::write(path, npy::Array{{2, 3}, "<f4", {1, 2, 3, 4, 5, 6}}));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header = uint8_t(bytes[8]) | uint8_t(bytes[9]) << 8;
  EXPECT_EQ((10 + header) % 64, 0u) << "the data must start 64-byte aligned";
  EXPECT_NE(bytes.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + header + 6 * 4);
  std::filesystem::remove(path);
}

TEST(Npy, RoundTripsEveryLayoutAndDtype) {
  for (Layout layout : {Layout::bshd, Layout::bhsd, Layout::interleaved})
    for (DType t : {DType::bf16, DType::f16}) {
      AttentionSpec s = make_spec(2, 4, 2, 5, 7, 24, 16, t, layout);
      HostTensors in = make_random_inputs(s, 11);
      const npy::Array a =
          npy::gather(in.k, s.k, layout, t, s.batch, s.kv_heads, s.seqlen_k, s.head_dim_qk);
      EXPECT_EQ(a.shape, npy::tensor_shape(layout, 2, 2, 7, 24));
      const std::string path = temp_path("k.npy");
      ASSERT_TRUE(npy::write(path, a));
      auto back = npy::read(path);
      ASSERT_TRUE(back) << back.status().message();
      EXPECT_EQ(back->descr, t == DType::f16 ? "<f2" : "<f4");
      std::vector<float> buf(in.k.size(), NAN);
      ASSERT_TRUE(npy::scatter(*back, buf, s.k, layout, t, s.batch, s.kv_heads, s.seqlen_k,
                               s.head_dim_qk, path));
      for (size_t i = 0; i < buf.size(); ++i)
        if (!std::isnan(in.k[i]))
          ASSERT_EQ(buf[i], in.k[i]) << "element " << i;
      std::filesystem::remove(path);
    }
}

TEST(Npy, RejectsWrongShapesUnroundedValuesAndBadFiles) {
  AttentionSpec s = make_spec(1, 2, 2, 3, 3, 8, 8, DType::bf16);
  std::vector<float> buf(s.q_elements());
  npy::Array wrong{{1, 3, 2, 9}, "<f4", std::vector<double>(54, 0.5)};
  Status st = npy::scatter(wrong, buf, s.q, Layout::bshd, DType::bf16, 1, 2, 3, 8, "q.npy");
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
  npy::Array unrounded{{1, 3, 2, 8}, "<f4", std::vector<double>(48, 0.1)};
  st = npy::scatter(unrounded, buf, s.q, Layout::bshd, DType::bf16, 1, 2, 3, 8, "q.npy");
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("not representable in bf16"), std::string::npos) << st.message();

  const std::string path = temp_path("bad.npy");
  std::ofstream(path) << "not an npy file";
  auto r = npy::read(path);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("not a .npy file"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_FALSE(npy::read(temp_path("missing.npy")));
}

} // namespace
