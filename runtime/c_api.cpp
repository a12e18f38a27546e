// The C API (include/flashjit/flashjit.h) over flashjit::Attention. Every entry
// point catches what C++ could throw, so no exception crosses into C.
#include "flashjit/flashjit.h"

#include "compiler/code_object.h"
#include "runtime/attention.h"
#include "runtime/attention_detail.h"
#include "runtime/device.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

struct fj_attention {
  flashjit::Attention attention;
  std::string explain; // kept so the returned pointer outlives the call
};

namespace {

using flashjit::Status;
using flashjit::detail::Failure;

thread_local std::string t_last_error;

fj_error fail(fj_error code, std::string message) {
  t_last_error = std::move(message);
  return code;
}

fj_error code_of(Failure f) {
  switch (f) {
  case Failure::argument:
    return FJ_ERROR_INVALID_ARGUMENT;
  case Failure::spec:
    return FJ_ERROR_INVALID_SPEC;
  case Failure::device:
    return FJ_ERROR_DEVICE;
  case Failure::unsupported:
    return FJ_ERROR_UNSUPPORTED;
  case Failure::compile:
    return FJ_ERROR_COMPILE;
  case Failure::none:
  case Failure::runtime:
    break;
  }
  return FJ_ERROR_RUNTIME;
}

fj_error fail(Failure f, const Status &s) { return fail(code_of(f), s.message()); }

/// Runs an entry point's body, turning C++ exceptions into error codes.
template <typename Body> fj_error guarded(const char *function, Body &&body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return fail(FJ_ERROR_OUT_OF_MEMORY, fmt::format("{}: out of memory", function));
  } catch (const std::exception &e) {
    return fail(FJ_ERROR_RUNTIME, fmt::format("{}: internal error: {}", function, e.what()));
  } catch (...) {
    return fail(FJ_ERROR_RUNTIME, fmt::format("{}: internal error", function));
  }
}

fj_error null_argument(const char *function, const char *name) {
  return fail(FJ_ERROR_INVALID_ARGUMENT, fmt::format("{}: {} is NULL", function, name));
}

// The struct_size of each layout of a struct that a caller may have been built
// against, oldest first and the library's own (sizeof) last: a caller built
// against an older header passes its layout's size, and the fields added since
// read as their defaults.
template <typename T> struct Layouts {
  static constexpr std::array sizes{sizeof(T)};
};
template <> struct Layouts<fj_backward_tensors> {
  static constexpr std::array sizes{offsetof(fj_backward_tensors, sinks),
                                    sizeof(fj_backward_tensors)};
};
template <> struct Layouts<fj_spec> {
  static constexpr std::array sizes{offsetof(fj_spec, f32_io), sizeof(fj_spec)};
};
template <> struct Layouts<fj_options> {
  static constexpr std::array sizes{offsetof(fj_options, persistent),
                                    offsetof(fj_options, prefetch_blocks),
                                    offsetof(fj_options, dkdv_passes), sizeof(fj_options)};
};

/// A caller's struct is one this library can read (include/flashjit/flashjit.h,
/// FJ_ABI_VERSION): its struct_size is one of the struct's Layouts, as an init
/// function of this or an older header set it. ABI 1 is the first layout, so
/// every smaller size is one no init function ever wrote.
template <typename T> fj_error check_size(const char *function, const char *type, const T *in) {
  constexpr auto &sizes = Layouts<T>::sizes;
  static_assert(std::ranges::is_sorted(sizes) && sizes.back() == sizeof(T));
  if (std::ranges::find(sizes, size_t{in->struct_size}) != sizes.end())
    return FJ_OK;
  if (in->struct_size > sizeof(T))
    return fail(FJ_ERROR_INVALID_ARGUMENT,
                fmt::format("{}: {}.struct_size is {}, larger than this library's {} (flashjit "
                            "{}, ABI {}): the caller was built against a newer flashjit.h; load "
                            "the library of that version",
                            function, type, in->struct_size, sizeof(T), flashjit::version(),
                            FJ_ABI_VERSION));
  return fail(FJ_ERROR_INVALID_ARGUMENT,
              fmt::format("{}: {}.struct_size is {}, not sizeof({}) = {}: initialize the struct "
                          "with its init function ({}), which sets it, then change fields",
                          function, type, in->struct_size, type, sizeof(T),
                          std::string_view(type) == "fj_spec" ? "fj_spec_init or fj_spec_init_bshd"
                                                              : fmt::format("{}_init", type)));
}

fj_error to_dtype(int32_t value, flashjit::DType *out) {
  switch (value) {
  case FJ_DTYPE_BF16:
    *out = flashjit::DType::bf16;
    return FJ_OK;
  case FJ_DTYPE_F16:
    *out = flashjit::DType::f16;
    return FJ_OK;
  case FJ_DTYPE_F32:
    *out = flashjit::DType::f32;
    return FJ_OK;
  }
  return fail(FJ_ERROR_INVALID_ARGUMENT,
              fmt::format("dtype {} is not an fj_dtype: use FJ_DTYPE_BF16 ({}), FJ_DTYPE_F16 ({}) "
                          "or FJ_DTYPE_F32 ({})",
                          value, int(FJ_DTYPE_BF16), int(FJ_DTYPE_F16), int(FJ_DTYPE_F32)));
}

fj_error to_layout(int32_t value, flashjit::Layout *out) {
  switch (value) {
  case FJ_LAYOUT_BSHD:
    *out = flashjit::Layout::bshd;
    return FJ_OK;
  case FJ_LAYOUT_BHSD:
    *out = flashjit::Layout::bhsd;
    return FJ_OK;
  case FJ_LAYOUT_INTERLEAVED:
    *out = flashjit::Layout::interleaved;
    return FJ_OK;
  }
  return fail(FJ_ERROR_INVALID_ARGUMENT,
              fmt::format("layout {} is not an fj_layout: use FJ_LAYOUT_BSHD ({}), FJ_LAYOUT_BHSD "
                          "({}) or FJ_LAYOUT_INTERLEAVED ({})",
                          value, int(FJ_LAYOUT_BSHD), int(FJ_LAYOUT_BHSD),
                          int(FJ_LAYOUT_INTERLEAVED)));
}

int32_t from_dtype(flashjit::DType t) {
  switch (t) {
  case flashjit::DType::bf16:
    return FJ_DTYPE_BF16;
  case flashjit::DType::f16:
    return FJ_DTYPE_F16;
  case flashjit::DType::f32:
    return FJ_DTYPE_F32;
  }
  return -1;
}

int32_t from_layout(flashjit::Layout l) {
  switch (l) {
  case flashjit::Layout::bshd:
    return FJ_LAYOUT_BSHD;
  case flashjit::Layout::bhsd:
    return FJ_LAYOUT_BHSD;
  case flashjit::Layout::interleaved:
    return FJ_LAYOUT_INTERLEAVED;
  }
  return -1;
}

fj_strides from_strides(const flashjit::Strides &s) { return {s.batch, s.head, s.seq, s.dim}; }
flashjit::Strides to_strides(const fj_strides &s) { return {s.batch, s.head, s.seq, s.dim}; }

/// Every field but the expression texts (score_mod, mask_mod), which stay the
/// caller's pointers (fj_spec_set_layout keeps them; fresh specs set them NULL).
void from_spec(const flashjit::AttentionSpec &s, fj_spec *out) {
  out->struct_size = sizeof(fj_spec);
  out->batch = s.batch;
  out->heads = s.heads;
  out->kv_heads = s.kv_heads;
  out->seqlen_q = s.seqlen_q;
  out->seqlen_k = s.seqlen_k;
  out->head_dim_qk = s.head_dim_qk;
  out->head_dim_v = s.head_dim_v;
  out->dtype = from_dtype(s.dtype);
  out->layout = from_layout(s.layout);
  out->scale = s.scale;
  out->causal = s.causal;
  out->lse = s.lse;
  out->num_splits = s.num_splits;
  out->packed_q = s.seqs.packed_q;
  out->packed_k = s.seqs.packed_k;
  out->used_k = s.seqs.used_k;
  out->total_q = s.seqs.total_q;
  out->total_k = s.seqs.total_k;
  out->softcap = s.softcap;
  out->alibi = int32_t(s.alibi);
  out->sinks = s.sinks;
  out->mask_type = int32_t(s.mask);
  out->mask_batch_stride = s.mask_strides.batch;
  out->mask_head_stride = s.mask_strides.head;
  out->mask_q_stride = s.mask_strides.q;
  out->mask_k_stride = s.mask_strides.k;
  out->dropout_p = s.dropout_p;
  out->dropout_seed = s.dropout_seed;
  out->dropout_offset = s.dropout_offset;
  out->f32_io = s.f32_io ? 1 : 0;
  out->page_size = s.seqs.page_size;
  out->num_pages = s.seqs.num_pages;
  out->pages_per_seq = s.seqs.pages_per_seq;
  out->window_left = s.window.left;
  out->window_right = s.window.right;
  out->q = from_strides(s.q);
  out->k = from_strides(s.k);
  out->v = from_strides(s.v);
  out->o = from_strides(s.o);
}

fj_error to_spec(const char *function, const fj_spec *in, flashjit::AttentionSpec *out) {
  if (fj_error e = check_size(function, "fj_spec", in); e != FJ_OK)
    return e;
  if (fj_error e = to_dtype(in->dtype, &out->dtype); e != FJ_OK)
    return e;
  if (fj_error e = to_layout(in->layout, &out->layout); e != FJ_OK)
    return e;
  // A caller's older, shorter struct lacks the fields added since: their defaults.
  const int32_t f32_io = in->struct_size > offsetof(fj_spec, f32_io) ? in->f32_io : 0;
  const std::pair<const char *, int32_t> flags[] = {
      {"causal", in->causal},     {"lse", in->lse},       {"packed_q", in->packed_q},
      {"packed_k", in->packed_k}, {"used_k", in->used_k}, {"sinks", in->sinks},
      {"f32_io", f32_io}};
  for (const auto &[name, value] : flags)
    if (value != 0 && value != 1)
      return fail(FJ_ERROR_INVALID_SPEC,
                  fmt::format("spec.{} is {}: it is a flag, 0 or 1", name, value));
  out->batch = in->batch;
  out->heads = in->heads;
  out->kv_heads = in->kv_heads;
  out->seqlen_q = in->seqlen_q;
  out->seqlen_k = in->seqlen_k;
  out->head_dim_qk = in->head_dim_qk;
  out->head_dim_v = in->head_dim_v;
  out->scale = in->scale;
  out->causal = in->causal != 0;
  out->lse = in->lse != 0;
  out->num_splits = in->num_splits;
  out->seqs = {in->packed_q != 0, in->packed_k != 0, in->used_k != 0, in->total_q,
               in->total_k,       in->page_size,     in->num_pages,   in->pages_per_seq};
  out->window = {in->window_left, in->window_right};
  if (in->alibi < 0 || in->alibi > 2)
    return fail(FJ_ERROR_INVALID_SPEC, fmt::format("spec.alibi is {}: expected 0 (none), 1 "
                                                   "(slopes [heads]) or 2 ([batch, heads])",
                                                   in->alibi));
  out->softcap = in->softcap;
  out->alibi = flashjit::Alibi(in->alibi);
  out->score_mod = in->score_mod ? in->score_mod : "";
  out->mask_mod = in->mask_mod ? in->mask_mod : "";
  out->sinks = in->sinks != 0;
  if (in->mask_type < FJ_MASK_NONE || in->mask_type > FJ_MASK_BF16)
    return fail(FJ_ERROR_INVALID_SPEC,
                fmt::format("spec.mask_type is {}: expected an fj_mask_type, 0 (none), 1 (bool), "
                            "2 (f32), 3 (f16) or 4 (bf16)",
                            in->mask_type));
  out->mask = flashjit::MaskType(in->mask_type);
  out->mask_strides = {in->mask_batch_stride, in->mask_head_stride, in->mask_q_stride,
                       in->mask_k_stride};
  out->dropout_p = in->dropout_p;
  out->dropout_seed = in->dropout_seed;
  out->dropout_offset = in->dropout_offset;
  out->f32_io = f32_io != 0;
  out->q = to_strides(in->q);
  out->k = to_strides(in->k);
  out->v = to_strides(in->v);
  out->o = to_strides(in->o);
  return FJ_OK;
}

fj_error init_dense(const char *function, fj_spec *spec, int64_t batch, int64_t heads,
                    int64_t kv_heads, int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim_qk,
                    int64_t head_dim_v, fj_dtype dtype, flashjit::Layout layout) {
  if (spec == nullptr)
    return null_argument(function, "spec");
  flashjit::DType t;
  if (fj_error e = to_dtype(dtype, &t); e != FJ_OK)
    return e;
  spec->score_mod = spec->mask_mod = nullptr;
  from_spec(flashjit::make_spec(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim_qk, head_dim_v,
                                t, layout),
            spec);
  return FJ_OK;
}

fj_error to_options(const fj_options *in, flashjit::Options *out) {
  if (fj_error e = check_size("fj_attention_create_ex", "fj_options", in); e != FJ_OK)
    return e;
  if (in->compiler != nullptr)
    out->compiler = in->compiler;
  if (in->rules != nullptr)
    out->rules = in->rules;
  if (in->opt_level < 0 || in->opt_level > 3)
    return fail(FJ_ERROR_INVALID_ARGUMENT,
                fmt::format("options.opt_level is {}: expected 0 to 3", in->opt_level));
  out->opt_level = in->opt_level;
  out->allow_fallback = in->allow_fallback != 0;
  out->synchronize = in->synchronize != 0;
  out->cpu_threads = in->cpu_threads;
  out->mma_m = in->mma_m;
  if (in->block_m != 0) {
    out->config = flashjit::ir::Config{in->block_m,       in->block_n, in->waves, in->stages,
                                       in->q_in_lds != 0, in->pad_k,   in->mma_m};
    // The flags appended after ABI 1's first layout: 0 where the caller's struct
    // ends before them (a field past it is never read).
    struct Flag {
      const char *name;
      size_t offset;
      const int64_t *field;
      bool &into;
    };
    const Flag flags[] = {
        {"persistent", offsetof(fj_options, persistent), &in->persistent, out->config->persistent},
        {"prefetch_blocks", offsetof(fj_options, prefetch_blocks), &in->prefetch_blocks,
         out->config->prefetch_blocks}};
    for (const Flag &f : flags) {
      const int64_t v = in->struct_size > f.offset ? *f.field : 0;
      if (v != 0 && v != 1)
        return fail(FJ_ERROR_INVALID_ARGUMENT,
                    fmt::format("options.{} is {}: expected 0 or 1", f.name, v));
      f.into = v == 1;
    }
    const int64_t passes =
        in->struct_size > offsetof(fj_options, dkdv_passes) ? in->dkdv_passes : 0;
    if (passes < 0 || passes > 2)
      return fail(FJ_ERROR_INVALID_ARGUMENT,
                  fmt::format("options.dkdv_passes is {}: expected 1 (one loop), 2 (dV's loop, "
                              "then dK's) or 0 (the lowering's choice)",
                              passes));
    out->config->dkdv_passes = passes;
  }
  return FJ_OK;
}

/// A malloc'd copy of `text` for the caller, released with fj_free.
fj_error give_string(const std::string &text, char **out) {
  char *copy = static_cast<char *>(std::malloc(text.size() + 1));
  if (copy == nullptr)
    return fail(FJ_ERROR_OUT_OF_MEMORY, "out of memory");
  std::memcpy(copy, text.c_str(), text.size() + 1);
  *out = copy;
  return FJ_OK;
}

} // namespace

extern "C" {

const char *fj_last_error(void) { return t_last_error.c_str(); }

const char *fj_error_name(fj_error error) {
  switch (error) {
  case FJ_OK:
    return "FJ_OK";
  case FJ_ERROR_INVALID_ARGUMENT:
    return "FJ_ERROR_INVALID_ARGUMENT";
  case FJ_ERROR_INVALID_SPEC:
    return "FJ_ERROR_INVALID_SPEC";
  case FJ_ERROR_DEVICE:
    return "FJ_ERROR_DEVICE";
  case FJ_ERROR_UNSUPPORTED:
    return "FJ_ERROR_UNSUPPORTED";
  case FJ_ERROR_COMPILE:
    return "FJ_ERROR_COMPILE";
  case FJ_ERROR_RUNTIME:
    return "FJ_ERROR_RUNTIME";
  case FJ_ERROR_OUT_OF_MEMORY:
    return "FJ_ERROR_OUT_OF_MEMORY";
  }
  return "FJ_ERROR_UNKNOWN";
}

const char *fj_version(void) { return flashjit::version().data(); }

int fj_abi_version(void) { return FJ_ABI_VERSION; }

void fj_free(void *pointer) { std::free(pointer); }

void fj_spec_init(fj_spec *spec) {
  if (spec == nullptr)
    return;
  flashjit::AttentionSpec s;
  s.set_layout(flashjit::Layout::bshd);
  spec->score_mod = spec->mask_mod = nullptr;
  from_spec(s, spec);
}

fj_error fj_spec_init_bshd(fj_spec *spec, int64_t batch, int64_t heads, int64_t kv_heads,
                           int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim_qk,
                           int64_t head_dim_v, fj_dtype dtype) {
  return guarded("fj_spec_init_bshd", [&] {
    return init_dense("fj_spec_init_bshd", spec, batch, heads, kv_heads, seqlen_q, seqlen_k,
                      head_dim_qk, head_dim_v, dtype, flashjit::Layout::bshd);
  });
}

fj_error fj_spec_init_bhsd(fj_spec *spec, int64_t batch, int64_t heads, int64_t kv_heads,
                           int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim_qk,
                           int64_t head_dim_v, fj_dtype dtype) {
  return guarded("fj_spec_init_bhsd", [&] {
    return init_dense("fj_spec_init_bhsd", spec, batch, heads, kv_heads, seqlen_q, seqlen_k,
                      head_dim_qk, head_dim_v, dtype, flashjit::Layout::bhsd);
  });
}

fj_error fj_spec_set_layout(fj_spec *spec, fj_layout layout) {
  return guarded("fj_spec_set_layout", [&] {
    if (spec == nullptr)
      return null_argument("fj_spec_set_layout", "spec");
    flashjit::AttentionSpec s;
    flashjit::Layout l;
    if (fj_error e = to_layout(layout, &l); e != FJ_OK)
      return e;
    if (fj_error e = to_spec("fj_spec_set_layout", spec, &s); e != FJ_OK)
      return e;
    s.set_layout(l);
    from_spec(s, spec);
    return FJ_OK;
  });
}

fj_error fj_spec_validate(const fj_spec *spec) {
  return guarded("fj_spec_validate", [&] {
    if (spec == nullptr)
      return null_argument("fj_spec_validate", "spec");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_spec_validate", spec, &s); e != FJ_OK)
      return e;
    if (Status st = s.validate(); !st)
      return fail(FJ_ERROR_INVALID_SPEC, st.message());
    return FJ_OK;
  });
}

fj_error fj_spec_signature(const fj_spec *spec, char *out, size_t size) {
  return guarded("fj_spec_signature", [&] {
    if (spec == nullptr)
      return null_argument("fj_spec_signature", "spec");
    if (out == nullptr)
      return null_argument("fj_spec_signature", "out");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_spec_signature", spec, &s); e != FJ_OK)
      return e;
    if (Status st = s.validate(); !st)
      return fail(FJ_ERROR_INVALID_SPEC, st.message());
    const std::string text = s.signature().summary();
    if (text.size() + 1 > size)
      return fail(FJ_ERROR_INVALID_ARGUMENT,
                  fmt::format("fj_spec_signature: the signature needs {} bytes, the buffer has {}",
                              text.size() + 1, size));
    std::memcpy(out, text.c_str(), text.size() + 1);
    return FJ_OK;
  });
}

fj_error fj_list_devices(char **json) {
  return guarded("fj_list_devices", [&] {
    if (json == nullptr)
      return null_argument("fj_list_devices", "json");
    auto devices = flashjit::list_devices();
    if (!devices)
      return fail(FJ_ERROR_DEVICE, devices.status().message());
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const flashjit::DeviceInfo &d : *devices)
      list.push_back({{"id", d.id()},
                      {"kind", flashjit::device_kind_name(d.kind)},
                      {"index", d.index},
                      {"name", d.name},
                      {"arch", d.arch}});
    return give_string(flashjit::compiler::json_line(list), json);
  });
}

void fj_options_init(fj_options *options) {
  if (options == nullptr)
    return;
  const flashjit::Options defaults;
  *options = fj_options{};
  options->struct_size = sizeof(fj_options);
  options->compiler = nullptr;
  options->rules = nullptr;
  options->allow_fallback = defaults.allow_fallback;
  options->synchronize = defaults.synchronize;
  options->opt_level = defaults.opt_level;
  options->cpu_threads = defaults.cpu_threads;
}

void fj_tensors_init(fj_tensors *tensors) {
  if (tensors == nullptr)
    return;
  *tensors = fj_tensors{};
  tensors->struct_size = sizeof(fj_tensors);
}

void fj_backward_tensors_init(fj_backward_tensors *tensors) {
  if (tensors == nullptr)
    return;
  *tensors = fj_backward_tensors{};
  tensors->struct_size = sizeof(fj_backward_tensors);
}

fj_error fj_attention_create_ex(const fj_spec *spec, const char *device, const fj_options *options,
                                fj_attention **out) {
  return guarded("fj_attention_create", [&] {
    const char *fn = "fj_attention_create";
    if (out == nullptr)
      return null_argument(fn, "out");
    *out = nullptr;
    if (spec == nullptr)
      return null_argument(fn, "spec");
    if (device == nullptr)
      return null_argument(fn, "device");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_attention_create", spec, &s); e != FJ_OK)
      return e;
    flashjit::Options o;
    if (options != nullptr)
      if (fj_error e = to_options(options, &o); e != FJ_OK)
        return e;
    Failure failure = Failure::none;
    auto attention = flashjit::detail::AttentionAccess::create(s, device, o, &failure);
    if (!attention)
      return fail(failure, attention.status());
    *out = new fj_attention{attention.take(), {}};
    return FJ_OK;
  });
}

fj_error fj_attention_create(const fj_spec *spec, const char *device, const char *compiler,
                             fj_attention **out) {
  fj_options options;
  fj_options_init(&options);
  options.compiler = compiler;
  return fj_attention_create_ex(spec, device, &options, out);
}

fj_error fj_attention_forward(fj_attention *attention, const void *q, const void *k, const void *v,
                              void *out, float *lse, void *stream) {
  return guarded("fj_attention_forward", [&] {
    if (attention == nullptr)
      return null_argument("fj_attention_forward", "attention");
    Failure failure = Failure::none;
    const flashjit::Attention &a = attention->attention;
    Status s = flashjit::detail::AttentionAccess::forward(attention->attention, a.spec(),
                                                          {q, k, v, out, lse}, stream, &failure);
    return s ? FJ_OK : fail(failure, s);
  });
}

fj_error fj_attention_forward_shape(fj_attention *attention, const fj_spec *shape, const void *q,
                                    const void *k, const void *v, void *out, float *lse,
                                    void *stream) {
  return guarded("fj_attention_forward_shape", [&] {
    if (attention == nullptr)
      return null_argument("fj_attention_forward_shape", "attention");
    if (shape == nullptr)
      return null_argument("fj_attention_forward_shape", "shape");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_attention_forward_shape", shape, &s); e != FJ_OK)
      return e;
    Failure failure = Failure::none;
    Status status = flashjit::detail::AttentionAccess::forward(
        attention->attention, s, {q, k, v, out, lse}, stream, &failure);
    return status ? FJ_OK : fail(failure, status);
  });
}

fj_error fj_attention_forward_tensors(fj_attention *attention, const fj_spec *shape,
                                      const fj_tensors *tensors, void *stream) {
  return guarded("fj_attention_forward_tensors", [&] {
    if (attention == nullptr)
      return null_argument("fj_attention_forward_tensors", "attention");
    if (tensors == nullptr)
      return null_argument("fj_attention_forward_tensors", "tensors");
    if (fj_error e = check_size("fj_attention_forward_tensors", "fj_tensors", tensors); e != FJ_OK)
      return e;
    flashjit::AttentionSpec s = attention->attention.spec();
    if (shape != nullptr)
      if (fj_error e = to_spec("fj_attention_forward_tensors", shape, &s); e != FJ_OK)
        return e;
    flashjit::AttentionTensors t{tensors->q,   tensors->k,   tensors->v,
                                 tensors->out, tensors->lse, tensors->cu_seqlens_q};
    t.cu_seqlens_k = tensors->cu_seqlens_k;
    t.seqused_k = tensors->seqused_k;
    t.block_table = tensors->block_table;
    t.alibi_slopes = tensors->alibi_slopes;
    t.sinks = tensors->sinks;
    t.attn_mask = tensors->attn_mask;
    Failure failure = Failure::none;
    Status status =
        flashjit::detail::AttentionAccess::forward(attention->attention, s, t, stream, &failure);
    return status ? FJ_OK : fail(failure, status);
  });
}

fj_error fj_attention_backward(fj_attention *attention, const fj_spec *shape,
                               const fj_backward_tensors *tensors, void *stream) {
  return guarded("fj_attention_backward", [&] {
    if (attention == nullptr)
      return null_argument("fj_attention_backward", "attention");
    if (tensors == nullptr)
      return null_argument("fj_attention_backward", "tensors");
    if (fj_error e = check_size("fj_attention_backward", "fj_backward_tensors", tensors);
        e != FJ_OK)
      return e;
    flashjit::AttentionSpec s = attention->attention.spec();
    if (shape != nullptr)
      if (fj_error e = to_spec("fj_attention_backward", shape, &s); e != FJ_OK)
        return e;
    fj_backward_tensors in{}; // a caller's older, shorter struct: the rest NULL
    std::memcpy(&in, tensors, tensors->struct_size);
    flashjit::BackwardTensors t{
        in.q,           in.k,  in.v,  in.out,          in.lse,       in.dout,
        in.dq,          in.dk, in.dv, in.alibi_slopes, in.attn_mask, in.cu_seqlens_q,
        in.cu_seqlens_k};
    t.sinks = in.sinks;
    t.dsinks = in.dsinks;
    Failure failure = Failure::none;
    Status status =
        flashjit::detail::AttentionAccess::backward(attention->attention, s, t, stream, &failure);
    return status ? FJ_OK : fail(failure, status);
  });
}

const char *fj_attention_explain(const fj_attention *attention) {
  if (attention == nullptr)
    return "";
  auto *a = const_cast<fj_attention *>(attention);
  try {
    a->explain = a->attention.explain(); // it counts launches: never stale
  } catch (...) {
    return "";
  }
  return a->explain.c_str();
}

const char *fj_attention_source(const fj_attention *attention) {
  return attention == nullptr ? "" : attention->attention.source().c_str();
}

int fj_attention_uses_fallback(const fj_attention *attention) {
  return attention != nullptr && attention->attention.uses_fallback();
}

void fj_attention_destroy(fj_attention *attention) { delete attention; }

fj_error fj_emit(const fj_spec *spec, const char *arch, char **source) {
  return guarded("fj_emit", [&] {
    if (source == nullptr)
      return null_argument("fj_emit", "source");
    *source = nullptr;
    if (spec == nullptr)
      return null_argument("fj_emit", "spec");
    if (arch == nullptr)
      return null_argument("fj_emit", "arch");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_emit", spec, &s); e != FJ_OK)
      return e;
    Failure failure = Failure::none;
    auto text = flashjit::detail::AttentionAccess::emit_source(s, arch, {}, &failure);
    if (!text)
      return fail(failure, text.status());
    return give_string(*text, source);
  });
}

fj_error fj_compile_report(const fj_spec *spec, const char *arch, const char *compiler,
                           char **json) {
  return guarded("fj_compile_report", [&] {
    if (json == nullptr)
      return null_argument("fj_compile_report", "json");
    *json = nullptr;
    if (spec == nullptr)
      return null_argument("fj_compile_report", "spec");
    if (arch == nullptr)
      return null_argument("fj_compile_report", "arch");
    flashjit::AttentionSpec s;
    if (fj_error e = to_spec("fj_compile_report", spec, &s); e != FJ_OK)
      return e;
    flashjit::Options o;
    if (compiler != nullptr)
      o.compiler = compiler;
    Failure failure = Failure::none;
    auto report = flashjit::detail::AttentionAccess::compile_report(s, arch, o, &failure);
    if (!report)
      return fail(failure, report.status());
    return give_string(*report, json);
  });
}

} // extern "C"
