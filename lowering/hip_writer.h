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

/// A workgroup's reduction, in a fixed order (a tree over the LDS array `tree`
/// of kThreads floats, indexed by `tid`): each work-item's `value` combined by
/// fj_max (max) or + into `result` (an lvalue or a declaration), which every
/// work-item reads before the closing barrier frees `tree` for reuse.
inline void tree_reduce(HipWriter &w, std::string_view tree, std::string_view value, bool max,
                        std::string_view result) {
  w.line("{}[tid] = {};", tree, value);
  w.line("fj_barrier();");
  w.line("for (int half = kThreads / 2; half > 0; half /= 2) {{");
  w.line("  if (tid < half)");
  if (max)
    w.line("    {0}[tid] = fj_max({0}[tid], {0}[tid + half]);", tree);
  else
    w.line("    {0}[tid] += {0}[tid + half];", tree);
  w.line("  fj_barrier();");
  w.line("}}");
  w.line("{} = {}[0];", result, tree);
  w.line("fj_barrier();");
}

} // namespace flashjit::lowering
