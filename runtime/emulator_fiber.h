// Fibers for the emulator: one per emulated lane, each on its own stack with a
// guard page below it. A switch saves only what the C ABI says a call
// preserves, so it costs a few nanoseconds (swapcontext would make a
// sigprocmask system call every time, and lanes switch at every collective).
#pragma once

#include "ir/status.h"

#include <cstddef>
#include <memory>

// The hand-written switch exists for x86-64; elsewhere (or with
// -DFLASHJIT_EMU_UCONTEXT, to test the fallback) fibers use ucontext.
#if defined(__x86_64__) && !defined(FLASHJIT_EMU_UCONTEXT)
#define FLASHJIT_EMU_FAST_SWITCH 1
#else
#define FLASHJIT_EMU_FAST_SWITCH 0
#endif

#if !FLASHJIT_EMU_FAST_SWITCH
#include <ucontext.h>
#endif

namespace flashjit::runtime::emu {

#if !FLASHJIT_EMU_FAST_SWITCH
struct UcontextBox {
  ucontext_t uc;
};
#endif

/// A suspended execution context: the stack pointer its registers were saved to.
struct Context {
  void *sp = nullptr;
#if !FLASHJIT_EMU_FAST_SWITCH
  std::unique_ptr<UcontextBox> uc; // the portable fallback's ucontext_t
#endif
};

/// `count` stacks of `bytes` each (rounded up to pages), every one with a
/// PROT_NONE guard page below it, in one mapping.
class StackPool {
public:
  static Expected<StackPool> create(int count, size_t bytes);
  StackPool() = default;
  StackPool(StackPool &&other) noexcept;
  StackPool &operator=(StackPool &&other) noexcept;
  StackPool(const StackPool &) = delete;
  ~StackPool();
  /// The highest address of stack `i` (stacks grow down), 64-byte aligned.
  void *top(int i) const;

private:
  char *base_ = nullptr;
  size_t mapped_ = 0, stride_ = 0;
  int count_ = 0;
};

/// Prepares `ctx` so that the first switch to it calls fn(arg) on the stack
/// ending at `stack_top`. fn must never return (it switches away for good).
void make_context(Context &ctx, void *stack_top, size_t stack_bytes, void (*fn)(void *), void *arg);

/// Saves the running context into `from` and resumes `to`.
void switch_context(Context &from, Context &to);

} // namespace flashjit::runtime::emu
