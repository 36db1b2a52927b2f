/* The engine's token output, on the executor thread: a token picked from
 * a logits row (the device's argmax or sample, or the host sampler, under
 * a grammar's mask), reported to the request's callback with its text;
 * a request's end (its blocks published to the prefix cache and released,
 * its DONE event, its stats). Split from scheduler.c (issue 44). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kv.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

void sl__req_free(sl__req *r) {
  if (!r)
    return;
  sl_free(r->tokens);
  sl_free(r->blocks);
  sl_free(r->pend);
  for (int i = 0; i < r->params.n_stop; i++)
    sl_free((char *)r->params.stop[i]);
  sl_sampler_free(r->sampler);
  sl_grammar_matcher_free(r->matcher);
  sl_drafter_seq_end(r->dseq);
  sl_free(r->pred);
  sl_free(r->emb);
  sl_free(r);
}

void sl__release_blocks(sl_engine_t *e, sl__req *r) {
  for (int i = 0; i < r->n_blocks; i++)
    sl_kv_block_unref(e->kv, r->blocks[i]);
  r->n_blocks = 0;
}

void sl__publish_blocks(sl_engine_t *e, sl__req *r) {
  int T = e->cfg.kv_block_tokens;
  int full = r->n_computed / T;
  uint64_t h = 0;
  sl_event ev = {0};
  bool have_ev = false;
  for (int i = 0; i < full && i < r->n_blocks; i++) {
    const int32_t *bt = r->tokens + (size_t)i * (size_t)T;
    h = sl_kv_hash_block(e->kv, h, bt, T);
    if (!sl_kv_publish(e->kv, r->blocks[i], h, bt) || !e->store)
      continue; /* published before (found by a lookup, or restored) */
    sl_kv_block_key k = {sl_kv_config_of(e->kv)->fingerprint, h, bt};
    if (sl__tiers_hold(e, &k, true))
      continue;
    /* the block's K/V is written by work queued so far */
    if (!have_ev && sl_event_record(e->stream, &ev) != SL_OK)
      return;
    have_ev = true;
    sl__store_enqueue(e, r->blocks[i], h, bt, ev);
  }
}

static void emit_done(sl_engine_t *e, sl__req *r, sl_finish why, sl_status err,
                      sl_reason reason, const char *msg) {
  sl_engine_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = SL_EV_DONE;
  ev.request_id = r->id;
  ev.prompt_tokens = r->n_prompt;
  ev.cached_tokens = r->n_cached;
  ev.completion_tokens = r->n_generated;
  ev.draft_accepted = r->n_kept;
  ev.draft_rejected = r->n_drafted - r->n_kept;
  ev.finish = why;
  ev.error = err;
  ev.reason = why == SL_FINISH_ERROR && reason == SL_REASON_NONE
                  ? sl_reason_of_status(err)
                  : reason;
  ev.error_msg = msg;
  ev.est_bytes = r->est_bytes;
  ev.limit_bytes = e->cfg.max_memory;
  if (r->params.pooling && why != SL_FINISH_ERROR && why != SL_FINISH_ABORT) {
    ev.embedding = r->emb;
    ev.n_embd = (int)sl_model_hparams_of(e->model)->n_embd;
  }
  r->cb(r->user, &ev);
}

/* The pick counts (and the drafts') into the stats (e->mu held). */
void sl__publish_picks(sl_engine_t *e) {
  e->stats.argmax_device = e->n_argmax;
  e->stats.sampled_device = e->n_sampled_device;
  e->stats.sampled_host = e->n_sampled_host;
  e->stats.grammar_masks = e->n_grammar_masks;
  e->stats.grammar_unmasked = e->n_grammar_unmasked;
  e->stats.sample_fallbacks = e->n_fallbacks;
  e->stats.drafted = e->drafted; /* a request's drafts, before its end */
  e->stats.accepted = e->accepted;
}

void sl__finish(sl_engine_t *e, sl__req *r, sl_finish why, sl_status err,
                sl_reason reason, const char *msg) {
  if (r->state == SL__REQ_RUNNING || r->state == SL__REQ_PREFILLING) {
    if (why != SL_FINISH_ERROR)
      sl__publish_blocks(e, r);
    sl__release_blocks(e, r);
    e->finished_since_clear = 1; /* decode site: K steps after a finish */
  }
  r->state = SL__REQ_DONE;
  /* where tokens were picked, published before the end is reported: a
   * client that reads the stats once its request is done sees its picks
   * (and the step's end publishes them for the others) */
  pthread_mutex_lock(&e->mu);
  sl__publish_picks(e);
  pthread_mutex_unlock(&e->mu);
  emit_done(e, r, why, err, reason, msg);
  pthread_mutex_lock(&e->mu);
  if (why == SL_FINISH_ERROR)
    e->stats.requests_failed++;
  e->stats.generated_tokens_total += (uint64_t)r->n_generated;
  pthread_mutex_unlock(&e->mu);
  sl__req_free(r);
}

/* Whether r's grammar takes token tok next (a greedy pick, checked before
 * any mask is made). An end-of-generation token: when the grammar is done
 * (as the mask has it); any other: its bytes, which the matcher then has
 * taken (r->grammar_taken). */
static bool grammar_takes(sl_engine_t *e, sl__req *r, int32_t tok) {
  if (sl_tokenizer_is_eog(e->tok, tok))
    return sl_grammar_matcher_done(r->matcher);
  char piece[256];
  size_t len = 0;
  if (sl_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof piece,
                                  &len) != SL_OK ||
      len == 0 || /* control tokens: never (the vocabulary's trie) */
      !sl_grammar_matcher_accept(r->matcher, piece, len))
    return false;
  r->grammar_taken = true;
  return true;
}

/* Picks the next token of r, batch sequence s whose logits row is `row`:
 * the device's argmax (argmax_only), the device sampler's token (`sample`),
 * or the host sampler's from the row (copied back, or fetched when the
 * device sampler could not decide). Returns the token, or -1 when the row
 * could not be fetched (*st says why). Fills lp and top when logprobs are
 * asked for. */
static int32_t pick_token(sl_engine_t *e, sl__req *r, int s, int row, float *lp,
                          sl_token_logprob *top, sl_status *st) {
  const sl_batch_seq *q = &e->batch_seqs[s];
  int nv = (int)sl_model_hparams_of(e->model)->n_vocab;
  int n_top = r->params.top_logprobs;
  if (q->argmax_only) {
    e->n_argmax++;
    return e->argmax[row]; /* the device's argmax (maybe not copied) */
  }
  if (q->sample && e->sampled[s].id >= 0) {
    const sl_kcu_sample_out *o = &e->sampled[s];
    for (int k = 0; k < n_top; k++)
      top[k] = (sl_token_logprob){o->top_id[k], o->top_logprob[k]};
    *lp = n_top >= 0 ? o->logprob : 0;
    r->has_draw = false;
    e->n_sampled_device++;
    return o->id;
  }
  float *lg = e->logits + (size_t)row * (size_t)nv;
  if (q->sample) {
    /* the device could not decide: its row, to the host */
    e->n_fallbacks++;
    if ((*st = sl_batch_ctx_fetch_row(e->bctx, row, lg)) != SL_OK)
      return -1;
  }
  if (r->matcher && n_top < 0 && sl_sampler_is_argmax(r->sampler)) {
    /* greedy: the argmax is the masked argmax whenever the grammar takes
     * it (the lowest id among equals, as the sampler picks), so the mask
     * is made only when it does not (llama.cpp samples first and checks
     * too). Most steps of a JSON answer never walk the vocabulary. */
    int32_t best = 0;
    for (int i = 1; i < nv; i++)
      if (lg[i] > lg[best])
        best = i;
    if (grammar_takes(e, r, best)) {
      r->has_draw = false;
      e->n_sampled_host++;
      e->n_grammar_unmasked++;
      return best;
    }
  }
  if (r->matcher) { /* constrained: what the grammar cannot take is out */
    e->n_grammar_masks++;
    if (!e->gvocab && !e->gmask) {
      e->gvocab = sl_grammar_vocab_create(e->tok);
      e->gmask = sl_malloc((size_t)nv);
    }
    if (!e->gvocab || !e->gmask ||
        !sl_grammar_matcher_mask(r->matcher, e->gvocab, e->tok, e->gmask)) {
      *st = SL_ERR_NOMEM;
      return -1;
    }
    for (int i = 0; i < nv; i++)
      if (!e->gmask[i])
        lg[i] = -INFINITY;
  }
  if (n_top >= 0)
    memcpy(e->logits_tmp, lg, sizeof(float) * (size_t)nv);
  /* the draw made for the device, if any, else a fresh one */
  int32_t tok = r->has_draw ? sl_sampler_sample_with(r->sampler, lg, r->draw)
                            : sl_sampler_sample(r->sampler, lg);
  r->has_draw = false;
  if (n_top >= 0)
    *lp = sl__logprobs(e->logits_tmp, nv, tok, n_top, top);
  e->n_sampled_host++;
  return tok;
}

bool sl__pick(sl_engine_t *e, sl__req *r, int s, int row, sl__picked *pk) {
  pk->lp = 0;
  pk->n_top = r->params.top_logprobs > 0 ? r->params.top_logprobs : 0;
  sl_status st = SL_OK;
  pk->tok = pick_token(e, r, s, row, &pk->lp, pk->top, &st);
  if (pk->tok >= 0)
    return true;
  if (r->matcher && sl_grammar_matcher_overrun(r->matcher))
    sl__finish(e, r, SL_FINISH_ERROR, SL_ERR_INVALID_ARG,
               SL_REASON_INVALID_REQUEST,
               "the grammar is too ambiguous to follow: it keeps so many "
               "parses open at once that the next token's mask would "
               "take too long (make its alternatives and repetitions "
               "unambiguous)");
  else
    sl__finish(e, r, SL_FINISH_ERROR, st, SL_REASON_NONE,
               st == SL_ERR_NOMEM ? "out of memory for the grammar's token mask"
                                  : "the logits row could not be read back "
                                    "from the device");
  return false;
}

bool sl__emit(sl_engine_t *e, sl__req *r, const sl__picked *pk) {
  const int32_t tok = pk->tok;
  const int n_top = pk->n_top;
  if (r->n_generated == 0) {
    r->t_first = sl_now_ns();
  }
  bool eog = !r->params.ignore_eos && sl_tokenizer_is_eog(e->tok, tok);
  if (eog) {
    sl__detok_flush(r);
    sl__finish(e, r, SL_FINISH_STOP, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  if (r->matcher && r->grammar_taken) {
    r->grammar_taken = false; /* taken when it was picked */
  } else if (r->matcher) {    /* the mask allowed it: the matcher takes it */
    char piece[256];
    size_t len = 0;
    if (sl_tokenizer_token_to_piece(e->tok, tok, false, piece, sizeof piece,
                                    &len) != SL_OK ||
        !sl_grammar_matcher_accept(r->matcher, piece, len)) {
      sl__detok_flush(r);
      sl__finish(e, r, SL_FINISH_ERROR, SL_ERR_STATE, SL_REASON_NONE,
                 "constrained decoding: the grammar refused a token its "
                 "mask allowed");
      return true;
    }
  }
  r->n_generated++;
  sl_sampler_accept(r->sampler, tok);
  r->tokens[r->n_tokens++] = tok;
  e->tokens_since_clear++;
  if (sl__detok_step(e, r, tok, pk->lp, n_top ? pk->top : NULL, n_top)) {
    sl__finish(e, r, SL_FINISH_STOP, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  if (r->n_generated >= r->params.max_tokens) {
    sl__detok_flush(r);
    sl__finish(e, r, SL_FINISH_LENGTH, SL_OK, SL_REASON_NONE, NULL);
    return true;
  }
  return false;
}

bool sl__sample_and_emit(sl_engine_t *e, sl__req *r, int s, int row) {
  sl__picked pk;
  return !sl__pick(e, r, s, row, &pk) || sl__emit(e, r, &pk);
}
