/* Prints the version and emits a gfx1201 kernel through the installed C API. */
#include <flashjit/flashjit.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  fj_spec spec;
  char *source = NULL;
  printf("flashjit %s\n", fj_version());
  if (fj_spec_init_bshd(&spec, 1, 8, 8, 128, 128, 64, 64, FJ_DTYPE_BF16) != FJ_OK)
    return 1;
  spec.causal = 1;
  if (fj_emit(&spec, "gfx1201", &source) != FJ_OK) {
    fprintf(stderr, "fj_emit: %s\n", fj_last_error());
    return 1;
  }
  if (strstr(source, "gfx1201") == NULL) {
    fprintf(stderr, "the emitted source does not mention gfx1201\n");
    return 1;
  }
  printf("emitted %zu bytes of HIP for gfx1201\n", strlen(source));
  fj_free(source);
  return 0;
}
