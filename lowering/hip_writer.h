// A small writer for readable generated code: indentation, blocks, comments.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

namespace flashjit::lowering {

class HipWriter {
public:
  template <typename... Args> void line(fmt::format_string<Args...> f, Args &&...args) {
    out_.append(indent_ * 2, ' ');
    out_ += fmt::format(f, std::forward<Args>(args)...);
    out_ += '\n';
  }
  void blank() { out_ += '\n'; }
  void raw(std::string_view text) { out_ += text; }
  template <typename... Args> void open(fmt::format_string<Args...> f, Args &&...args) {
    line(f, std::forward<Args>(args)...);
    ++indent_;
  }
  void close(std::string_view tail = "}") {
    --indent_;
    line("{}", tail);
  }
  void indent(int levels) { indent_ += levels; }
  const std::string &str() const { return out_; }

private:
  std::string out_;
  int indent_ = 0;
};

} // namespace flashjit::lowering
