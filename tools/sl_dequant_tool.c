/* sl_dequant_tool TYPE N IN OUT: reads the raw blocks of N elements of ggml
 * type TYPE (its number) from file IN, dequantizes them with
 * sl_kern_dequant_row and writes N float32 to file OUT. For the Python tests.
 * Exit 0 on success, 1 on a bad argument or I/O error, 2 on a status error. */
#include <stdio.h>
#include <stdlib.h>

#include "sluice/kern_cpu.h"
#include "sluice/util.h"

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s TYPE N IN OUT\n", argv[0]);
    return 1;
  }
  sl_ggml_type t = (sl_ggml_type)atoi(argv[1]);
  int64_t n = atoll(argv[2]);
  size_t bytes;
  sl_status st = sl_kern_row_bytes(t, n, &bytes);
  if (st != SL_OK) {
    fprintf(stderr, "type %d n %lld: %s\n", t, (long long)n, sl_status_str(st));
    return 2;
  }
  int rc = 1;
  void *src = sl_malloc(bytes ? bytes : 1);
  float *dst = sl_malloc(n ? (size_t)n * sizeof(float) : 1);
  FILE *in = NULL, *out = NULL;
  if (!src || !dst)
    goto done;
  if (!(in = fopen(argv[3], "rb")) || fread(src, 1, bytes, in) != bytes) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, argv[3]);
    goto done;
  }
  if ((st = sl_kern_dequant_row(t, src, dst, n)) != SL_OK) {
    fprintf(stderr, "dequant: %s\n", sl_status_str(st));
    rc = 2;
    goto done;
  }
  if (!(out = fopen(argv[4], "wb")) ||
      fwrite(dst, sizeof(float), (size_t)n, out) != (size_t)n) {
    fprintf(stderr, "cannot write %s\n", argv[4]);
    goto done;
  }
  rc = 0;
done:
  if (out && fclose(out) != 0)
    rc = 1;
  if (in)
    fclose(in);
  sl_free(dst);
  sl_free(src);
  return rc;
}
