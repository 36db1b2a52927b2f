/* sluice — server: the job, one generation or embeddings request between
 * its submission to the engine and its answer (job.c); and the registry of
 * the live jobs, which the hang-up watch and the shutdown walk.
 *
 * The API has the shape of llama.cpp's server_response_reader: post the
 * request's engine tasks (sl__srv_job_post: one per choice, or one per
 * embeddings input), wait for all of them (sl__srv_job_wait; the HTTP
 * front never waits: it parks the connection and is woken through the
 * registry's notify hook), stop them (sl__srv_job_stop). Nothing here
 * knows libmicrohttpd: the connection fields below are the reply layer's
 * (reply.c), kept in the job because they share its mutex.
 *
 * Who writes what, under which lock:
 *   - the connection's pool thread, before sl__srv_job_post (the job is
 *     not shared yet, no lock): req, ids, n_ids, id, created, fd, mdl,
 *     kids, parts, emb, n_embd, n_parts, index, parent, srv, reg;
 *   - that thread, under mu, as each engine request is queued: engine_id,
 *     parts[i].engine_id, submitted, parts_next (the executor too, for an
 *     embeddings job's later inputs);
 *   - the engine's executor thread (on_event, on_embed_event, kid_event in
 *     job.c), under mu (a child's events also take the parent's mu, parent
 *     first, never a child's then its parent's): text, toks, started,
 *     done, oom, the token counts, finish, error, reason, error_msg,
 *     est_bytes, limit_bytes, t_first, t_done, parts_done; it calls the
 *     registry's notify with mu held;
 *   - the connection's pool threads (reply.c, generate.c, openai.c,
 *     anthropic.c, toolcall.c), under mu: conn, parked, watched, phase,
 *     sent_text, sent_toks, ant_blocks, ant_open, out, out_off, calls,
 *     calls_read, await, http10; once detached (libmicrohttpd closed the
 *     connection of a client that half-closed), the watch's thread
 *     (detach.c) in their place;
 *   - probed: under mu by the watch's thread (reply.c's reap_parked);
 *   - resumed: set under mu by whoever wakes the connection (the executor
 *     through notify, the stopping thread), cleared by a pool thread;
 *   - aborted: under mu by sl__srv_job_stop (any thread) and by the
 *     hang-up watch's thread (sockwatch.c's tick, reap_parked in reply.c);
 *   - cut: under mu by the stopping thread (sl__srv_jobs_cut);
 *   - prev, next: under the registry's mu;
 *   - refs: atomic, any thread.
 *
 * Invariants (sl__srv_job_sanity checks them, with mu held):
 *   - refs >= 1 while the job is reachable; the connection holds one, each
 *     engine request one from submit to its DONE (a child's: one on its
 *     parent), a streaming response one until libmicrohttpd frees it, and
 *     the registry's walkers one while they abort outside its lock;
 *   - a child (parent != NULL) has no children and no parts, its index
 *     is in [0, parent->n_parts) and parent->kids[index] is itself;
 *   - a parent of n choices has n_parts == n children, parts[i].job ==
 *     &kids[i]; an embeddings job has parts[i].job == itself, an emb of
 *     n_parts * n_embd floats;
 *   - 0 <= parts_done <= n_parts;
 *   - n_toks <= toks_cap (a parent's n_toks, set at its end, counts its
 *     choices' tokens, which it does not hold); text is NUL-terminated at
 *     text_len < text_cap (once allocated), and the last token's text ends
 *     inside it;
 *   - sent_toks <= n_toks; out_off <= out.len; resumed only when parked. */
#ifndef SLUICE_SERVER_JOB_H
#define SLUICE_SERVER_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "server/parse.h"
#include "server/reasoning.h"
#include "server/toolcall.h"
#include "sluice/engine.h"
#include "sluice/pool.h"
#include "sluice/reason.h"
#include "sluice/server.h"

struct MHD_Connection; /* libmicrohttpd's: the reply layer's only */

typedef struct sl_srv_tok {
  int32_t id;
  float logprob;
  size_t text_off, text_len; /* the event's text in job->text */
  int n_top;
  sl_token_logprob top[SL_MAX_TOP_LOGPROBS];
} sl_srv_tok;

typedef struct sl_srv_job sl_srv_job;
typedef struct sl_srv_jobs sl_srv_jobs;

/* A model as one request uses it: its pool lease (engine, model, tokenizer,
 * chat template, context) while the request lives. routes.c leases it
 * (sl__srv_model_acquire, setting srv and pool); whoever holds it lets it
 * go with sl__srv_model_release (job.c, for a job's). */
typedef struct sl_srv_model {
  sl_server_t *srv;    /* the leasing side's (routes.c) */
  sl_pool_t *pool;     /* NULL: nothing leased yet */
  sl_pool_lease lease; /* index -1: none */
} sl_srv_model;

/* Gives the lease back (a no-op without one). */
void sl__srv_model_release(sl_srv_model *m);

/* The most inputs of one embeddings job in the engine at once. */
#define SL_SRV_EMBED_WINDOW 32

/* One input of an embeddings job, or one choice of n: the engine
 * callback's user pointer. */
typedef struct sl_srv_emb_part {
  sl_srv_job *job;
  int index;
  uint64_t engine_id; /* 0: not submitted */
} sl_srv_emb_part;

struct sl_srv_job {
  atomic_int refs;
  sl_srv_jobs *reg; /* the registry it is posted to */
  sl_server_t *srv; /* the reply layer's (NULL outside a server) */
  sl_srv_model mdl; /* the parent's (children use their parent's) */
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* broadcast at each event */
  sl_srv_job *prev, *next; /* the registry's list of live jobs */

  sl_srv_request req;
  int32_t *ids;
  int n_ids;
  uint64_t engine_id;
  bool submitted;
  char id[48]; /* "chatcmpl-...", "cmpl-...", "msg_..." */
  long long created;
  int fd; /* the client's socket, to notice a hang-up */
  /* the connection while it waits on the engine (under mu; NULL once MHD
   * completed it): parked = suspended by the handler until the engine's
   * next event resumes it (resumed); reply.c */
  struct MHD_Connection *conn;
  bool parked, resumed;
  bool watched; /* fd registered with sl__srv_watch_hangup */

  /* filled by the engine callback, under mu */
  char *text;
  size_t text_len, text_cap;
  sl_srv_tok *toks;
  int n_toks, toks_cap;
  bool started, done, oom;
  int prompt_tokens, cached_tokens, completion_tokens;
  int draft_accepted, draft_rejected; /* speculative drafts, every request
                                         of the answer */
  sl_finish finish;
  sl_status error;
  sl_reason reason; /* sluice/reason.h */
  char error_msg[256];
  uint64_t est_bytes, limit_bytes;
  uint64_t t_submit, t_first, t_done;

  /* n > 1: one child job per choice (its text, tokens, finish), which the
   * engine's events fill; the parent holds the connection and answers for
   * all. A child's req is a shallow copy of the parent's (never freed). */
  sl_srv_job *kids, *parent;
  int index; /* the choice's index (0 for a lone job) */
  /* embeddings: one part per input; the vectors (n_inputs, n_embd);
   * children: their engine ids. An embeddings job has at most
   * SL_SRV_EMBED_WINDOW inputs in the engine at once: parts_next is the
   * first not yet submitted (the posting thread sets the first window,
   * then the executor submits one more as each input ends, under mu) */
  sl_srv_emb_part *parts;
  int n_parts, parts_done, parts_next;
  sl_pooling pooling; /* an embeddings job's (set before it is posted) */
  float *emb;
  int n_embd;

  /* tools: the answer's calls, read once it is done (sl__srv_job_calls) */
  sl_srv_toolcalls calls;
  bool calls_read;

  /* the thinking budget (job.c): budget_total is the request's max_tokens
   * (0: no budget) while the first engine request generates only
   * req.think_budget; at its end the thinking is closed (close_ids, when
   * still open) and a second request continues the answer from the prompt
   * and the tokens so far (budget_went; budget_base: the tokens before
   * it). Written by the posting thread, then by the executor under mu. */
  int budget_total, budget_base;
  bool budget_went;
  int32_t *close_ids;
  int n_close;

  /* the consumer's (HTTP thread's) state */
  int phase;        /* streaming state machine, per API */
  size_t sent_text; /* with tools: text bytes streamed as content (or
                       skipped as leading blanks) */
  int ant_blocks;   /* Anthropic: content blocks started */
  bool ant_open;    /* Anthropic: a text block is open */
  int sent_toks;    /* token records already streamed */
  bool aborted;     /* we asked the engine to abort */
  bool cut;         /* ... because the server is shutting down (under mu): the
                       abort ends it as an error (503), not as complete */
  bool await;       /* parked for its answer: no byte of it was sent */
  bool http10;      /* an HTTP/1.0 request: no 1xx may be sent to it */
  bool probed;      /* a 100 Continue went out to learn whether a client
                       that shut its side still reads (reply.c) */
  bool detached;    /* libmicrohttpd gave the connection up to a client
                       that half-closed; detach.c answers it */
  sl_sbuf out;      /* bytes produced and not yet handed to MHD */
  size_t out_off;
  /* reasoning (reasoning.c): the answer's split, fed text[0..rs_fed);
   * sent_reason / sent_content: bytes of rs.reasoning / rs.content
   * streamed; ant_think: Anthropic's open block is a thinking block */
  sl_srv_rsplit rs;
  bool rs_on;
  size_t rs_fed, sent_reason, sent_content;
  bool ant_think;
};

/* Records a finished job (no lock held; it may take j->mu). */
typedef void (*sl_srv_job_record)(void *arg, sl_srv_job *j, bool failed);

/* The live jobs of one server (or of a test), and the count of responses
 * not yet handed to their clients. */
struct sl_srv_jobs {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast when a job leaves or a response closes */
  sl_srv_job *head;  /* live jobs (posted, not yet done) */
  int n;
  int n_open;    /* generation requests whose response MHD has not yet
                  * reported complete (delivered or failed) */
  bool stopping; /* no job is posted any more */
  /* each finished job is recorded through it, with record_arg (NULL:
   * not recorded): admin.c's sl__srv_metrics_job, which the front
   * registers, so that the job knows no metrics */
  sl_srv_job_record record;
  void *record_arg;
  /* called with j->mu held whenever the consumer has news: the job is
   * done, or it streams and had an event (NULL: nobody to tell; waiters
   * use j->cv). Must not block. */
  void (*notify)(sl_srv_job *j);
};

/* Initializes *reg (record and its arg borrowed; record may be NULL). */
void sl__srv_jobs_init(sl_srv_jobs *reg, sl_srv_job_record record,
                       void *record_arg, void (*notify)(sl_srv_job *j));
/* After every job left and nobody uses it. */
void sl__srv_jobs_destroy(sl_srv_jobs *reg);
/* From here on sl__srv_job_post refuses (503 shutting_down). */
void sl__srv_jobs_stop(sl_srv_jobs *reg);
bool sl__srv_jobs_stopping(sl_srv_jobs *reg);
/* A response counted by sl__srv_job_post was handed over or failed. */
void sl__srv_jobs_closed(sl_srv_jobs *reg);
/* Waits until no job is live and no response is open, or `ms` pass.
 * Returns the number of jobs still live plus responses still open. */
int sl__srv_jobs_wait(sl_srv_jobs *reg, unsigned ms);
/* Aborts the engine requests of the live jobs that `pick` chooses: it is
 * called with the registry's mu and j->mu held, for each job that was
 * submitted, is not done and whose ids fit in what is left of this call's
 * 64 (a job with more, alone); it may mark the job. The aborts run
 * outside both locks, each job referenced until its own. Returns the
 * number of engine requests asked. Any thread but the executor's. */
int sl__srv_jobs_abort_where(sl_srv_jobs *reg,
                             bool (*pick)(sl_srv_job *j, void *arg), void *arg);
/* Shutdown: marks the live jobs (only those not yet started, with
 * queued_only) as cut and aborts them, so that they end as errors (503
 * shutting_down), not as complete answers. Returns how many engine
 * requests were asked (at most 64 a call: call again while it returns
 * more than 0 and jobs are live). */
int sl__srv_jobs_cut(sl_srv_jobs *reg, bool queued_only);

/* A new job for reg with one reference (the caller's), no model leased
 * (mdl.lease.index -1), no socket; srv may be NULL. NULL when out of
 * memory. */
sl_srv_job *sl__srv_job_new(sl_srv_jobs *reg, sl_server_t *srv);
void sl__srv_job_ref(sl_srv_job *j);
/* Drops a reference; the last frees the job, its children, its request
 * and its model lease. */
void sl__srv_job_unref(sl_srv_job *j);
/* n > 1: a child job per choice, each its own engine request with the
 * seed + its index (so that sampled choices differ and stay
 * reproducible); before sl__srv_job_post; false when out of memory. */
bool sl__srv_job_make_kids(sl_srv_job *j, int n);
/* Registers the job and submits its engine requests to `eng`: the prompt
 * j->ids with j->req.gen, once per choice; or, for an embeddings job
 * (j->req.api SL_SRV_EMBEDDINGS, j->n_embd set), one request per input
 * with `pooling`. Each request holds a reference until its DONE. SL_OK:
 * something runs (a later choice or input that could not be queued ends
 * the job failed, and the rest is aborted). Otherwise nothing runs: *err
 * holds the answer (503 shutting_down, 400 context_length_exceeded, ...),
 * the job is in no list and holds only the caller's references. *open is
 * set once the job was registered: a response is then counted open until
 * the caller calls sl__srv_jobs_closed (after handing it over), whether
 * the post succeeded or not. The caller's thread, no lock held. */
sl_status sl__srv_job_post(sl_srv_job *j, sl_engine_t *eng, sl_pooling pooling,
                           bool *open, sl_srv_error *err);
/* Waits until the job is done or `ms` pass (0: no limit); true when done.
 * For callers that may block (tests, tools): the HTTP front parks
 * instead. */
bool sl__srv_job_wait(sl_srv_job *j, unsigned ms);
/* Asks the engine to abort the job's requests (once; a no-op for a job
 * not submitted or done). Each ends with its DONE event (SL_FINISH_ABORT).
 * Any thread but the executor's; j->mu not held. */
void sl__srv_job_stop(sl_srv_job *j);
/* Whether the job's answer can start (j->mu held): it is done, or it
 * streams and has begun. */
static inline bool sl__srv_job_ready(const sl_srv_job *j) {
  return j->done || (j->req.stream && (j->started || j->n_toks > 0));
}
/* Whether it failed before any of its answer could go out (j->mu held):
 * then it is answered as an error, not as a body or a stream. */
static inline bool sl__srv_job_failed_early(const sl_srv_job *j) {
  return j->done && j->finish == SL_FINISH_ERROR &&
         (!j->req.stream || j->n_toks == 0);
}

/* A job the engine finished with SL_FINISH_ERROR, as an API error: the
 * code and status from sluice/reason.h's table, the engine's words. */
void sl__srv_job_error(const sl_srv_job *j, sl_srv_error *e);
/* The job's invariants (see above), j->mu held: for SL_ASSERT only. */
bool sl__srv_job_sanity(const sl_srv_job *j);

/* The job's model (a child's is its parent's). */
static inline const sl_pool_lease *sl__srv_job_lease(const sl_srv_job *j) {
  return &(j->parent ? j->parent : j)->mdl.lease;
}

/* A new random id with the prefix ("chatcmpl-", "req_", ...) in buf. */
void sl__srv_make_id(char *buf, size_t cap, const char *prefix);

#endif
