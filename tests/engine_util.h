/* Helpers shared by the engine tests (test_engine.c, test_engine_cuda.c):
 * collecting a request's events, waiting for its end, greedy parameters.
 * Each test includes it once. */
#ifndef SLUICE_TEST_ENGINE_UTIL_H
#define SLUICE_TEST_ENGINE_UTIL_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "default_model.h"
#include "sluice/engine.h"
#include "sluice/reason.h"
#include "sluice/tokenizer.h"

typedef struct result {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int32_t toks[512];
  int n;
  sl_finish finish;
  sl_status error;
  sl_reason reason;
  char code[64];
  int cached;
  int prompt;
} result;

static void result_init(result *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void on_event(void *ud, const sl_engine_event *ev) {
  result *r = ud;
  pthread_mutex_lock(&r->mu);
  if (ev->kind == SL_EV_TOKEN && ev->token >= 0 && r->n < 512)
    r->toks[r->n++] = ev->token;
  if (ev->kind == SL_EV_DONE) {
    r->done = true;
    r->finish = ev->finish;
    r->error = ev->error;
    r->reason = ev->reason;
    r->cached = ev->cached_tokens;
    r->prompt = ev->prompt_tokens;
    if (ev->reason != SL_REASON_NONE)
      snprintf(r->code, sizeof r->code, "%s", sl_reason_code(ev->reason));
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static void result_wait(result *r) {
  pthread_mutex_lock(&r->mu);
  while (!r->done)
    pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
}

/* Tokenizes text (no BOS, special tokens parsed) into a new array (free
 * with sl_free); returns its length, or -1. */
static inline int engine_tokenize(const sl_tokenizer_t *tok, const char *text,
                                  int32_t **ids) {
  size_t n = 0;
  if (sl_tokenizer_encode(tok, text, strlen(text), false, true, ids, &n) !=
      SL_OK)
    return -1;
  return (int)n;
}

static sl_gen_params greedy(int max_tokens) {
  sl_gen_params p;
  memset(&p, 0, sizeof p);
  p.max_tokens = max_tokens;
  p.sampling = sl_sampler_defaults();
  p.sampling.temperature = 0;
  p.top_logprobs = -1;
  p.ignore_eos = true;
  return p;
}

#endif
