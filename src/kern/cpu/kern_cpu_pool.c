/* sluice — kern/cpu: the kernel thread pool.
 *
 * n-1 persistent workers wait for a job generation to move. They spin (with
 * pause) for a while after each job, so that back-to-back jobs (decode runs
 * ~200 matmuls per token) start in well under a microsecond, then sleep on a
 * condition variable.
 *
 * A job is n_threads shares, fn(ctx, 0..n-1, n): the same partition
 * whatever runs it, so a result never depends on which thread computed a
 * share. The shares are claimed, not assigned: the caller and each worker
 * take the next unclaimed share until none is left, and the caller then
 * waits only for the shares still running. A worker that the OS has not
 * scheduled (other processes on the cores, or another engine's pool) holds
 * no share, so its part does not wait for its time slice: the caller runs
 * it. With a fixed share per thread, two 2-thread processes on 2 cores ran
 * 5 to 12 times slower than alone (every job waited for a descheduled
 * worker: test_engine_guard 6 s alone, 77 s beside another test). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "kern_cpu_impl.h"
#include "sluice/util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SL__PAUSE() _mm_pause()
#else
#define SL__PAUSE() ((void)0)
#endif

enum { SPIN_WORKER = 20000, SPIN_CALLER = 2000 };

struct sl_kern_pool {
  int n_threads;
  pthread_t *threads;      /* [n_threads - 1] */
  struct worker_arg *args; /* [n_threads - 1] */

  void (*fn)(void *ctx, int ith, int nth);
  void *ctx;
  /* (job generation << 32) | the next share to claim: a new generation
   * publishes a job (fn, ctx); a claim is a compare-and-swap that keeps
   * the generation, so a worker late from an earlier job claims nothing */
  _Atomic uint64_t ticket;
  _Atomic int done;     /* shares of the current job finished */
  _Atomic int sleepers; /* workers blocked in cond_wait */
  _Atomic bool stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;

  void *scratch; /* matmul's activation buffer */
  size_t scratch_cap;
};

struct worker_arg {
  sl_kern_pool_t *pool;
  int ith;
};

static unsigned gen_of(uint64_t ticket) {
  return (unsigned)(ticket >> 32);
}

/* Claims and runs shares of job `g` until none is left (or the job is no
 * longer g's: it ended, and another began). */
static void run_shares(sl_kern_pool_t *pool, unsigned g) {
  const int n = pool->n_threads;
  uint64_t t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
  for (;;) {
    if (gen_of(t) != g || (int)(uint32_t)t >= n)
      return;
    if (!atomic_compare_exchange_weak_explicit(&pool->ticket, &t, t + 1,
                                               memory_order_acq_rel,
                                               memory_order_acquire))
      continue; /* t reloaded */
    /* the claim holds job g open (its caller waits for this share), so
     * fn and ctx are still g's */
    pool->fn(pool->ctx, (int)(uint32_t)t, n);
    atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
  }
}

static void *worker_main(void *p) {
  struct worker_arg *a = p;
  sl_kern_pool_t *pool = a->pool;
  unsigned seen = 0;
  for (;;) {
    unsigned g;
    int spins = 0;
    while ((g = gen_of(atomic_load_explicit(&pool->ticket,
                                            memory_order_acquire))) == seen &&
           !atomic_load_explicit(&pool->stop, memory_order_relaxed)) {
      if (++spins < SPIN_WORKER) {
        SL__PAUSE();
        continue;
      }
      pthread_mutex_lock(&pool->mu);
      atomic_fetch_add(&pool->sleepers, 1);
      while (gen_of(atomic_load(&pool->ticket)) == seen &&
             !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->cv, &pool->mu);
      atomic_fetch_sub(&pool->sleepers, 1);
      pthread_mutex_unlock(&pool->mu);
      spins = 0;
    }
    if (atomic_load(&pool->stop))
      return NULL;
    seen = g;
    run_shares(pool, g);
  }
}

sl_kern_pool_t *sl_kern_pool_create(int n_threads) {
  if (n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  sl_kern_pool_t *pool = sl_calloc(1, sizeof *pool);
  if (!pool)
    return NULL;
  pool->n_threads = n_threads;
  if (pthread_mutex_init(&pool->mu, NULL) != 0)
    goto fail_pool;
  if (pthread_cond_init(&pool->cv, NULL) != 0)
    goto fail_mutex;
  int nw = n_threads - 1;
  if (nw > 0) {
    pool->threads = sl_calloc((size_t)nw, sizeof *pool->threads);
    pool->args = sl_calloc((size_t)nw, sizeof *pool->args);
    if (!pool->threads || !pool->args)
      goto fail_arrays;
  }
  int started = 0;
  for (; started < nw; started++) {
    pool->args[started] = (struct worker_arg){pool, started + 1};
    if (pthread_create(&pool->threads[started], NULL, worker_main,
                       &pool->args[started]) != 0)
      goto fail_threads;
  }
  return pool;

fail_threads:
  pthread_mutex_lock(&pool->mu);
  atomic_store(&pool->stop, true);
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < started; i++)
    pthread_join(pool->threads[i], NULL);
fail_arrays:
  sl_free(pool->args);
  sl_free(pool->threads);
  pthread_cond_destroy(&pool->cv);
fail_mutex:
  pthread_mutex_destroy(&pool->mu);
fail_pool:
  sl_free(pool);
  return NULL;
}

void sl_kern_pool_destroy(sl_kern_pool_t *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->mu);
  atomic_store(&pool->stop, true);
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n_threads - 1; i++)
    pthread_join(pool->threads[i], NULL);
  sl_free(pool->args);
  sl_free(pool->threads);
  pthread_cond_destroy(&pool->cv);
  pthread_mutex_destroy(&pool->mu);
  sl_free(pool->scratch);
  sl_free(pool);
}

int sl_kern_pool_n_threads(const sl_kern_pool_t *pool) {
  return pool ? pool->n_threads : 1;
}

void sl_kern_pool_run(sl_kern_pool_t *pool,
                      void (*fn)(void *ctx, int ith, int nth), void *ctx) {
  if (!pool || pool->n_threads == 1) {
    fn(ctx, 0, 1);
    return;
  }
  pool->fn = fn;
  pool->ctx = ctx;
  /* every share of the last job finished before it returned: no worker
   * adds to `done` until it claims one of this job's */
  atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
  unsigned g = gen_of(atomic_load(&pool->ticket)) + 1;
  /* seq_cst: publishes fn, ctx and done, and orders the sleepers check */
  atomic_store(&pool->ticket, (uint64_t)g << 32);
  if (atomic_load(&pool->sleepers) > 0) {
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
  }
  run_shares(pool, g);
  int spins = 0;
  while (atomic_load_explicit(&pool->done, memory_order_acquire) <
         pool->n_threads) {
    if (++spins < SPIN_CALLER)
      SL__PAUSE();
    else
      sched_yield();
  }
}

void *sl__kern_pool_scratch(sl_kern_pool_t *pool, size_t bytes) {
  SL_ASSERT(pool != NULL);
  if (bytes <= pool->scratch_cap)
    return pool->scratch;
  size_t cap = bytes + bytes / 4 + 64;
  void *p = sl_malloc(cap);
  if (!p)
    return NULL;
  sl_free(pool->scratch);
  pool->scratch = p;
  pool->scratch_cap = cap;
  return p;
}
