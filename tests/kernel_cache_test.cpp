// KernelCache (memory + disk), its file format's defences, and the pieces it
// stands on: SHA-256, KeyParts::hash, the knob registry; Attention::create from
// many threads through the process's cache (also run under ThreadSanitizer by
// scripts/sanitize.sh).
#include "compiler/kernel_cache.h"
#include "compiler/knobs.h"
#include "compiler/sha256.h"
#include "ir/reference.h"
#include "runtime/attention.h"
#include "runtime/emulator.h"
#include "runtime/pipeline.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace flashjit::compiler {
namespace {

// ---- SHA-256 ---------------------------------------------------------------

TEST(Sha256, KnownAnswers) {
  // FIPS 180-4 examples and the NIST one-million-'a' vector.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i)
    text += char('a' + i * 7 % 26);
  for (size_t step : {1, 3, 63, 64, 65, 200}) {
    Sha256 h;
    for (size_t i = 0; i < text.size(); i += step)
      h.update(std::string_view(text).substr(i, step));
    EXPECT_EQ(to_hex(h.finish()), sha256_hex(text)) << step;
  }
}

// ---- keys ------------------------------------------------------------------

KeyParts sample_key(const std::string &ir = "attention v1") {
  KeyParts k;
  k.ir_text = ir;
  k.target_id = "gfx1201";
  k.config = "bm=64 bn=64";
  k.compile_options = "O3";
  k.templates_hash = "t";
  k.flashjit_version = std::string(flashjit_version());
  k.compiler_identity = "test 1.0";
  return k;
}

TEST(KeyParts, HashIsHexDeterministicAndCoversEveryPart) {
  const KeyParts base = sample_key();
  const std::string h = base.hash();
  ASSERT_EQ(h.size(), 64u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(h, sample_key().hash());
  std::set<std::string> seen = {h};
  for (std::string KeyParts::*part :
       {&KeyParts::ir_text, &KeyParts::target_id, &KeyParts::config, &KeyParts::compile_options,
        &KeyParts::templates_hash, &KeyParts::flashjit_version, &KeyParts::compiler_identity,
        &KeyParts::source_hash}) {
    KeyParts k = base;
    k.*part += "x";
    EXPECT_TRUE(seen.insert(k.hash()).second);
  }
  // The label describes the kernel; it is not a part of the key.
  KeyParts labelled = base;
  labelled.label = "fa_fwd_bf16_d64_64_0123 (any shape of bf16 d=64/64)";
  EXPECT_EQ(labelled.hash(), h);
  EXPECT_EQ(labelled, base);
  // Parts are length-prefixed: moving a character across a boundary changes the key.
  KeyParts a = base, b = base;
  a.ir_text = "ab";
  a.target_id = "c";
  b.ir_text = "a";
  b.target_id = "bc";
  EXPECT_NE(a.hash(), b.hash());
}

TEST(KeyParts, DescribeOptions) {
  CompileOptions o;
  o.arch = "gfx90a";
  o.features = "xnack-";
  o.wave_size = 64;
  o.extra_flags = {"-mcode-object-version=4"};
  EXPECT_EQ(describe(o), "arch=gfx90a features=xnack- wave=64 O3 flags=[-mcode-object-version=4]");
}

// ---- the cache -------------------------------------------------------------

/// get_or_compile, expected to succeed; its outcome.
CacheOutcome fetch(KernelCache &cache, const KeyParts &key,
                   const std::function<Expected<CodeObject>()> &compile) {
  CacheOutcome o = CacheOutcome::compiled;
  auto code = cache.get_or_compile(key, compile, &o);
  EXPECT_TRUE(code) << code.status().message();
  return o;
}

/// A fresh directory per test, removed afterwards.
class CacheTest : public ::testing::Test {
protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("flashjit-cache-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = (root_ / "cache").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  /// A compile function that counts its calls and returns `size` bytes.
  std::function<Expected<CodeObject>()> compiler(std::atomic<int> &calls, size_t size = 1000,
                                                 uint8_t fill = 0x5a) {
    return [&calls, size, fill]() -> Expected<CodeObject> {
      ++calls;
      CodeObject c;
      c.arch = "gfx1201";
      c.compiler = "test 1.0";
      c.bytes.assign(size, fill);
      for (size_t i = 0; i < size; i += 7)
        c.bytes[i] = uint8_t(i);
      return c;
    };
  }

  /// A cache that records its reports instead of printing them.
  std::unique_ptr<KernelCache> make(int64_t budget = 256 << 20) {
    auto c = std::make_unique<KernelCache>(dir_, budget);
    c->set_reporter([this](const std::string &line) { reports_.push_back(line); });
    return c;
  }

  std::string read(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void write(const std::string &path, const std::string &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  std::vector<std::string> files() {
    std::vector<std::string> names;
    for (const auto &e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Damages the entry of `key` with `damage`, then checks that a fresh cache
  /// rejects it with a report containing `why`, recompiles and repairs the file.
  void expect_rejected(const std::function<void(std::string &)> &damage, const std::string &why) {
    std::atomic<int> calls{0};
    const KeyParts key = sample_key();
    ASSERT_TRUE(make()->get_or_compile(key, compiler(calls)));
    const std::string path = *make()->path_for(key.hash());
    std::string bytes = read(path);
    const std::string good = bytes;
    damage(bytes);
    write(path, bytes);

    reports_.clear();
    auto cache = make();
    CacheOutcome outcome;
    auto code = cache->get_or_compile(key, compiler(calls), &outcome);
    ASSERT_TRUE(code);
    EXPECT_EQ(outcome, CacheOutcome::compiled) << why;
    EXPECT_EQ(calls.load(), 2);
    ASSERT_EQ(reports_.size(), 1u) << why;
    EXPECT_EQ(reports_[0].rfind("flashjit: cache: " + path + " is corrupt (", 0), 0u)
        << reports_[0];
    EXPECT_NE(reports_[0].find(why), std::string::npos) << reports_[0];
    EXPECT_TRUE(reports_[0].ends_with("); recompiling")) << reports_[0];
    EXPECT_EQ(cache->stats().rejected_files, 1);
    EXPECT_EQ(read(path), good) << "the recompile replaces the damaged file";
    auto again = make()->get_or_compile(key, compiler(calls), &outcome);
    EXPECT_EQ(outcome, CacheOutcome::disk_hit);
  }

  fs::path root_;
  std::string dir_;
  std::vector<std::string> reports_;
};

TEST_F(CacheTest, MemoryOnlyHitsAfterTheFirstCompile) {
  std::atomic<int> calls{0};
  KernelCache cache("");
  CacheOutcome o;
  auto a = cache.get_or_compile(sample_key(), compiler(calls), &o);
  ASSERT_TRUE(a);
  EXPECT_EQ(o, CacheOutcome::compiled);
  auto b = cache.get_or_compile(sample_key(), compiler(calls), &o);
  ASSERT_TRUE(b);
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  EXPECT_EQ(a->bytes, b->bytes);
  EXPECT_EQ(calls.load(), 1);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.memory_entries, 1);
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.disk_entries, 0);
  EXPECT_FALSE(cache.path_for(sample_key().hash()));
  EXPECT_EQ(cache.clear()->removed, 0);
}

TEST_F(CacheTest, DiskHitInAFreshCacheKeepsEveryField) {
  std::atomic<int> calls{0};
  CacheOutcome o;
  auto first = make()->get_or_compile(sample_key(), compiler(calls), &o);
  ASSERT_TRUE(first);
  EXPECT_EQ(o, CacheOutcome::compiled);
  auto cache = make();
  auto second = cache->get_or_compile(sample_key(), compiler(calls), &o);
  ASSERT_TRUE(second);
  EXPECT_EQ(o, CacheOutcome::disk_hit);
  EXPECT_EQ(second->bytes, first->bytes);
  EXPECT_EQ(second->arch, "gfx1201");
  EXPECT_EQ(second->compiler, "test 1.0");
  EXPECT_EQ(calls.load(), 1);
  o = fetch(*cache, sample_key(), compiler(calls));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  EXPECT_EQ(cache->stats().disk_hits, 1);
  EXPECT_EQ(cache->stats().disk_entries, 1);
  EXPECT_TRUE(reports_.empty());
  // Another key misses.
  o = fetch(*make(), sample_key("other"), compiler(calls));
  EXPECT_EQ(o, CacheOutcome::compiled);
}

TEST_F(CacheTest, CompileErrorsAreReturnedAndNotCached) {
  auto cache = make();
  int calls = 0;
  auto failing = [&]() -> Expected<CodeObject> {
    ++calls;
    return Status::error("kernel.hip:3:1: error: nope");
  };
  auto a = cache->get_or_compile(sample_key(), failing);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.status().message(), "kernel.hip:3:1: error: nope");
  EXPECT_FALSE(cache->get_or_compile(sample_key(), failing));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(files().empty());
}

TEST_F(CacheTest, ListShowsTheLabelAndReadsFormatOneEntries) {
  std::atomic<int> calls{0};
  KeyParts key = sample_key();
  key.label = "fa_fwd_bf16_d64_64_0123 (any shape of bf16 d=64/64 align16)";
  ASSERT_TRUE(make()->get_or_compile(key, compiler(calls, 100)));
  auto listed = make()->list();
  ASSERT_TRUE(listed) << listed.status().message();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].label, key.label);
  // The same entry as a flashjit before the label wrote it (format 1): the
  // payload without the label, under its own checksum, still loads.
  const std::string path = *make()->path_for(key.hash());
  std::string file = read(path);
  const size_t header = 8 + 4 + 64 + 8 + 32, at_label = header + 4 + 7 + 4 + 8 + 4 + 7;
  ASSERT_EQ(file.substr(at_label + 4, key.label.size()), key.label);
  std::string payload = file.substr(header);
  payload.erase(at_label - header, 4 + key.label.size());
  file = file.substr(0, header) + payload;
  file[8] = 1;
  const size_t size_at = 8 + 4 + 64;
  for (int i = 0; i < 8; ++i)
    file[size_at + size_t(i)] = char((uint64_t(payload.size()) >> (8 * i)) & 0xFF);
  const Digest digest = sha256(payload);
  file.replace(size_at + 8, 32, reinterpret_cast<const char *>(digest.data()), 32);
  write(path, file);
  EXPECT_EQ(fetch(*make(), key, compiler(calls)), CacheOutcome::disk_hit);
  EXPECT_EQ(calls.load(), 1);
  listed = make()->list();
  ASSERT_TRUE(listed);
  EXPECT_TRUE((*listed)[0].problem.empty()) << (*listed)[0].problem;
  EXPECT_EQ((*listed)[0].label, "");
  EXPECT_EQ((*listed)[0].bytes, 100);
}

TEST_F(CacheTest, FlippedPayloadByte) {
  expect_rejected([](std::string &b) { b[b.size() - 10] ^= 0x01; }, "checksum mismatch");
}
TEST_F(CacheTest, FlippedHeaderByte) {
  expect_rejected([](std::string &b) { b[0] ^= 0x20; }, "bad magic");
}
TEST_F(CacheTest, FlippedVersionByte) {
  expect_rejected([](std::string &b) { b[8] = 7; }, "format version 7");
}
TEST_F(CacheTest, TruncatedPayload) {
  expect_rejected([](std::string &b) { b.resize(b.size() / 2); }, "truncated");
}
TEST_F(CacheTest, TruncatedHeader) {
  expect_rejected([](std::string &b) { b.resize(10); }, "shorter than the");
}
TEST_F(CacheTest, EmptyFile) {
  expect_rejected([](std::string &b) { b.clear(); }, "empty file");
}
TEST_F(CacheTest, StrayBytesAfterThePayload) {
  expect_rejected([](std::string &b) { b += "xx"; }, "stray bytes");
}
TEST_F(CacheTest, ForeignEntry) {
  // A complete, valid file of another key, under this key's name.
  std::atomic<int> calls{0};
  const KeyParts other = sample_key("another program");
  ASSERT_TRUE(make()->get_or_compile(other, compiler(calls, 1000, 0x11)));
  const std::string foreign = read(*make()->path_for(other.hash()));
  expect_rejected([&](std::string &b) { b = foreign; },
                  "it holds the entry of key " + other.hash().substr(0, 16));
}

TEST_F(CacheTest, ASymbolicLinkIsNeverFollowed) {
  std::atomic<int> calls{0};
  const KeyParts key = sample_key();
  const std::string path = *make()->path_for(key.hash());
  const std::string target = (root_ / "precious.txt").string();
  write(target, "do not touch");
  fs::create_symlink(target, path);
  CacheOutcome o;
  ASSERT_TRUE(make()->get_or_compile(key, compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::compiled);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("a symbolic link"), std::string::npos) << reports_[0];
  EXPECT_EQ(read(target), "do not touch");
  EXPECT_FALSE(fs::is_symlink(path)) << "the entry replaced the link, not its target";
}

TEST_F(CacheTest, TheSameDamageIsReportedOnce) {
  std::atomic<int> calls{0};
  const KeyParts key = sample_key();
  auto cache = make();
  const std::string path = *cache->path_for(key.hash());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache->clear()); // forget the entry, so the next request reads the disk
    write(path, "garbage");
    ASSERT_TRUE(cache->get_or_compile(key, compiler(calls)));
  }
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(cache->stats().rejected_files, 3);
  EXPECT_EQ(reports_.size(), 1u);
}

TEST_F(CacheTest, EightThreadsCompileOneKeyOnce) {
  std::atomic<int> calls{0};
  auto cache = make();
  auto slow = [&]() -> Expected<CodeObject> {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return compiler(calls)();
  };
  std::vector<std::thread> threads;
  std::vector<std::vector<uint8_t>> results(8);
  std::vector<CacheOutcome> outcomes(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto code = cache->get_or_compile(sample_key(), slow, &outcomes[t]);
      if (code)
        results[t] = code->bytes;
    });
  for (auto &t : threads)
    t.join();
  EXPECT_EQ(calls.load(), 1);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(results[t], results[0]);
    EXPECT_FALSE(results[t].empty());
  }
  EXPECT_EQ(std::count(outcomes.begin(), outcomes.end(), CacheOutcome::compiled), 1);
  EXPECT_EQ(std::count(outcomes.begin(), outcomes.end(), CacheOutcome::memory_hit), 7);
  EXPECT_EQ(files().size(), 1u);
}

TEST_F(CacheTest, ProcessesHammeringOneKeyAgree) {
  // Four processes, each alternating forced rewrites of the entry with reads
  // of it, all through fresh caches (empty memory). Every read must return the
  // one right code object: a reader never sees half a file, and no report of
  // a corrupt file is ever made.
  constexpr int kChildren = 4, kRounds = 40;
  const KeyParts key = sample_key();
  std::atomic<int> unused{0};
  const std::vector<uint8_t> expected = compiler(unused, 300000)()->bytes;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      for (int round = 0; round < kRounds && status == 0; ++round) {
        std::atomic<int> calls{0};
        bool reported = false;
        KernelCache cache(dir_);
        cache.set_reporter([&](const std::string &) { reported = true; });
        cache.set_always_compile((round + c) % 3 == 0);
        auto code = cache.get_or_compile(key, compiler(calls, 300000));
        if (!code)
          status = 1;
        else if (code->bytes != expected)
          status = 2;
        else if (reported)
          status = 3;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: compile failed, 2: wrong bytes, 3: corrupt file seen";
  }
  EXPECT_EQ(files(), std::vector<std::string>{key.hash() + ".fjk"}) << "no temporary files left";
  std::atomic<int> calls{0};
  CacheOutcome o;
  auto code = make()->get_or_compile(key, compiler(calls, 300000), &o);
  EXPECT_EQ(o, CacheOutcome::disk_hit);
  EXPECT_EQ(code->bytes, expected);
}

TEST_F(CacheTest, PermissionsAreUserOnly) {
  dir_ = (root_ / "a" / "b" / "cache").string();
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls)));
  for (const fs::path &d : {root_ / "a", root_ / "a" / "b", fs::path(dir_)}) {
    struct stat st{};
    ASSERT_EQ(::stat(d.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << d;
  }
  struct stat st{};
  ASSERT_EQ(::stat(cache->path_for(sample_key().hash())->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(CacheTest, AKeyNeverEscapesTheDirectory) {
  std::atomic<int> calls{0};
  auto cache = make();
  KeyParts evil = sample_key("../../../../etc/passwd");
  evil.target_id = "/tmp/x";
  evil.source_hash = "..";
  ASSERT_TRUE(cache->get_or_compile(evil, compiler(calls)));
  EXPECT_EQ(files(), std::vector<std::string>{evil.hash() + ".fjk"});
  std::vector<std::string> in_root;
  for (const auto &e : fs::directory_iterator(root_))
    in_root.push_back(e.path().filename().string());
  EXPECT_EQ(in_root, std::vector<std::string>{"cache"});
  for (const std::string &bad :
       std::vector<std::string>{"../x", "", std::string(64, 'g'), std::string(63, 'a'),
                                "/etc/passwd", std::string(64, 'A'), std::string(62, 'a') + "/."}) {
    auto p = cache->path_for(bad);
    EXPECT_FALSE(p) << bad;
  }
  EXPECT_EQ(*cache->path_for(std::string(64, 'a')), dir_ + "/" + std::string(64, 'a') + ".fjk");
}

TEST_F(CacheTest, MemoryIsBoundedLeastRecentlyUsedFirst) {
  std::atomic<int> calls{0};
  KernelCache cache("", 3000);
  CacheOutcome o;
  // Each entry costs its 900 bytes plus its strings (~30 bytes).
  for (const char *k : {"k1", "k2", "k3"})
    ASSERT_TRUE(cache.get_or_compile(sample_key(k), compiler(calls, 900)));
  EXPECT_EQ(cache.stats().memory_entries, 3);
  o = fetch(cache, sample_key("k1"), compiler(calls, 900));
  EXPECT_EQ(o, CacheOutcome::memory_hit); // k1 is now the most recent
  o = fetch(cache, sample_key("k4"), compiler(calls, 900));
  EXPECT_EQ(o, CacheOutcome::compiled);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.memory_entries, 3);
  EXPECT_LE(s.memory_bytes, 3000);
  o = fetch(cache, sample_key("k1"), compiler(calls, 900));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  o = fetch(cache, sample_key("k3"), compiler(calls, 900));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  o = fetch(cache, sample_key("k2"), compiler(calls, 900));
  EXPECT_EQ(o, CacheOutcome::compiled) << "k2 was the least recently used and went";
  // An entry larger than the whole budget is not kept at all.
  o = fetch(cache, sample_key("huge"), compiler(calls, 5000));
  o = fetch(cache, sample_key("huge"), compiler(calls, 5000));
  EXPECT_EQ(o, CacheOutcome::compiled);
  EXPECT_LE(cache.stats().memory_bytes, 3000);
}

TEST_F(CacheTest, AlwaysCompileSkipsLookupsButStores) {
  std::atomic<int> calls{0};
  auto cache = make();
  cache->set_always_compile(true);
  CacheOutcome o;
  for (int i = 0; i < 3; ++i) {
    o = fetch(*cache, sample_key(), compiler(calls));
    EXPECT_EQ(o, CacheOutcome::compiled);
  }
  EXPECT_EQ(calls.load(), 3);
  o = fetch(*make(), sample_key(), compiler(calls));
  EXPECT_EQ(o, CacheOutcome::disk_hit);
}

TEST_F(CacheTest, ListStatsAndClear) {
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key("a"), compiler(calls, 100)));
  ASSERT_TRUE(cache->get_or_compile(sample_key("b"), compiler(calls, 200)));
  write(*cache->path_for(std::string(64, 'c')), "junk");
  write(dir_ + "/notes.txt", "mine");
  const std::string fresh_temp = dir_ + "/.tmp-" + std::string(64, 'd') + "-AAAAAA";
  const std::string stale_temp = dir_ + "/.tmp-" + std::string(64, 'e') + "-BBBBBB";
  write(fresh_temp, "in progress");
  // A writer that died after the magic and the format version.
  write(stale_temp, read(*cache->path_for(sample_key("a").hash())).substr(0, 12));
  struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimes(stale_temp.c_str(), old), 0);

  auto entries = cache->list();
  ASSERT_TRUE(entries) << entries.status().message();
  ASSERT_EQ(entries->size(), 3u);
  int good = 0;
  for (const CacheEntryInfo &e : *entries) {
    if (e.key == std::string(64, 'c')) {
      EXPECT_NE(e.problem.find("shorter than the"), std::string::npos) << e.problem;
      continue;
    }
    ++good;
    EXPECT_TRUE(e.problem.empty()) << e.problem;
    EXPECT_EQ(e.target_id, "gfx1201");
    EXPECT_EQ(e.compiler_identity, "test 1.0");
    EXPECT_EQ(e.arch, "gfx1201");
    EXPECT_TRUE(e.bytes == 100 || e.bytes == 200);
    EXPECT_GT(e.file_bytes, e.bytes);
    EXPECT_EQ(e.path, *cache->path_for(e.key));
  }
  EXPECT_EQ(good, 2);
  CacheStats s = cache->stats();
  EXPECT_EQ(s.disk_entries, 3);
  EXPECT_EQ(s.memory_entries, 2);

  auto cleared = cache->clear();
  ASSERT_TRUE(cleared) << cleared.status().message();
  EXPECT_EQ(cleared->removed, 3); // two entries and the stale temporary file
  // The junk under an entry's name is not the cache's to delete: it stays, reported.
  ASSERT_EQ(cleared->problems.size(), 1u);
  EXPECT_NE(cleared->problems[0].find(std::string(64, 'c') + ".fjk: not a flashjit cache entry"),
            std::string::npos)
      << cleared->problems[0];
  EXPECT_EQ(files(), (std::vector<std::string>{fs::path(fresh_temp).filename().string(),
                                               std::string(64, 'c') + ".fjk", "notes.txt"}));
  EXPECT_EQ(cache->stats().memory_entries, 0);
  EXPECT_EQ(cache->stats().disk_entries, 1);
}

TEST_F(CacheTest, AnUnusableDirectoryFallsBackToMemory) {
  write((root_ / "file").string(), "x");
  dir_ = (root_ / "file" / "cache").string(); // under a regular file
  std::atomic<int> calls{0};
  auto cache = make();
  CacheOutcome o;
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("keeping kernels in memory only"), std::string::npos) << reports_[0];
  EXPECT_FALSE(cache->list());
}

// ---- issue 18 (hardening) ------------------------------------------------------

/// Finding 1: a cache directory others can write is refused (the cache keeps
/// kernels in memory and says how to fix the directory), as ssh refuses ~/.ssh.
TEST_F(CacheTest, Issue18Finding1CacheDirWritableByOthersIsRefused) {
  ASSERT_TRUE(fs::create_directory(dir_));
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  std::atomic<int> calls{0};
  auto cache = make();
  CacheOutcome o;
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  EXPECT_TRUE(files().empty()) << "nothing is written to an untrusted directory";
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("is writable by its group or others (mode 0777)"), std::string::npos)
      << reports_[0];
  EXPECT_NE(reports_[0].find("run chmod go-w " + dir_), std::string::npos) << reports_[0];
  EXPECT_NE(reports_[0].find("keeping kernels in memory only"), std::string::npos) << reports_[0];
  EXPECT_FALSE(cache->disk_status());
  auto listed = cache->list();
  ASSERT_FALSE(listed);
  EXPECT_EQ(listed.status().message(), cache->disk_status().message());
  EXPECT_FALSE(cache->clear());

  // A planted entry is never read from it...
  ASSERT_TRUE(KernelCache((root_ / "elsewhere").string())
                  .get_or_compile(sample_key(), compiler(calls, 10)));
  fs::copy_file(root_ / "elsewhere" / (sample_key().hash() + ".fjk"),
                fs::path(dir_) / (sample_key().hash() + ".fjk"));
  ASSERT_TRUE(make()->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::compiled);
  // ...and the fixed directory is used again.
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  auto fixed = make();
  EXPECT_TRUE(fixed->disk_status());
  ASSERT_TRUE(fixed->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::disk_hit);
}

TEST_F(CacheTest, Issue18Finding1CacheDirOfAnotherUserIsRefused) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "giving a directory to another user needs root";
  ASSERT_TRUE(fs::create_directory(dir_));
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls)));
  EXPECT_TRUE(files().empty());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("belongs to uid 65534, not to you (uid 0)"), std::string::npos)
      << reports_[0];
  EXPECT_NE(reports_[0].find("set FLASHJIT_CACHE_DIR to a directory of your own"),
            std::string::npos)
      << reports_[0];
}

/// Finding 6: a FIFO where an entry should be hung every reader; now it is
/// refused unopened for reading, reported, and the kernel recompiled.
TEST_F(CacheTest, Issue18Finding6FifoEntryIsSkippedAndRecompiled) {
  std::atomic<int> calls{0};
  auto cache = make();
  const std::string path = *cache->path_for(sample_key().hash());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto listed = cache->list();
  ASSERT_TRUE(listed) << listed.status().message();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].problem, "a FIFO, not a regular file");
  CacheOutcome o;
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::compiled);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0],
            "flashjit: cache: " + path + " is corrupt (a FIFO, not a regular file); recompiling");
  EXPECT_TRUE(fs::is_regular_file(path)) << "the fresh entry replaced the FIFO";
}

TEST_F(CacheTest, Issue18Finding6HugeSparseEntryIsSkippedAndRecompiled) {
  std::atomic<int> calls{0};
  auto cache = make();
  const std::string path = *cache->path_for(sample_key().hash());
  write(path, "FJKCACHE");
  fs::resize_file(path, uintmax_t(8) << 30); // 8 GiB, sparse
  auto listed = cache->list();
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].problem, "8589934592 bytes, more than the 268435456 allowed");
  CacheOutcome o;
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::compiled);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("more than the 268435456 allowed); recompiling"), std::string::npos)
      << reports_[0];
  EXPECT_LT(fs::file_size(path), 10000u);
}

/// Finding 11: `cache clear` deleted by name alone; now only what verifies as
/// an entry goes, nothing is entered, and every file left in place is reported.
TEST_F(CacheTest, Issue18Finding11ClearRemovesOnlyVerifiedEntries) {
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key("a"), compiler(calls, 100)));
  ASSERT_TRUE(cache->get_or_compile(sample_key("b"), compiler(calls, 100)));
  const std::string entry_a = read(*cache->path_for(sample_key("a").hash()));
  auto entry_name = [](char c) { return std::string(64, c) + ".fjk"; };
  // A user's file under an entry's name, and another entry's file renamed.
  write(dir_ + "/" + entry_name('1'), "my notes, which happen to have this name");
  write(dir_ + "/" + entry_name('2'), entry_a);
  // A directory under an entry's name, with a file in it.
  fs::create_directory(dir_ + "/" + entry_name('3'));
  write(dir_ + "/" + entry_name('3') + "/" + entry_name('3'), entry_a);
  // A symbolic link to a precious file, and a FIFO.
  write((root_ / "precious").string(), entry_a);
  fs::create_symlink(root_ / "precious", dir_ + "/" + entry_name('4'));
  ASSERT_EQ(::mkfifo((dir_ + "/" + entry_name('5')).c_str(), 0600), 0);
  // A stale temporary file that is not the cache's.
  const std::string stale = dir_ + "/.tmp-" + std::string(64, '6') + "-XXXXXX";
  write(stale, "not a cache header");
  struct timeval old[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimes(stale.c_str(), old), 0);

  auto cleared = cache->clear();
  ASSERT_TRUE(cleared) << cleared.status().message();
  EXPECT_EQ(cleared->removed, 2);
  std::map<std::string, std::string> problems; // file name -> line
  for (const std::string &line : cleared->problems) {
    EXPECT_TRUE(line.starts_with(dir_ + "/")) << line;
    EXPECT_TRUE(line.ends_with("; left in place")) << line;
    problems[fs::path(line.substr(0, line.find(':'))).filename().string()] = line;
  }
  ASSERT_EQ(problems.size(), 6u);
  EXPECT_NE(problems[entry_name('1')].find("not a flashjit cache entry (40 bytes, shorter than"),
            std::string::npos);
  EXPECT_NE(problems[entry_name('2')].find("not a flashjit cache entry (its header names another "
                                           "key)"),
            std::string::npos);
  EXPECT_NE(problems[entry_name('3')].find("not a regular file"), std::string::npos);
  EXPECT_NE(problems[entry_name('4')].find("a symbolic link"), std::string::npos);
  EXPECT_NE(problems[entry_name('5')].find("not a regular file"), std::string::npos);
  EXPECT_NE(problems[fs::path(stale).filename().string()].find("not a flashjit cache entry (bad "
                                                               "magic)"),
            std::string::npos);
  EXPECT_EQ(files(), (std::vector<std::string>{fs::path(stale).filename().string(), entry_name('1'),
                                               entry_name('2'), entry_name('3'), entry_name('4'),
                                               entry_name('5')}));
  EXPECT_TRUE(fs::exists(dir_ + "/" + entry_name('3') + "/" + entry_name('3')))
      << "clear never enters a directory";
  EXPECT_EQ(read((root_ / "precious").string()), entry_a);
}

TEST_F(CacheTest, Issue18Finding11ClearOfAnUnreadableDirectoryIsAnError) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "root reads every directory";
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls)));
  ASSERT_EQ(::chmod(dir_.c_str(), 0300), 0);
  auto cleared = cache->clear();
  ::chmod(dir_.c_str(), 0700);
  ASSERT_FALSE(cleared);
  EXPECT_NE(cleared.status().message().find("cannot read the cache directory"), std::string::npos);
}

/// Finding 9: a store that failed left get_or_compile successful (the kernel
/// stays in memory), and `warmup` reported it ready. stored() now says whether
/// another process will find the entry, and why not.
TEST_F(CacheTest, Issue18Finding9StoredReportsAFailedStore) {
  std::atomic<int> calls{0};
  EXPECT_NE(KernelCache("").stored(sample_key().hash()).message().find("memory only"),
            std::string::npos);
  auto cache = make();
  const std::string key = sample_key().hash();
  Status before = cache->stored(key);
  ASSERT_FALSE(before);
  EXPECT_EQ(before.message(),
            dir_ + " holds no entry for key " + key.substr(0, 16) +
                ": it was never stored there, or was removed since (by `flashjit cache clear`, or "
                "to keep the cache within FLASHJIT_CACHE_MAX_BYTES); compile the kernel again");

  // A full disk, as far as this process can tell: writes past 512 bytes fail
  // with EFBIG (the signal that would kill the process is ignored).
  struct rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 512;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  CacheOutcome o;
  auto code = cache->get_or_compile(sample_key(), compiler(calls, 4000), &o);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(code) << "the kernel itself is fine: it is kept in memory";
  EXPECT_EQ(o, CacheOutcome::compiled);
  Status full = cache->stored(key);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.message().rfind("the kernel was compiled but not stored in " + dir_ +
                                     ": cannot write " + dir_ + "/.tmp-" + key,
                                 0),
            0u)
      << full.message();
  EXPECT_TRUE(full.message().ends_with(": File too large; free space in " + dir_ +
                                       " or fix its permissions, or point FLASHJIT_CACHE_DIR (or "
                                       "--dir) at another directory"))
      << full.message();
  EXPECT_TRUE(files().empty()) << "no partial file is left";
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("the kernel is kept in memory only"), std::string::npos);

  // A later store that succeeds clears the failure.
  cache->set_always_compile(true);
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls, 4000)));
  EXPECT_TRUE(cache->stored(key)) << cache->stored(key).message();

  // A damaged entry is not stored either.
  const std::string path = *cache->path_for(key);
  write(path, read(path).substr(0, 200));
  Status damaged = cache->stored(key);
  ASSERT_FALSE(damaged);
  EXPECT_NE(damaged.message().find("the entry " + path + " is corrupt (truncated"),
            std::string::npos)
      << damaged.message();
  EXPECT_TRUE(damaged.message().ends_with("remove it, and the kernel will be compiled again"));

  // The directory replaced by a regular file under a live cache.
  fs::remove_all(dir_);
  write(dir_, "not a directory");
  cache->set_always_compile(true);
  ASSERT_TRUE(cache->get_or_compile(sample_key("other"), compiler(calls, 100)));
  Status gone = cache->stored(sample_key("other").hash());
  ASSERT_FALSE(gone);
  EXPECT_NE(gone.message().find("Not a directory"), std::string::npos) << gone.message();
}

/// Finding 9: a cache directory under a regular file is unusable from the
/// start; list(), clear() and stored() say so instead of "no kernels".
TEST_F(CacheTest, Issue18Finding9DirectoryUnderARegularFileIsAnError) {
  write((root_ / "file").string(), "x");
  KernelCache cache((root_ / "file" / "cache").string());
  ASSERT_FALSE(cache.disk_status());
  EXPECT_NE(cache.disk_status().message().find("Not a directory"), std::string::npos)
      << cache.disk_status().message();
  EXPECT_FALSE(cache.list());
  EXPECT_FALSE(cache.clear());
  EXPECT_EQ(cache.stored(sample_key().hash()).message(), cache.disk_status().message());
}

/// The modification time of `path`, set to `seconds` past the epoch.
void set_mtime(const std::string &path, time_t seconds) {
  struct timeval t[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimes(path.c_str(), t), 0) << path;
}

/// Finding 14: the disk cache grew without bound. Past its limit the least
/// recently used entries go; a hit renews an entry; nothing else is removed.
TEST_F(CacheTest, Issue18Finding14DiskLimitEvictsTheLeastRecentlyUsed) {
  std::atomic<int> calls{0};
  auto cache = make();
  EXPECT_EQ(cache->disk_limit(), kDefaultCacheMaxBytes);
  cache->set_disk_limit(0); // none while the entries are made
  for (const char *name : {"a", "b", "c"})
    ASSERT_TRUE(cache->get_or_compile(sample_key(name), compiler(calls, 1000)));
  auto path = [&](const char *name) { return *cache->path_for(sample_key(name).hash()); };
  const int64_t entry = int64_t(fs::file_size(path("a")));
  // Used in the order a, b, c, long ago; then a is hit by another process.
  set_mtime(path("a"), 1000000000);
  set_mtime(path("b"), 1000000100);
  set_mtime(path("c"), 1000000200);
  CacheOutcome o;
  auto other = make();
  ASSERT_TRUE(other->get_or_compile(sample_key("a"), compiler(calls), &o));
  ASSERT_EQ(o, CacheOutcome::disk_hit);
  EXPECT_GT(fs::last_write_time(path("a")), fs::last_write_time(path("c")))
      << "a disk hit renews the entry";
  // A user's file named like an entry, older than all: never removed.
  const std::string foreign = dir_ + "/" + std::string(64, '0') + ".fjk";
  write(foreign, std::string(100, 'x'));
  set_mtime(foreign, 900000000);

  // Room for three entries and the foreign file: storing d removes b alone.
  cache->set_disk_limit(3 * entry + 100 + entry / 2);
  ASSERT_TRUE(cache->get_or_compile(sample_key("d"), compiler(calls, 1000)));
  EXPECT_FALSE(fs::exists(path("b")));
  for (const char *name : {"a", "c", "d"})
    EXPECT_TRUE(fs::exists(path(name))) << name;
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_EQ(cache->stats().evicted_files, 1);
  EXPECT_EQ(cache->stats().disk_limit, 3 * entry + 100 + entry / 2);
  EXPECT_LE(cache->stats().disk_bytes, cache->disk_limit());

  // A lower limit: c (the least recently used now) and then a go; d, just
  // stored, stays even when it alone is all the limit allows.
  cache->set_disk_limit(entry + 100);
  ASSERT_TRUE(cache->get_or_compile(sample_key("e"), compiler(calls, 1000)));
  EXPECT_EQ(files(), (std::vector<std::string>{fs::path(foreign).filename().string(),
                                               fs::path(path("e")).filename().string()}));
  EXPECT_EQ(cache->stats().evicted_files, 4);

  // A kernel larger than the whole limit is kept in memory only, and said so.
  reports_.clear();
  cache->set_disk_limit(500);
  ASSERT_TRUE(cache->get_or_compile(sample_key("f"), compiler(calls, 1000)));
  EXPECT_FALSE(fs::exists(path("f")));
  EXPECT_TRUE(fs::exists(path("e"))) << "nothing is evicted for a kernel that is not stored";
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_NE(reports_[0].find("more than the cache's whole limit of 500 (FLASHJIT_CACHE_MAX_BYTES): "
                             "raise the limit, or set it to 0 for none"),
            std::string::npos)
      << reports_[0];
  Status f = cache->stored(sample_key("f").hash());
  ASSERT_FALSE(f);
  EXPECT_NE(f.message().find("FLASHJIT_CACHE_MAX_BYTES"), std::string::npos) << f.message();
}

/// Finding 14: a memory hit renews its entry file too, at most once per
/// renewal interval (a minute unless set), so a kernel a long-running process
/// keeps using is not the first to go.
TEST_F(CacheTest, Issue18Finding14MemoryHitRenewsTheEntry) {
  std::atomic<int> calls{0};
  auto cache = make();
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls)));
  const std::string path = *cache->path_for(sample_key().hash());
  auto mtime = [&] {
    struct stat st{};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_mtime;
  };
  set_mtime(path, 1000000000);
  CacheOutcome o;
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  EXPECT_EQ(mtime(), 1000000000) << "stored less than a minute ago: not renewed yet";
  cache->set_disk_limit(kDefaultCacheMaxBytes, std::chrono::seconds(0));
  ASSERT_TRUE(cache->get_or_compile(sample_key(), compiler(calls), &o));
  EXPECT_EQ(o, CacheOutcome::memory_hit);
  EXPECT_GT(mtime(), 1000000000) << "due: renewed";
  EXPECT_EQ(calls.load(), 1);
}

// ---- Attention::create from many threads ------------------------------------

/// The process's cache (KernelCache::global(), which Attention::create uses) in
/// a fresh user-only directory, set before anything reads the knobs.
class PrivateCacheDirEnvironment : public ::testing::Environment {
public:
  void SetUp() override {
    char pattern[] = "/tmp/flashjit-kernel-cache-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    setenv("FLASHJIT_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override { fs::remove_all(dir_); }

private:
  std::string dir_;
};
const auto *const kPrivateCacheDir =
    ::testing::AddGlobalTestEnvironment(new PrivateCacheDirEnvironment);

/// Eight threads create Attention objects for two signatures at once on the
/// emulator, all through the one cache directory: each kernel is compiled
/// once, the other six creates are memory hits with the same code object, and
/// the directory holds one entry per kernel.
TEST(AttentionThreads, EightThreadsSharingOneCacheDirCompileEachKernelOnce) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  KernelCache &cache = KernelCache::global();
  ASSERT_EQ(cache.directory(), std::getenv("FLASHJIT_CACHE_DIR"));
  const CacheStats before = cache.stats();
  const AttentionSpec specs[] = {make_spec(1, 2, 1, 16, 16, 32, 32, DType::bf16),
                                 make_spec(1, 2, 1, 16, 16, 32, 32, DType::f16)};
  Options options;
  options.compiler = "llvm";
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<std::string> errors(kThreads), explains(kThreads);
  std::vector<std::vector<uint8_t>> code(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      auto attn = Attention::create(specs[t % 2], "emulator:gfx1201", options);
      if (!attn) {
        errors[t] = attn.status().message();
        return;
      }
      explains[t] = attn->explain();
      code[t] = attn->code_object();
    });
  for (std::thread &t : threads)
    t.join();
  int compiled[2] = {0, 0};
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << "thread " << t;
    EXPECT_FALSE(code[t].empty()) << "thread " << t;
    EXPECT_EQ(code[t], code[t % 2]) << "thread " << t << " got another code object";
    compiled[t % 2] += explains[t].find("cache:    compiled") != std::string::npos;
  }
  EXPECT_NE(code[0], code[1]) << "two signatures, two kernels";
  EXPECT_EQ(compiled[0], 1) << explains[0];
  EXPECT_EQ(compiled[1], 1) << explains[1];
  const CacheStats after = cache.stats();
  EXPECT_EQ(after.compiles - before.compiles, 2);
  EXPECT_EQ(after.memory_hits - before.memory_hits, kThreads - 2);
  int entries = 0;
  for (const auto &e : fs::directory_iterator(cache.directory()))
    entries += e.path().extension() == ".fjk";
  EXPECT_EQ(entries, 2);
}

/// Attentions run from many threads at once (the thread-safety contract of
/// flashjit.h and attention.h): four threads share one Attention and four have
/// their own, each running forward on its own inputs (fresh random values, the
/// output poisoned) with its own shapes, and every output matches the float64
/// reference within the dtype's tolerance. ThreadSanitizer runs this too.
TEST(AttentionThreads, ForwardFromEightThreadsSharedAndOwnAttentions) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  const AttentionSpec base = make_spec(1, 2, 1, 16, 16, 32, 32, DType::bf16);
  Options options;
  options.compiler = "llvm";
  options.cpu_threads = 1;
  auto shared = Attention::create(base, "emulator:gfx1201", options);
  ASSERT_TRUE(shared) << shared.status().message();
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Other lengths each: one signature, shapes at run time.
      AttentionSpec spec = base;
      spec.seqlen_q = 5 + 7 * t;
      spec.seqlen_k = 9 + 5 * t;
      start.arrive_and_wait();
      std::optional<Attention> own;
      if (t % 2 == 1) {
        auto a = Attention::create(base, "emulator:gfx1201", options);
        if (!a) {
          errors[t] = a.status().message();
          return;
        }
        own.emplace(a.take());
      }
      Attention &attn = own ? *own : *shared;
      HostTensors h = make_random_inputs(spec, 100 + t);
      std::vector<uint16_t> q(h.q.size()), k(h.k.size()), v(h.v.size()), o(h.o.size(), 0x7fff);
      for (auto [from, to] : {std::pair{&h.q, &q}, std::pair{&h.k, &k}, std::pair{&h.v, &v}})
        for (size_t i = 0; i < from->size(); ++i)
          (*to)[i] = uint16_t(to_bits(spec.dtype, (*from)[i]));
      if (Status s = attn.forward(spec, q.data(), k.data(), v.data(), o.data(), nullptr); !s) {
        errors[t] = s.message();
        return;
      }
      for (size_t i = 0; i < o.size(); ++i)
        h.o[i] = from_bits(spec.dtype, o[i]);
      const Tolerance tol = tolerance_for(spec.dtype);
      const ErrorStats err = compare(spec, h, reference_attention(spec, h));
      if (!err.within(tol.abs, tol.rel))
        errors[t] = fmt::format("max_abs {} rel_l2 {} nonfinite {}", err.max_abs, err.rel_l2,
                                err.nonfinite);
    });
  for (std::thread &t : threads)
    t.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(errors[t], "") << "thread " << t;
}

/// A plan's kernels compile together (pipeline::compile_all): split-KV's two
/// and the decode kernel on the first decode call, two of them on threads of
/// their own (ThreadSanitizer runs this too). The cache counts the three
/// compiles; the output is checked against the float64 reference.
TEST(AttentionThreads, SplitKvKernelsCompileTogether) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no emulator (FLASHJIT_WITH_LLVM=OFF)";
  AttentionSpec spec = make_spec(1, 2, 2, 1, 300, 32, 32, DType::f16);
  spec.num_splits = 3;
  Options options;
  options.compiler = "llvm";
  options.cpu_threads = 2;
  auto attn = Attention::create(spec, "emulator:gfx1201", options);
  ASSERT_TRUE(attn) << attn.status().message();
  KernelCache &cache = KernelCache::global();
  const CacheStats before = cache.stats();
  HostTensors t = make_random_inputs(spec, 17);
  std::vector<uint16_t> q(t.q.size()), k(t.k.size()), v(t.v.size()), o(t.o.size(), 0x7fff);
  for (auto [from, to] : {std::pair{&t.q, &q}, std::pair{&t.k, &k}, std::pair{&t.v, &v}})
    for (size_t i = 0; i < from->size(); ++i)
      (*to)[i] = uint16_t(to_bits(spec.dtype, (*from)[i]));
  Status s = attn->forward(spec, q.data(), k.data(), v.data(), o.data(), nullptr);
  ASSERT_TRUE(s) << s.message();
  for (size_t i = 0; i < o.size(); ++i)
    t.o[i] = from_bits(spec.dtype, o[i]);
  const Tolerance tol = tolerance_for(spec.dtype);
  const ErrorStats err = compare(spec, t, reference_attention(spec, t));
  EXPECT_TRUE(err.within(tol.abs, tol.rel)) << err.max_abs << " " << err.rel_l2;
  const CacheStats after = cache.stats();
  EXPECT_EQ(after.compiles - before.compiles + after.memory_hits - before.memory_hits +
                after.disk_hits - before.disk_hits,
            3)
      << attn->explain();
  EXPECT_NE(attn->explain().find("1 of those calls ran the split-KV kernels"), std::string::npos)
      << attn->explain();
}

/// The key covers the source compiled: an emitter that writes other text for
/// the same IR (a newer build of the same version) compiles anew and never
/// gets the older build's binary; the first source still finds its own.
TEST_F(CacheTest, AnotherSourceOfTheSameIrIsAnotherKey) {
  if (!runtime::emulator_available())
    GTEST_SKIP() << "this build has no LLVM compiler (FLASHJIT_WITH_LLVM=OFF)";
  const AttentionSpec spec = make_spec(1, 1, 1, 64, 64, 32, 32, DType::f16);
  Options options;
  options.compiler = "llvm";
  auto g = pipeline::generate(spec, "gfx1201", options);
  ASSERT_TRUE(g) << g.status().message();
  auto cache = make();
  auto first = pipeline::compile(*g, options, *cache);
  ASSERT_TRUE(first) << first.status().message();
  pipeline::Generated edited = *g;
  edited.lowered.source += "\n// what a later emitter writes for the same IR\n";
  auto second = pipeline::compile(edited, options, *cache);
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_NE(second->cache_key, first->cache_key);
  EXPECT_EQ(second->cache_outcome, "compiled");
  auto again = pipeline::compile(*g, options, *cache);
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(again->cache_key, first->cache_key);
  EXPECT_NE(again->cache_outcome, "compiled");
}

// ---- knobs -----------------------------------------------------------------

Getenv env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(Knobs, Defaults) {
  auto k = parse_knobs(env({{"HOME", "/home/u"}}));
  ASSERT_TRUE(k);
  EXPECT_EQ(k->debug, 0);
  EXPECT_FALSE(k->always_compile);
  EXPECT_EQ(k->dump_dir, "");
  EXPECT_EQ(k->override_dir, "");
  EXPECT_EQ(k->cache_dir, "/home/u/.cache/flashjit");
  EXPECT_EQ(k->cache_max_bytes, int64_t(2) << 30);
}

TEST(Knobs, CacheDirectoryPrecedence) {
  EXPECT_EQ(parse_knobs(env({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}}))->cache_dir, "/x/flashjit");
  EXPECT_EQ(parse_knobs(env({{"HOME", "/h"}, {"XDG_CACHE_HOME", "relative"}}))->cache_dir,
            "/h/.cache/flashjit");
  EXPECT_EQ(
      parse_knobs(env({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}, {"FLASHJIT_CACHE_DIR", "/c"}}))
          ->cache_dir,
      "/c");
  EXPECT_EQ(parse_knobs(env({}))->cache_dir, "");
}

TEST(Knobs, Values) {
  auto k = parse_knobs(env({{"FLASHJIT_DEBUG", "4"},
                            {"FLASHJIT_ALWAYS_COMPILE", "yes"},
                            {"FLASHJIT_DUMP_DIR", "/d"},
                            {"FLASHJIT_OVERRIDE_DIR", "/o"}}));
  ASSERT_TRUE(k) << k.status().message();
  EXPECT_EQ(k->debug, 4);
  EXPECT_TRUE(k->always_compile);
  EXPECT_EQ(k->dump_dir, "/d");
  EXPECT_EQ(k->override_dir, "/o");
  EXPECT_FALSE(parse_knobs(env({{"FLASHJIT_ALWAYS_COMPILE", "0"}}))->always_compile);
  EXPECT_TRUE(k->dependent_launch) << "on unless asked off";
  EXPECT_FALSE(parse_knobs(env({{"FLASHJIT_DEPENDENT_LAUNCH", "off"}}))->dependent_launch);
  auto bad = parse_knobs(env({{"FLASHJIT_DEPENDENT_LAUNCH", "2"}}));
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("FLASHJIT_DEPENDENT_LAUNCH=2: expected 0 or 1"),
            std::string::npos);
}

TEST(Knobs, BadValuesAreClearErrors) {
  auto a = parse_knobs(env({{"FLASHJIT_DEBUG", "abc"}}));
  ASSERT_FALSE(a);
  EXPECT_EQ(a.status().message(), "FLASHJIT_DEBUG=abc: expected a level from 0 (silent) to 4 "
                                  "(the tile IR and the emitted source)");
  EXPECT_FALSE(parse_knobs(env({{"FLASHJIT_DEBUG", "5"}})));
  EXPECT_FALSE(parse_knobs(env({{"FLASHJIT_DEBUG", "-1"}})));
  EXPECT_FALSE(parse_knobs(env({{"FLASHJIT_DEBUG", "2x"}})));
  auto b = parse_knobs(env({{"FLASHJIT_DEBUG", "x"}, {"FLASHJIT_ALWAYS_COMPILE", "maybe"}}));
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("FLASHJIT_DEBUG=x"), std::string::npos);
  EXPECT_NE(b.status().message().find("FLASHJIT_ALWAYS_COMPILE=maybe: expected 0 or 1"),
            std::string::npos);
}

TEST(Knobs, TableDocumentsEveryKnob) {
  std::set<std::string_view> names;
  for (const KnobInfo &k : knob_table()) {
    EXPECT_TRUE(k.name.starts_with("FLASHJIT_")) << k.name;
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_FALSE(k.fallback.empty()) << k.name;
    names.insert(k.name);
  }
  EXPECT_EQ(names, (std::set<std::string_view>{
                       "FLASHJIT_DEBUG", "FLASHJIT_DUMP_DIR", "FLASHJIT_OVERRIDE_DIR",
                       "FLASHJIT_CACHE_DIR", "FLASHJIT_CACHE_MAX_BYTES", "FLASHJIT_ALWAYS_COMPILE",
                       "FLASHJIT_LLVM_PLUGIN", "FLASHJIT_DEPENDENT_LAUNCH", "FLASHJIT_PROGRESS"}));
  auto on = parse_knobs(
      [](const char *n) { return std::string(n) == "FLASHJIT_PROGRESS" ? "1" : nullptr; });
  ASSERT_TRUE(on) << on.status().message();
  EXPECT_EQ(on->progress, 1);
  auto unset = parse_knobs([](const char *) -> const char * { return nullptr; });
  ASSERT_TRUE(unset);
  EXPECT_EQ(unset->progress, -1) << "unset: the command line asks whether stderr is a terminal";
}

TEST(Knobs, SourceOverride) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("fj-override-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all); // private, whatever the umask
  Knobs k;
  k.override_dir = dir.string();
  EXPECT_FALSE(source_override("fj_attention", k)->has_value()) << "no file, no override";
  {
    std::ofstream out(dir / "fj_attention.hip");
    out << "// edited by hand\n";
  }
  auto o = source_override("fj_attention", k);
  ASSERT_TRUE(o && o->has_value());
  EXPECT_EQ((*o)->source, "// edited by hand\n");
  EXPECT_EQ((*o)->hash, sha256_hex("// edited by hand\n"));
  EXPECT_EQ((*o)->path, (dir / "fj_attention.hip").string());
  EXPECT_FALSE(source_override("../fj_attention", k));
  EXPECT_FALSE(source_override("fj_attention", Knobs{})->has_value()) << "knob unset";
  fs::remove_all(dir);
}

TEST(Knobs, DumpFile) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("fj-dump-" + std::to_string(getpid()));
  fs::remove_all(dir);
  Knobs k;
  k.dump_dir = dir.string();
  ASSERT_TRUE(dump_file("k-1234.hip", "source", k));
  std::ifstream in(dir / "k-1234.hip");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "source");
  EXPECT_FALSE(dump_file("../escape.hip", "x", k));
  EXPECT_FALSE(dump_file(".hidden", "x", k));
  EXPECT_TRUE(dump_file("ignored.hip", "x", Knobs{})) << "no dump dir: nothing to do";
  fs::remove_all(dir);
}

/// Finding 1: the dump and override directories must be private too.
TEST(Knobs, Issue18Finding1DumpAndOverrideDirsWritableByOthersAreRefused) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("fj-shared-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0); // like /tmp
  std::ofstream(dir / "fj_attention.hip") << "// planted by someone else\n";
  Knobs k;
  k.dump_dir = k.override_dir = dir.string();
  Status dumped = dump_file("k-1234.hip", "source", k);
  ASSERT_FALSE(dumped);
  EXPECT_EQ(dumped.message(), "FLASHJIT_DUMP_DIR directory " + dir.string() +
                                  " is writable by its group or others (mode 1777), so another "
                                  "user could plant files in it: run chmod go-w " +
                                  dir.string() +
                                  ", or set FLASHJIT_DUMP_DIR to a directory of "
                                  "your own");
  EXPECT_FALSE(fs::exists(dir / "k-1234.hip"));
  auto o = source_override("fj_attention", k);
  ASSERT_FALSE(o);
  EXPECT_NE(o.status().message().find("FLASHJIT_OVERRIDE_DIR directory " + dir.string() +
                                      " is writable by its group or others"),
            std::string::npos)
      << o.status().message();
  // A missing override directory is no override at all, as before.
  k.override_dir = (dir / "missing").string();
  EXPECT_FALSE(source_override("fj_attention", k)->has_value());
  fs::remove_all(dir);
}

/// Finding 7: a symbolic link planted under a dump's name is replaced, not
/// written through.
TEST(Knobs, Issue18Finding7DumpFileNeverFollowsASymbolicLink) {
  const fs::path root =
      fs::path(::testing::TempDir()) / ("fj-dumplink-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "dump");
  fs::permissions(root / "dump", fs::perms::owner_all);
  std::ofstream(root / "precious") << "do not touch";
  fs::create_symlink(root / "precious", root / "dump" / "k-1234.hip");
  Knobs k;
  k.dump_dir = (root / "dump").string();
  ASSERT_TRUE(dump_file("k-1234.hip", "source", k));
  std::ifstream precious(root / "precious");
  std::string text;
  std::getline(precious, text);
  EXPECT_EQ(text, "do not touch");
  EXPECT_FALSE(fs::is_symlink(root / "dump" / "k-1234.hip"));
  EXPECT_EQ(fs::file_size(root / "dump" / "k-1234.hip"), 6u);
  EXPECT_EQ(std::distance(fs::directory_iterator(root / "dump"), fs::directory_iterator()), 1)
      << "no temporary file is left behind";
  fs::remove_all(root);
}

/// Finding 10 (the part in the knobs): a FIFO, a directory or an empty file as
/// an override is refused, never read as a kernel.
TEST(Knobs, Issue18Finding10OverrideMustBeANonEmptyRegularFile) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("fj-override-bad-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all);
  Knobs k;
  k.override_dir = dir.string();
  ASSERT_EQ(::mkfifo((dir / "fifo_kernel.hip").c_str(), 0600), 0);
  fs::create_directory(dir / "dir_kernel.hip");
  std::ofstream(dir / "empty_kernel.hip").close();
  for (auto [name, why] : {std::pair{"fifo_kernel", "a FIFO, not a regular file"},
                           std::pair{"dir_kernel", "a directory, not a regular file"},
                           std::pair{"empty_kernel", "is empty"}}) {
    auto o = source_override(name, k);
    ASSERT_FALSE(o) << name;
    EXPECT_NE(o.status().message().find(why), std::string::npos) << o.status().message();
    EXPECT_NE(o.status().message().find("remove it to compile the generated one"),
              std::string::npos)
        << o.status().message();
  }
  fs::remove_all(dir);
}

/// Finding 14: FLASHJIT_CACHE_MAX_BYTES takes bytes with K/M/G/T suffixes.
TEST(Knobs, Issue18Finding14CacheMaxBytes) {
  auto bytes = [](const char *v) { return parse_knobs(env({{"FLASHJIT_CACHE_MAX_BYTES", v}})); };
  EXPECT_EQ(bytes("0")->cache_max_bytes, 0);
  EXPECT_EQ(bytes("123456")->cache_max_bytes, 123456);
  EXPECT_EQ(bytes("512k")->cache_max_bytes, 512 << 10);
  EXPECT_EQ(bytes("64M")->cache_max_bytes, int64_t(64) << 20);
  EXPECT_EQ(bytes("2G")->cache_max_bytes, int64_t(2) << 30);
  EXPECT_EQ(bytes("1t")->cache_max_bytes, int64_t(1) << 40);
  for (const char *bad :
       {"-1", "1.5G", "G", "2GB", "0x100", " 5", "99999999999T", "99999999999999999999"}) {
    auto k = bytes(bad);
    ASSERT_FALSE(k) << bad;
    EXPECT_EQ(k.status().message(),
              fmt::format("FLASHJIT_CACHE_MAX_BYTES={}: expected a size in bytes, optionally with "
                          "a K, M, G or T suffix (powers of 1024), e.g. 2G; 0 for no cap",
                          bad));
  }
}

/// Finding 10: the emulator ran the generated kernel although an override was
/// compiled and announced. It runs the override's kernel text now; an edit it
/// cannot run (in the target prelude, which it replaces) is refused.
TEST(Knobs, Issue18Finding10EmulatorTakesTheOverridesKernelText) {
  const std::string kernel_text =
      "// ---- the element type (bf16) ----\nint kernel() { return 1; }\n";
  const std::string source =
      "// flashjit kernel k for gfx1201\n#define FJ_PRELUDE 1\n\n" + kernel_text;
  SourceOverride o;
  o.path = "/o/k.hip";
  o.source = source;
  EXPECT_EQ(*override_kernel_text(o, source, kernel_text), kernel_text);
  // Kernel edits and comments anywhere are taken.
  o.source = "// my notes\n" + source;
  o.source.replace(o.source.find("return 1"), 8, "return 2");
  EXPECT_EQ(*override_kernel_text(o, source, kernel_text),
            "// ---- the element type (bf16) ----\nint kernel() { return 2; }\n");
  // An edit of the prelude is not.
  o.source = source;
  o.source.replace(o.source.find("FJ_PRELUDE 1"), 12, "FJ_PRELUDE 2");
  auto prelude = override_kernel_text(o, source, kernel_text);
  ASSERT_FALSE(prelude);
  EXPECT_EQ(prelude.status().message(),
            "FLASHJIT_OVERRIDE_DIR: /o/k.hip changes the code before the line '// ---- the "
            "element type (bf16) ----' (the target prelude or the matrix-instruction wrapper), "
            "which the CPU emulator replaces with its own prelude, so the emulator cannot run "
            "that edit: make it below that line, or run the override on a GPU");
  // Without the line that begins the kernel text, it cannot be found.
  o.source = "int kernel() { return 3; }\n";
  auto lost = override_kernel_text(o, source, kernel_text);
  ASSERT_FALSE(lost);
  EXPECT_NE(lost.status().message().find("has no line '// ---- the element type (bf16) ----'"),
            std::string::npos)
      << lost.status().message();
}

} // namespace
} // namespace flashjit::compiler
