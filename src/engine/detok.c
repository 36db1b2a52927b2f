/* Detokenization and stop strings: the text a request emits. Holds back a
 * suffix that could begin a stop string and any incomplete UTF-8 sequence;
 * at a stop string, emits the text before it and ends the request. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/memsync.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

sl_status sl__detok_append(sl__req *r, const char *piece, size_t plen,
                           size_t *emit, bool *stopped) {
  if (r->pend_len + plen + 1 > r->pend_cap) {
    size_t cap = (r->pend_len + plen + 1) * 2 + 64;
    char *np = sl_realloc(r->pend, cap);
    if (!np)
      return SL_ERR_NOMEM;
    r->pend = np;
    r->pend_cap = cap;
  }
  memcpy(r->pend + r->pend_len, piece, plen);
  r->pend_len += plen;
  /* pend holds the text not yet emitted; a stop string can only end in the
   * new bytes (earlier text held none), and the automata carry over what
   * came before them, so only the new bytes are read */
  size_t tail;
  *stopped = sl__stops_feed(&r->stops, piece, plen, &tail);
  if (*stopped) {
    SL_ASSERT(tail <= r->pend_len);
    *emit = r->pend_len - tail;
  } else {
    /* hold back a suffix that could begin a stop string: it lies in pend,
     * since what was emitted could begin none */
    size_t hold = sl__stops_hold(&r->stops);
    SL_ASSERT(hold <= r->pend_len);
    *emit = sl_utf8_complete_prefix(r->pend, r->pend_len - hold);
  }
  return SL_OK;
}

void sl__detok_consume(sl__req *r, size_t emit, bool stopped) {
  memmove(r->pend, r->pend + emit, r->pend_len - emit);
  r->pend_len -= emit;
  if (stopped)
    r->pend_len = 0;
}

/* Appends a token's text; emits what is safe; returns true when a stop
 * string ended the request (text before it was emitted). */
bool sl__detok_step(sl_engine_t *e, sl__req *r, int32_t tok, float lp,
                    const sl_token_logprob *top, int n_top) {
  char piece[512];
  size_t plen = 0;
  if (sl_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof piece,
                                  &plen) != SL_OK)
    plen = 0;
  size_t emit;
  bool stopped;
  if (sl__detok_append(r, piece, plen, &emit, &stopped) != SL_OK)
    return false;
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_TOKEN;
  ev.request_id = r->id;
  ev.token = tok;
  ev.text = r->pend;
  ev.text_len = emit;
  ev.logprob = lp;
  ev.top = top;
  ev.n_top = n_top;
  ev.completion_tokens = r->n_generated;
  r->cb(r->user, &ev);
  sl__detok_consume(r, emit, stopped);
  return stopped;
}

/* Emits the text held back (a partial stop prefix or UTF-8 sequence is just
 * text once the request ends) as a token event with token -1. */
void sl__detok_flush(sl__req *r) {
  if (!r->pend_len)
    return;
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_TOKEN;
  ev.request_id = r->id;
  ev.token = -1;
  ev.text = r->pend;
  ev.text_len = r->pend_len;
  r->cb(r->user, &ev);
  r->pend_len = 0;
}

/* log-softmax of one logit vector (the raw distribution) at `tok`, and the
 * top-n entries. */
float sl__logprobs(const float *lg, int nv, int32_t tok, int n_top,
                   sl_token_logprob *top) {
  float mx = lg[0];
  for (int i = 1; i < nv; i++)
    if (lg[i] > mx)
      mx = lg[i];
  double sum = 0;
  for (int i = 0; i < nv; i++)
    sum += exp((double)(lg[i] - mx));
  float lse = mx + (float)log(sum);
  for (int k = 0; k < n_top; k++) {
    top[k].id = -1;
    top[k].logprob = -INFINITY;
  }
  for (int i = 0; i < nv && n_top > 0; i++) {
    float v = lg[i] - lse;
    if (v <= top[n_top - 1].logprob)
      continue;
    int k = n_top - 1;
    while (k > 0 && top[k - 1].logprob < v) {
      top[k] = top[k - 1];
      k--;
    }
    top[k].id = i;
    top[k].logprob = v;
  }
  return lg[tok] - lse;
}
