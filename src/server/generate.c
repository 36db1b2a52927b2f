/* sluice — server: the generation and embeddings routes (generate.h). A
 * pool thread parses the body, tokenizes and posts the job to the engine
 * (job.c), then parks the connection (reply.c) instead of waiting; each
 * resume runs sl__srv_generate_next, which answers once there is
 * something to answer.
 *
 * Job lifetime: a job is reference counted. The connection holds one
 * reference (dropped in http.c's request-completed callback), the engine
 * one per request from submit until SL_EV_DONE, and a streaming response
 * one until MHD frees it. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server/admin.h"
#include "server/anthropic.h"
#include "server/embed.h"
#include "server/generate.h"
#include "server/job.h"
#include "server/json.h"
#include "server/openai.h"
#include "server/parse.h"
#include "server/prompt.h"
#include "server/reply.h"
#include "server/routes.h"
#include "server/state.h"
#include "sluice/model.h"
#include "sluice/pool.h"
#include "sluice/reason.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

enum MHD_Result sl__srv_generate_next(sl_server_t *s, struct MHD_Connection *c,
                                      sl_srv_conn *cn) {
  sl_srv_job *j = cn->job;
  sl_srv_error err;
  pthread_mutex_lock(&j->mu);
  sl__srv_unparked(j);
  bool ready = sl__srv_job_ready(j);
  j->await = !ready;
  if (!ready) {
    if (!atomic_load(&s->closing)) {
      sl__srv_park(j);
      pthread_mutex_unlock(&j->mu);
      return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    sl__srv_job_stop(j);
    cn->waiting = false;
    sl__srv_error_set(&err, sl_reason_http(SL_REASON_SHUTTING_DOWN),
                      sl_reason_code(SL_REASON_SHUTTING_DOWN), NULL, "%s",
                      sl_reason_message(SL_REASON_SHUTTING_DOWN));
    return sl__srv_send_error(c, cn->fam, &err, true);
  }
  cn->waiting = false;
  if (sl__srv_job_failed_early(j)) {
    sl__srv_job_error(j, &err);
    pthread_mutex_unlock(&j->mu);
    return sl__srv_send_error(c, cn->fam, &err, false);
  }
  if (!j->req.stream) {
    json_t *body = sl__srv_answer_body(j);
    pthread_mutex_unlock(&j->mu);
    return sl__srv_send_json(c, 200, body, false, 0);
  }
  pthread_mutex_unlock(&j->mu);
  return sl__srv_send_stream(c, j);
}

/* A posted job's connection waits for its answer (generate_next). The
 * idle timeout guards the request's arrival (slow clients); while the
 * engine works, the connection is not idle: no timeout until the request
 * completes (on_completed restores it). */
static enum MHD_Result await_answer(sl_server_t *s, struct MHD_Connection *c,
                                    sl_srv_conn *cn, sl_srv_job *j) {
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  pthread_mutex_lock(&j->mu);
  j->conn = c;
  pthread_mutex_unlock(&j->mu);
  cn->waiting = true;
  return sl__srv_generate_next(s, c, cn);
}

/* The client's socket, to notice a hang-up (-1: unknown). */
static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

/* POST /v1/embeddings, once parsed: each input is one embedding request to
 * the engine; the answer comes when the last is done (generate_next). */
static enum MHD_Result handle_embed(sl_server_t *s, struct MHD_Connection *c,
                                    sl_srv_conn *cn, sl_srv_job *j,
                                    sl_srv_error *err) {
  sl_srv_request *r = &j->req;
  const sl_pool_lease *ml = &j->mdl.lease;
  j->n_embd = (int)sl_model_hparams_of(ml->model)->n_embd;
  if (r->emb_dimensions && r->emb_dimensions != j->n_embd) {
    sl__srv_error_set(err, 400, "unsupported_parameter", "dimensions",
                      "this model's embeddings have %d dimensions; it "
                      "cannot give %d",
                      j->n_embd, r->emb_dimensions);
    goto fail;
  }
  if (sl__srv_embed_ids(r, ml->tok, ml->n_ctx, err) != SL_OK)
    goto fail;
  int n = r->n_inputs;
  j->parts = sl_calloc((size_t)n, sizeof *j->parts);
  j->emb = sl_calloc((size_t)n * (size_t)j->n_embd, sizeof(float));
  if (!j->parts || !j->emb) {
    sl__srv_error_set(err, 503, "out_of_memory", NULL,
                      "the server ran out of memory; retry later");
    goto fail;
  }
  j->n_parts = n;
  j->created = (long long)time(NULL);
  sl__srv_make_id(j->id, sizeof j->id, "embd-");
  j->fd = conn_fd(c);
  j->http10 = cn->http10;
  sl_status st =
      sl__srv_job_post(j, ml->engine, s->cfg.pooling, &cn->open, err);
  if (st != SL_OK)
    goto fail;
  return await_answer(s, c, cn, j);
fail:
  sl__srv_metrics_failed(s, &j->req, err->http);
  return sl__srv_send_error(c, cn->fam, err, false);
}

/* OpenAI's predicted output, tokenized as text (special tokens not
 * parsed, no BOS) into r->prediction_ids for the drafter; longer than the
 * context (which bounds the answer) is refused before it is tokenized
 * whole. */
static sl_status prediction_ids(sl_srv_request *r, const sl_pool_lease *ml,
                                sl_srv_error *err) {
  size_t n = 0, len = r->prediction_len;
  uint8_t *plain = sl_malloc(len ? len : 1);
  if (!plain) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return SL_ERR_NOMEM;
  }
  memset(plain, 1, len);
  sl_status st = len ? sl_tokenizer_encode_limited(
                           ml->tok, r->prediction, len, false, plain,
                           (size_t)ml->n_ctx, &r->prediction_ids, &n)
                     : SL_OK;
  sl_free(plain);
  if (st == SL_ERR_NOMEM) {
    sl__srv_error_set(err, 500, NULL, NULL, "out of memory");
    return st;
  }
  if (st == SL_ERR_RANGE) {
    sl__srv_error_set(err, 400, "context_length_exceeded", "prediction",
                      "'prediction' has more tokens than this model's "
                      "maximum context length, %d tokens",
                      ml->n_ctx);
    return st;
  }
  if (st != SL_OK) {
    sl__srv_error_set(err, 400, "invalid_value", "prediction",
                      "cannot tokenize 'prediction'");
    return st;
  }
  r->gen.prediction = r->prediction_ids;
  r->gen.n_prediction = (int)n;
  return SL_OK;
}

/* Anthropic's thinking.budget_tokens (under max_tokens): the first engine
 * request generates that many tokens, then the job closes the thinking
 * and continues (job.c's budget_continue); the tokens of the closing tag
 * are made here. Without a split (--reasoning-format none) or with a
 * grammar (which would restart in the continuation) there is no cap. */
static sl_status think_budget(sl_srv_job *j, const sl_pool_lease *ml) {
  sl_srv_request *r = &j->req;
  /* the answer's length as the engine will clamp it */
  int max_new = sl_engine_max_new(ml->engine, j->n_ids, r->gen.max_tokens);
  if (r->think_budget <= 0 || r->rfmt == SL_RFMT_NONE || r->grammar ||
      r->think_budget >= max_new || r->n_choices > 1)
    return SL_OK;
  const char *close = sl__srv_think_close(r->rfmt);
  size_t n = 0;
  sl_status st = sl_tokenizer_encode(ml->tok, close, strlen(close), false, true,
                                     &j->close_ids, &n);
  if (st != SL_OK)
    return st == SL_ERR_NOMEM ? st : SL_OK; /* (no tokens: no cap) */
  j->n_close = (int)n;
  j->budget_total = max_new;
  r->gen.max_tokens = r->think_budget;
  return SL_OK;
}

enum MHD_Result sl__srv_generate(sl_server_t *s, struct MHD_Connection *c,
                                 sl_srv_conn *cn) {
  sl_srv_api api = cn->api;
  sl_srv_error err;
  sl_srv_job *j = sl__srv_job_new(&s->jobs, s);
  if (!j) {
    sl__srv_error_set(&err, 500, NULL, NULL, "out of memory");
    goto fail_respond;
  }
  /* the parse leases the model the body names (released with the job) */
  sl_srv_limits lim = sl__srv_limits_of(s, &j->mdl);
  cn->job = j;
  if (sl__srv_parse(api, cn->body.p ? cn->body.p : "", cn->body.len, &lim,
                    &j->req, &err) != SL_OK)
    goto fail_respond;
  if (api == SL_SRV_EMBEDDINGS)
    return handle_embed(s, c, cn, j, &err);
  const sl_pool_lease *ml = &j->mdl.lease;
  if (sl__srv_prompt_ids(&j->req, ml->tok, ml->chat_template,
                         s->cfg.parse_special_in_content, ml->n_ctx, &j->ids,
                         &j->n_ids, &err) != SL_OK)
    goto fail_respond;
  if (j->n_ids >= ml->n_ctx) {
    sl__srv_error_set(&err, 400, "context_length_exceeded",
                      api == SL_SRV_COMPLETIONS ? "prompt" : "messages",
                      "this model's maximum context length is %d tokens, "
                      "but the prompt has %d tokens",
                      ml->n_ctx, j->n_ids);
    goto fail_respond;
  }
  if (j->req.prediction && prediction_ids(&j->req, ml, &err) != SL_OK)
    goto fail_respond;
  size_t nv = sl_tokenizer_vocab_size(ml->tok);
  for (int i = 0; i < j->req.gen.n_logit_bias; i++)
    if ((size_t)j->req.gen.logit_bias[i].id >= nv) {
      sl__srv_error_set(&err, 400, "invalid_value", "logit_bias",
                        "logit_bias: token id %d is outside the vocabulary "
                        "(%zu)",
                        j->req.gen.logit_bias[i].id, nv);
      goto fail_respond;
    }
  /* no max_tokens: --max-tokens-default (0: as many as fit); the engine
   * clamps it to the room left in the context (sl_engine_max_new) */
  if (!j->req.max_tokens_set && api == SL_SRV_CHAT)
    j->req.gen.max_tokens =
        s->cfg.max_tokens_default > 0 ? s->cfg.max_tokens_default : INT_MAX;
  /* a constrained answer (a grammar, a forced tool call) leaves no room
   * for thinking: what it writes is content even after an opened block */
  j->req.think_open =
      !j->req.grammar &&
      sl__srv_think_opened(j->req.rfmt, ml->tok, j->ids, j->n_ids);
  if (think_budget(j, ml) != SL_OK) {
    sl__srv_error_set(&err, 500, NULL, NULL, "out of memory");
    goto fail_respond;
  }
  j->prompt_tokens = j->n_ids;
  j->created = (long long)time(NULL);
  sl__srv_make_id(j->id, sizeof j->id,
                  api == SL_SRV_CHAT          ? "chatcmpl-"
                  : api == SL_SRV_COMPLETIONS ? "cmpl-"
                                              : "msg_");
  j->fd = conn_fd(c);
  j->http10 = cn->http10;
  int n = j->req.n_choices > 1 ? j->req.n_choices : 1;
  if (n > 1 && !sl__srv_job_make_kids(j, n)) {
    sl__srv_error_set(&err, 503, "out_of_memory", NULL,
                      "the server ran out of memory; retry later");
    goto fail_respond;
  }
  if (sl__srv_job_post(j, ml->engine, s->cfg.pooling, &cn->open, &err) != SL_OK)
    goto fail_respond;
  return await_answer(s, c, cn, j);

fail_respond:
  sl__srv_metrics_failed(s, j ? &j->req : NULL, err.http);
  return sl__srv_send_error(c, cn->fam, &err, false);
}

/* ---- waiting for a model's load --------------------------------------------
 *
 * A generation request for a model that is not loaded does not hold a
 * libmicrohttpd thread through the load: its connection is suspended and
 * the model's helper thread (one per model loading) loads it and resumes
 * every connection waiting for it; each then runs as if it had just
 * arrived (sl__srv_generate). */

typedef struct load_waiter {
  struct load_waiter *next;
  struct MHD_Connection *c;
  sl_srv_conn *cn;
} load_waiter;

struct sl_srv_loading {
  struct sl_srv_loading *next;
  sl_server_t *s;
  int index;
  char name[256];
  load_waiter *waiters;
};

static void *load_helper(void *arg) {
  struct sl_srv_loading *L = arg;
  sl_server_t *s = L->s;
  char why[320] = "";
  sl_status st = sl_pool_load(s->pool, L->name, why, sizeof why);
  pthread_mutex_lock(&s->load_mu);
  for (struct sl_srv_loading **pp = &s->loading; *pp; pp = &(*pp)->next)
    if (*pp == L) {
      *pp = L->next;
      break;
    }
  load_waiter *w = L->waiters;
  pthread_mutex_unlock(&s->load_mu);
  while (w) {
    load_waiter *next = w->next;
    memset(&w->cn->load_err, 0, sizeof w->cn->load_err);
    if (st != SL_OK)
      sl__srv_load_error(st, L->name, why, &w->cn->load_err);
    MHD_resume_connection(w->c);
    atomic_fetch_sub(&s->n_load_parked, 1); /* s may go once all are 0 */
    sl_free(w);
    w = next;
  }
  sl_free(L);
  return NULL;
}

bool sl__srv_park_for_load(sl_server_t *s, struct MHD_Connection *c,
                           sl_srv_conn *cn) {
  if (atomic_load(&s->closing) ||
      sl_pool_loaded_count(s->pool) == sl_pool_count(s->pool))
    return false; /* the common case costs no parse */
  sl_srv_error err;
  json_t *root =
      sl__srv_body_object(cn->body.p ? cn->body.p : "", cn->body.len, &err);
  json_t *m = root ? json_object_get(root, "model") : NULL;
  int i = json_is_string(m) ? sl__srv_model_index(s, json_string_value(m)) : -1;
  json_decref(root);
  sl_pool_info in;
  if (i < 0 || !sl_pool_info_at(s->pool, i, &in) || in.state == SL_POOL_LOADED)
    return false; /* unknown or loaded: the parse answers, or it runs */
  load_waiter *w = sl_calloc(1, sizeof *w);
  if (!w)
    return false;
  w->c = c;
  w->cn = cn;
  pthread_mutex_lock(&s->load_mu);
  struct sl_srv_loading *L = s->loading;
  while (L && L->index != i)
    L = L->next;
  if (!L) {
    pthread_t th;
    pthread_attr_t at;
    L = sl_calloc(1, sizeof *L);
    bool ok = L && pthread_attr_init(&at) == 0;
    if (ok) {
      L->s = s;
      L->index = i;
      snprintf(L->name, sizeof L->name, "%s", in.name);
      L->waiters = w;
      pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      ok = pthread_create(&th, &at, load_helper, L) == 0;
      pthread_attr_destroy(&at);
    }
    if (!ok) { /* no thread: the handler loads it itself */
      pthread_mutex_unlock(&s->load_mu);
      sl_free(L);
      sl_free(w);
      return false;
    }
    L->next = s->loading;
    s->loading = L;
  } else {
    w->next = L->waiters;
    L->waiters = w;
  }
  cn->load_wait = true;
  atomic_fetch_add(&s->n_load_parked, 1);
  /* under load_mu: the helper resumes only after taking it */
  MHD_suspend_connection(c);
  pthread_mutex_unlock(&s->load_mu);
  return true;
}
