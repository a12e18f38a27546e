// JSON for the tool and its tests, through nlohmann::json: reading the manifests
// of `flashjit warmup` and the test data (tests/data/*.json) under the limits
// below, and printing the --json output of the commands.
// Nothing a file holds can crash the reader: nesting is bounded (kMaxDepth),
// parse_file reads only regular files of bounded size, and every refusal is an
// error message, never an exception. Numbers follow JSON's grammar strictly (no
// hex, NaN, Infinity, leading '+', leading zeros or bare '.5'), strings must be
// UTF-8, and an integer is one only as written in digits: integer() refuses
// 1e15 or 2.0 where an integer is expected.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace flashjit::cli::json {

/// A JSON document; objects keep their keys in the order written.
using Value = nlohmann::ordered_json;

/// Arrays and objects nested deeper than this are refused (a manifest is two
/// levels deep).
constexpr int kMaxDepth = 64;
/// parse_file's default limit on the file's size.
constexpr int64_t kMaxFileBytes = 64 << 20;

/// The integer `v` holds if it is written as one (-?[0-9]+, no fraction or
/// exponent) and fits int64; nullopt for anything else (1e15, 2.0,
/// 99999999999999999999, "64").
inline std::optional<int64_t> integer(const Value &v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer())
    return v.get<int64_t>();
  return std::nullopt;
}

/// Parses `text` as one JSON value; on failure returns nullopt and, if given,
/// sets *error.
inline std::optional<Value> parse(std::string_view text, std::string *error = nullptr) {
  struct TooDeep : std::exception {};
  // `depth` counts the arrays and objects around the one that starts.
  auto bounded = [](int depth, Value::parse_event_t event, Value &) {
    if ((event == Value::parse_event_t::array_start ||
         event == Value::parse_event_t::object_start) &&
        depth >= kMaxDepth)
      throw TooDeep{};
    return true;
  };
  auto fail = [&](const std::string &what) {
    if (error)
      *error = what;
    return std::nullopt;
  };
  try {
    return Value::parse(text.begin(), text.end(), bounded);
  } catch (const TooDeep &) {
    return fail("JSON error: arrays and objects nested more than " + std::to_string(kMaxDepth) +
                " deep; flatten the document");
  } catch (const Value::exception &e) {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 4: ..."
    std::string_view what = e.what();
    if (const size_t end = what.find("] "); what.starts_with("[json.") && end != what.npos)
      what.remove_prefix(end + 2);
    return fail((what.starts_with("parse error") ? "JSON " : "JSON error: ") + std::string(what));
  }
}

/// Reads and parses the JSON file at `path`; on failure returns nullopt and
/// sets *error to the problem and the fix. Only a regular file of at most
/// `max_bytes` is read: a FIFO or a device (`/dev/zero`) is refused before any
/// read could block or run away, as is a huge file.
inline std::optional<Value> parse_file(const std::string &path, std::string *error,
                                       int64_t max_bytes = kMaxFileBytes) {
  auto fail = [&](const std::string &what) {
    if (error)
      *error = path + ": " + what;
    return std::nullopt;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail(std::string("cannot read it: ") + std::strerror(errno));
  std::string text;
  struct stat st{};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && st.st_size <= max_bytes) {
    text.resize(size_t(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      done += size_t(n);
    }
    text.resize(done);
  }
  ::close(fd);
  if (!regular)
    return fail("not a regular file (a FIFO, device or directory); give a JSON file");
  if (st.st_size > max_bytes)
    return fail(std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                " a JSON file here may be; give a smaller file");
  std::string why;
  std::optional<Value> v = parse(text, &why);
  if (!v)
    return fail(why);
  return v;
}

/// `v` as the commands' --json prints it: two-space indents, keys in insertion
/// order, a newline at the end. Bytes that are not UTF-8 (in a path, say)
/// become U+FFFD rather than an exception.
inline std::string print(const Value &v) {
  return v.dump(2, ' ', false, Value::error_handler_t::replace) + "\n";
}

} // namespace flashjit::cli::json
