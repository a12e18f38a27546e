#include "runtime/emulator_fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace flashjit::runtime::emu {

Expected<StackPool> StackPool::create(int count, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  StackPool p;
  p.count_ = count;
  p.stride_ = (bytes + page - 1) / page * page + page; // the stack, then the next one's guard
  p.mapped_ = p.stride_ * size_t(count);
  void *m = ::mmap(nullptr, p.mapped_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED)
    return Status::error("emulator: cannot map {} lane stacks of {} bytes: {}", count, bytes,
                         std::strerror(errno));
  p.base_ = static_cast<char *>(m);
  for (int i = 0; i < count; ++i)
    if (::mprotect(p.base_ + p.stride_ * size_t(i), page, PROT_NONE) != 0)
      return Status::error("emulator: cannot protect a lane stack's guard page: {}",
                           std::strerror(errno));
  return p;
}

StackPool::StackPool(StackPool &&o) noexcept
    : base_(o.base_), mapped_(o.mapped_), stride_(o.stride_), count_(o.count_) {
  o.base_ = nullptr;
  o.mapped_ = 0;
}

StackPool &StackPool::operator=(StackPool &&o) noexcept {
  if (this != &o) {
    if (base_)
      ::munmap(base_, mapped_);
    base_ = o.base_;
    mapped_ = o.mapped_;
    stride_ = o.stride_;
    count_ = o.count_;
    o.base_ = nullptr;
    o.mapped_ = 0;
  }
  return *this;
}

StackPool::~StackPool() {
  if (base_)
    ::munmap(base_, mapped_);
}

void *StackPool::top(int i) const {
  auto end = reinterpret_cast<uintptr_t>(base_ + stride_ * size_t(i + 1));
  return reinterpret_cast<void *>(end & ~uintptr_t(63));
}

#if FLASHJIT_EMU_FAST_SWITCH

// flashjit_emu_switch(void **save_sp, void *new_sp): pushes the callee-saved
// registers and the SSE/x87 control words, stores the stack pointer, loads the
// other one and pops in reverse. A fresh context's frame "returns" into
// flashjit_emu_entry, which calls r12(r13).
asm(R"(
  .text
  .p2align 4
  .globl flashjit_emu_switch
  .hidden flashjit_emu_switch
  .type flashjit_emu_switch, @function
flashjit_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size flashjit_emu_switch, .-flashjit_emu_switch

  .p2align 4
  .globl flashjit_emu_entry
  .hidden flashjit_emu_entry
  .type flashjit_emu_entry, @function
flashjit_emu_entry:
  movq %r13, %rdi
  callq *%r12
  ud2
  .size flashjit_emu_entry, .-flashjit_emu_entry
)");

extern "C" void flashjit_emu_switch(void **save_sp, void *new_sp);
extern "C" void flashjit_emu_entry();

void make_context(Context &ctx, void *stack_top, size_t, void (*fn)(void *), void *arg) {
  // flashjit_emu_entry starts with rsp 16-byte aligned, so its call leaves the
  // callee's rsp + 8 aligned as the ABI wants.
  auto top = reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t(15);
  auto *slot = reinterpret_cast<uint64_t *>(top - 24); // the "return address" into the entry
  slot[0] = reinterpret_cast<uint64_t>(&flashjit_emu_entry);
  slot[1] = 0;
  uint64_t *frame = slot - 7;
  uint32_t control[2] = {0x1f80, 0x037f}; // MXCSR and x87 control word at process start
  std::memcpy(&frame[0], control, sizeof control);
  frame[1] = 0;                               // r15
  frame[2] = 0;                               // r14
  frame[3] = reinterpret_cast<uint64_t>(arg); // r13
  frame[4] = reinterpret_cast<uint64_t>(fn);  // r12
  frame[5] = 0;                               // rbx
  frame[6] = 0;                               // rbp
  ctx.sp = frame;
}

void switch_context(Context &from, Context &to) { flashjit_emu_switch(&from.sp, to.sp); }

#else // the portable fallback: ucontext (slower, one system call per switch)

namespace {
void trampoline(unsigned hi, unsigned lo, unsigned fhi, unsigned flo) {
  auto arg = reinterpret_cast<void *>((uintptr_t(hi) << 32) | lo);
  auto fn = reinterpret_cast<void (*)(void *)>((uintptr_t(fhi) << 32) | flo);
  fn(arg);
  __builtin_trap();
}
} // namespace

void make_context(Context &ctx, void *stack_top, size_t stack_bytes, void (*fn)(void *),
                  void *arg) {
  if (!ctx.uc)
    ctx.uc = std::make_unique<UcontextBox>();
  getcontext(&ctx.uc->uc);
  ctx.uc->uc.uc_stack.ss_sp = static_cast<char *>(stack_top) - stack_bytes;
  ctx.uc->uc.uc_stack.ss_size = stack_bytes;
  ctx.uc->uc.uc_link = nullptr;
  auto a = reinterpret_cast<uintptr_t>(arg), f = reinterpret_cast<uintptr_t>(fn);
  makecontext(&ctx.uc->uc, reinterpret_cast<void (*)()>(&trampoline), 4, unsigned(a >> 32),
              unsigned(a), unsigned(f >> 32), unsigned(f));
}

void switch_context(Context &from, Context &to) {
  if (!from.uc)
    from.uc = std::make_unique<UcontextBox>();
  swapcontext(&from.uc->uc, &to.uc->uc);
}

#endif

} // namespace flashjit::runtime::emu
