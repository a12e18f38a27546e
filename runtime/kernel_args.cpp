#include "runtime/kernel_args.h"

#include <cstring>

namespace flashjit::runtime {

Expected<KernelArgs> KernelArgs::make(std::span<const lowering::KernelParam> params,
                                      const ir::Bindings &scalars,
                                      std::span<const NamedPointer> tensors) {
  KernelArgs args;
  args.values_.assign(params.size(), 0);
  size_t hint = 0; // the parameters come in nearly the order they were bound
  for (size_t i = 0; i < params.size(); ++i) {
    const lowering::KernelParam &p = params[i];
    uint64_t &slot = args.values_[i];
    if (p.kind == lowering::KernelParam::Kind::tensor) {
      const void *pointer = nullptr;
      for (const NamedPointer &t : tensors)
        if (t.name == p.name)
          pointer = t.pointer;
      std::memcpy(&slot, &pointer, sizeof pointer);
      continue;
    }
    if (p.type == ir::ScalarType::f32) {
      auto v = scalars.real(p.name, &hint);
      if (!v)
        return v.status();
      const float f = float(*v);
      std::memcpy(&slot, &f, sizeof f);
      continue;
    }
    auto v = scalars.integer(p.name, &hint);
    if (!v)
      return v.status();
    if (p.type == ir::ScalarType::i32) {
      if (*v < INT32_MIN || *v > INT32_MAX)
        return Status::error("kernel argument {} = {} does not fit its 32-bit parameter", p.name,
                             *v);
      const int32_t narrow = int32_t(*v);
      std::memcpy(&slot, &narrow, sizeof narrow);
    } else {
      std::memcpy(&slot, &*v, sizeof(int64_t));
    }
  }
  args.addresses_.reserve(args.values_.size());
  for (uint64_t &slot : args.values_)
    args.addresses_.push_back(&slot);
  return args;
}

} // namespace flashjit::runtime
