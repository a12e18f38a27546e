/* The C API, from C (compiled as C99, linked against libflashjit.so):
 *   - spec helpers, validation errors that name the field;
 *   - fj_emit for gfx1201;
 *   - errors: bad spec, bad enum, unknown device, NULL pointers, missing GPU
 *     libraries; each with its code and a message saying what to fix;
 *   - with the emulator (builds with LLVM): create on "emulator:gfx1201", forward
 *     on host buffers of bf16 bits with random inputs against a float64
 *     reference written here, explain, source, fallback, compile report.
 * Exits 0 when every check passes; prints each failure. */
#include <flashjit/flashjit.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; fj_last_error: %s\n", __FILE__, __LINE__, #cond,   \
              fj_last_error());                                                                    \
      ++failures;                                                                                  \
    }                                                                                              \
  } while (0)

#define CHECK_ERROR(call, code, text)                                                              \
  do {                                                                                             \
    fj_error e_ = (call);                                                                          \
    if (e_ != (code) || strstr(fj_last_error(), (text)) == NULL) {                                 \
      fprintf(stderr, "%s:%d: %s gave %s, \"%s\"; expected %s with \"%s\"\n", __FILE__, __LINE__,  \
              #call, fj_error_name(e_), fj_last_error(), #code, (text));                           \
      ++failures;                                                                                  \
    }                                                                                              \
  } while (0)

#ifdef FLASHJIT_TEST_WITH_LLVM
/* ---- bf16 and random inputs (for the emulator checks) -------------------- */

static uint16_t f32_to_bf16(float x) { /* round to nearest even; no NaN here */
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill_random(uint16_t *bits, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i)
    bits[i] = f32_to_bf16(uniform());
}

/* Element offset of [b, h, s, d] under strides. */
static int64_t at(const fj_strides *st, int64_t b, int64_t h, int64_t s, int64_t d) {
  return b * st->batch + h * st->head + s * st->seq + d * st->dim;
}

/* softmax(q k^T / sqrt(d) + bottom-right causal mask) v in double, and the LSE;
 * compares with the kernel's bf16 output and f32 LSE. Returns the max abs error. */
static double check_rows(const fj_spec *sp, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                         const uint16_t *o, const float *lse, int64_t lse_head_stride) {
  const double scale = 1.0 / sqrt((double)sp->head_dim_qk);
  const int64_t group = sp->heads / sp->kv_heads, offset = sp->seqlen_k - sp->seqlen_q;
  double worst = 0, *p = malloc(sizeof(double) * (size_t)sp->seqlen_k);
  int64_t b, h, i, j, d;
  for (b = 0; b < sp->batch; ++b)
    for (h = 0; h < sp->heads; ++h)
      for (i = 0; i < sp->seqlen_q; ++i) {
        double max = -INFINITY, sum = 0, err;
        for (j = 0; j < sp->seqlen_k; ++j) {
          double s = 0;
          if (sp->causal && j > i + offset) {
            p[j] = -INFINITY;
            continue;
          }
          for (d = 0; d < sp->head_dim_qk; ++d)
            s += (double)bf16_to_f32(q[at(&sp->q, b, h, i, d)]) *
                 (double)bf16_to_f32(k[at(&sp->k, b, h / group, j, d)]);
          p[j] = s * scale;
          if (p[j] > max)
            max = p[j];
        }
        for (j = 0; j < sp->seqlen_k; ++j)
          sum += p[j] == -INFINITY ? 0 : exp(p[j] - max);
        for (d = 0; d < sp->head_dim_v; ++d) {
          double acc = 0;
          for (j = 0; j < sp->seqlen_k; ++j)
            if (p[j] != -INFINITY)
              acc += exp(p[j] - max) / sum * (double)bf16_to_f32(v[at(&sp->v, b, h / group, j, d)]);
          err = fabs(acc - (double)bf16_to_f32(o[at(&sp->o, b, h, i, d)]));
          if (!(err <= worst)) /* NaN counts as worst */
            worst = isnan(err) ? INFINITY : err;
        }
        err = fabs(max + log(sum) - (double)lse[(b * sp->heads + h) * lse_head_stride + i]);
        if (!(err <= worst))
          worst = isnan(err) ? INFINITY : err;
      }
  free(p);
  return worst;
}

/* LSE [batch, heads, seqlen_q]. */
static double check_against_reference(const fj_spec *sp, const uint16_t *q, const uint16_t *k,
                                      const uint16_t *v, const uint16_t *o, const float *lse) {
  return check_rows(sp, q, k, v, o, lse, sp->seqlen_q);
}

#endif

/* ---- the checks ---------------------------------------------------------- */

/* A config of 64 rows on four waves with `block_n` keys and `stages`. */
static void set_tiles(fj_options *o, int64_t block_n, int64_t stages) {
  o->block_m = 64;
  o->block_n = block_n;
  o->waves = 4;
  o->stages = stages;
  o->pad_k = 16;
}

static void test_basics(void) {
  fj_spec spec;
  char *source = NULL;
  CHECK(fj_version() != NULL && fj_version()[0] != '\0');
  CHECK(strcmp(fj_error_name(FJ_ERROR_INVALID_SPEC), "FJ_ERROR_INVALID_SPEC") == 0);

  fj_spec_init(&spec);
  CHECK(spec.batch == 1 && spec.head_dim_qk == 64 && spec.dtype == FJ_DTYPE_BF16);
  CHECK(fj_spec_validate(&spec) == FJ_OK);

  CHECK(fj_spec_init_bshd(&spec, 2, 8, 2, 100, 120, 128, 128, FJ_DTYPE_F16) == FJ_OK);
  CHECK(spec.q.dim == 1 && spec.q.seq == 8 * 128 && spec.k.seq == 2 * 128);
  CHECK(spec.q.batch == 100 * 8 * 128 && spec.layout == FJ_LAYOUT_BSHD);
  CHECK(fj_spec_set_layout(&spec, FJ_LAYOUT_BHSD) == FJ_OK);
  CHECK(spec.q.seq == 128 && spec.q.head == 100 * 128 && spec.layout == FJ_LAYOUT_BHSD);
  CHECK(fj_spec_init_bhsd(&spec, 1, 4, 4, 64, 64, 64, 64, FJ_DTYPE_BF16) == FJ_OK);
  CHECK(spec.k.head == 64 * 64);

  CHECK(fj_emit(&spec, "gfx1201", &source) == FJ_OK);
  CHECK(source != NULL && strstr(source, "gfx1201") != NULL);
  CHECK(source != NULL && strstr(source, "__builtin_amdgcn_wmma") != NULL);
  fj_free(source);

  /* The signature ignores shapes: another length and batch, the same text. */
  char sig[256], other[256];
  CHECK(fj_spec_signature(&spec, sig, sizeof sig) == FJ_OK);
  CHECK(strstr(sig, "bf16 d=64/64") != NULL);
  fj_spec longer = spec;
  CHECK(fj_spec_init_bhsd(&longer, 3, 4, 4, 129, 1000, 64, 64, FJ_DTYPE_BF16) == FJ_OK);
  CHECK(fj_spec_signature(&longer, other, sizeof other) == FJ_OK);
  CHECK(strcmp(sig, other) == 0);
  longer.causal = 1;
  CHECK(fj_spec_signature(&longer, other, sizeof other) == FJ_OK);
  CHECK(strcmp(sig, other) != 0 && strstr(other, "causal") != NULL);
  CHECK_ERROR(fj_spec_signature(&spec, sig, 4), FJ_ERROR_INVALID_ARGUMENT, "buffer");

  /* Score modifiers: the texts survive fj_spec_set_layout and are checked. */
  fj_spec_init_bshd(&spec, 1, 2, 2, 8, 8, 64, 64, FJ_DTYPE_BF16);
  CHECK(spec.score_mod == NULL && spec.mask_mod == NULL && spec.alibi == 0);
  spec.mask_mod = "q_idx >= kv_idx";
  spec.softcap = 30.0;
  CHECK(fj_spec_set_layout(&spec, FJ_LAYOUT_BHSD) == FJ_OK);
  CHECK(spec.mask_mod != NULL && strcmp(spec.mask_mod, "q_idx >= kv_idx") == 0);
  CHECK(fj_spec_validate(&spec) == FJ_OK);
  CHECK(fj_spec_signature(&spec, sig, sizeof sig) == FJ_OK);
  CHECK(strstr(sig, "softcap") != NULL && strstr(sig, "mask_mod") != NULL);
  spec.score_mod = "score +";
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "score_mod, column 8");
  spec.score_mod = NULL;
  spec.alibi = 3;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "spec.alibi is 3");
}

static void test_errors(void) {
  fj_spec spec;
  fj_attention *attn = (fj_attention *)&spec; /* must be reset to NULL on failure */
  char *text = NULL;
  fj_spec_init_bshd(&spec, 1, 3, 2, 16, 16, 64, 64, FJ_DTYPE_BF16);
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "kv_heads");
  CHECK_ERROR(fj_attention_create(&spec, "emulator:gfx1201", NULL, &attn), FJ_ERROR_INVALID_SPEC,
              "heads (3) must be a multiple of kv_heads (2)");
  CHECK(attn == NULL);
  CHECK_ERROR(fj_emit(&spec, "gfx1201", &text), FJ_ERROR_INVALID_SPEC, "kv_heads");
  CHECK(text == NULL);

  fj_spec_init_bshd(&spec, 1, 2, 2, 16, 16, 0, 64, FJ_DTYPE_BF16);
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "head_dim_qk");
  fj_spec_init_bshd(&spec, 1, 2, 2, 16, 16, 64, 64, FJ_DTYPE_BF16);
  spec.dtype = 7;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_ARGUMENT, "dtype 7");
  spec.dtype = FJ_DTYPE_BF16;
  spec.causal = 2;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "spec.causal");
  spec.causal = 0;
  CHECK_ERROR(fj_spec_init_bshd(&spec, 1, 1, 1, 1, 1, 64, 64, (fj_dtype)9),
              FJ_ERROR_INVALID_ARGUMENT, "dtype 9");

  CHECK_ERROR(fj_attention_create(&spec, "tpu:0", NULL, &attn), FJ_ERROR_DEVICE,
              "unknown device 'tpu:0'");
  CHECK_ERROR(fj_attention_create(&spec, "emulator", NULL, &attn), FJ_ERROR_DEVICE,
              "emulator:gfx1201");
  CHECK_ERROR(fj_attention_create(NULL, "emulator:gfx1201", NULL, &attn), FJ_ERROR_INVALID_ARGUMENT,
              "spec is NULL");
  CHECK_ERROR(fj_attention_create(&spec, NULL, NULL, &attn), FJ_ERROR_INVALID_ARGUMENT,
              "device is NULL");
  CHECK_ERROR(fj_attention_create(&spec, "emulator:gfx1201", NULL, NULL), FJ_ERROR_INVALID_ARGUMENT,
              "out is NULL");
  CHECK_ERROR(fj_emit(&spec, NULL, &text), FJ_ERROR_INVALID_ARGUMENT, "arch is NULL");
  CHECK_ERROR(fj_emit(&spec, "gfx9999", &text), FJ_ERROR_UNSUPPORTED, "unknown arch 'gfx9999'");
  CHECK_ERROR(fj_attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL),
              FJ_ERROR_INVALID_ARGUMENT, "attention is NULL");
  CHECK(strcmp(fj_attention_explain(NULL), "") == 0);
  fj_attention_destroy(NULL);
  fj_free(NULL);

  /* The versioned structs: a struct_size no init function wrote, or one from a
   * newer header, is refused by name; the init functions set it. */
  CHECK(fj_abi_version() == FJ_ABI_VERSION);
  {
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", FJ_VERSION_MAJOR, FJ_VERSION_MINOR,
             FJ_VERSION_PATCH);
    CHECK(strcmp(fj_version(), version) == 0);
  }
  fj_spec_init_bshd(&spec, 1, 2, 2, 16, 16, 64, 64, FJ_DTYPE_BF16);
  CHECK(spec.struct_size == sizeof(fj_spec));
  spec.struct_size = 0;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_ARGUMENT,
              "fj_spec_validate: fj_spec.struct_size is 0, not sizeof(fj_spec)");
  CHECK_ERROR(fj_attention_create(&spec, "emulator:gfx1201", NULL, &attn),
              FJ_ERROR_INVALID_ARGUMENT, "initialize the struct with its init function");
  spec.struct_size = sizeof(fj_spec) + 8;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_ARGUMENT, "built against a newer");
  fj_spec_init(&spec);
  CHECK(fj_spec_validate(&spec) == FJ_OK);
  /* A caller built before f32_io passes ABI 1's first, shorter fj_spec: valid, and
   * f32_io reads as 0 whatever lies past its end. */
  CHECK(spec.f32_io == 0);
  spec.f32_io = 7;
  CHECK_ERROR(fj_spec_validate(&spec), FJ_ERROR_INVALID_SPEC, "spec.f32_io is 7: it is a flag");
  spec.struct_size = (uint32_t)offsetof(fj_spec, f32_io);
  CHECK(fj_spec_validate(&spec) == FJ_OK);
  fj_spec_init(&spec);
  {
    fj_options options;
    fj_tensors tensors;
    fj_backward_tensors backward;
    fj_options_init(&options);
    fj_tensors_init(&tensors);
    fj_backward_tensors_init(&backward);
    CHECK(options.struct_size == sizeof options && tensors.struct_size == sizeof tensors &&
          backward.struct_size == sizeof backward);
    CHECK(tensors.q == NULL && tensors.attn_mask == NULL && backward.cu_seqlens_k == NULL);
    options.struct_size = 4;
    CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
                FJ_ERROR_INVALID_ARGUMENT, "fj_options.struct_size is 4");
    CHECK(attn == NULL);
    /* persistent, appended to fj_options: a flag, and only for a producer's config. */
    fj_options_init(&options);
    CHECK(options.persistent == 0);
    set_tiles(&options, 64, 1);
    options.persistent = 7;
    CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
                FJ_ERROR_INVALID_ARGUMENT, "options.persistent is 7: expected 0 or 1");
#ifdef FLASHJIT_TEST_WITH_LLVM /* the emulator's device */
    options.persistent = 1;
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) != FJ_OK);
    CHECK(strstr(fj_last_error(), "config persistent needs stages 3") != NULL);
    /* A caller built before persistent passes the shorter struct: it reads as 0. */
    options.struct_size = (uint32_t)offsetof(fj_options, persistent);
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
    fj_attention_destroy(attn);
    attn = NULL;
#endif
    /* prefetch_blocks, appended after persistent: a flag, and only with stages 2. */
    fj_options_init(&options);
    CHECK(options.prefetch_blocks == 0);
    set_tiles(&options, 32, 2);
    options.prefetch_blocks = 2;
    CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
                FJ_ERROR_INVALID_ARGUMENT, "options.prefetch_blocks is 2: expected 0 or 1");
    CHECK(attn == NULL);
    /* Only sizes of a known layout: one between two is refused by name. */
    options.prefetch_blocks = 1;
    options.struct_size = (uint32_t)offsetof(fj_options, prefetch_blocks) + 4;
    CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
                FJ_ERROR_INVALID_ARGUMENT, "fj_options.struct_size is");
    options.struct_size = (uint32_t)sizeof(fj_options);
#ifdef FLASHJIT_TEST_WITH_LLVM /* the emulator's device */
    options.stages = 1;
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) != FJ_OK);
    CHECK(strstr(fj_last_error(), "config prefetch_blocks needs stages 2 (got stages 1)") != NULL);
    /* Each of fj_options' layouts is read: the current one takes the block
     * prefetch, the two before prefetch_blocks read it (and the first
     * persistent) as 0, so stages 1 is valid there. */
    options.stages = 2;
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
    CHECK(strstr(fj_attention_explain(attn), "prefetch_blocks") != NULL);
    fj_attention_destroy(attn);
    attn = NULL;
    options.stages = 1;
    options.struct_size = (uint32_t)offsetof(fj_options, prefetch_blocks);
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
    CHECK(strstr(fj_attention_explain(attn), "prefetch_blocks") == NULL);
    fj_attention_destroy(attn);
    attn = NULL;
    options.persistent = 7; /* past the first layout's end: not read */
    options.struct_size = (uint32_t)offsetof(fj_options, persistent);
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
    fj_attention_destroy(attn);
    attn = NULL;
#endif
    /* dkdv_passes, appended after prefetch_blocks: 0 (the lowering's choice), 1
     * or 2; a caller built before it reads 0. */
    fj_options_init(&options);
    CHECK(options.dkdv_passes == 0);
    set_tiles(&options, 32, 2);
    options.dkdv_passes = 3;
    CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
                FJ_ERROR_INVALID_ARGUMENT,
                "options.dkdv_passes is 3: expected 1 (one loop), 2 (dV's loop, then dK's) or 0");
    CHECK(attn == NULL);
#ifdef FLASHJIT_TEST_WITH_LLVM /* the emulator's device */
    options.struct_size = (uint32_t)offsetof(fj_options, dkdv_passes);
    CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
    fj_attention_destroy(attn);
    attn = NULL;
#endif
    options.struct_size = (uint32_t)sizeof(fj_options);
  }

  /* No GPU libraries on a CPU-only machine: the error names the paths tried. */
  if (fj_attention_create(&spec, "hip:0", NULL, &attn) != FJ_OK) {
    CHECK(strstr(fj_last_error(), "hip:0") != NULL);
  } else {
    fj_attention_destroy(attn);
  }
}

static void test_emulator(void) {
#ifdef FLASHJIT_TEST_WITH_LLVM
  fj_spec spec;
  fj_attention *attn = NULL;
  fj_options options;
  char *json = NULL;
  uint16_t *q, *k, *v, *o;
  float *lse;
  size_t nq, nk, no, i;
  double err;

  CHECK(fj_list_devices(&json) == FJ_OK);
  CHECK(json != NULL && strstr(json, "\"kind\": \"emulator\"") != NULL);
  fj_free(json);

  fj_spec_init_bshd(&spec, 2, 4, 2, 20, 37, 32, 32, FJ_DTYPE_BF16);
  spec.causal = 1;
  spec.lse = 1;
  nq = (size_t)(spec.batch * spec.seqlen_q * spec.heads * spec.head_dim_qk);
  nk = (size_t)(spec.batch * spec.seqlen_k * spec.kv_heads * spec.head_dim_qk);
  no = nq;
  q = malloc(nq * 2 + 16); /* +16: room for a misaligned pointer */
  k = malloc(nk * 2);
  v = malloc(nk * 2);
  o = malloc(no * 2);
  lse = malloc(sizeof(float) * (size_t)(spec.batch * spec.heads * spec.seqlen_q));
  fill_random(q, nq);
  fill_random(k, nk);
  fill_random(v, nk);
  for (i = 0; i < no; ++i)
    o[i] = 0xffff; /* NaN: an unwritten output cannot pass */
  for (i = 0; i < (size_t)(spec.batch * spec.heads * spec.seqlen_q); ++i)
    lse[i] = NAN;

  if (fj_attention_create(&spec, "emulator:gfx1201", "auto", &attn) != FJ_OK) {
    CHECK(!"fj_attention_create on emulator:gfx1201");
    return;
  }
  CHECK(strstr(fj_attention_explain(attn), "emulator:gfx1201") != NULL);
  CHECK(strstr(fj_attention_explain(attn), "rules:") != NULL);
  CHECK(strstr(fj_attention_source(attn), "__builtin_amdgcn_wmma") != NULL);
  CHECK(fj_attention_uses_fallback(attn) == 0);

  CHECK(fj_attention_forward(attn, q, k, v, o, lse, NULL) == FJ_OK);
  err = check_against_reference(&spec, q, k, v, o, lse);
  if (!(err <= 3e-2)) {
    fprintf(stderr, "emulator vs float64 reference: max abs error %g > 3e-2\n", err);
    ++failures;
  }
  /* The same shapes through split-KV (3 splits), outputs poisoned again. */
  spec.num_splits = 3;
  for (i = 0; i < no; ++i)
    o[i] = 0xffff;
  CHECK(fj_attention_forward_shape(attn, &spec, q, k, v, o, lse, NULL) == FJ_OK);
  err = check_against_reference(&spec, q, k, v, o, lse);
  if (!(err <= 3e-2)) {
    fprintf(stderr, "split-KV emulator vs float64 reference: max abs error %g > 3e-2\n", err);
    ++failures;
  }
  CHECK(strstr(fj_attention_explain(attn), "1 of those calls ran the split-KV kernels") != NULL);
  spec.num_splits = 129;
  CHECK_ERROR(fj_attention_forward_shape(attn, &spec, q, k, v, o, lse, NULL), FJ_ERROR_INVALID_SPEC,
              "num_splits (129)");
  spec.num_splits = 0;

  /* No keys (FlashAttention-2's empty call): K and V may be NULL, every query
     gets output 0 and LSE -inf; no query rows: nothing is written. */
  {
    fj_spec empty = spec;
    empty.seqlen_k = 0;
    CHECK(fj_spec_set_layout(&empty, FJ_LAYOUT_BSHD) == FJ_OK);
    for (i = 0; i < no; ++i)
      o[i] = 0xffff;
    CHECK(fj_attention_forward_shape(attn, &empty, q, NULL, NULL, o, lse, NULL) == FJ_OK);
    for (i = 0; i < no; ++i)
      if (o[i] != 0) {
        CHECK(!"output 0 without keys");
        break;
      }
    for (i = 0; i < (size_t)(spec.batch * spec.heads * spec.seqlen_q); ++i)
      if (!(isinf(lse[i]) && lse[i] < 0)) {
        CHECK(!"LSE -inf without keys");
        break;
      }
    empty = spec;
    empty.batch = 0;
    CHECK(fj_spec_set_layout(&empty, FJ_LAYOUT_BSHD) == FJ_OK);
    CHECK(fj_attention_forward_shape(attn, &empty, NULL, NULL, NULL, NULL, NULL, NULL) == FJ_OK);
  }

  CHECK_ERROR(fj_attention_forward(attn, NULL, k, v, o, lse, NULL), FJ_ERROR_INVALID_ARGUMENT,
              "q is null");
  CHECK_ERROR(fj_attention_forward(attn, q, k, v, o, NULL, NULL), FJ_ERROR_INVALID_ARGUMENT,
              "lse is null");
  CHECK_ERROR(fj_attention_forward(attn, (const char *)q + 2, k, v, o, lse, NULL),
              FJ_ERROR_INVALID_ARGUMENT, "not aligned to 16 bytes");
  fj_attention_destroy(attn);

  /* Strict by default, the interpreter only on request. */
  fj_spec_init_bshd(&spec, 1, 1, 1, 3, 5, 512, 512, FJ_DTYPE_BF16);
  CHECK_ERROR(fj_attention_create(&spec, "emulator:gfx1201", NULL, &attn), FJ_ERROR_UNSUPPORTED,
              "VGPRs");
  fj_options_init(&options);
  options.allow_fallback = 1;
  CHECK(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn) == FJ_OK);
  if (attn != NULL) {
    CHECK(fj_attention_uses_fallback(attn) == 1);
    CHECK(strstr(fj_attention_explain(attn), "IR interpreter") != NULL);
    fj_attention_destroy(attn);
  }
  fj_options_init(&options);
  options.opt_level = 9;
  CHECK_ERROR(fj_attention_create_ex(&spec, "emulator:gfx1201", &options, &attn),
              FJ_ERROR_INVALID_ARGUMENT, "opt_level");

  fj_spec_init_bshd(&spec, 1, 2, 2, 64, 64, 64, 64, FJ_DTYPE_F16);
  CHECK(fj_compile_report(&spec, "gfx1201", NULL, &json) == FJ_OK);
  CHECK(json != NULL && strstr(json, "\"vgprs\"") != NULL);
  fj_free(json);
  CHECK_ERROR(fj_compile_report(&spec, "gfx1201", "fortran", &json), FJ_ERROR_COMPILE,
              "unknown compiler 'fortran'");

  free(q);
  free(k);
  free(v);
  free(o);
  free(lse);
#endif
}

/* A varlen batch (packed Q/K/V, cu_seqlens) through fj_attention_forward_tensors:
 * each sequence checked as a dense call of its own rows; bad cu_seqlens refused. */
static void test_varlen(void) {
#ifdef FLASHJIT_TEST_WITH_LLVM
  const int32_t cu[4] = {0, 7, 7, 30}; /* lengths 7, 0 (empty), 23 */
  const int64_t heads = 4, kv_heads = 2, d = 64, total = 32;
  fj_spec spec;
  fj_attention *attn = NULL;
  fj_tensors t;
  uint16_t *q, *k, *v, *o;
  float *lse;
  size_t i, n = (size_t)(total * heads * d);
  int b;
  fj_spec_init_bshd(&spec, 3, heads, kv_heads, 23, 23, d, d, FJ_DTYPE_BF16);
  spec.packed_q = spec.packed_k = 1;
  spec.total_q = spec.total_k = total;
  spec.causal = 1;
  spec.lse = 1;
  CHECK(fj_spec_set_layout(&spec, FJ_LAYOUT_BSHD) == FJ_OK);
  CHECK(fj_spec_validate(&spec) == FJ_OK);
  q = malloc(n * 2);
  k = malloc(n * 2);
  v = malloc(n * 2);
  o = malloc(n * 2);
  lse = malloc(sizeof(float) * (size_t)(heads * total));
  fill_random(q, n);
  fill_random(k, n);
  fill_random(v, n);
  for (i = 0; i < n; ++i)
    o[i] = 0xffff;
  for (i = 0; i < (size_t)(heads * total); ++i)
    lse[i] = NAN;
  if (fj_attention_create(&spec, "emulator:gfx1100", "auto", &attn) != FJ_OK) {
    CHECK(!"fj_attention_create of a varlen spec on emulator:gfx1100");
  } else {
    fj_tensors_init(&t);
    t.q = q;
    t.k = k;
    t.v = v;
    t.out = o;
    t.lse = lse;
    t.cu_seqlens_q = t.cu_seqlens_k = cu;
    CHECK(fj_attention_forward_tensors(attn, NULL, &t, NULL) == FJ_OK);
    for (b = 0; b < 3; ++b) { /* sequence b as a dense batch of one */
      fj_spec one = spec;
      const int64_t start = cu[b], rows = cu[b + 1] - cu[b];
      double err;
      one.batch = 1;
      one.seqlen_q = one.seqlen_k = rows;
      err = check_rows(&one, q + start * spec.q.seq, k + start * spec.k.seq, v + start * spec.v.seq,
                       o + start * spec.o.seq, lse + start, total);
      if (!(err <= 3e-2)) {
        fprintf(stderr, "varlen sequence %d vs float64 reference: max abs error %g > 3e-2\n", b,
                err);
        ++failures;
      }
    }
    t.cu_seqlens_k = NULL;
    CHECK_ERROR(fj_attention_forward_tensors(attn, NULL, &t, NULL), FJ_ERROR_INVALID_ARGUMENT,
                "cu_seqlens_k is null");
    {
      const int32_t bad[4] = {0, 9, 7, 30};
      t.cu_seqlens_k = bad;
      CHECK_ERROR(fj_attention_forward_tensors(attn, NULL, &t, NULL), FJ_ERROR_INVALID_ARGUMENT,
                  "cu_seqlens_k is not nondecreasing");
    }
    fj_attention_destroy(attn);
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(lse);
#endif
}

/* The backward with attention sinks through the C ABI: dsinks written (it starts
 * as NaN) and the same bits twice; a caller built before fj_backward_tensors had
 * sinks (the shorter struct_size) reads as NULL there and gets the error naming
 * them. The numbers against float64: backward_test.cpp. */
static void test_backward_sinks(void) {
#ifdef FLASHJIT_TEST_WITH_LLVM
  const int64_t heads = 2, seq = 24, d = 32;
  const size_t n = (size_t)(heads * seq * d), rows = (size_t)(heads * seq);
  fj_spec spec;
  fj_attention *attn = NULL;
  fj_tensors t;
  fj_backward_tensors g;
  uint16_t *q = malloc(n * 2), *k = malloc(n * 2), *v = malloc(n * 2), *o = malloc(n * 2),
           *dout = malloc(n * 2), *dq = malloc(n * 2), *dk = malloc(n * 2), *dv = malloc(n * 2);
  float *lse = malloc(rows * sizeof(float));
  const float sinks[2] = {0.75f, -1.5f};
  float dsinks[2] = {NAN, NAN}, again[2] = {NAN, NAN};
  size_t i;
  fj_spec_init_bshd(&spec, 1, heads, heads, seq, seq, d, d, FJ_DTYPE_BF16);
  spec.causal = 1;
  spec.lse = 1;
  spec.sinks = 1;
  fill_random(q, n);
  fill_random(k, n);
  fill_random(v, n);
  fill_random(dout, n);
  for (i = 0; i < n; ++i)
    o[i] = 0xffff;
  if (fj_attention_create(&spec, "emulator:gfx1201", "auto", &attn) != FJ_OK) {
    CHECK(!"fj_attention_create of a spec with sinks on emulator:gfx1201");
  } else {
    fj_tensors_init(&t);
    t.q = q;
    t.k = k;
    t.v = v;
    t.out = o;
    t.lse = lse;
    t.sinks = sinks;
    CHECK(fj_attention_forward_tensors(attn, NULL, &t, NULL) == FJ_OK);
    fj_backward_tensors_init(&g);
    g.q = q;
    g.k = k;
    g.v = v;
    g.out = o;
    g.lse = lse;
    g.dout = dout;
    g.dq = dq;
    g.dk = dk;
    g.dv = dv;
    g.sinks = sinks;
    g.dsinks = dsinks;
    CHECK(fj_attention_backward(attn, NULL, &g, NULL) == FJ_OK);
    CHECK(isfinite(dsinks[0]) && isfinite(dsinks[1]) && dsinks[0] != 0.0f);
    g.dsinks = again;
    CHECK(fj_attention_backward(attn, NULL, &g, NULL) == FJ_OK);
    CHECK(memcmp(dsinks, again, sizeof dsinks) == 0);
    g.struct_size = (uint32_t)offsetof(fj_backward_tensors, sinks);
    CHECK_ERROR(fj_attention_backward(attn, NULL, &g, NULL), FJ_ERROR_INVALID_ARGUMENT,
                "sinks is null but the spec has attention sinks");
    fj_attention_destroy(attn);
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(dout);
  free(dq);
  free(dk);
  free(dv);
  free(lse);
#endif
}

/* f32 tensors in memory (fj_spec.f32_io): float32 q, k, v of fresh random values,
 * rounded to bf16 in the kernel, and a float32 out (NaN until written), against a
 * float64 reference; tolerance 3e-2 (bf16 operands, inputs in [-1, 1)). */
static void test_f32_io(void) {
#ifdef FLASHJIT_TEST_WITH_LLVM
  enum { B = 1, H = 2, SQ = 9, SK = 13, D = 40 };
  static float q[B * SQ * H * D], k[B * SK * H * D], v[B * SK * H * D], o[B * SQ * H * D];
  fj_spec spec;
  fj_attention *attn = NULL;
  double worst = 0;
  size_t i;
  int h, s, t, d;
  for (i = 0; i < sizeof q / sizeof *q; ++i)
    q[i] = uniform();
  for (i = 0; i < sizeof k / sizeof *k; ++i) {
    k[i] = uniform();
    v[i] = uniform();
  }
  for (i = 0; i < sizeof o / sizeof *o; ++i)
    o[i] = NAN;
  fj_spec_init_bshd(&spec, B, H, H, SQ, SK, D, D, FJ_DTYPE_BF16);
  spec.f32_io = 1;
  CHECK(fj_attention_create(&spec, "emulator:gfx1201", NULL, &attn) == FJ_OK);
  if (attn == NULL)
    return;
  CHECK(fj_attention_forward(attn, q, k, v, o, NULL, NULL) == FJ_OK);
  for (h = 0; h < H; ++h)
    for (s = 0; s < SQ; ++s) {
      double p[SK], max = -INFINITY, sum = 0;
      for (t = 0; t < SK; ++t) {
        double dot = 0;
        for (d = 0; d < D; ++d)
          dot += (double)q[(s * H + h) * D + d] * (double)k[(t * H + h) * D + d];
        p[t] = dot / sqrt((double)D);
        if (p[t] > max)
          max = p[t];
      }
      for (t = 0; t < SK; ++t)
        sum += (p[t] = exp(p[t] - max));
      for (d = 0; d < D; ++d) {
        double ref = 0, err;
        for (t = 0; t < SK; ++t)
          ref += p[t] / sum * (double)v[(t * H + h) * D + d];
        err = fabs((double)o[(s * H + h) * D + d] - ref);
        if (!(err <= worst)) /* NaN too */
          worst = err;
      }
    }
  CHECK(worst <= 3e-2);
  fj_attention_destroy(attn);
#endif
}

int main(void) {
  test_basics();
  test_errors();
  test_emulator();
  test_varlen();
  test_backward_sinks();
  test_f32_io();
  if (failures)
    fprintf(stderr, "c_api_test: %d check(s) failed\n", failures);
  else
    printf("c_api_test: all checks passed (flashjit %s)\n", fj_version());
  return failures ? 1 : 0;
}
