/* The server's job (src/server/job.c) against a real engine on the
 * default model, without libmicrohttpd: what the HTTP front does with a
 * job, done here by hand (labels c;threaded: the engine's executor fills
 * the jobs while this thread waits on them).
 * - a job aborted mid-generation ends SL_FINISH_ABORT, early, and gives
 *   back the engine's reference; so do the choices of an n = 3 job;
 * - a stopping registry refuses new jobs (503 shutting_down);
 * - the shutdown's cut: queued jobs (not started) end at once as errors
 *   (shutting_down, "not started"), the running ones only at the second
 *   cut, as errors too (never as complete answers), an n = 2 job's
 *   choices included;
 * - every job is out of the live list at its end, holds only the test's
 *   reference, the open responses count down to 0, and the metrics count
 *   every finished job. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "default_model.h"
#include "harness.h"
#include "server/admin.h"
#include "server/job.h"
#include "sluice/engine.h"
#include "sluice/reason.h"
#include "sluice/sampler.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

#define WAIT_MS 120000 /* the engine under TSan on a busy machine */

static sl_model_t *g_model;
static sl_tokenizer_t *g_tok;
static sl_engine_t *g_eng;
static atomic_int g_notified;

static void count_notify(sl_srv_job *j) {
  (void)j;
  atomic_fetch_add(&g_notified, 1);
}

/* A completions job of `max_tokens` greedy tokens with n choices, as the
 * generation route makes it (the test holds its one reference). */
static sl_srv_job *make_job(sl_srv_jobs *reg, const char *prompt,
                            int max_tokens, int n) {
  sl_srv_job *j = sl__srv_job_new(reg, NULL);
  CHECK(j != NULL);
  j->mdl.lease.engine = g_eng;
  j->mdl.lease.tok = g_tok;
  j->req.api = SL_SRV_COMPLETIONS;
  j->req.n_choices = n;
  j->req.gen.max_tokens = max_tokens;
  j->req.gen.sampling = sl_sampler_defaults();
  j->req.gen.sampling.temperature = 0;
  j->req.gen.top_logprobs = -1;
  j->req.gen.ignore_eos = true;
  size_t ni = 0;
  CHECK_OK(sl_tokenizer_encode(g_tok, prompt, strlen(prompt), false, true,
                               &j->ids, &ni));
  j->n_ids = (int)ni;
  j->prompt_tokens = j->n_ids;
  if (n > 1)
    CHECK(sl__srv_job_make_kids(j, n));
  return j;
}

static void post(sl_srv_job *j) {
  sl_srv_error err;
  bool open = false;
  CHECK_OK(sl__srv_job_post(j, g_eng, SL_POOL_MEAN, &open, &err));
  CHECK(open);
}

/* Waits until the job (a parent: any of its choices) has `n` tokens or is
 * done; true when it got them. */
static bool wait_tokens(sl_srv_job *j, int n) {
  uint64_t t0 = sl_now_ns();
  for (;;) {
    int got = 0;
    bool done;
    pthread_mutex_lock(&j->mu);
    done = j->done;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < (j->kids ? j->n_parts : 1); i++) {
      sl_srv_job *k = j->kids ? &j->kids[i] : j;
      pthread_mutex_lock(&k->mu);
      if (k->n_toks > got)
        got = k->n_toks;
      pthread_mutex_unlock(&k->mu);
    }
    if (got >= n)
      return true;
    if (done || sl_now_ns() - t0 > (uint64_t)WAIT_MS * 1000000ull)
      return false;
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static bool started(sl_srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool s = j->started;
  pthread_mutex_unlock(&j->mu);
  return s;
}

static bool is_done(sl_srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool d = j->done;
  pthread_mutex_unlock(&j->mu);
  return d;
}

static int live(sl_srv_jobs *reg) {
  pthread_mutex_lock(&reg->mu);
  int n = reg->n;
  pthread_mutex_unlock(&reg->mu);
  return n;
}

/* The job at its end: out of the list, only the test's reference left
 * (the executor drops its own just after the DONE that wakes the test). */
static void check_released(sl_srv_jobs *reg, sl_srv_job *j) {
  CHECK(is_done(j));
  uint64_t t0 = sl_now_ns();
  while (atomic_load(&j->refs) > 1 &&
         sl_now_ns() - t0 < (uint64_t)WAIT_MS * 1000000ull) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECK_EQ_INT(atomic_load(&j->refs), 1);
  CHECK(!j->prev && !j->next);
  pthread_mutex_lock(&reg->mu);
  for (sl_srv_job *x = reg->head; x; x = x->next)
    CHECK(x != j);
  pthread_mutex_unlock(&reg->mu);
}

static const char *k_prompt =
    "Once upon a time, in a small village by the sea, there lived";

static void test_abort_mid_generation(void) {
  sl_srv_metrics m;
  sl__srv_metrics_init(&m);
  sl_srv_jobs reg;
  sl__srv_jobs_init(&reg, sl__srv_metrics_job, &m, count_notify);
  atomic_store(&g_notified, 0);

  sl_srv_job *j = make_job(&reg, k_prompt, 400, 1);
  post(j);
  CHECK_EQ_INT(atomic_load(&j->refs), 2); /* the test's, the engine's */
  CHECK(wait_tokens(j, 3));
  sl__srv_job_stop(j);
  sl__srv_job_stop(j); /* once: a second stop asks nothing */
  CHECK(sl__srv_job_wait(j, WAIT_MS));
  CHECK_EQ_INT(j->finish, SL_FINISH_ABORT);
  CHECK(j->aborted);
  CHECK(j->n_toks >= 3 && j->n_toks < 400);
  CHECK(j->completion_tokens < 400);
  CHECK(atomic_load(&g_notified) >= 1); /* at least its end */
  check_released(&reg, j);
  CHECK_EQ_INT(live(&reg), 0);
  /* its response is open until it is handed over */
  CHECK_EQ_INT(sl__srv_jobs_wait(&reg, 10), 1);
  sl__srv_jobs_closed(&reg);
  CHECK_EQ_INT(sl__srv_jobs_wait(&reg, 10), 0);
  sl__srv_job_unref(j);

  /* n = 3: the stop reaches every choice's engine request */
  sl_srv_job *p = make_job(&reg, k_prompt, 400, 3);
  post(p);
  CHECK_EQ_INT(atomic_load(&p->refs), 4); /* the test's, one per choice */
  CHECK(wait_tokens(p, 2));
  sl__srv_job_stop(p);
  CHECK(sl__srv_job_wait(p, WAIT_MS));
  for (int i = 0; i < 3; i++) {
    CHECK(is_done(&p->kids[i]));
    CHECK_EQ_INT(p->kids[i].finish, SL_FINISH_ABORT);
    CHECK(p->kids[i].n_toks < 400);
  }
  CHECK_EQ_INT(p->parts_done, 3);
  check_released(&reg, p);
  sl__srv_jobs_closed(&reg);
  CHECK_EQ_INT(sl__srv_jobs_wait(&reg, 10), 0);
  sl__srv_job_unref(p);

  pthread_mutex_lock(&m.mu);
  CHECK_EQ_INT(m.requests, 2);
  pthread_mutex_unlock(&m.mu);
  sl__srv_jobs_destroy(&reg);
  sl__srv_metrics_destroy(&m);
}

static void test_shutdown_in_flight(void) {
  sl_srv_metrics m;
  sl__srv_metrics_init(&m);
  sl_srv_jobs reg;
  sl__srv_jobs_init(&reg, sl__srv_metrics_job, &m, count_notify);

  /* max_seqs 3: a (1 sequence) and b (2 choices) run, c and d wait */
  sl_srv_job *a = make_job(&reg, k_prompt, 300, 1);
  sl_srv_job *b = make_job(&reg, "The three rules of the sea are", 300, 2);
  post(a);
  post(b);
  CHECK(wait_tokens(a, 2));
  CHECK(wait_tokens(b, 2));
  sl_srv_job *c = make_job(&reg, "A list of ten birds:", 300, 1);
  sl_srv_job *d = make_job(&reg, "Dear diary, today", 300, 1);
  post(c);
  post(d);
  CHECK_EQ_INT(live(&reg), 4);

  /* stopping: nothing new is posted */
  sl__srv_jobs_stop(&reg);
  CHECK(sl__srv_jobs_stopping(&reg));
  sl_srv_job *e = make_job(&reg, k_prompt, 8, 1);
  sl_srv_error err;
  bool open = true;
  CHECK(sl__srv_job_post(e, g_eng, SL_POOL_MEAN, &open, &err) != SL_OK);
  CHECK(!open);
  CHECK_EQ_INT(err.http, 503);
  CHECK(!strcmp(err.code, sl_reason_code(SL_REASON_SHUTTING_DOWN)));
  CHECK_EQ_INT(atomic_load(&e->refs), 1);
  sl__srv_job_unref(e);

  /* the first cut: the queued ones only */
  CHECK(!started(c) && !started(d));
  CHECK_EQ_INT(sl__srv_jobs_cut(&reg, true), 2);
  CHECK(sl__srv_job_wait(c, WAIT_MS));
  CHECK(sl__srv_job_wait(d, WAIT_MS));
  sl_srv_job *queued[] = {c, d};
  for (int i = 0; i < 2; i++) {
    sl_srv_job *x = queued[i];
    CHECK(x->cut);
    CHECK_EQ_INT(x->finish, SL_FINISH_ERROR);
    CHECK_EQ_INT(x->reason, SL_REASON_SHUTTING_DOWN);
    CHECK_EQ_INT(x->error, SL_ERR_CANCELLED);
    CHECK(strstr(x->error_msg, "not started") != NULL);
    CHECK_EQ_INT(x->n_toks, 0);
    check_released(&reg, x);
    sl__srv_jobs_closed(&reg);
  }
  /* the running ones go on */
  CHECK(!is_done(a) && !is_done(b) && !a->cut && !b->cut);
  CHECK(sl__srv_jobs_wait(&reg, 10) == 4); /* 2 live, 2 open */

  /* the second cut: everything left ends as an error */
  CHECK_EQ_INT(sl__srv_jobs_cut(&reg, false), 3); /* a, b's 2 choices */
  CHECK(sl__srv_job_wait(a, WAIT_MS));
  CHECK(sl__srv_job_wait(b, WAIT_MS));
  CHECK_EQ_INT(a->finish, SL_FINISH_ERROR);
  CHECK_EQ_INT(a->reason, SL_REASON_SHUTTING_DOWN);
  CHECK(strstr(a->error_msg, "cut off after") != NULL);
  CHECK(a->n_toks >= 2 && a->n_toks < 300);
  CHECK_EQ_INT(b->finish, SL_FINISH_ERROR); /* from its choices */
  CHECK_EQ_INT(b->reason, SL_REASON_SHUTTING_DOWN);
  for (int i = 0; i < 2; i++) {
    CHECK(b->kids[i].cut);
    CHECK_EQ_INT(b->kids[i].finish, SL_FINISH_ERROR);
    CHECK_EQ_INT(b->kids[i].reason, SL_REASON_SHUTTING_DOWN);
  }
  check_released(&reg, a);
  check_released(&reg, b);
  CHECK_EQ_INT(live(&reg), 0);
  CHECK_EQ_INT(sl__srv_jobs_cut(&reg, false), 0); /* nothing left */
  CHECK_EQ_INT(sl__srv_jobs_wait(&reg, 10), 2);   /* a's, b's responses */
  sl__srv_jobs_closed(&reg);
  sl__srv_jobs_closed(&reg);
  CHECK_EQ_INT(sl__srv_jobs_wait(&reg, 10), 0);

  pthread_mutex_lock(&m.mu);
  CHECK_EQ_INT(m.requests, 4);
  CHECK_EQ_INT(m.requests_failed, 4);
  pthread_mutex_unlock(&m.mu);
  sl__srv_job_unref(a);
  sl__srv_job_unref(b);
  sl__srv_job_unref(c);
  sl__srv_job_unref(d);
  sl__srv_jobs_destroy(&reg);
  sl__srv_metrics_destroy(&m);
}

int main(void) {
  int rc = load_default_model(&g_model, &g_tok);
  if (rc)
    return rc;
  sl_engine_config cfg = sl_engine_config_defaults();
  cfg.device = SL_ENGINE_DEVICE_CPU;
  cfg.n_ctx = 512;
  cfg.kv_block_tokens = 16;
  cfg.kv_blocks = 256;
  cfg.n_threads = 2;
  cfg.max_seqs = 3;
  if (sl_engine_create(g_model, g_tok, &cfg, &g_eng) != SL_OK) {
    fprintf(stderr, "cannot create the engine\n");
    return 1;
  }
  RUN(test_abort_mid_generation);
  RUN(test_shutdown_in_flight);
  sl_engine_free(g_eng);
  sl_tokenizer_free(g_tok);
  sl_model_free(g_model);
  return sl_test_finish();
}
