#include "runtime/kernel_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace flashjit::runtime {

namespace {

const void *pointer_of(std::span<const NamedPointer> tensors, std::string_view name) {
  for (const NamedPointer &t : tensors)
    if (t.name == name)
      return t.pointer;
  return nullptr;
}

// The tensor map of a KernelParam::Kind::tensor_map parameter: the tensor's
// [batch, heads, seq, dim] as dims (dim, seq, heads, batch), innermost first,
// with its byte strides; a box of 64 columns x the tile's rows of one head.
Status encode_map(const lowering::KernelParam &p, const ir::Bindings &scalars,
                  std::span<const NamedPointer> tensors, GpuDriver *driver, int device,
                  TensorMapBytes &map) {
  const ir::TensorParam &t = *p.map_of;
  if (driver == nullptr)
    return Status::error("kernel parameter {} is a tensor map (TMA), which only a CUDA device "
                         "runs",
                         p.name);
  TensorMapRequest r;
  r.base = pointer_of(tensors, t.name);
  r.bf16 = t.dtype == DType::bf16;
  r.rank = 4;
  const ir::Extent *extents[] = {&t.seq, &t.heads, &t.batch};
  const ir::Extent *strides[] = {&t.stride_seq, &t.stride_head, &t.stride_batch};
  r.dims[0] = uint64_t(t.dim);
  for (int i = 0; i < 3; ++i) {
    auto extent = scalars.resolve(*extents[i]);
    if (!extent)
      return extent.status();
    auto stride = scalars.resolve(*strides[i]);
    if (!stride)
      return stride.status();
    // An empty tensor is never read (its loops run no block), but a map's
    // extents are at least 1; a stride of an extent of 1 is never applied.
    r.dims[i + 1] = uint64_t(std::max<int64_t>(*extent, 1));
    r.strides[i] = *extent > 1 ? uint64_t(*stride) * dtype_bytes(t.dtype) : 16;
  }
  r.box[0] = 64;
  r.box[1] = unsigned(p.box_rows);
  r.box[2] = r.box[3] = 1;
  return driver->encode_tensor_map(device, r, map)
      .with_context(fmt::format("the tensor map of {} ({} x {} x {} x {}, byte strides {}, {}, {})",
                                t.name, r.dims[3], r.dims[2], r.dims[1], r.dims[0], r.strides[2],
                                r.strides[1], r.strides[0]));
}

} // namespace

Expected<KernelArgs> KernelArgs::make(std::span<const lowering::KernelParam> params,
                                      const ir::Bindings &scalars,
                                      std::span<const NamedPointer> tensors, GpuDriver *driver,
                                      int device) {
  KernelArgs args;
  args.values_.assign(params.size(), 0);
  size_t hint = 0; // the parameters come in nearly the order they were bound
  for (size_t i = 0; i < params.size(); ++i) {
    const lowering::KernelParam &p = params[i];
    uint64_t &slot = args.values_[i];
    if (p.kind == lowering::KernelParam::Kind::tensor) {
      const void *pointer = pointer_of(tensors, p.name);
      std::memcpy(&slot, &pointer, sizeof pointer);
      continue;
    }
    if (p.kind == lowering::KernelParam::Kind::tensor_map) {
      FJ_RETURN_IF_ERROR(
          encode_map(p, scalars, tensors, driver, device, args.maps_.emplace_back()));
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
  // A tensor map's value is its 128 bytes; every other argument's its slot.
  args.addresses_.reserve(args.values_.size());
  size_t map = 0;
  for (size_t i = 0; i < params.size(); ++i)
    args.addresses_.push_back(params[i].kind == lowering::KernelParam::Kind::tensor_map
                                  ? static_cast<void *>(&args.maps_[map++])
                                  : static_cast<void *>(&args.values_[i]));
  return args;
}

} // namespace flashjit::runtime
