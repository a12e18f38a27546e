// .npy files: what flashjit writes NumPy reads (checked against the format's
// header rules), and what it reads back is what it wrote, in every layout.
#include "ir/reference.h"
#include "runtime/npy.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

using namespace flashjit;

namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string &name) {
  return (fs::temp_directory_path() / ("flashjit_npy_test_" + name)).string();
}

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// A fresh, empty directory for one test, removed when it ends.
class NpyDir : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flashjit_npy_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string &name) const { return (dir_ / name).string(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto &e : fs::directory_iterator(dir_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  /// A .npy file of format `major`.0 with the header dict `dict` and `data`.
  std::string npy_file(const std::string &name, const std::string &dict, const std::string &data,
                       int major = 1) {
    std::string header = dict;
    const size_t preamble = major == 1 ? 10 : 12;
    header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string file = "\x93NUMPY" + std::string(1, char(major)) + std::string(1, '\0');
    for (size_t i = 0; i < preamble - 8; ++i)
      file += char(header.size() >> (8 * i));
    file += header + data;
    std::ofstream(path(name), std::ios::binary) << file;
    return path(name);
  }
  /// npy::read's error for the file, expected to be one.
  std::string read_error(const std::string &file) {
    auto r = npy::read(file);
    EXPECT_FALSE(r) << file << " was accepted";
    return r ? "" : r.status().message();
  }
  fs::path dir_;
};

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE(std::string(message).find(text), std::string::npos)                                    \
      << "expected \"" << (text) << "\" in:\n"                                                     \
      << (message)

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

// ---- issue 18 (hardening) ------------------------------------------------------

/// Findings 3 and 7: npy::write never overwrites unasked, never follows a
/// symbolic link, and leaves no temporary file behind.
TEST_F(NpyDir, Issue18Finding3WriteRefusesToOverwriteUnlessForced) {
  const npy::Array one{{2}, "<f4", {1, 2}}, two{{3}, "<f4", {3, 4, 5}};
  ASSERT_TRUE(npy::write(path("a.npy"), one));
  const std::string first = slurp(path("a.npy"));
  Status again = npy::write(path("a.npy"), two);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.message(), path("a.npy") + " already exists and was left as it was: remove it, "
                                             "choose another name, or pass --force to replace it");
  EXPECT_EQ(slurp(path("a.npy")), first);
  ASSERT_TRUE(npy::write(path("a.npy"), two, /*force=*/true));
  EXPECT_EQ(npy::read(path("a.npy"))->values, two.values);
  EXPECT_EQ(names(), std::vector<std::string>{"a.npy"}) << "no temporary file is left behind";
}

TEST_F(NpyDir, Issue18Finding7WriteNeverFollowsASymbolicLink) {
  std::ofstream(path("precious")) << "do not touch";
  fs::create_symlink(path("precious"), path("q.npy"));
  fs::create_symlink(path("nowhere"), path("k.npy")); // dangling
  const npy::Array a{{1}, "<f4", {1}};
  EXPECT_FALSE(npy::write(path("q.npy"), a));
  EXPECT_FALSE(npy::write(path("k.npy"), a));
  EXPECT_FALSE(fs::exists(path("nowhere")));
  ASSERT_TRUE(npy::write(path("q.npy"), a, /*force=*/true));
  EXPECT_EQ(slurp(path("precious")), "do not touch");
  EXPECT_FALSE(fs::is_symlink(path("q.npy"))) << "the link itself was replaced";
  EXPECT_TRUE(npy::read(path("q.npy")));
}

/// Finding 3: a write that fails midway (here past RLIMIT_FSIZE, as on a full
/// disk) is an error and loses nothing: the old file stays, no partial one.
TEST_F(NpyDir, Issue18Finding3FailedWriteLeavesTheOldFileAndNoPartialOne) {
  const npy::Array small{{4}, "<f4", {1, 2, 3, 4}};
  ASSERT_TRUE(npy::write(path("out.npy"), small));
  const std::string before = slurp(path("out.npy"));
  const npy::Array big{{100000}, "<f4", std::vector<double>(100000, 0.5)};
  struct rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto *old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = saved;
  limit.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  Status replaced = npy::write(path("out.npy"), big, /*force=*/true);
  Status fresh = npy::write(path("new.npy"), big);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(replaced);
  EXPECT_HAS(replaced.message(), "cannot write " + path("out.npy") + ": writing failed after");
  EXPECT_HAS(replaced.message(), "File too large");
  EXPECT_HAS(replaced.message(), path("out.npy") + " was left as it was");
  ASSERT_FALSE(fresh);
  EXPECT_EQ(slurp(path("out.npy")), before);
  EXPECT_EQ(names(), std::vector<std::string>{"out.npy"});
}

/// Finding 5: shapes that are not numbers, negative or huge, and headers that
/// claim more data than the file holds, are clear errors, and nothing is
/// allocated for what the file does not hold.
TEST_F(NpyDir, Issue18Finding5ReaderRefusesBadShapesAndClaimsPastTheFile) {
  const std::string f4 = "'descr': '<f4', 'fortran_order': False, ";
  EXPECT_HAS(read_error(npy_file("a.npy", "{" + f4 + "'shape': ('a',), }", "")),
             "'shape' must be a tuple of non-negative integers such as (2, 3) or (5,), not "
             "''a''");
  EXPECT_HAS(read_error(npy_file("b.npy", "{" + f4 + "'shape': (-3,), }", "")), "not '-3'");
  EXPECT_HAS(read_error(npy_file("c.npy", "{" + f4 + "'shape': (99999999999999999999,), }", "")),
             "the shape dimension 99999999999999999999 is too large");
  EXPECT_HAS(
      read_error(npy_file("d.npy", "{" + f4 + "'shape': (4294967296, 4294967296, 16), }", "")),
      "needs more than 2^64 bytes of data");
  // Version 2.0, 12 bytes of data, a shape of 4 GiB: refused before any allocation.
  const std::string big =
      npy_file("e.npy", "{" + f4 + "'shape': (1073741824,), }", std::string(12, '\0'), 2);
  EXPECT_HAS(read_error(big), big + ": truncated: shape (1073741824,) of '<f4' needs 4294967296 "
                                    "bytes of data, the file holds 12: save the array again "
                                    "with numpy.save");
  // A header length past the end of the file.
  std::ofstream(path("f.npy"), std::ios::binary)
      << std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  EXPECT_HAS(read_error(path("f.npy")), "truncated .npy header: it claims 4294967295 bytes");
  EXPECT_HAS(read_error(npy_file("g.npy", "{" + f4 + "'shape': (2, 2), }", std::string(8, 'x'))),
             "truncated: shape (2, 2) of '<f4' needs 16 bytes of data, the file holds 8");
  // A FIFO is refused, not waited on.
  ASSERT_EQ(::mkfifo(path("h.npy").c_str(), 0600), 0);
  EXPECT_HAS(read_error(path("h.npy")), "a FIFO, not a regular file");
  EXPECT_HAS(read_error(path("missing.npy")), "no such file");
}

/// Finding 13: lenient parsing: a junk fortran_order, a shape of 1.5 and
/// trailing data were accepted.
TEST_F(NpyDir, Issue18Finding13ReaderRefusesJunkFortranOrderFractionalShapesAndTrailingData) {
  const std::string d = "'descr': '<f4', ";
  EXPECT_HAS(read_error(npy_file("a.npy", "{" + d + "'fortran_order': Maybe, 'shape': (1,), }",
                                 std::string(4, '\0'))),
             "'fortran_order' must be True or False, not 'Maybe'");
  EXPECT_HAS(read_error(npy_file("b.npy", "{" + d + "'fortran_order': 0, 'shape': (1,), }",
                                 std::string(4, '\0'))),
             "'fortran_order' must be True or False, not '0'");
  EXPECT_HAS(read_error(npy_file("c.npy", "{" + d + "'fortran_order': Falsely, 'shape': (1,), }",
                                 std::string(4, '\0'))),
             "must be True or False");
  EXPECT_HAS(read_error(npy_file("e.npy", "{" + d + "'fortran_order': False, 'shape': (1.5,), }",
                                 std::string(4, '\0'))),
             "not '1.5'");
  EXPECT_HAS(read_error(npy_file("f.npy", "{" + d + "'fortran_order': False, 'shape': (2,), }",
                                 std::string(12, '\0'))),
             "4 stray bytes after the 8 bytes of data of shape (2,): save the array again with "
             "numpy.save");
  EXPECT_HAS(read_error(npy_file("g.npy", "{" + d + "'fortran_order': False, 'shape': (2), }",
                                 std::string(8, '\0'))),
             "(2) is a number, not a tuple: a 1-d shape is written (2,)");
  EXPECT_HAS(read_error(npy_file("h.npy",
                                 "{" + d +
                                     "'fortran_order': False, 'shape': (1,), "
                                     "'shape': (1,), }",
                                 std::string(4, '\0'))),
             "the key 'shape' is repeated");
  EXPECT_HAS(read_error(npy_file("i.npy",
                                 "{" + d +
                                     "'fortran_order': False, 'shape': (1,), "
                                     "'extra': 1}",
                                 std::string(4, '\0'))),
             "the key 'extra' is not one of");
  EXPECT_HAS(read_error(npy_file("j.npy", "{" + d + "'shape': (1,)}", std::string(4, '\0'))),
             "it lacks 'fortran_order'");
  EXPECT_HAS(read_error(npy_file("k.npy", "{" + d + "'fortran_order': False, 'shape': (1,)} x",
                                 std::string(4, '\0'))),
             "stray characters after the closing '}'");
  EXPECT_HAS(read_error(npy_file("l.npy", "{" + d + "'fortran_order': True, 'shape': (1,)}",
                                 std::string(4, '\0'))),
             "Fortran-order arrays are not supported");

  // What numpy.save writes in every format version still reads.
  const std::string f4 = d + "'fortran_order': False, ";
  float values[3] = {1.5f, -2, 0.25f};
  const std::string data(reinterpret_cast<const char *>(values), sizeof(values));
  for (int major : {1, 2, 3})
    for (const char *shape : {"(3,)", "(1, 3)", "(3, 1,)", "( 1 , 3 )"}) {
      auto a = npy::read(npy_file("ok.npy", "{" + f4 + "'shape': " + shape + ", }", data, major));
      ASSERT_TRUE(a) << a.status().message();
      EXPECT_EQ(a->values, (std::vector<double>{1.5, -2, 0.25})) << shape;
    }
  auto scalar = npy::read(npy_file("s.npy", "{" + f4 + "'shape': (), }", data.substr(0, 4)));
  ASSERT_TRUE(scalar) << scalar.status().message();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->values, std::vector<double>{1.5});
  auto empty = npy::read(npy_file("z.npy",
                                  "{\"descr\": \"<f4\", 'fortran_order': False, 'shape': "
                                  "(0, 4294967296), }",
                                  ""));
  ASSERT_TRUE(empty) << empty.status().message();
  EXPECT_TRUE(empty->values.empty());
}

} // namespace
