/* flashjit C API: the whole of flashjit::Attention for C and for foreign
 * function interfaces (Rust, Python ctypes). Plain C99: opaque handles, plain
 * structs of fixed-size fields, error codes plus messages; no C++ type crosses
 * this boundary.
 *
 * Errors: every function that can fail returns an fj_error (FJ_OK = 0). The
 * message of the last failure on the calling thread is fj_last_error(); it
 * names what was wrong (the spec field, the device, the library paths tried,
 * the pointer and its alignment) and how to fix it.
 *
 * Strings handed out are either owned by a handle (valid until it is
 * destroyed) or malloc'd for the caller (release them with fj_free); each
 * function says which.
 *
 * Threads: every function may be called from any thread, concurrently.
 * fj_attention_create from several threads compiles each kernel once per
 * process (the others wait for it; the disk cache is shared by processes too).
 * One fj_attention may run forward and backward calls from several threads at
 * once: the workspaces a call needs are allocated per call, on its stream, and
 * kernels built on first use (split-KV, the backward) are built once. Calls on
 * one stream run in the order they are made; order calls on different streams
 * yourself. fj_attention_destroy must not race with other calls on the same
 * handle.
 *
 *   fj_spec spec;
 *   fj_spec_init_bshd(&spec, 1, 16, 4, 1024, 1024, 128, 128, FJ_DTYPE_BF16);
 *   spec.causal = 1;
 *   fj_attention *attn;
 *   if (fj_attention_create(&spec, "hip:0", "auto", &attn) != FJ_OK)
 *     fprintf(stderr, "%s\n", fj_last_error());
 *   fj_attention_forward(attn, q, k, v, out, NULL, stream);
 *   spec.seqlen_k = 1025;  // any other length: the same kernel, nothing compiles
 *   fj_spec_set_layout(&spec, FJ_LAYOUT_BSHD);
 *   fj_attention_forward_shape(attn, &spec, q, k, v, out, NULL, stream);
 *   fj_attention_destroy(attn);
 */
#ifndef FLASHJIT_FLASHJIT_H
#define FLASHJIT_FLASHJIT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define FJ_API __attribute__((visibility("default")))
#else
#define FJ_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The enums below are ints in C; in C++ they are given `int` as their fixed
 * underlying type (the same ABI), so that a C caller's out-of-range value,
 * which the library refuses by name, is a valid value of the C++ type too. */
#ifdef __cplusplus
#define FJ_ENUM(name) enum name : int
#else
#define FJ_ENUM(name) enum name
#endif

/* ---- errors ------------------------------------------------------------ */

typedef FJ_ENUM(fj_error) {
  FJ_OK = 0,
  FJ_ERROR_INVALID_ARGUMENT = 1, /* a NULL or misaligned pointer, a bad enum, name or option */
  FJ_ERROR_INVALID_SPEC = 2,     /* the spec fails validation; the message names the field */
  FJ_ERROR_DEVICE = 3,           /* unknown device name, vendor library missing, no such device */
  FJ_ERROR_UNSUPPORTED = 4,      /* no generated kernel for the spec on that target */
  FJ_ERROR_COMPILE = 5,          /* no device compiler, or the compile failed */
  FJ_ERROR_RUNTIME = 6,          /* module load, launch, copy, emulator or interpreter failure */
  FJ_ERROR_OUT_OF_MEMORY = 7
} fj_error;

/* The message of the last failing call on this thread ("" if none yet). The
 * pointer stays valid until the next flashjit call on this thread. */
FJ_API const char *fj_last_error(void);
/* "FJ_OK", "FJ_ERROR_INVALID_SPEC", ... */
FJ_API const char *fj_error_name(fj_error error);
/* ---- versions --------------------------------------------------------- */

/* The version of this header. fj_version() is the loaded library's. */
#define FJ_VERSION_MAJOR 0
#define FJ_VERSION_MINOR 1
#define FJ_VERSION_PATCH 0
/* The layout of the structs a caller fills (fj_spec, fj_options, fj_tensors,
 * fj_backward_tensors). Each starts with `struct_size`, which its init function
 * (fj_spec_init*, fj_options_init, fj_tensors_init, fj_backward_tensors_init)
 * sets to the sizeof of the header the caller was built with: the library knows
 * which fields a caller has from it. Structs only grow at their end, and a
 * library reads the fields an older caller lacks as their defaults; a struct
 * larger than the library knows (a caller built against a newer header) or a
 * struct_size of 0 (a struct that no init function set) is refused with
 * FJ_ERROR_INVALID_ARGUMENT naming the struct and the fix. */
#define FJ_ABI_VERSION 1

/* The library version, e.g. "0.1.0". */
FJ_API const char *fj_version(void);
/* The library's FJ_ABI_VERSION. */
FJ_API int fj_abi_version(void);
/* Releases a string that flashjit malloc'd for the caller. NULL is ignored. */
FJ_API void fj_free(void *pointer);

/* ---- the attention spec ------------------------------------------------ */

typedef FJ_ENUM(fj_dtype) { FJ_DTYPE_BF16 = 0, FJ_DTYPE_F16 = 1, FJ_DTYPE_F32 = 2 } fj_dtype;

/* The named layouts the helpers below compute strides for; strides can also be
 * set directly (the layout field is then only a label, used for .npy files). */
typedef FJ_ENUM(fj_layout) {
  FJ_LAYOUT_BSHD = 0,       /* [batch, seq, heads, dim] */
  FJ_LAYOUT_BHSD = 1,       /* [batch, heads, seq, dim] */
  FJ_LAYOUT_INTERLEAVED = 2 /* fused QKV projection: [batch, seq, Hq*Dqk + Hkv*Dqk + Hkv*Dv] */
} fj_layout;

/* The element type of a mask tensor (fj_spec.mask_type): bool (1 byte, nonzero
 * attends), or f32 / f16 / bf16 values added to the scaled score. */
typedef FJ_ENUM(fj_mask_type) {
  FJ_MASK_NONE = 0,
  FJ_MASK_BOOL = 1,
  FJ_MASK_F32 = 2,
  FJ_MASK_F16 = 3,
  FJ_MASK_BF16 = 4
} fj_mask_type;

/* Element strides of a logical [batch, head, seq, dim] tensor. */
typedef struct fj_strides {
  int64_t batch, head, seq, dim;
} fj_strides;

/* Every field of flashjit::AttentionSpec. Initialize with fj_spec_init or one
 * of the fj_spec_init_* helpers (they set struct_size), then change fields. */
typedef struct fj_spec {
  uint32_t struct_size; /* sizeof(fj_spec), set by the init functions (FJ_ABI_VERSION) */
  int64_t batch;        /* >= 0; batch 0 (or seqlen_q 0) is a call that writes nothing */
  int64_t heads;        /* query heads */
  int64_t kv_heads;     /* key/value heads; heads % kv_heads == 0 (GQA/MQA) */
  int64_t seqlen_q;     /* >= 0 */
  int64_t seqlen_k;     /* >= 0; 0: every query gets output 0 and LSE -inf (an empty
                           tensor may be NULL) */
  int64_t head_dim_qk;
  int64_t head_dim_v;
  int32_t dtype;                     /* fj_dtype, of Q, K, V and O; accumulation is f32 */
  int32_t layout;                    /* fj_layout the strides came from */
  double scale;                      /* softmax scale; 0 means 1/sqrt(head_dim_qk) */
  int32_t causal;                    /* 0 or 1; bottom-right aligned when seqlen_q != seqlen_k */
  int32_t lse;                       /* 0 or 1: also write the LSE, f32 [batch, heads, seqlen_q] */
  int64_t window_left, window_right; /* sliding window; -1: unbounded on that side */
  fj_strides q, k, v, o;
  /* Split-KV (flash-decoding): 0 chooses per call from the device's compute
   * units, 1 turns it off (decode then runs the decode kernel, which needs no
   * workspace), n (up to 128) splits each query block's keys over n workgroups.
   * Not part of the signature. */
  int64_t num_splits;
  /* Sequences (flashjit::Sequences): varlen batches, per-batch key counts and
   * paged KV caches; all 0 for dense tensors. With packed_q (cu_seqlens_q), Q
   * and O are [total_q, heads, dim] and LSE [heads, total_q], and seqlen_q is
   * the longest sequence; packed_k (cu_seqlens_k) likewise for K and V; used_k
   * (seqused_k / cache_seqlens): batch b attends to its first used[b] keys; a
   * paged cache (page_size > 0): K and V are [num_pages, page_size, kv_heads,
   * dim] and block_table [batch, pages_per_seq]. Flags are 0 or 1. The arrays
   * are given per call (fj_attention_forward_tensors). */
  int32_t packed_q, packed_k, used_k;
  int64_t total_q, total_k;
  int64_t page_size, num_pages, pages_per_seq;
  /* Score modifiers, in this order on the scaled score q.k * scale: softcap > 0
   * gives softcap * tanh(score / softcap); alibi 1 (slopes f32 [heads]) or 2
   * ([batch, heads]) subtracts slope * |q_idx + seqlen_k - seqlen_q - kv_idx|;
   * score_mod (NULL: none) is an expression of score, b, h, q_idx, kv_idx,
   * seqlen_q and seqlen_k; mask_mod (NULL: none) one of the same names but score,
   * 0 hiding the key. C-like syntax: see flashjit --help or docs/masks.md. The
   * texts are copied; the slopes are given per call (fj_tensors). */
  double softcap;
  int32_t alibi;
  const char *score_mod, *mask_mod;
  /* Attention sinks (gpt-oss), 0 or 1: a learned logit per query head, f32
   * [heads] given per call (fj_tensors.sinks), joins each row's softmax
   * denominator without a value. Split-KV does not run with sinks. */
  int32_t sinks;
  /* A mask tensor (SDPA's attn_mask), given per call (fj_tensors.attn_mask):
   * mask_type is an fj_mask_type; its element of (b, h, q_idx, kv_idx) sits at
   * b * mask_batch_stride + h * mask_head_stride + q_idx * mask_q_stride +
   * kv_idx * mask_k_stride (0 broadcasts an axis). Applied after score_mod,
   * before mask_mod. Not with sequences. */
  int32_t mask_type;
  int64_t mask_batch_stride, mask_head_stride, mask_q_stride, mask_k_stride;
  /* Dropout (training): each attention weight is dropped with probability
   * dropout_p in [0, 1) (0: off) and the kept ones scaled by 1 / (1 - dropout_p);
   * which ones is a pure function of (dropout_seed, dropout_offset, b, h, q_idx,
   * kv_idx), both below 2^53, so the backward with the same values drops the same. */
  double dropout_p;
  uint64_t dropout_seed, dropout_offset;
  /* 1: q, k, v and out are float32 in memory (engines that keep activations in
   * f32). The kernel rounds q, k and v to `dtype` (FJ_DTYPE_BF16 or
   * FJ_DTYPE_F16, nearest even) as it loads them, for the matrix products
   * (accumulation stays f32), and writes out as float32, unrounded. Forward
   * only: the backward refuses it. 0 (the default): they are `dtype`. Added
   * after ABI 1's first layout; a caller built before it reads as 0. */
  int32_t f32_io;
} fj_spec;

/* The defaults of flashjit::AttentionSpec: all sizes 1, head dims 64, bf16, BSHD. */
FJ_API void fj_spec_init(fj_spec *spec);
/* Sets the sizes and the strides of a dense layout; scale 0, not causal, no
 * window, no LSE. Returns FJ_ERROR_INVALID_ARGUMENT for a NULL spec or a bad
 * dtype; the sizes are checked by fj_spec_validate (and create). */
FJ_API fj_error fj_spec_init_bshd(fj_spec *spec, int64_t batch, int64_t heads, int64_t kv_heads,
                                  int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim_qk,
                                  int64_t head_dim_v, fj_dtype dtype);
FJ_API fj_error fj_spec_init_bhsd(fj_spec *spec, int64_t batch, int64_t heads, int64_t kv_heads,
                                  int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim_qk,
                                  int64_t head_dim_v, fj_dtype dtype);
/* Recomputes the q/k/v/o strides from the sizes for a named layout. */
FJ_API fj_error fj_spec_set_layout(fj_spec *spec, fj_layout layout);
/* FJ_OK, or FJ_ERROR_INVALID_SPEC with a message naming the field and the fix. */
FJ_API fj_error fj_spec_validate(const fj_spec *spec);

/* The kernel signature of a valid spec, as text, into out[size] (NUL
 * included; 256 bytes suffice unless score_mod / mask_mod texts are long: a
 * short buffer gets FJ_ERROR_INVALID_ARGUMENT naming the size needed): what a
 * kernel specializes on (dtype, head dims, causal, window on/off, lse, layout
 * class, the score modifiers and their texts, the mask tensor's type, dropout
 * on/off). Specs with equal signatures share one fj_attention
 * (fj_attention_forward_shape). */
FJ_API fj_error fj_spec_signature(const fj_spec *spec, char *out, size_t size);

/* ---- devices ----------------------------------------------------------- */

/* The devices this process can reach, as a JSON array malloc'd into *json
 * (release with fj_free): [{"id": "hip:0", "kind": "hip", "index": 0,
 * "name": "...", "arch": "gfx1201"}, ...]. The emulator entry has "arch": "". */
FJ_API fj_error fj_list_devices(char **json);

/* ---- attention --------------------------------------------------------- */

typedef struct fj_attention fj_attention;

/* Options of fj_attention_create_ex; fj_options_init sets the defaults. */
typedef struct fj_options {
  uint32_t struct_size;   /* sizeof(fj_options), set by fj_options_init */
  const char *compiler;   /* "auto" (NULL means auto), "llvm", "hiprtc", "nvrtc"; "none" on the
                             emulator: run the kernel text without compiling a code object */
  const char *rules;      /* lowering rules: "auto" (NULL means auto), "matrix" or "simt" */
  int32_t allow_fallback; /* 1: run the IR interpreter when no generated kernel can serve */
  int32_t synchronize;    /* 1: forward waits for the kernel and reports its errors */
  int32_t opt_level;      /* device compiler -O level, 0..3 (default 3) */
  int32_t cpu_threads;    /* emulator worker threads; 0: every core */
  /* The tuning config; 0 in block_m keeps the default for the target (all of
   * these are then ignored). */
  int64_t block_m, block_n, waves, stages, q_in_lds, pad_k;
  /* Queries per matrix-instruction tile: 16, 32 (the CDNA 32x32 MFMAs) or 0 for
   * the lowering's choice; with block_m 0 it picks the default config's rules. */
  int64_t mma_m;
  /* With stages 3 (the sm90 forward's producer warpgroup): 1 runs it as a
   * persistent kernel (a workgroup per SM walks the tiles), 0 does not. Ignored
   * with block_m 0 (the default config says). Added after ABI 1's first layout;
   * a caller built before passes the shorter struct_size and reads 0. */
  int64_t persistent;
  /* With stages 2: 1 makes the forward's KV loop issue the next block's K and V
   * tiles at the top of each iteration, into a second copy of their LDS buffers
   * (twice their LDS), 0 issues each tile one step ahead. Ignored with block_m 0
   * (the default config says). Added after persistent; a caller built before
   * passes the shorter struct_size and reads 0. */
  int64_t prefetch_blocks;
  /* The backward's dK/dV kernel: 1 accumulates dK and dV in one loop, 2 runs dV's
   * loop then dK's (one accumulator live at a time), 0 lets the lowering choose
   * by the registers the config's block needs. Ignored with block_m 0 (the
   * default config says). Added after prefetch_blocks; a caller built before
   * passes the shorter struct_size and reads 0. */
  int64_t dkdv_passes;
} fj_options;

FJ_API void fj_options_init(fj_options *options);

/* Generates, compiles and loads the kernel of `spec` on `device` ("hip:0",
 * "cuda:0", "emulator:gfx1201"). `compiler` NULL means "auto". Strict: when no
 * generated kernel can serve the spec on the device this fails, saying why. */
FJ_API fj_error fj_attention_create(const fj_spec *spec, const char *device, const char *compiler,
                                    fj_attention **out);
FJ_API fj_error fj_attention_create_ex(const fj_spec *spec, const char *device,
                                       const fj_options *options, fj_attention **out);

/* out = attention(q, k, v); lse (f32 [batch, heads, seqlen_q]) when the spec
 * has lse = 1, else it must be NULL. On hip/cuda devices the pointers are
 * device pointers laid out by the spec's strides and the kernel is queued on
 * `stream` (hipStream_t / CUstream; NULL: the default stream). On the emulator
 * they are host pointers to the 16-bit element bits (bf16 / f16), or to floats
 * with f32_io. */
FJ_API fj_error fj_attention_forward(fj_attention *attention, const void *q, const void *k,
                                     const void *v, void *out, float *lse, void *stream);
/* The same with the shapes of `shape`: batch, heads, kv_heads, seqlens,
 * strides, window sizes and scale may differ from the spec the handle was
 * created with, nothing else (dtype, head dims, causal, window on/off, lse and
 * the layout class are the kernel's signature; the error names what differs).
 * Nothing is compiled: one handle serves every length. */
FJ_API fj_error fj_attention_forward_shape(fj_attention *attention, const fj_spec *shape,
                                           const void *q, const void *k, const void *v, void *out,
                                           float *lse, void *stream);

/* The buffers of one call: q, k, v, out and lse as for fj_attention_forward,
 * and the int32 arrays a spec with sequences needs (each exactly when the spec
 * uses it, NULL otherwise): cu_seqlens_q / cu_seqlens_k [batch + 1], seqused_k
 * [batch], block_table [batch, pages_per_seq]. Device memory on a GPU (the
 * kernels clamp what they read, so no content makes them access memory outside
 * the tensors); host memory on the emulator, where each entry is checked and a
 * bad one is an FJ_ERROR_INVALID_ARGUMENT naming it. */
typedef struct fj_tensors {
  uint32_t struct_size; /* sizeof(fj_tensors), set by fj_tensors_init */
  const void *q, *k, *v;
  void *out;
  float *lse;
  const int32_t *cu_seqlens_q, *cu_seqlens_k, *seqused_k, *block_table;
  const float *alibi_slopes; /* f32 [heads] or [batch, heads] when spec.alibi is 1 or 2 */
  const float *sinks;        /* f32 [heads] when spec.sinks is 1 */
  const void *attn_mask;     /* the mask tensor when spec.mask_type is not 0 */
} fj_tensors;

/* Every pointer NULL, struct_size set. */
FJ_API void fj_tensors_init(fj_tensors *tensors);

/* The general call: the shapes of `shape` (NULL: the handle's spec) over
 * `tensors`; otherwise as fj_attention_forward_shape. */
FJ_API fj_error fj_attention_forward_tensors(fj_attention *attention, const fj_spec *shape,
                                             const fj_tensors *tensors, void *stream);

/* The buffers of one backward call, laid out by the shape's strides: the
 * forward's inputs and outputs (lse: f32 [batch, heads, seqlen_q], as the
 * forward wrote it with spec.lse = 1), dout (the gradient of out, laid out as
 * out) and the gradients to write: dq as q, dk as k, dv as v. */
typedef struct fj_backward_tensors {
  uint32_t struct_size; /* sizeof(fj_backward_tensors), set by fj_backward_tensors_init */
  const void *q, *k, *v, *out;
  const float *lse;
  const void *dout;
  void *dq, *dk, *dv;
  const float *alibi_slopes; /* as the forward took them when spec.alibi is 1 or 2, else NULL */
  const void *attn_mask;     /* as the forward took it when spec.mask_type is not 0 (no gradient) */
  /* Varlen: the int32 [batch + 1] arrays the forward took, each exactly when the
   * spec packs that side (packed_q / packed_k), else NULL; lse is then
   * [heads, total_q]. Rows past the last sequence: dq not written, dk and dv 0. */
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
  /* Attention sinks (spec.sinks = 1): the forward's f32 logits [heads] in, their
   * f32 gradient [heads] out (written, not accumulated); else both NULL. Added in
   * 0.1.0 after the first ABI 1 header: a caller built before them passes a
   * smaller struct_size and reads as NULL here. */
  const float *sinks;
  float *dsinks;
} fj_backward_tensors;

/* Every pointer NULL, struct_size set. */
FJ_API void fj_backward_tensors_init(fj_backward_tensors *tensors);

/* The gradients of out = attention(q, k, v) with respect to q, k and v given
 * dout (FlashAttention-2's backward, deterministic: the same bits run to run),
 * through the score modifiers (softcap, ALiBi, score_mod, mask_mod). `shape` as
 * for fj_attention_forward_tensors (NULL: the handle's spec). Its kernels are
 * built on the first call. Varlen specs (packed_q / packed_k) and attention sinks
 * (with their gradient, dsinks) are taken; KV-cache sequences (used_k, paged)
 * return FJ_ERROR_UNSUPPORTED naming the feature. */
FJ_API fj_error fj_attention_backward(fj_attention *attention, const fj_spec *shape,
                                      const fj_backward_tensors *tensors, void *stream);

/* What create did: spec, signature, device, target, rules, config, compiler,
 * cache outcome, launches so far, executor. Owned by the handle, valid until
 * the next call of this function on it. */
FJ_API const char *fj_attention_explain(const fj_attention *attention);
/* The generated HIP source ("" when the fallback runs without one). Owned by the handle. */
FJ_API const char *fj_attention_source(const fj_attention *attention);
/* 1 when forward runs the IR interpreter fallback, 0 otherwise. */
FJ_API int fj_attention_uses_fallback(const fj_attention *attention);
/* NULL is ignored. */
FJ_API void fj_attention_destroy(fj_attention *attention);

/* ---- generation and compilation without a device ------------------------ */

/* The HIP source for `spec` on an AMD `arch` ("gfx1201"), malloc'd into
 * *source (release with fj_free). Nothing is compiled. */
FJ_API fj_error fj_emit(const fj_spec *spec, const char *arch, char **source);

/* Compiles the kernel for `spec` on `arch` with `compiler` (NULL: "auto"),
 * through the kernel cache, and returns its resource report as one JSON object
 * malloc'd into *json: {"kernel": ..., "vgprs": ..., "vgpr_spill": ..., ...}. */
FJ_API fj_error fj_compile_report(const fj_spec *spec, const char *arch, const char *compiler,
                                  char **json);

#ifdef __cplusplus
}
#endif

#endif /* FLASHJIT_FLASHJIT_H */
