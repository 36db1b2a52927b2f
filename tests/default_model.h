/* The default model for the tests that run it (test_engine*.c). */
#ifndef SLUICE_TEST_DEFAULT_MODEL_H
#define SLUICE_TEST_DEFAULT_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sluice/model.h"
#include "sluice/tokenizer.h"

/* The default model and its tokenizer (from models/ under
 * SLUICE_SOURCE_DIR when the default path has none): 0, 77 when there is
 * no model (the test skips), 1 when its tokenizer does not load. */
/* The default model's path (in buf, cap bytes), as load_default_model
 * finds it. */
static inline const char *default_model_path(char *buf, size_t cap) {
  const char *path = sl_model_default_path(buf, cap);
  const char *src = getenv("SLUICE_SOURCE_DIR");
  if (access(path, R_OK) != 0 && src) {
    snprintf(buf, cap, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", src);
    path = buf;
  }
  return path;
}

static inline int load_default_model(sl_model_t **model, sl_tokenizer_t **tok) {
  char buf[4096];
  const char *path = default_model_path(buf, sizeof buf);
  char err[256];
  sl_status st;
  *model = sl_model_load(path, &st, err, sizeof err);
  if (!*model) {
    fprintf(stderr, "skipping: no model (%s)\n", err);
    return 77;
  }
  if (sl_tokenizer_load(sl_model_gguf(*model), tok, err, sizeof err) != SL_OK) {
    fprintf(stderr, "tokenizer: %s\n", err);
    return 1;
  }
  return 0;
}

#endif
