// The flashjit tool's own pieces, linked from tools/: the command-line parser
// and `flashjit archs`, the JSON reader of warmup manifests, and the writer of
// output files (-o, --save-dir).
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/json.h"
#include "tools/safe_write.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace flashjit::cli {
namespace {

#define EXPECT_HAS(message, text)                                                                  \
  EXPECT_NE(std::string(message).find(text), std::string::npos)                                    \
      << "expected \"" << (text) << "\" in:\n"                                                     \
      << (message)

/// A fresh, empty directory for one test, removed when it ends.
class TempDir : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flashjit_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string &name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// Runs the command `name` of `commands` with `argv`; its exit code and stdout.
std::pair<int, std::string> run(const std::vector<Command> &commands, const std::string &name,
                                const std::vector<std::string> &argv) {
  for (const Command &c : commands)
    if (c.name == name) {
      auto args = parse_args(c, argv);
      EXPECT_TRUE(args) << args.status().message();
      if (!args)
        return {-1, ""};
      ::testing::internal::CaptureStdout();
      const int code = c.run(*args);
      return {code, ::testing::internal::GetCapturedStdout()};
    }
  ADD_FAILURE() << "no command " << name;
  return {-1, ""};
}

// ---- issue 18 (hardening) ------------------------------------------------------

/// Finding 4: `archs --arch gfx942:sramecc+:xnack-` read the arch through a
/// string_view into a destroyed temporary (a use-after-free ASan reports).
TEST(Archs, Issue18Finding4ArchWithFeaturesOutlivesTheFlagValue) {
  auto [code, out] = run(archs_commands(), "archs", {"--arch", "gfx942:sramecc+:xnack-"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_HAS(out, "\ngfx942 ");
  EXPECT_HAS(out, "builtins: ");
  auto [json_code, json] =
      run(archs_commands(), "archs", {"--arch", "gfx942:sramecc+:xnack-", "--json"});
  EXPECT_EQ(json_code, 0) << json;
  EXPECT_HAS(json, "\"arch\": \"gfx942\"");
}

/// Finding 5: a manifest nested 100,000 deep overflowed the stack.
TEST(Json, Issue18Finding5NestingIsBounded) {
  std::string error;
  EXPECT_FALSE(json::parse(std::string(100000, '['), &error));
  EXPECT_EQ(error, "JSON error at offset 64: arrays and objects nested more than 64 deep; "
                   "flatten the document");
  std::string objects;
  for (int i = 0; i < 100000; ++i)
    objects += "{\"a\":";
  EXPECT_FALSE(json::parse(objects, &error));
  EXPECT_HAS(error, "nested more than 64 deep");
  // 64 levels still parse.
  auto deep = json::parse(std::string(64, '[') + std::string(64, ']'), &error);
  ASSERT_TRUE(deep) << error;
  EXPECT_FALSE(json::parse(std::string(65, '[') + std::string(65, ']')));
}

/// Finding 5: `warmup /dev/zero` aborted reading forever; a FIFO would hang.
TEST_F(TempDir, Issue18Finding5JsonFileReaderRefusesDevicesFifosAndHugeFiles) {
  std::string error;
  EXPECT_FALSE(json::parse_file("/dev/zero", &error));
  EXPECT_EQ(error, "/dev/zero: not a regular file (a FIFO, device or directory); give a JSON file");
  ASSERT_EQ(::mkfifo(path("fifo.json").c_str(), 0600), 0);
  EXPECT_FALSE(json::parse_file(path("fifo.json"), &error));
  EXPECT_HAS(error, "not a regular file");
  EXPECT_FALSE(json::parse_file(dir_.string(), &error));
  EXPECT_HAS(error, "not a regular file");
  std::ofstream(path("m.json")) << "[{\"arch\": \"gfx1201\"}]";
  EXPECT_FALSE(json::parse_file(path("m.json"), &error, 10));
  EXPECT_EQ(error, path("m.json") + ": 21 bytes, more than the 10 a JSON file here may be; give a "
                                    "smaller file");
  auto ok = json::parse_file(path("m.json"), &error);
  ASSERT_TRUE(ok) << error;
  EXPECT_EQ(ok->items.at(0).find("arch")->string, "gfx1201");
  std::ofstream(path("bad.json")) << "[1,";
  EXPECT_FALSE(json::parse_file(path("bad.json"), &error));
  EXPECT_EQ(error, path("bad.json") + ": JSON error at offset 3: unexpected end");
  EXPECT_FALSE(json::parse_file(path("missing.json"), &error));
  EXPECT_EQ(error, path("missing.json") + ": cannot read it: No such file or directory");
}

/// Findings 3 and 7: `-o` truncated its target on a failed write and wrote
/// through symbolic links; --save-dir overwrote q/k/v/out.npy silently.
TEST_F(TempDir, Issue18Finding3WriteOutputRefusesToOverwriteUnlessForced) {
  ASSERT_TRUE(write_output(path("k.hip"), "first", false));
  Status again = write_output(path("k.hip"), "second", false);
  ASSERT_FALSE(again);
  EXPECT_HAS(again.message(), "pass --force to replace it");
  EXPECT_EQ(slurp(path("k.hip")), "first");
  ASSERT_TRUE(write_output(path("k.hip"), "second", true));
  EXPECT_EQ(slurp(path("k.hip")), "second");
  Status into_dir = write_output(dir_.string() + "/", "x", true);
  ASSERT_FALSE(into_dir);
  EXPECT_HAS(into_dir.message(), "give a file name");
  fs::create_directory(path("sub"));
  EXPECT_FALSE(write_output(path("sub"), "x", true));
  EXPECT_TRUE(fs::is_directory(path("sub")));
}

TEST_F(TempDir, Issue18Finding7WriteOutputNeverFollowsASymbolicLink) {
  std::ofstream(path("precious")) << "do not touch";
  fs::create_symlink(path("precious"), path("k.co"));
  EXPECT_FALSE(write_output(path("k.co"), "code", false));
  ASSERT_TRUE(write_output(path("k.co"), "code", true));
  EXPECT_EQ(slurp(path("precious")), "do not touch");
  EXPECT_FALSE(fs::is_symlink(path("k.co")));
  EXPECT_EQ(slurp(path("k.co")), "code");
}

TEST_F(TempDir, Issue18Finding7SaveDirRefusesExistingFilesBeforeWritingAny) {
  const std::vector<std::string> names = {"q.npy", "k.npy", "v.npy", "out.npy"};
  EXPECT_TRUE(check_outputs_absent(dir_.string(), names, false));
  std::ofstream(path("k.npy")) << "mine";
  fs::create_symlink(path("nowhere"), path("out.npy"));
  Status s = check_outputs_absent(dir_.string(), names, false);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.message(), dir_.string() + " already holds k.npy, out.npy: nothing was written; "
                                         "choose another directory, remove them, or pass --force "
                                         "to replace them");
  EXPECT_TRUE(check_outputs_absent(dir_.string(), names, true));
  EXPECT_TRUE(check_outputs_absent(path("not-yet"), names, false));
}

} // namespace
} // namespace flashjit::cli
