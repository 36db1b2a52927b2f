/* sluice — engine: the store worker, and restores from the tiers.
 *
 * The store worker (one thread per engine, with its own stream) copies
 * finished prefix blocks out of the KV pool into the tiers (today: the SSD
 * tier) without blocking the executor:
 *   - the executor, publishing a block, takes a reference on it (so the
 *     pool cannot evict and reuse it) and queues it with an event: the
 *     point on the engine stream after which the block's K/V is written;
 *   - the worker takes a batch, waits for the events, then, holding the
 *     buffer-access lock, submits one copy task on its own stream that
 *     names the pool's buffer (a use recorded on the store stream, I1) and
 *     waits for it; the lock is released before any file I/O;
 *   - it writes each block to the tier, then hands the block ids back; the
 *     executor drops the references at its next step (sl__store_collect).
 * The queue is bounded: when the disk is slower than the producer, the
 * oldest unwritten blocks are dropped (and counted); decode never waits.
 *
 * Restores run on the executor at admission (sl__store_restore): each
 * block is read from the first tier that holds it into host memory (its
 * checksum checked), and one task on the engine stream copies them into
 * the pool blocks the request was given, ahead of the request's own
 * prefill in stream order. The copy task frees the host memory, so the
 * executor never waits. A block read from below the first tier (SSD) is
 * queued to the store worker as a published block is, which promotes it
 * to the tiers above (hot).
 *
 * On CUDA the pool is device memory: the same tasks enqueue asynchronous
 * copies (cudaMemcpyAsync) between it and page-locked host memory, on the
 * store stream (stores: the worker waits for them under the lock) or the
 * engine stream (restores). A restore's page-locked staging buffer cannot
 * be freed by its task, which runs at submission: the executor keeps it
 * until the engine stream has passed the copy (sl__store_collect), then
 * reuses it for the next restore or frees it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_impl.h"
#include "sluice/alloc.h"
#include "sluice/kern_cuda.h"
#include "sluice/kv_tier.h"
#include "sluice/memsync.h"
#include "sluice/util.h"

#define STORE_QUEUE   1024 /* blocks waiting to be written, at most */
#define STORE_BATCH   8    /* blocks per copy task (and per lock hold) */
#define RESTORE_GROUP 64   /* blocks per restore task */
#define STAGING_KEEP  4    /* idle page-locked restore buffers kept (CUDA) */
#define READERS                                                                \
  3 /* threads that read a restore's files, besides                            \
       the executor */
_Static_assert(RESTORE_GROUP <= SL_KCU_KV_BLOCKS_MAX, "a group in one launch");

typedef struct store_item {
  int block;
  uint64_t hash;
  sl_event ev;
  int32_t *tokens; /* block_tokens, owned */
} store_item;

/* A tier's block lent to a restore's copy (sl_kv_tier_get_ref). */
typedef struct lent {
  sl_kv_tier_t *tier;
  void *hold;
} lent;

/* What a restore group's copy reads, in flight until the engine stream
 * passes `seq`: its page-locked staging buffer (CUDA; NULL when none) and
 * the tier blocks lent to it. Idle buffers kept for reuse lend nothing.
 * Executor only. */
typedef struct staging {
  void *p;
  size_t cap;
  uint64_t seq;
  lent *lent; /* n_lent, owned */
  int n_lent;
} staging;

/* One block a restore reads by a copy (from SSD), and how that went. */
typedef struct read_job {
  sl_kv_tier_t *tier;
  sl_kv_block_key key;
  void *dst;
  size_t n;
  sl_status st;
} read_job;

typedef struct sl__store {
  sl_engine_t *e;
  bool gpu; /* the pool is CUDA device memory */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  store_item q[STORE_QUEUE]; /* ring */
  int head, n;
  int *done; /* block ids to unref (executor) */
  int n_done, cap_done;
  bool stopping;
  sl_engine_store_stats st;
  staging *busy; /* restores in flight (executor) */
  int n_busy, cap_busy;
  staging idle[STAGING_KEEP]; /* done, kept for reuse (executor) */
  int n_idle;
  /* the readers: a group's jobs, taken in order by them and the executor */
  pthread_mutex_t rmu;
  pthread_cond_t rcv, rdone;
  read_job *jobs;
  int n_jobs, next_job, jobs_done;
  bool rstop;
  pthread_t readers[READERS];
  int n_readers;
} sl__store;

/* The store queue's invariants, with s->mu held (store_queue_sanity checks
 * them where the queue changes hands: an enqueue, the worker's take of a
 * batch, a hand-back, a collect):
 *   - the ring: 0 <= head < STORE_QUEUE, 0 <= n <= STORE_QUEUE;
 *   - each queued item names a block of the pool, owns its token ids, and
 *     carries an event of the engine stream (the point after which the
 *     block's K/V is written);
 *   - done[0..n_done) are blocks of the pool, n_done <= cap_done, and done
 *     is NULL exactly when cap_done is 0;
 *   - every block queued or handed back holds the pool reference that the
 *     enqueue took until sl__store_collect drops it (refcount >= 1; read
 *     only where the caller is the executor, which owns the counts);
 *   - each block queued is written, failed, dropped, still queued or in
 *     the worker's batch: queued - written - failed - dropped - n is
 *     0..STORE_BATCH. */
static bool store_queue_sanity(const sl__store *s, const sl_kv_pool_t *kv) {
  const sl_engine_t *e = s->e;
  int nb = sl_kv_config_of(e->kv)->n_blocks;
  if (s->head < 0 || s->head >= STORE_QUEUE || s->n < 0 || s->n > STORE_QUEUE)
    return false;
  for (int i = 0; i < s->n; i++) {
    const store_item *it = &s->q[(s->head + i) % STORE_QUEUE];
    if (it->block < 0 || it->block >= nb || !it->tokens ||
        it->ev.stream != e->stream)
      return false;
    if (kv && sl_kv_block_refcount(kv, it->block) < 1)
      return false;
  }
  if (s->n_done < 0 || s->n_done > s->cap_done || (!s->done) != !s->cap_done)
    return false;
  for (int i = 0; i < s->n_done; i++)
    if (s->done[i] < 0 || s->done[i] >= nb ||
        (kv && sl_kv_block_refcount(kv, s->done[i]) < 1))
      return false;
  uint64_t out = s->st.written + s->st.failed + s->st.dropped + (uint64_t)s->n;
  return s->st.queued >= out && s->st.queued - out <= STORE_BATCH;
}

/* ---- the copy tasks ---------------------------------------------------- */

/* Blocks out of the pool (out = true) or into it: for each block, for each
 * layer, K then V (the tier's byte order, kv_tier.h). */
typedef struct copy_arg {
  sl_buf_t *pool;
  sl_kv_view view;
  int n;
  int blocks[RESTORE_GROUP]; /* >= STORE_BATCH */
  uint8_t *host;             /* out: n * block bytes */
  /* in: each block's bytes (in a staging buffer, or a tier's own memory
   * held by a reference until the stream passes the task) */
  const uint8_t *src[RESTORE_GROUP];
  sl_buf_t *stage; /* CUDA: n * block bytes of device memory, or NULL */
  bool out;
  bool free_host; /* the task frees `host` when done (restores) */
  int delay_ms;   /* a test's long read (sl__engine_test_hooks) */
} copy_arg;

static sl_status copy_task(const sl_task_ctx *ctx, void *p) {
  (void)ctx;
  copy_arg *a = p;
  if (a->delay_ms)
    usleep((useconds_t)a->delay_ms * 1000u);
  uint16_t *base = sl_buf_ptr(a->pool);
  size_t half = sl_kv_view_half_elems(&a->view);
  size_t span = (size_t)a->view.block_tokens * (size_t)a->view.kv_dim;
  size_t span_b = span * sizeof(uint16_t);
  uint8_t *h = a->host;
  for (int i = 0; i < a->n; i++) {
    const uint8_t *in = a->out ? NULL : a->src[i];
    for (int l = 0; l < a->view.n_layer; l++) {
      size_t k = sl_kv_view_k_offset(&a->view, l, a->blocks[i]);
      uint16_t *kp = base + k, *vp = base + half + k;
      if (a->out) {
        memcpy(h, kp, span_b);
        memcpy(h + span_b, vp, span_b);
        h += 2 * span_b;
      } else {
        memcpy(kp, in, span_b);
        memcpy(vp, in + span_b, span_b);
        in += 2 * span_b;
      }
    }
  }
  if (a->free_host)
    free(a->host);
  return SL_OK;
}

/* The same on a CUDA pool: asynchronous copies on the task's stream, which
 * a sync (stores) or the engine stream's order (restores) waits for. With
 * a device staging buffer, the group crosses PCIe as one copy and one
 * launch moves its blocks between the staging buffer and the pool
 * (sl_kcu_kv_blocks); without one (it could not be had), one copy per
 * block, layer and half. */
static sl_status copy_task_cuda(const sl_task_ctx *ctx, void *p) {
  copy_arg *a = p;
  if (a->delay_ms)
    usleep((useconds_t)a->delay_ms * 1000u); /* before the enqueue */
  uint16_t *base = sl_buf_ptr(a->pool);
  size_t half = sl_kv_view_half_elems(&a->view);
  size_t span = (size_t)a->view.block_tokens * (size_t)a->view.kv_dim;
  size_t span_b = span * sizeof(uint16_t);
  uint8_t *h = a->host;
  sl_status st = SL_OK;
  if (a->stage) {
    uint16_t *d = sl_buf_ptr(a->stage);
    size_t bytes = (size_t)a->n * (size_t)a->view.n_layer * 2 * span_b;
    if (a->out) {
      st = sl_kcu_kv_blocks(ctx->native, base, a->view.n_layer,
                            a->view.n_blocks, span, a->blocks, a->n, d, true);
      if (st == SL_OK)
        st = sl_kcu_copy_d2h(ctx->native, h, d, bytes);
    } else {
      /* one copy per run of blocks adjacent in host memory (the staging
       * buffer's), one per block held in a tier's page-locked slot */
      size_t bb = bytes / (size_t)a->n;
      for (int i = 0, j; i < a->n && st == SL_OK; i = j) {
        for (j = i + 1; j < a->n && a->src[j] == a->src[j - 1] + bb; j++)
          ;
        st = sl_kcu_copy_h2d(ctx->native, (uint8_t *)d + (size_t)i * bb,
                             a->src[i], (size_t)(j - i) * bb);
      }
      if (st == SL_OK)
        st =
            sl_kcu_kv_blocks(ctx->native, base, a->view.n_layer,
                             a->view.n_blocks, span, a->blocks, a->n, d, false);
    }
    return st;
  }
  for (int i = 0; i < a->n && st == SL_OK; i++) {
    const uint8_t *in = a->out ? NULL : a->src[i];
    for (int l = 0; l < a->view.n_layer && st == SL_OK; l++) {
      size_t k = sl_kv_view_k_offset(&a->view, l, a->blocks[i]);
      uint16_t *kp = base + k, *vp = base + half + k;
      if (a->out) {
        st = sl_kcu_copy_d2h(ctx->native, h, kp, span_b);
        if (st == SL_OK)
          st = sl_kcu_copy_d2h(ctx->native, h + span_b, vp, span_b);
        h += 2 * span_b;
      } else {
        st = sl_kcu_copy_h2d(ctx->native, kp, in, span_b);
        if (st == SL_OK)
          st = sl_kcu_copy_h2d(ctx->native, vp, in + span_b, span_b);
        in += 2 * span_b;
      }
    }
  }
  return st;
}

/* ---- the hot tier's page-locked slots (CUDA) ----------------------------- */

#define SLAB_SLOTS 32 /* slots per page-locked allocation */

/* Fixed-size slots carved from page-locked chunks, which stay until the
 * engine ends (page-locking is slow, and cudaFreeHost waits for the
 * device): the hot tier's payloads on CUDA (sl_kv_ram_config.pay_alloc),
 * so that a restore's copy to the device reads them where they are. */
typedef struct sl__pinned {
  pthread_mutex_t mu;
  size_t slot;
  void **chunks;
  int n_chunks;
  void **free_slots; /* a stack; room for every slot of every chunk */
  int n_free;
} sl__pinned;

sl__pinned *sl__pinned_create(size_t slot) {
  sl__pinned *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->slot = (slot + 255) & ~(size_t)255; /* each slot 256-byte aligned */
  pthread_mutex_init(&p->mu, NULL);
  return p;
}

void *sl__pinned_alloc(void *ctx, size_t n) {
  sl__pinned *p = ctx;
  void *r = NULL;
  pthread_mutex_lock(&p->mu);
  if (n <= p->slot && !p->n_free) {
    void **c = realloc(p->chunks, sizeof *c * (size_t)(p->n_chunks + 1));
    void **f = c ? realloc(p->free_slots,
                           sizeof *f * (size_t)(p->n_chunks + 1) * SLAB_SLOTS)
                 : NULL;
    if (c)
      p->chunks = c;
    if (f)
      p->free_slots = f;
    uint8_t *m = f ? sl_kcu_host_alloc(p->slot * SLAB_SLOTS) : NULL;
    if (m) {
      p->chunks[p->n_chunks++] = m;
      for (int i = SLAB_SLOTS - 1; i >= 0; i--)
        p->free_slots[p->n_free++] = m + (size_t)i * p->slot;
    }
  }
  if (n <= p->slot && p->n_free)
    r = p->free_slots[--p->n_free];
  pthread_mutex_unlock(&p->mu);
  return r;
}

void sl__pinned_free(void *ctx, void *ptr) {
  sl__pinned *p = ctx;
  pthread_mutex_lock(&p->mu);
  p->free_slots[p->n_free++] = ptr; /* room: see free_slots */
  pthread_mutex_unlock(&p->mu);
}

void sl__pinned_destroy(sl__pinned *p) {
  if (!p)
    return;
  for (int i = 0; i < p->n_chunks; i++)
    sl_kcu_host_free(p->chunks[i]);
  free(p->chunks);
  free(p->free_slots);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* ---- the worker -------------------------------------------------------- */

static void hand_back(sl__store *s, const store_item *it, int n) {
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < n; i++) {
    if (s->n_done == s->cap_done) {
      int cap = s->cap_done ? 2 * s->cap_done : 64;
      int *d = realloc(s->done, sizeof *d * (size_t)cap);
      if (!d)
        abort(); /* a lost id would pin a block forever */
      s->done = d;
      s->cap_done = cap;
    }
    s->done[s->n_done++] = it[i].block;
  }
  SL_ASSERT(store_queue_sanity(s, NULL)); /* the worker's thread, or a drop */
  pthread_mutex_unlock(&s->mu);
}

static void *store_main(void *p) {
  sl__store *s = p;
  sl_engine_t *e = s->e;
  const sl_kv_config *kc = sl_kv_config_of(e->kv);
  size_t bb =
      (size_t)sl_kv_block_bytes(kc->n_layer, kc->kv_dim, kc->block_tokens);
  uint8_t *host =
      s->gpu ? sl_kcu_host_alloc(bb * STORE_BATCH) : malloc(bb * STORE_BATCH);
  sl_stream_t *own = sl_thread_stream(e->dev);
  /* CUDA: the batch's device staging buffer, the worker's for its life (a
   * use of it is recorded with each copy, like the pool's) */
  sl_buf_t *stage = NULL;
  if (s->gpu && own && sl_buf_alloc(own, bb * STORE_BATCH, &stage) != SL_OK)
    stage = NULL; /* the copies go block by block */
  store_item batch[STORE_BATCH];
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->n && !s->stopping)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->n) { /* stopping, and everything written */
      pthread_mutex_unlock(&s->mu);
      break;
    }
    int n = s->n < STORE_BATCH ? s->n : STORE_BATCH;
    for (int i = 0; i < n; i++)
      batch[i] = s->q[(s->head + i) % STORE_QUEUE];
    s->head = (s->head + n) % STORE_QUEUE;
    s->n -= n;
    SL_ASSERT(store_queue_sanity(s, NULL));
    pthread_mutex_unlock(&s->mu);
    copy_arg a = {.pool = sl_kv_buffer(e->kv),
                  .view = sl_kv_view_of(e->kv),
                  .n = n,
                  .host = host,
                  .stage = stage,
                  .out = true,
                  .delay_ms = e->hooks.store_copy_delay_ms};
    sl_buf_t *bufs[2] = {a.pool, stage};
    sl_status st = host ? SL_OK : SL_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
      a.blocks[i] = batch[i].block;
      /* the block's K/V is written once the engine stream passes this;
       * waited for before the lock, so that a hold is the copy alone */
      if (st == SL_OK)
        st = sl_stream_wait_seq(batch[i].ev.stream, batch[i].ev.seq);
    }
    if (st == SL_OK) {
      sl_buffer_access_lock(e->dev);
      uint64_t t0 = sl_now_ns(), seq = 0;
      st = sl_stream_submit(own, s->gpu ? copy_task_cuda : copy_task, &a,
                            sizeof a, bufs, stage ? 2 : 1, &seq);
      if (st == SL_OK)
        st = sl_stream_sync(own);
      uint64_t held = sl_now_ns() - t0;
      sl_buffer_access_unlock(e->dev);
      /* the protocol's own evidence: the copy was a use of the pool on
       * this stream, and no clear found it in flight */
      bool unrecorded = st == SL_OK && sl_buf_use_seq(a.pool, own) < seq;
      uint64_t at_clear = sl_stream_clear_evidence(own).others.clears;
      pthread_mutex_lock(&s->mu);
      s->st.copies_unrecorded += unrecorded;
      s->st.copies_at_clear = at_clear;
      s->st.lock_holds++;
      s->st.lock_ns_total += held;
      if (held > s->st.lock_ns_max)
        s->st.lock_ns_max = held;
      for (int b = 0; b < SL_STORE_HOLD_BUCKETS; b++)
        if (held <= sl_engine_store_hold_bucket_ns(b)) {
          s->st.lock_hold_hist[b]++;
          break;
        }
      pthread_mutex_unlock(&s->mu);
    }
    for (int i = 0; i < n; i++) {
      sl_status ps = SL_ERR_STATE;
      if (st == SL_OK) {
        sl_kv_block_key k = {kc->fingerprint, batch[i].hash, batch[i].tokens};
        /* every tier; a block is written if one of them took it (a
         * tier that already held it counts as taking it) */
        for (int j = 0; j < e->n_tiers; j++)
          if (sl_kv_tier_put(e->tiers[j], &k, host + (size_t)i * bb, bb) ==
              SL_OK)
            ps = SL_OK;
      }
      pthread_mutex_lock(&s->mu);
      if (ps == SL_OK)
        s->st.written++;
      else
        s->st.failed++;
      pthread_mutex_unlock(&s->mu);
      free(batch[i].tokens);
    }
    hand_back(s, batch, n);
  }
  if (stage)
    sl_buf_release(stage); /* its last copy was waited for */
  if (s->gpu)
    sl_kcu_host_free(host);
  else
    free(host);
  sl_clear_thread_streams(); /* I5 */
  return NULL;
}

/* ---- the readers ------------------------------------------------------- */

/* Takes and runs jobs until none is left to take; called with rmu held,
 * returns with it held. */
static void read_jobs_locked(sl__store *s) {
  while (s->jobs && s->next_job < s->n_jobs) {
    read_job *j = &s->jobs[s->next_job++];
    pthread_mutex_unlock(&s->rmu);
    j->st = sl_kv_tier_get(j->tier, &j->key, j->dst, j->n);
    pthread_mutex_lock(&s->rmu);
    if (++s->jobs_done == s->n_jobs)
      pthread_cond_signal(&s->rdone);
  }
}

static void *reader_main(void *p) {
  sl__store *s = p;
  pthread_mutex_lock(&s->rmu);
  for (;;) {
    while (!s->rstop && !(s->jobs && s->next_job < s->n_jobs))
      pthread_cond_wait(&s->rcv, &s->rmu);
    if (s->rstop)
      break;
    read_jobs_locked(s);
  }
  pthread_mutex_unlock(&s->rmu);
  return NULL;
}

/* Runs n jobs on the readers and this thread (the executor); returns when
 * all are done. The files are read in parallel: a disk answers several
 * reads at once faster than one after another. */
static void read_all(sl__store *s, read_job *jobs, int n) {
  if (!n)
    return;
  pthread_mutex_lock(&s->rmu);
  s->jobs = jobs;
  s->n_jobs = n;
  s->next_job = s->jobs_done = 0;
  if (n > 1)
    pthread_cond_broadcast(&s->rcv);
  read_jobs_locked(s);
  while (s->jobs_done < s->n_jobs)
    pthread_cond_wait(&s->rdone, &s->rmu);
  s->jobs = NULL;
  s->n_jobs = 0;
  pthread_mutex_unlock(&s->rmu);
}

sl_status sl__store_start(sl_engine_t *e) {
  sl__store *s = calloc(1, sizeof *s);
  if (!s)
    return SL_ERR_NOMEM;
  s->e = e;
  s->gpu = sl_device_kind_of(e->dev) == SL_DEVICE_CUDA;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_mutex_init(&s->rmu, NULL);
  pthread_cond_init(&s->rcv, NULL);
  pthread_cond_init(&s->rdone, NULL);
  if (pthread_create(&s->thread, NULL, store_main, s) != 0) {
    pthread_cond_destroy(&s->rdone);
    pthread_cond_destroy(&s->rcv);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return SL_ERR_THREAD;
  }
  /* CUDA with the SSD tier: two page-locked staging buffers now, at load
   * (a group's reads fill one while the other's copy runs), rather than
   * page-locking them during the first restores after a restart */
  if (s->gpu && e->cfg.ssd_cache_dir) {
    const sl_kv_config *kc = sl_kv_config_of(e->kv);
    size_t n =
        (size_t)sl_kv_block_bytes(kc->n_layer, kc->kv_dim, kc->block_tokens) *
        RESTORE_GROUP;
    for (int i = 0; i < 2; i++) {
      void *p = sl_kcu_host_alloc(n);
      if (p)
        s->idle[s->n_idle++] = (staging){p, n, 0, NULL, 0};
    }
  }
  /* fewer readers (none) only make restores slower */
  while (s->n_readers < READERS &&
         pthread_create(&s->readers[s->n_readers], NULL, reader_main, s) == 0)
    s->n_readers++;
  e->store = s;
  return SL_OK;
}

void sl__store_enqueue(sl_engine_t *e, int block, uint64_t hash,
                       const int32_t *tokens, sl_event ev) {
  sl__store *s = e->store;
  int T = e->cfg.kv_block_tokens;
  int32_t *t = malloc(sizeof *t * (size_t)T);
  if (!t)
    return;
  memcpy(t, tokens, sizeof *t * (size_t)T);
  sl_kv_block_ref(e->kv, block); /* held until the worker hands it back */
  pthread_mutex_lock(&s->mu);
  if (s->n == STORE_QUEUE) {
    /* the disk is behind: the oldest unwritten block goes */
    store_item old = s->q[s->head];
    s->head = (s->head + 1) % STORE_QUEUE;
    s->n--;
    s->st.dropped++;
    pthread_mutex_unlock(&s->mu);
    free(old.tokens);
    hand_back(s, &old, 1);
    pthread_mutex_lock(&s->mu);
  }
  s->q[(s->head + s->n) % STORE_QUEUE] =
      (store_item){.block = block, .hash = hash, .ev = ev, .tokens = t};
  s->n++;
  s->st.queued++;
  SL_ASSERT(store_queue_sanity(s, e->kv)); /* the executor: counts readable */
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- page-locked restore buffers (CUDA; executor only) ------------------ */

/* Once nothing reads them: the lent blocks go back to their tiers, the
 * buffer is kept idle or freed. */
static void staging_release(sl__store *s, staging g) {
  for (int i = 0; i < g.n_lent; i++)
    sl_kv_tier_unref(g.lent[i].tier, g.lent[i].hold);
  free(g.lent);
  if (!g.p)
    return;
  if (s->n_idle < STAGING_KEEP)
    s->idle[s->n_idle++] = (staging){g.p, g.cap, 0, NULL, 0};
  else
    sl_kcu_host_free(g.p);
}

/* Groups whose copy the engine stream has passed are released; wait: wait
 * for every one (at the end). */
static void staging_reap(sl_engine_t *e, sl__store *s, bool wait) {
  int k = 0;
  for (int i = 0; i < s->n_busy; i++) {
    staging g = s->busy[i];
    if (wait)
      (void)sl_stream_wait_seq(e->stream, g.seq);
    if (wait || sl_stream_done(e->stream, g.seq))
      staging_release(s, g);
    else
      s->busy[k++] = g;
  }
  s->n_busy = k;
}

static void *staging_take(sl__store *s, size_t n, size_t *cap) {
  for (int i = 0; i < s->n_idle; i++)
    if (s->idle[i].cap >= n) {
      void *p = s->idle[i].p;
      *cap = s->idle[i].cap;
      s->idle[i] = s->idle[--s->n_idle];
      return p;
    }
  return NULL;
}

/* A page-locked buffer of at least n bytes: an idle one, else one whose
 * copy the engine stream has passed (an earlier group's, often), else a
 * new one of `full` bytes (a whole group's, so that it serves any). */
static void *staging_get(sl_engine_t *e, sl__store *s, size_t n, size_t full,
                         size_t *cap) {
  void *p = staging_take(s, n, cap);
  if (!p && s->n_busy) {
    staging_reap(e, s, false);
    p = staging_take(s, n, cap);
  }
  if (p)
    return p;
  *cap = full > n ? full : n;
  return sl_kcu_host_alloc(*cap);
}

/* After the group's copy was submitted as task g.seq of the engine
 * stream: kept until the stream passes it. */
static void staging_submitted(sl_engine_t *e, sl__store *s, staging g) {
  if (s->n_busy == s->cap_busy) {
    int c = s->cap_busy ? 2 * s->cap_busy : 8;
    staging *b = realloc(s->busy, sizeof *b * (size_t)c);
    if (!b) { /* cannot keep it: wait for the copy, then release */
      (void)sl_stream_wait_seq(e->stream, g.seq);
      staging_release(s, g);
      return;
    }
    s->busy = b;
    s->cap_busy = c;
  }
  s->busy[s->n_busy++] = g;
}

void sl__store_collect(sl_engine_t *e) {
  sl__store *s = e->store;
  if (!s)
    return;
  if (s->n_busy)
    staging_reap(e, s, false);
  int ids[256];
  for (;;) {
    pthread_mutex_lock(&s->mu);
    SL_ASSERT(store_queue_sanity(s, e->kv)); /* the executor */
    int n = s->n_done < 256 ? s->n_done : 256;
    if (n) /* done is NULL until the first hand-back */
      memcpy(ids, s->done + s->n_done - n, sizeof *ids * (size_t)n);
    s->n_done -= n;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
      sl_kv_block_unref(e->kv, ids[i]);
    if (n < 256)
      return;
  }
}

void sl__store_stop(sl_engine_t *e) {
  sl__store *s = e->store;
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->stopping = true; /* the worker writes what is queued, then ends */
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&s->rmu);
  s->rstop = true;
  pthread_cond_broadcast(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
  for (int i = 0; i < s->n_readers; i++)
    pthread_join(s->readers[i], NULL);
  pthread_cond_destroy(&s->rdone);
  pthread_cond_destroy(&s->rcv);
  pthread_mutex_destroy(&s->rmu);
  sl__store_collect(e);
  staging_reap(e, s, true);
  for (int i = 0; i < s->n_idle; i++)
    sl_kcu_host_free(s->idle[i].p);
  free(s->busy);
  free(s->done);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
  e->store = NULL;
}

bool sl_engine_tier_stats(sl_engine_t *e, int i, sl_kv_tier_stats *tier,
                          sl_engine_store_stats *store) {
  if (i < 0 || i >= e->n_tiers)
    return false;
  if (tier)
    *tier = sl_kv_tier_stats_of(e->tiers[i]);
  sl__store *s = e->store;
  if (store) {
    memset(store, 0, sizeof *store);
    if (s) {
      pthread_mutex_lock(&s->mu);
      *store = s->st;
      store->pending = (uint64_t)s->n;
      pthread_mutex_unlock(&s->mu);
    }
  }
  return true;
}

uint64_t sl_engine_store_hold_bucket_ns(int b) {
  return sl_lock_hist_bound_ns(b); /* the clears' histogram's bounds */
}

sl_access_lock_stats sl_engine_clear_lock_stats(sl_engine_t *e) {
  return sl_buffer_access_stats(e->dev);
}

/* ---- restores ------------------------------------------------------------ */

/* One group of up to RESTORE_GROUP blocks: read, then one copy task. */
static int restore_group(sl_engine_t *e, const int32_t *tokens, uint64_t *h,
                         const int32_t *blocks, int n) {
  const sl_kv_config *kc = sl_kv_config_of(e->kv);
  int T = kc->block_tokens;
  size_t bb = (size_t)sl_kv_block_bytes(kc->n_layer, kc->kv_dim, T);
  sl__store *s = e->store;
  size_t cap = 0;
  uint8_t *host = NULL; /* for the blocks read by a copy, if any */
  uint64_t hashes[RESTORE_GROUP];
  int from[RESTORE_GROUP];      /* the tier each block came from */
  lent held[RESTORE_GROUP];     /* blocks read in place from a tier */
  int held_at[RESTORE_GROUP];   /* their places in the group */
  read_job jobs[RESTORE_GROUP]; /* blocks read by a copy */
  int job_of[RESTORE_GROUP];    /* a block's job, or -1 */
  int n_held = 0, n_jobs = 0;
  copy_arg a = {.pool = sl_kv_buffer(e->kv),
                .view = sl_kv_view_of(e->kv),
                .out = false,
                .free_host = !s->gpu};
  uint64_t hh = *h;
  uint64_t t_look = sl_now_ns();
  int got = 0;
  for (; got < n; got++) {
    const int32_t *bt = tokens + (size_t)got * (size_t)T;
    uint64_t nh = sl_kv_hash_block(e->kv, hh, bt, T);
    sl_kv_block_key k = {kc->fingerprint, nh, bt};
    bool found = false;
    int j = 0;
    for (; j < e->n_tiers && !found; j++) {
      /* in place where the tier can lend it (the hot tier: no copy on
       * the executor; on CUDA its slots are page-locked), else a read
       * into the staging buffer, run below with the group's others */
      const void *p = NULL;
      void *hold = NULL;
      sl_status gs = sl_kv_tier_get_ref(e->tiers[j], &k, &p, bb, &hold);
      if (gs == SL_OK) {
        a.src[got] = p;
        held_at[n_held] = got;
        held[n_held++] = (lent){e->tiers[j], hold};
        job_of[got] = -1;
        found = true;
      } else if (gs == SL_ERR_UNSUPPORTED && sl_kv_tier_peek(e->tiers[j], &k)) {
        jobs[n_jobs] = (read_job){e->tiers[j], k, NULL, bb, SL_OK};
        job_of[got] = n_jobs++;
        found = true;
      }
    }
    if (!found)
      break; /* missing: computed instead */
    from[got] = j - 1;
    hashes[got] = hh = nh;
  }
  t_look = sl_now_ns() - t_look;
  /* the staging buffer, only for reads (a restore from the hot tier
   * alone needs none: on CUDA, page-locking one costs milliseconds) */
  if (n_jobs) {
    host = s->gpu ? staging_get(e, s, bb * (size_t)got,
                                bb * (size_t)RESTORE_GROUP, &cap)
                  : malloc(bb * (size_t)got);
    if (!host) {
      for (int i = 0; i < n_held; i++)
        sl_kv_tier_unref(held[i].tier, held[i].hold);
      return 0;
    }
    for (int i = 0; i < got; i++)
      if (job_of[i] >= 0)
        a.src[i] = jobs[job_of[i]].dst = host + (size_t)i * bb;
  }
  a.host = host;
  uint64_t r0 = sl_now_ns();
  read_all(s, jobs, n_jobs);
  uint64_t read_ns = sl_now_ns() - r0;
  /* a block that failed its read (bad, then dropped) ends the chain */
  for (int i = 0; i < got; i++)
    if (job_of[i] >= 0 && jobs[job_of[i]].st != SL_OK) {
      got = i;
      hh = i ? hashes[i - 1] : *h;
      break;
    }
  int n_read = 0;
  for (int i = 0; i < got; i++)
    n_read += job_of[i] >= 0;
  int kept = 0; /* lent blocks past the chain's end go back */
  for (int i = 0; i < n_held; i++)
    if (held_at[i] < got)
      held[kept++] = held[i];
    else
      sl_kv_tier_unref(held[i].tier, held[i].hold);
  n_held = kept;
  if (n_jobs) {
    pthread_mutex_lock(&e->mu);
    e->stats.restore_read_blocks += (uint64_t)n_read;
    e->stats.restore_read_bytes += (uint64_t)n_read * bb;
    e->stats.restore_read_ns += read_ns;
    pthread_mutex_unlock(&e->mu);
  }
  a.n = got;
  memcpy(a.blocks, blocks, sizeof *blocks * (size_t)got);
  uint64_t t_sub = sl_now_ns();
  /* CUDA: a device staging buffer for the group, released at once: its
   * use on the engine stream keeps it until the copy has run (I1) */
  if (s->gpu && got &&
      sl_buf_alloc(e->stream, bb * (size_t)got, &a.stage) != SL_OK)
    a.stage = NULL; /* the copies go block by block */
  sl_buf_t *bufs[2] = {a.pool, a.stage};
  uint64_t seq = 0;
  sl_status ss = SL_ERR_NOT_FOUND;
  if (got)
    ss = sl_stream_submit(e->stream, s->gpu ? copy_task_cuda : copy_task, &a,
                          sizeof a, bufs, a.stage ? 2 : 1, &seq);
  if (a.stage)
    sl_buf_release(a.stage);
  SL_LOGD("restore: %d of %d blocks (%d lent, %d read): lookups %.2f ms, "
          "reads %.2f ms, staging and copy submitted in %.2f ms",
          got, n, n_held, n_read, sl_ns_to_ms(t_look), sl_ns_to_ms(read_ns),
          sl_ns_to_ms(sl_now_ns() - t_sub));
  staging g = {s->gpu ? host : NULL, cap, seq, NULL, 0};
  if (ss != SL_OK) { /* nothing reads them */
    if (!s->gpu)
      free(host);
    for (int i = 0; i < n_held; i++)
      sl_kv_tier_unref(held[i].tier, held[i].hold);
    staging_release(s, g);
    return 0;
  }
  /* what the copy reads stays until the engine stream passes it (on the
   * CPU its task frees the host buffer itself) */
  if (n_held && (g.lent = malloc(sizeof *g.lent * (size_t)n_held))) {
    memcpy(g.lent, held, sizeof *g.lent * (size_t)n_held);
    g.n_lent = n_held;
  } else if (n_held) { /* cannot keep the list: wait for the copy */
    (void)sl_stream_wait_seq(e->stream, seq);
    for (int i = 0; i < n_held; i++)
      sl_kv_tier_unref(held[i].tier, held[i].hold);
  }
  if (g.p || g.n_lent)
    staging_submitted(e, s, g);
  /* found by later lookups at once: their prefill runs after this copy on
   * the same stream */
  for (int i = 0; i < got; i++)
    sl_kv_publish(e->kv, blocks[i], hashes[i], tokens + (size_t)i * (size_t)T);
  /* promotion: a block read from a lower tier (SSD) goes to the tiers
   * above it (hot) as a published block does, through the store worker,
   * which copies it out of the pool once this copy has run (the tiers
   * that hold it already only count a use) */
  sl_event ev;
  bool have_ev = false;
  for (int i = 0; i < got; i++) {
    if (!from[i])
      continue;
    if (!have_ev && sl_event_record(e->stream, &ev) != SL_OK)
      break;
    have_ev = true;
    sl__store_enqueue(e, blocks[i], hashes[i], tokens + (size_t)i * (size_t)T,
                      ev);
  }
  *h = hh;
  return got;
}

int sl__store_restore(sl_engine_t *e, const int32_t *tokens, uint64_t parent,
                      const int32_t *blocks, int n) {
  if (!e->n_tiers || n <= 0)
    return 0;
  int T = e->cfg.kv_block_tokens;
  uint64_t t0 = sl_now_ns();
  uint64_t h = parent;
  int done = 0;
  while (done < n) {
    int want = n - done < RESTORE_GROUP ? n - done : RESTORE_GROUP;
    int got = restore_group(e, tokens + (size_t)done * (size_t)T, &h,
                            blocks + done, want);
    done += got;
    if (got < want)
      break;
  }
  if (done) {
    pthread_mutex_lock(&e->mu);
    e->stats.restored_blocks += (uint64_t)done;
    e->stats.restore_ns += sl_now_ns() - t0;
    pthread_mutex_unlock(&e->mu);
  }
  return done;
}

bool sl__tiers_hold(sl_engine_t *e, const sl_kv_block_key *key, bool all) {
  for (int i = 0; i < e->n_tiers; i++) {
    /* all: the store's check (not a lookup of a prefix, so not a miss) */
    bool held = all ? sl_kv_tier_peek(e->tiers[i], key)
                    : sl_kv_tier_contains(e->tiers[i], key);
    if (held != all)
      return !all;
  }
  return all && e->n_tiers > 0;
}
