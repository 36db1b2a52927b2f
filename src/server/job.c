/* sluice — server: the job (job.h): its references, the engine's events
 * that fill it, its submission, its abort; the registry of live jobs and
 * the shutdown's cut. No libmicrohttpd here: the consumer learns of news
 * through the registry's notify hook (reply.c resumes the connection). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/job.h"
#include "server/json.h"
#include "server/parse.h"
#include "server/toolcall.h"
#include "sluice/util.h"

/* ---- references ------------------------------------------------------------
 */

sl_srv_job *sl__srv_job_new(sl_srv_jobs *reg, sl_server_t *srv) {
  sl_srv_job *j = sl_calloc(1, sizeof *j);
  if (!j)
    return NULL;
  atomic_init(&j->refs, 1);
  j->reg = reg;
  j->srv = srv;
  j->mdl.lease.index = -1;
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->fd = -1;
  return j;
}

void sl__srv_job_ref(sl_srv_job *j) {
  atomic_fetch_add(&j->refs, 1);
}

/* A job's own buffers (a child's too: its req is its parent's). */
static void job_buffers_free(sl_srv_job *j) {
  sl_free(j->text);
  sl_free(j->toks);
  sl__srv_toolcalls_free(&j->calls);
  sl__srv_rsplit_free(&j->rs);
  sl__sbuf_free(&j->out);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
}

void sl__srv_job_unref(sl_srv_job *j) {
  int was = atomic_fetch_sub(&j->refs, 1);
  SL_ASSERT(was >= 1);
  if (was != 1)
    return;
  SL_ASSERT(!j->prev && !j->next); /* out of the live list */
  for (int i = 0; j->kids && i < j->n_parts; i++)
    job_buffers_free(&j->kids[i]);
  sl_free(j->kids);
  sl__srv_request_free(&j->req);
  sl__srv_model_release(&j->mdl); /* the engine no longer calls back */
  sl_free(j->ids);
  sl_free(j->close_ids);
  sl_free(j->parts);
  sl_free(j->emb);
  job_buffers_free(j);
  sl_free(j);
}

void sl__srv_make_id(char *buf, size_t cap, const char *prefix) {
  static atomic_uint_fast64_t counter;
  uint64_t x = sl_now_ns() ^ ((uint64_t)getpid() << 32) ^
               (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  snprintf(buf, cap, "%s%016llx", prefix, (unsigned long long)x);
}

bool sl__srv_job_sanity(const sl_srv_job *j) {
  if (atomic_load(&j->refs) < 1)
    return false;
  if (j->parent) {
    const sl_srv_job *p = j->parent;
    if (j->kids || j->parts || j->index < 0 || j->index >= p->n_parts ||
        &p->kids[j->index] != j)
      return false;
  } else if (j->kids) {
    for (int i = 0; i < j->n_parts; i++)
      if (j->parts[i].job != &j->kids[i] || j->kids[i].parent != j)
        return false;
  } else if (j->parts) {
    if (!j->emb || j->n_embd <= 0)
      return false;
    for (int i = 0; i < j->n_parts; i++)
      if (j->parts[i].job != j || j->parts[i].index != i)
        return false;
  }
  if (j->parts_done < 0 || j->parts_done > j->n_parts || j->parts_next < 0 ||
      j->parts_next > j->n_parts)
    return false;
  if (j->n_toks < 0 || (!j->kids && j->n_toks > j->toks_cap))
    return false; /* (a parent's n_toks counts its choices' tokens) */
  if (j->text && (j->text_len >= j->text_cap || j->text[j->text_len]))
    return false;
  if (!j->kids && j->n_toks > 0) {
    const sl_srv_tok *t = &j->toks[j->n_toks - 1];
    if (t->text_off + t->text_len > j->text_len)
      return false;
  }
  if (j->sent_toks > j->n_toks || j->out_off > j->out.len)
    return false;
  return !j->resumed || j->parked;
}

/* ---- the registry ----------------------------------------------------------
 */

void sl__srv_jobs_init(sl_srv_jobs *reg, sl_srv_job_record record,
                       void *record_arg, void (*notify)(sl_srv_job *j)) {
  memset(reg, 0, sizeof *reg);
  pthread_mutex_init(&reg->mu, NULL);
  pthread_cond_init(&reg->cv, NULL);
  reg->record = record;
  reg->record_arg = record_arg;
  reg->notify = notify;
}

void sl__srv_jobs_destroy(sl_srv_jobs *reg) {
  pthread_cond_destroy(&reg->cv);
  pthread_mutex_destroy(&reg->mu);
}

void sl__srv_jobs_stop(sl_srv_jobs *reg) {
  pthread_mutex_lock(&reg->mu);
  reg->stopping = true;
  pthread_mutex_unlock(&reg->mu);
}

bool sl__srv_jobs_stopping(sl_srv_jobs *reg) {
  pthread_mutex_lock(&reg->mu);
  bool stop = reg->stopping;
  pthread_mutex_unlock(&reg->mu);
  return stop;
}

void sl__srv_jobs_closed(sl_srv_jobs *reg) {
  pthread_mutex_lock(&reg->mu);
  SL_ASSERT(reg->n_open > 0);
  reg->n_open--;
  pthread_cond_broadcast(&reg->cv);
  pthread_mutex_unlock(&reg->mu);
}

/* Takes the job out of the live list. */
static void jobs_remove(sl_srv_jobs *reg, sl_srv_job *j) {
  pthread_mutex_lock(&reg->mu);
  if (j->prev)
    j->prev->next = j->next;
  else if (reg->head == j)
    reg->head = j->next;
  if (j->next)
    j->next->prev = j->prev;
  j->prev = j->next = NULL;
  reg->n--;
  pthread_cond_broadcast(&reg->cv);
  pthread_mutex_unlock(&reg->mu);
}

/* Adds a job about to be submitted to the live list and counts its
 * response open (false: the registry is stopping, *err says so). `refs`:
 * the references its engine requests will hold. */
static bool jobs_add(sl_srv_jobs *reg, sl_srv_job *j, int refs,
                     sl_srv_error *err) {
  pthread_mutex_lock(&reg->mu);
  if (reg->stopping) {
    pthread_mutex_unlock(&reg->mu);
    sl__srv_error_set(err, sl_reason_http(SL_REASON_SHUTTING_DOWN),
                      sl_reason_code(SL_REASON_SHUTTING_DOWN), NULL, "%s",
                      sl_reason_message(SL_REASON_SHUTTING_DOWN));
    return false;
  }
  j->next = reg->head;
  if (reg->head)
    reg->head->prev = j;
  reg->head = j;
  reg->n++;
  reg->n_open++;
  atomic_fetch_add(&j->refs, refs);
  pthread_mutex_unlock(&reg->mu);
  return true;
}

/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait */
static struct timespec deadline_in(unsigned ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

int sl__srv_jobs_wait(sl_srv_jobs *reg, unsigned ms) {
  struct timespec ts = deadline_in(ms);
  pthread_mutex_lock(&reg->mu);
  while (reg->n + reg->n_open > 0)
    if (pthread_cond_timedwait(&reg->cv, &reg->mu, &ts) == ETIMEDOUT)
      break;
  int n = reg->n + reg->n_open;
  pthread_mutex_unlock(&reg->mu);
  return n;
}

/* The job is done (no lock held): recorded, and out of the live list. */
/* (no lock held: its callers let go of mu first) */
static void job_finished(sl_srv_job *j) {
  if (j->reg->record)
    j->reg->record(j->reg->record_arg, j, j->finish == SL_FINISH_ERROR);
  jobs_remove(j->reg, j);
}

static void notify(sl_srv_job *j) {
  if (j->reg->notify)
    j->reg->notify(j);
}

/* ---- the engine's events
 * -----------------------------------------------------
 */

/* An event of choice k of parent p (n > 1; executor thread, no lock held):
 * p starts with its first choice's events and is done with the last
 * choice's end, its usage and error taken from the choices then. Each
 * choice holds a reference to p. */
static void kid_event(sl_srv_job *p, bool kid_done, bool kid_started) {
  pthread_mutex_lock(&p->mu);
  if (kid_started) /* (a choice refused before it started does not start
                      the stream: the request then fails with its status) */
    p->started = true;
  if (kid_done)
    p->parts_done++;
  bool all = kid_done && p->parts_done == p->n_parts;
  if (all) {
    p->done = true;
    p->t_done = sl_now_ns();
    p->finish = SL_FINISH_STOP;
    p->completion_tokens = p->n_toks = 0;
    p->draft_accepted = p->draft_rejected = 0;
    for (int i = 0; i < p->n_parts; i++) {
      sl_srv_job *k = &p->kids[i];
      pthread_mutex_lock(&k->mu);
      if (i == 0) { /* the prompt once: what the first choice computed */
        p->prompt_tokens = k->prompt_tokens;
        p->cached_tokens = k->cached_tokens;
      }
      p->completion_tokens += k->completion_tokens;
      p->draft_accepted += k->draft_accepted;
      p->draft_rejected += k->draft_rejected;
      p->n_toks += k->n_toks;
      if (k->t_first && (!p->t_first || k->t_first < p->t_first))
        p->t_first = k->t_first;
      if (k->finish == SL_FINISH_ERROR && p->finish != SL_FINISH_ERROR) {
        p->finish = SL_FINISH_ERROR;
        p->error = k->error;
        p->reason = k->reason;
        memcpy(p->error_msg, k->error_msg, sizeof p->error_msg);
        p->est_bytes = k->est_bytes;
        p->limit_bytes = k->limit_bytes;
      }
      pthread_mutex_unlock(&k->mu);
    }
  }
  SL_ASSERT(sl__srv_job_sanity(p));
  if (all || p->req.stream)
    notify(p);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (all)
    job_finished(p);
  if (kid_done)
    sl__srv_job_unref(p);
}

/* A token's record and text appended (j->mu held); false when out of
 * memory (the job then fails at its end). */
static bool add_token(sl_srv_job *j, const sl_engine_event *ev) {
  if (j->n_toks == j->toks_cap) {
    int cap = j->toks_cap ? j->toks_cap * 2 : 64;
    sl_srv_tok *nt = sl_realloc(j->toks, (size_t)cap * sizeof *nt);
    if (!nt)
      return false;
    j->toks = nt;
    j->toks_cap = cap;
  }
  if (j->text_len + ev->text_len + 1 > j->text_cap) {
    size_t cap = j->text_cap ? j->text_cap : 1024;
    while (cap < j->text_len + ev->text_len + 1)
      cap *= 2;
    char *nt = sl_realloc(j->text, cap);
    if (!nt)
      return false;
    j->text = nt;
    j->text_cap = cap;
  }
  sl_srv_tok *t = &j->toks[j->n_toks++];
  t->id = ev->token;
  t->logprob = ev->logprob;
  t->text_off = j->text_len;
  t->text_len = ev->text_len;
  if (ev->text_len)
    memcpy(j->text + j->text_len, ev->text, ev->text_len);
  j->text_len += ev->text_len;
  j->text[j->text_len] = 0;
  t->n_top = ev->top && ev->n_top > 0 ? ev->n_top : 0;
  if (t->n_top > SL_MAX_TOP_LOGPROBS)
    t->n_top = SL_MAX_TOP_LOGPROBS;
  if (t->n_top)
    memcpy(t->top, ev->top, (size_t)t->n_top * sizeof *t->top);
  return true;
}

/* SL_EV_DONE (j->mu held). */
static void job_done(sl_srv_job *j, const sl_engine_event *ev) {
  j->done = true;
  j->t_done = sl_now_ns();
  j->finish = ev->finish;
  j->error = ev->error;
  if (ev->prompt_tokens && !j->budget_went)
    j->prompt_tokens = ev->prompt_tokens;
  if ((ev->cached_tokens || !j->started) && !j->budget_went)
    j->cached_tokens = ev->cached_tokens;
  j->completion_tokens =
      ev->completion_tokens + (j->budget_went ? j->budget_base : 0);
  j->reason = ev->reason;
  snprintf(j->error_msg, sizeof j->error_msg, "%s",
           ev->error_msg ? ev->error_msg : "");
  j->est_bytes = ev->est_bytes;
  j->limit_bytes = ev->limit_bytes;
  if (j->oom && j->finish != SL_FINISH_ERROR) {
    j->finish = SL_FINISH_ERROR;
    j->error = SL_ERR_NOMEM;
    j->reason = SL_REASON_OUT_OF_MEMORY;
  }
  if (j->cut && j->finish == SL_FINISH_ABORT) {
    /* cut off by the shutdown: an error, never a complete answer */
    j->finish = SL_FINISH_ERROR;
    j->error = SL_ERR_CANCELLED;
    j->reason = SL_REASON_SHUTTING_DOWN;
    if (j->started)
      snprintf(j->error_msg, sizeof j->error_msg,
               "the server is shutting down: the answer was cut off after "
               "%d tokens; retry",
               ev->completion_tokens);
    else
      snprintf(j->error_msg, sizeof j->error_msg,
               "the server is shutting down: the request was not started; "
               "retry");
  }
}

static void on_event(void *user, const sl_engine_event *ev);

/* The thinking budget ran out: the first engine request's DONE at its
 * max_tokens (j->mu held, executor thread; engine callbacks run without
 * the engine's lock, so a submit from here is safe). The think block, when
 * still open, is closed by its closing tag's tokens, appended to the
 * answer as if generated; a second request then continues the answer from
 * the prompt and every token so far, with what is left of max_tokens (the
 * prefix cache holds all but the last tokens: the first request published
 * its blocks before it reported its end). The second request inherits the
 * first's reference to the job. Returns SL_OK when it runs (the job goes
 * on), SL_ERR_RANGE when the answer ends here (no budget, another finish,
 * nothing left), else the failure that ends it. */
static sl_status budget_continue(sl_srv_job *j, const sl_engine_event *ev) {
  if (!j->budget_total || j->budget_went || ev->finish != SL_FINISH_LENGTH ||
      j->aborted || j->cut || j->oom)
    return SL_ERR_RANGE;
  const sl_pool_lease *ml = sl__srv_job_lease(j);
  j->budget_went = true;
  j->budget_base = ev->completion_tokens;
  sl_srv_rsplit rs;
  sl__srv_rsplit_init(&rs, j->req.rfmt, j->req.think_open);
  sl__srv_rsplit_feed(&rs, j->text ? j->text : "", j->text_len);
  bool open = sl__srv_rsplit_thinking(&rs) && !sl__srv_rsplit_oom(&rs);
  sl__srv_rsplit_free(&rs);
  for (int i = 0; open && i < j->n_close; i++) {
    sl_engine_event tev = {.kind = SL_EV_TOKEN, .token = j->close_ids[i]};
    tev.text = sl_tokenizer_piece(ml->tok, j->close_ids[i], &tev.text_len);
    if (!add_token(j, &tev)) {
      j->oom = true;
      return SL_ERR_NOMEM;
    }
    j->budget_base++;
  }
  int left = j->budget_total - j->budget_base;
  if (left <= 0)
    return SL_ERR_RANGE;
  size_t n = (size_t)j->n_ids;
  int32_t *ids =
      sl_malloc(sizeof *ids * ((size_t)j->n_ids + (size_t)j->n_toks));
  if (!ids)
    return SL_ERR_NOMEM;
  memcpy(ids, j->ids, sizeof *ids * (size_t)j->n_ids);
  for (int i = 0; i < j->n_toks; i++)
    if (j->toks[i].id >= 0) /* (id < 0: flushed text, no token) */
      ids[n++] = j->toks[i].id;
  sl_gen_params gp = j->req.gen;
  gp.max_tokens = left;
  uint64_t eid = 0;
  sl_status st =
      sl_engine_submit(ml->engine, ids, (int)n, &gp, on_event, j, &eid);
  sl_free(ids);
  if (st == SL_OK)
    j->engine_id = eid;
  return st;
}

/* The engine's callback: executor thread, must not block. */
static void on_event(void *user, const sl_engine_event *ev) {
  sl_srv_job *j = user;
  sl_status bst;
  bool first;
  pthread_mutex_lock(&j->mu);
  switch (ev->kind) {
  case SL_EV_STARTED:
    j->started = true;
    if (!j->budget_went) { /* (the continuation's prompt is the answer's) */
      j->prompt_tokens = ev->prompt_tokens;
      j->cached_tokens = ev->cached_tokens;
    }
    break;
  case SL_EV_TOKEN:
    if (!j->t_first)
      j->t_first = sl_now_ns();
    if (!j->oom && !add_token(j, ev))
      j->oom = true;
    break;
  case SL_EV_DONE:
    j->draft_accepted += ev->draft_accepted;
    j->draft_rejected += ev->draft_rejected;
    first = !j->budget_went;
    if ((bst = budget_continue(j, ev)) == SL_OK)
      break; /* the answer goes on in the continuation */
    job_done(j, ev);
    if (first && j->budget_went) /* the first request's and the close's */
      j->completion_tokens = j->budget_base;
    if (bst != SL_ERR_RANGE && j->finish != SL_FINISH_ERROR) {
      j->finish = SL_FINISH_ERROR;
      j->error = bst;
      j->reason = bst == SL_ERR_CANCELLED ? SL_REASON_SHUTTING_DOWN
                  : bst == SL_ERR_NOMEM   ? SL_REASON_OUT_OF_MEMORY
                                          : SL_REASON_NONE;
      snprintf(j->error_msg, sizeof j->error_msg,
               "cannot continue the answer after its thinking budget: %s",
               sl_status_str(bst));
    }
    break;
  }
  SL_ASSERT(sl__srv_job_sanity(j));
  bool done = j->done;
  if (j->parent) { /* a choice of n: its parent answers */
    bool started = j->started || j->n_toks > 0;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    kid_event(j->parent, done, started);
    return;
  }
  /* a non-streamed answer has nothing to send before the end: its
   * connection stays parked (no pool-thread wake-up per token) */
  if (done || j->req.stream)
    notify(j);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (done) {
    job_finished(j);
    sl__srv_job_unref(j);
  }
}

static void on_embed_event(void *user, const sl_engine_event *ev);

/* Submits input i of an embeddings job (mu held): SL_OK with its engine
 * id recorded, or the engine's refusal. */
static sl_status embed_submit(sl_srv_job *j, int i) {
  sl_gen_params gp = j->req.gen;
  gp.pooling = j->pooling;
  gp.n_stop = 0;
  gp.grammar = NULL;
  uint64_t eid = 0;
  sl_status st = sl_engine_submit(sl__srv_job_lease(j)->engine,
                                  j->req.inputs[i].ids, j->req.inputs[i].n_ids,
                                  &gp, on_embed_event, &j->parts[i], &eid);
  if (st == SL_OK) {
    j->parts[i].engine_id = eid;
    j->submitted = true;
  }
  return st;
}

/* The engine's callback for one input of an embeddings job (executor
 * thread): its vector, or the job's error; the job is done with its last
 * input. Each input holds a reference to the job. While the job goes on,
 * the input's end lets the next one into the engine (at most
 * SL_SRV_EMBED_WINDOW at once: a request of 2,048 inputs queues no more,
 * and none waits long enough in the engine's queue to time out); once it
 * has failed or was aborted, the inputs never submitted end with it. */
static void on_embed_event(void *user, const sl_engine_event *ev) {
  sl_srv_emb_part *p = user;
  sl_srv_job *j = p->job;
  if (ev->kind != SL_EV_DONE)
    return;
  pthread_mutex_lock(&j->mu);
  if (ev->finish == SL_FINISH_STOP && ev->embedding &&
      ev->n_embd == j->n_embd) {
    memcpy(j->emb + (size_t)p->index * (size_t)j->n_embd, ev->embedding,
           sizeof(float) * (size_t)j->n_embd);
    j->prompt_tokens += ev->prompt_tokens;
  } else if (j->finish != SL_FINISH_ERROR) {
    j->finish = SL_FINISH_ERROR;
    j->error = ev->error != SL_OK ? ev->error : SL_ERR_CANCELLED;
    j->reason = j->cut ? SL_REASON_SHUTTING_DOWN : ev->reason;
    snprintf(j->error_msg, sizeof j->error_msg, "%s",
             j->cut || !ev->error_msg ? "" : ev->error_msg);
    j->est_bytes = ev->est_bytes;
    j->limit_bytes = ev->limit_bytes;
  }
  int dropped = 0; /* inputs that end unsubmitted, with this one */
  if (j->parts_next < j->n_parts) {
    sl_status st = j->finish == SL_FINISH_ERROR || j->aborted || j->cut
                       ? SL_ERR_CANCELLED
                       : embed_submit(j, j->parts_next);
    if (st == SL_OK) {
      j->parts_next++;
    } else {
      if (j->finish != SL_FINISH_ERROR) {
        j->finish = SL_FINISH_ERROR;
        j->error = st;
        j->reason = SL_REASON_NONE;
        snprintf(j->error_msg, sizeof j->error_msg, "cannot queue input %d: %s",
                 j->parts_next, sl_status_str(st));
      }
      dropped = j->n_parts - j->parts_next;
      j->parts_next = j->n_parts;
      j->parts_done += dropped;
    }
  }
  bool last = ++j->parts_done == j->n_parts;
  if (last) {
    j->done = true;
    j->t_done = sl_now_ns();
    if (j->finish != SL_FINISH_ERROR)
      j->finish = SL_FINISH_STOP;
    notify(j);
  }
  SL_ASSERT(sl__srv_job_sanity(j));
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (last)
    job_finished(j);
  for (int i = 0; i < dropped; i++) /* (never the last reference: this
                                       input's own is dropped below) */
    sl__srv_job_unref(j);
  sl__srv_job_unref(j);
}

/* ---- posting ---------------------------------------------------------------
 */

bool sl__srv_job_make_kids(sl_srv_job *j, int n) {
  j->kids = sl_calloc((size_t)n, sizeof *j->kids);
  j->parts = sl_calloc((size_t)n, sizeof *j->parts);
  if (!j->kids || !j->parts) {
    sl_free(j->kids);
    j->kids = NULL;
    return false;
  }
  j->n_parts = n;
  for (int i = 0; i < n; i++) {
    sl_srv_job *k = &j->kids[i];
    atomic_init(&k->refs, 1);
    k->reg = j->reg;
    k->srv = j->srv;
    k->mdl.lease.index = -1;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    k->req = j->req; /* shared, never freed through k */
    k->req.gen.sampling.seed = j->req.gen.sampling.seed + (uint64_t)i;
    k->parent = j;
    k->index = i;
    k->fd = -1;
    memcpy(k->id, j->id, sizeof k->id);
    k->created = j->created;
    k->prompt_tokens = j->n_ids;
    j->parts[i].job = k;
    j->parts[i].index = i;
  }
  return true;
}

/* The error of a refused sl_engine_submit. */
static void submit_error(sl_status st, int n_ids, sl_srv_error *err) {
  if (st == SL_ERR_RANGE)
    sl__srv_error_set(err, 400, "context_length_exceeded", NULL,
                      "the prompt (%d tokens) does not fit the context", n_ids);
  else if (st == SL_ERR_INVALID_ARG)
    sl__srv_error_set(err, 400, "invalid_value", NULL,
                      "the engine refused the request's parameters");
  else
    sl__srv_error_set(err, 503, NULL, NULL, "cannot queue the request: %s",
                      sl_status_str(st));
}

/* Each input is one embedding request to the engine; the job is done when
 * the last is. The first SL_SRV_EMBED_WINDOW go now, each later one as an
 * earlier one ends (on_embed_event). */
static sl_status post_embed(sl_srv_job *j, sl_engine_t *eng, sl_pooling pooling,
                            bool *open, sl_srv_error *err) {
  int n = j->n_parts;
  for (int i = 0; i < n; i++) {
    j->parts[i].job = j;
    j->parts[i].index = i;
  }
  if (!jobs_add(j->reg, j, n, err))
    return SL_ERR_CANCELLED;
  *open = true;
  j->pooling = pooling == SL_POOL_LAST ? SL_POOL_LAST : SL_POOL_MEAN;
  j->t_submit = sl_now_ns();
  int w = n < SL_SRV_EMBED_WINDOW ? n : SL_SRV_EMBED_WINDOW;
  int i = 0;
  sl_status st = SL_OK;
  pthread_mutex_lock(&j->mu);
  j->parts_next = w; /* (an early end submits past the window, never in it) */
  for (; i < w; i++)
    if ((st = embed_submit(j, i)) != SL_OK)
      break;
  if (st != SL_OK) {
    /* the inputs from i on were never submitted: no end will submit them */
    j->parts_next = n;
  }
  pthread_mutex_unlock(&j->mu);
  if (st == SL_OK)
    return SL_OK;
  if (st == SL_ERR_UNSUPPORTED)
    sl__srv_error_set(err, 400, "unsupported_device", NULL,
                      "embeddings are not served on this device (%s) yet; "
                      "serve with --device cpu",
                      sl_engine_device_name(eng));
  else
    sl__srv_error_set(err, 503, NULL, NULL, "cannot queue the request: %s",
                      sl_status_str(st));
  /* the inputs not submitted give their references back; the others end
   * by abort */
  pthread_mutex_lock(&j->mu);
  j->parts_done += n - i;
  bool none_left = j->parts_done == j->n_parts;
  if (j->finish != SL_FINISH_ERROR) {
    j->finish = SL_FINISH_ERROR;
    j->error = st;
    j->reason = SL_REASON_NONE;
    snprintf(j->error_msg, sizeof j->error_msg, "%.200s", err->message);
  }
  if (none_left)
    j->done = true;
  pthread_mutex_unlock(&j->mu);
  atomic_fetch_sub(&j->refs, n - i);
  if (none_left) { /* nothing runs: answer now */
    jobs_remove(j->reg, j);
    return st;
  }
  sl__srv_job_stop(j);
  return SL_OK;
}

sl_status sl__srv_job_post(sl_srv_job *j, sl_engine_t *eng, sl_pooling pooling,
                           bool *open, sl_srv_error *err) {
  *open = false;
  if (j->req.api == SL_SRV_EMBEDDINGS)
    return post_embed(j, eng, pooling, open, err);
  int n = j->kids ? j->n_parts : 1;
  /* register, then submit: the engine holds one reference per request
   * (each choice's) until DONE */
  if (!jobs_add(j->reg, j, n, err))
    return SL_ERR_CANCELLED;
  *open = true;
  /* no lock is held across submit: the executor may already be calling
   * back into this job (and into the jobs list) */
  j->t_submit = sl_now_ns();
  for (int i = 0; i < n; i++) {
    sl_srv_job *k = j->kids ? &j->kids[i] : j;
    uint64_t eid = 0;
    k->t_submit = j->t_submit;
    sl_status st =
        sl_engine_submit(eng, j->ids, j->n_ids, &k->req.gen, on_event, k, &eid);
    if (st != SL_OK && i == 0) { /* nothing runs: answer now */
      jobs_remove(j->reg, j);
      atomic_fetch_sub(&j->refs, n);
      submit_error(st, j->n_ids, err);
      return st;
    }
    if (st != SL_OK) { /* a later choice: it ends at once, failed */
      submit_error(st, j->n_ids, err);
      pthread_mutex_lock(&k->mu);
      k->done = true;
      k->finish = SL_FINISH_ERROR;
      k->error = st;
      k->reason = SL_REASON_NONE;
      snprintf(k->error_msg, sizeof k->error_msg, "choice %d: %.200s", i,
               err->message);
      pthread_mutex_unlock(&k->mu);
      kid_event(j, true, false);
      continue;
    }
    pthread_mutex_lock(&k->mu);
    k->engine_id = eid;
    k->submitted = true;
    pthread_mutex_unlock(&k->mu);
    if (k != j) {
      pthread_mutex_lock(&j->mu);
      j->parts[i].engine_id = eid;
      j->submitted = true;
      pthread_mutex_unlock(&j->mu);
    }
  }
  return SL_OK;
}

bool sl__srv_job_wait(sl_srv_job *j, unsigned ms) {
  struct timespec ts = deadline_in(ms);
  pthread_mutex_lock(&j->mu);
  while (!j->done)
    if (ms ? pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT
           : pthread_cond_wait(&j->cv, &j->mu) != 0)
      break;
  bool done = j->done;
  pthread_mutex_unlock(&j->mu);
  return done;
}

/* ---- aborts ----------------------------------------------------------------
 */

/* The engine requests of a job (j->mu held): its one, or one per input of
 * an embeddings job or per choice; at most cap of them. */
static int job_ids(const sl_srv_job *j, uint64_t *out, int cap) {
  if (!j->parts)
    return cap > 0 ? (out[0] = j->engine_id, 1) : 0;
  int n = 0;
  for (int i = 0; i < j->n_parts && n < cap; i++)
    if (j->parts[i].engine_id)
      out[n++] = j->parts[i].engine_id;
  return n;
}

static void abort_id(const sl_srv_job *j, uint64_t id) {
  if (sl_engine_abort(sl__srv_job_lease(j)->engine, id) != SL_OK)
    SL_LOGW("server: out of memory recording an abort; request %llu runs "
            "to its end",
            (unsigned long long)id);
}

void sl__srv_job_stop(sl_srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool go = j->submitted && !j->done && !j->aborted;
  j->aborted = true;
  int n = 0;
  uint64_t one, *ids = &one;
  if (go && j->parts && !(ids = sl_malloc(sizeof *ids * (size_t)j->n_parts)))
    go = false; /* out of memory: each input runs to its end */
  if (go)
    n = job_ids(j, ids, j->parts ? j->n_parts : 1);
  pthread_mutex_unlock(&j->mu);
  for (int i = 0; i < n; i++)
    abort_id(j, ids[i]);
  if (ids != &one)
    sl_free(ids);
}

#define ABORT_BATCH 64

int sl__srv_jobs_abort_where(sl_srv_jobs *reg,
                             bool (*pick)(sl_srv_job *j, void *arg),
                             void *arg) {
  uint64_t ids[ABORT_BATCH];
  sl_srv_job *owner[ABORT_BATCH]; /* each id's job, referenced until its
                                     abort */
  int n = 0;
  pthread_mutex_lock(&reg->mu);
  for (sl_srv_job *j = reg->head; j && n < ABORT_BATCH; j = j->next) {
    pthread_mutex_lock(&j->mu);
    int need = j->parts ? j->n_parts : 1;
    bool fits = n == 0 || n + need <= ABORT_BATCH; /* else: the next call */
    if (j->submitted && !j->done && fits && pick(j, arg)) {
      int k = job_ids(j, ids + n, ABORT_BATCH - n);
      for (int i = 0; i < k; i++) {
        owner[n + i] = j;
        atomic_fetch_add(&j->refs, 1); /* its engine stays loaded */
      }
      n += k;
    }
    pthread_mutex_unlock(&j->mu);
  }
  pthread_mutex_unlock(&reg->mu);
  for (int i = 0; i < n; i++) {
    abort_id(owner[i], ids[i]); /* a failed one: retried by the next call */
    sl__srv_job_unref(owner[i]);
  }
  return n;
}

/* sl__srv_jobs_cut's choice: marks the job and its choices cut. */
static bool pick_cut(sl_srv_job *j, void *arg) {
  bool queued_only = *(const bool *)arg;
  if (queued_only && (j->started || j->cut))
    return false;
  j->cut = true;
  for (int i = 0; j->kids && i < j->n_parts; i++) {
    pthread_mutex_lock(&j->kids[i].mu);
    j->kids[i].cut = true;
    pthread_mutex_unlock(&j->kids[i].mu);
  }
  return true;
}

int sl__srv_jobs_cut(sl_srv_jobs *reg, bool queued_only) {
  return sl__srv_jobs_abort_where(reg, pick_cut, &queued_only);
}

/* A finished job's failure, from the one reason table (sluice/reason.h):
 * here, with the job, so that json.c stays a leaf. */
void sl__srv_job_error(const sl_srv_job *j, sl_srv_error *e) {
  /* one table (sluice/reason.h) gives the code and the HTTP status */
  sl_reason reason =
      j->reason != SL_REASON_NONE ? j->reason : sl_reason_of_status(j->error);
  if (reason == SL_REASON_NONE)
    reason = SL_REASON_INTERNAL;
  const char *code = sl_reason_code(reason);
  sl__srv_error_set(e, sl_reason_http(reason), code[0] ? code : NULL, NULL,
                    "%s",
                    j->error_msg[0] ? j->error_msg : sl_reason_message(reason));
  e->est_bytes = j->est_bytes;
  e->limit_bytes = j->limit_bytes;
  if (reason == SL_REASON_PREFILL_MEMORY_EXCEEDED &&
      !strstr(e->message, "bytes"))
    snprintf(
        e->message + strlen(e->message), sizeof e->message - strlen(e->message),
        " (estimated %llu bytes, limit %llu bytes)",
        (unsigned long long)j->est_bytes, (unsigned long long)j->limit_bytes);
}

void sl__srv_model_release(sl_srv_model *m) {
  if (m->pool && m->lease.index >= 0)
    sl_pool_release(m->pool, &m->lease);
  m->lease.index = -1;
}
