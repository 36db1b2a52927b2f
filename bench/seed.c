#include "seed.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt/experiment.h"
#include "sluice/kern.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

typedef struct engine_job {
  sl_device_t *dev;
  int trials;
  double target_ms;
  int idle_iters;
  sl_seed_result *r;
  sl_status st;
} engine_job;

/* Two ping-pong buffers X0, X1 and a matrix A; product i reads X[i%2] and
 * writes X[(i+1)%2], so each depends on the one before. */
typedef struct chain {
  sl_buf_t *A, *X[2];
  int n;
} chain;

static sl_status chain_make(sl_stream_t *s, int n, chain *c) {
  size_t bytes = (size_t)n * (size_t)n * sizeof(float);
  memset(c, 0, sizeof *c);
  c->n = n;
  sl_status st;
  if ((st = sl_buf_alloc(s, bytes, &c->A)) != SL_OK ||
      (st = sl_buf_alloc(s, bytes, &c->X[0])) != SL_OK ||
      (st = sl_buf_alloc(s, bytes, &c->X[1])) != SL_OK)
    return st;
  float *h = sl_malloc(bytes);
  if (!h)
    return SL_ERR_NOMEM;
  /* entries of variance 1/n keep the chain's scale near 1 */
  uint64_t x = 0x9E3779B97F4A7C15ull;
  float scale = sqrtf(3.0f / (float)n);
  for (size_t i = 0; i < (size_t)n * (size_t)n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h[i] = ((float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * scale;
  }
  st = sl_buf_write(c->A, 0, h, bytes);
  if (st == SL_OK)
    st = sl_buf_write(c->X[0], 0, h, bytes);
  sl_free(h);
  return st;
}

static void chain_free(chain *c) {
  sl_buf_release(c->A);
  sl_buf_release(c->X[0]);
  sl_buf_release(c->X[1]);
}

static sl_status chain_queue(sl_stream_t *s, chain *c, int len) {
  for (int i = 0; i < len; i++) {
    sl_status st = sl_kern_sgemm(s, c->A, c->X[i & 1], c->X[(i + 1) & 1], c->n,
                                 c->n, c->n, 1.0f);
    if (st != SL_OK)
      return st;
  }
  return SL_OK;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static sl_status engine_body(engine_job *j) {
  sl_device_t *dev = j->dev;
  sl_seed_result *r = j->r;
  sl_stream_t *eng = sl_thread_stream(dev);
  if (!eng)
    return SL_ERR_NOMEM;
  sl_stream_t *gen = sl_generation_stream(dev);
  sl_stream_t *def = sl_device_default_stream(dev);
  r->engine_stream_id = sl_stream_id(eng);
  r->generation_stream_id = sl_stream_id(gen);
  r->default_stream_id = sl_stream_id(def);
  snprintf(r->engine_stream, sizeof r->engine_stream, "%s",
           sl_stream_name(eng));
  snprintf(r->generation_stream, sizeof r->generation_stream, "%s",
           sl_stream_name(gen));
  snprintf(r->default_stream, sizeof r->default_stream, "%s",
           sl_stream_name(def));
  r->streams_distinct = eng != gen && eng != def && gen != def &&
                        r->engine_stream_id != r->generation_stream_id &&
                        r->engine_stream_id != r->default_stream_id &&
                        r->generation_stream_id != r->default_stream_id;

  int n = r->kind == SL_DEVICE_CUDA ? 4096 : 256;
  chain c;
  sl_status st = chain_make(eng, n, &c);
  if (st != SL_OK)
    goto out_chain;
  /* calibrate: warm up, then time a few products synchronously */
  if ((st = chain_queue(eng, &c, 2)) != SL_OK ||
      (st = sl_stream_sync(eng)) != SL_OK)
    goto out_chain;
  int probe = r->kind == SL_DEVICE_CUDA ? 8 : 4;
  uint64_t t0 = sl_now_ns();
  if ((st = chain_queue(eng, &c, probe)) != SL_OK ||
      (st = sl_stream_sync(eng)) != SL_OK)
    goto out_chain;
  double one = sl_ns_to_ms(sl_now_ns() - t0) / probe;
  int len = (int)lround(j->target_ms / (one > 1e-3 ? one : 1e-3));
  if (len < 3)
    len = 3;
  if (len > 2000)
    len = 2000;
  r->n = n;
  r->chain_len = len;
  t0 = sl_now_ns();
  if ((st = chain_queue(eng, &c, len)) != SL_OK ||
      (st = sl_stream_sync(eng)) != SL_OK)
    goto out_chain;
  r->chain_ms = sl_ns_to_ms(sl_now_ns() - t0);
  /* one correction: the short probe above is noisy */
  if (r->chain_ms > 0 &&
      fabs(r->chain_ms - j->target_ms) > 0.2 * j->target_ms) {
    len = (int)lround(len * j->target_ms / r->chain_ms);
    len = len < 3 ? 3 : len > 2000 ? 2000 : len;
    r->chain_len = len;
    t0 = sl_now_ns();
    if ((st = chain_queue(eng, &c, len)) != SL_OK ||
        (st = sl_stream_sync(eng)) != SL_OK)
      goto out_chain;
    r->chain_ms = sl_ns_to_ms(sl_now_ns() - t0);
  }

  for (int i = 0; i < j->trials; i++) {
    sl_seed_trial *t = &r->t[i];
    /* (a) the bare clear: drains the default stream only */
    if ((st = chain_queue(eng, &c, len)) != SL_OK)
      goto out_chain;
    t0 = sl_now_ns();
    if ((st = sl__rt_experiment_bare_clear(dev)) != SL_OK)
      goto out_chain;
    t->bare_return_ms = sl_ns_to_ms(sl_now_ns() - t0);
    t->bare_pending_tasks = sl_stream_query(eng).tasks;
    /* the bare clear did not drain the engine stream: its evidence is on
     * the engine stream, as work of others' clears */
    sl_stream_evidence ev = sl_stream_clear_evidence(eng);
    t->bare_inflight_bytes = ev.others.bytes_last;
    if ((st = sl_stream_sync(eng)) != SL_OK) /* the watch is stamped */
      goto out_chain;
    t->bare_inflight_ms = sl_stream_clear_evidence(eng).others.ms_last;

    /* (b) the owning clear: drains the engine stream first */
    if ((st = chain_queue(eng, &c, len)) != SL_OK)
      goto out_chain;
    t->owning_pending_before = sl_stream_query(eng).tasks;
    t0 = sl_now_ns();
    if ((st = sl_sync_and_clear_cache(eng)) != SL_OK)
      goto out_chain;
    t->owning_return_ms = sl_ns_to_ms(sl_now_ns() - t0);
    t->owning_pending_tasks = sl_stream_query(eng).tasks;
    sl_alloc_stats a = sl_alloc_get_stats(dev);
    t->owning_inflight_bytes = a.inflight_bytes_last;
    t->owning_inflight_ms = a.inflight_ms_last;
  }
  r->trials = j->trials;

  /* the idle cost of the owning clear */
  double *us = sl_malloc(sizeof(double) * (size_t)j->idle_iters);
  if (!us) {
    st = SL_ERR_NOMEM;
    goto out_chain;
  }
  for (int i = 0; i < j->idle_iters; i++) {
    t0 = sl_now_ns();
    sl_sync_and_clear_cache(eng);
    us[i] = (double)(sl_now_ns() - t0) / 1e3;
  }
  qsort(us, (size_t)j->idle_iters, sizeof *us, cmp_double);
  r->idle_clear_us = us[j->idle_iters / 2];
  sl_free(us);
out_chain:
  chain_free(&c);
  sl_sync_and_clear_cache(eng);
  r->clears = sl_alloc_get_stats(dev).clears;
  return st;
}

static void *engine_main(void *p) {
  engine_job *j = p;
  j->st = engine_body(j);
  sl_clear_thread_streams(); /* I5 */
  return NULL;
}

sl_status sl_seed_run(sl_device_kind kind, int trials, double target_chain_ms,
                      int idle_iters, sl_seed_result *out) {
  if (trials < 1 || trials > SL_SEED_MAX_TRIALS || idle_iters < 1 || !out)
    return SL_ERR_INVALID_ARG;
  memset(out, 0, sizeof *out);
  out->kind = kind;
  sl_device_t *dev;
  sl_status st = sl_device_get(kind, 0, &dev);
  if (st != SL_OK)
    return st;
  int before = sl_device_stream_count(dev);
  engine_job j = {dev, trials, target_chain_ms, idle_iters, out, SL_OK};
  pthread_t th;
  if (pthread_create(&th, NULL, engine_main, &j) != 0)
    return SL_ERR_THREAD;
  pthread_join(th, NULL);
  out->thread_streams_cleared = sl_device_stream_count(dev) == before;
  return j.st;
}
