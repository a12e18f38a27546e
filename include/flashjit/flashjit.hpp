/* flashjit's C++ interface over the C ABI (flashjit.h): header only, C++17,
 * the standard library and flashjit.h alone (no fmt, no project headers).
 *
 *   #include <flashjit/flashjit.hpp>
 *
 *   fj::Spec spec = fj::Spec::bshd(batch, heads, kv_heads, seqlen_q, seqlen_k, 128, 128,
 *                                  FJ_DTYPE_BF16);
 *   spec.causal = 1;
 *   fj::Attention attention = fj::Attention::create(spec, "cuda:0");
 *   attention.forward(q, k, v, out);               // the spec's shapes
 *   attention.forward(other_shapes, tensors);      // any shapes of its signature
 *
 * Every failing call throws fj::Error (the C error code and fj_last_error()'s
 * message). The structs are the C ones with their init functions run, so the
 * ABI rules of flashjit.h (struct_size, fields added at the end) hold. The
 * library's own C++ API (runtime/attention.h, flashjit::Attention) has more
 * (the IR, the pipeline) and needs fmt; this one is what an application links. */
#ifndef FLASHJIT_FLASHJIT_HPP
#define FLASHJIT_FLASHJIT_HPP

#include <flashjit/flashjit.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace fj {

/// A failed flashjit call: its fj_error and the library's message.
class Error : public std::runtime_error {
public:
  Error(fj_error code, const std::string &message)
      : std::runtime_error(std::string(fj_error_name(code)) + ": " + message), code_(code) {}
  fj_error code() const noexcept { return code_; }

private:
  fj_error code_;
};

/// Throws fj::Error unless `e` is FJ_OK.
inline void check(fj_error e) {
  if (e != FJ_OK)
    throw Error(e, fj_last_error());
}

/// fj_spec with fj_spec_init's defaults; the fields are the C struct's.
struct Spec : fj_spec {
  Spec() : fj_spec() { fj_spec_init(this); }
  /// Dense [batch, seqlen, heads, dim] tensors (FlashAttention's layout).
  static Spec bshd(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q,
                   int64_t seqlen_k, int64_t head_dim_qk, int64_t head_dim_v, fj_dtype dtype) {
    return dense(fj_spec_init_bshd, batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim_qk,
                 head_dim_v, dtype);
  }
  /// Dense [batch, heads, seqlen, dim] tensors (SDPA's layout).
  static Spec bhsd(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seqlen_q,
                   int64_t seqlen_k, int64_t head_dim_qk, int64_t head_dim_v, fj_dtype dtype) {
    return dense(fj_spec_init_bhsd, batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim_qk,
                 head_dim_v, dtype);
  }
  /// Throws fj::Error (FJ_ERROR_INVALID_SPEC) naming the field and the fix.
  void validate() const { check(fj_spec_validate(this)); }
  /// What a kernel specializes on (fj_spec_signature).
  std::string signature() const {
    std::string out(256, '\0');
    fj_error e = fj_spec_signature(this, out.data(), out.size());
    if (e == FJ_ERROR_INVALID_ARGUMENT) { // a long score_mod / mask_mod text
      out.assign(64 * 1024, '\0');
      e = fj_spec_signature(this, out.data(), out.size());
    }
    check(e);
    out.resize(out.find('\0'));
    return out;
  }

private:
  // A spec of one of the C library's dense layouts, through its init function.
  template <typename Init, typename... Sizes> static Spec dense(Init init, Sizes... sizes) {
    Spec s;
    check(init(&s, sizes...));
    return s;
  }
};

/// fj_options with fj_options_init's defaults.
struct Options : fj_options {
  Options() : fj_options() { fj_options_init(this); }
};

/// fj_tensors with every pointer null.
struct Tensors : fj_tensors {
  Tensors() : fj_tensors() { fj_tensors_init(this); }
};

/// fj_backward_tensors with every pointer null.
struct BackwardTensors : fj_backward_tensors {
  BackwardTensors() : fj_backward_tensors() { fj_backward_tensors_init(this); }
};

/// One compiled signature on one device (fj_attention), released on destruction.
/// Movable, not copyable; safe to call from several threads (flashjit.h).
class Attention {
public:
  static Attention create(const fj_spec &spec, const std::string &device,
                          const Options &options = Options()) {
    fj_attention *handle = nullptr;
    check(fj_attention_create_ex(&spec, device.c_str(), &options, &handle));
    return Attention(handle);
  }

  /// out = attention(q, k, v) with the handle's spec; lse when the spec has lse.
  void forward(const void *q, const void *k, const void *v, void *out, float *lse = nullptr,
               void *stream = nullptr) {
    check(fj_attention_forward(get(), q, k, v, out, lse, stream));
  }
  /// The same with other shapes of the handle's signature.
  void forward(const fj_spec &shape, const void *q, const void *k, const void *v, void *out,
               float *lse = nullptr, void *stream = nullptr) {
    check(fj_attention_forward_shape(get(), &shape, q, k, v, out, lse, stream));
  }
  /// The general call (sequences, masks, ALiBi, sinks): fj_attention_forward_tensors.
  void forward(const fj_spec &shape, const fj_tensors &tensors, void *stream = nullptr) {
    check(fj_attention_forward_tensors(get(), &shape, &tensors, stream));
  }
  /// dq, dk, dv (and dsinks) of one backward call: fj_attention_backward.
  void backward(const fj_spec &shape, const fj_backward_tensors &tensors, void *stream = nullptr) {
    check(fj_attention_backward(get(), &shape, &tensors, stream));
  }

  std::string explain() const { return fj_attention_explain(get()); }
  std::string source() const { return fj_attention_source(get()); }
  bool uses_fallback() const { return fj_attention_uses_fallback(get()) != 0; }
  fj_attention *get() const {
    if (!handle_)
      throw Error(FJ_ERROR_INVALID_ARGUMENT, "fj::Attention: this handle was moved from");
    return handle_.get();
  }

private:
  struct Destroy {
    void operator()(fj_attention *a) const noexcept { fj_attention_destroy(a); }
  };
  explicit Attention(fj_attention *handle) : handle_(handle) {}
  std::unique_ptr<fj_attention, Destroy> handle_;
};

namespace detail {
/// Takes a string the library malloc'd for the caller.
inline std::string take(char *text) {
  std::unique_ptr<char, void (*)(void *)> owned(text, fj_free);
  return text ? std::string(text) : std::string();
}
} // namespace detail

/// The HIP source of `spec`'s kernel for `arch` (fj_emit).
inline std::string emit(const fj_spec &spec, const std::string &arch) {
  char *source = nullptr;
  check(fj_emit(&spec, arch.c_str(), &source));
  return detail::take(source);
}

/// The devices this process can reach, as JSON (fj_list_devices).
inline std::string list_devices() {
  char *json = nullptr;
  check(fj_list_devices(&json));
  return detail::take(json);
}

/// The loaded library's version ("0.1.0").
inline std::string version() { return fj_version(); }

} // namespace fj

#endif // FLASHJIT_FLASHJIT_HPP
