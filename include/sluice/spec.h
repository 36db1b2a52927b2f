/* sluice — engine: speculative decoding (issue 47).
 *
 * A drafter proposes the next few tokens of a sequence from what it has
 * seen; the target model scores them all in one pass (the drafted tokens
 * are a short prompt extension) and greedy decoding keeps the longest
 * prefix it agrees with plus its own next token. Because a token's logits
 * do not depend on how its sequence was cut into passes (DESIGN.md I9),
 * speculative greedy output equals plain greedy output bit for bit, logits
 * included. Drafters sit behind one interface (sl_drafter): prompt lookup
 * is the first; a draft model, suffix decoding or prediction heads plug in
 * the same way. The engine speculates in its steps (scheduler.c); this
 * header also has the greedy loop over a single-sequence context that
 * `sluice run --speculative ngram` uses.
 */
#ifndef SLUICE_SPEC_H
#define SLUICE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/status.h"
#include "sluice/tokenizer.h"

/* Prompt lookup (model-free n-gram drafts). */
typedef struct sl_draft_params {
  int n_max;     /* tokens drafted at most (k), >= 1 */
  int n_min;     /* fewer would be drafted: draft none, >= 1 */
  int ngram_max; /* the longest suffix looked up, >= ngram_min */
  int ngram_min; /* the shortest, >= 1 */
} sl_draft_params;

/* n_max 8, n_min 1, ngram_max 4, ngram_min 2. */
sl_draft_params sl_draft_defaults(void);

/* False (and a message in err) unless every field is in range. */
bool sl_draft_params_ok(const sl_draft_params *p, char *err, size_t errcap);

/* The drafts for a sequence whose tokens so far are hist[0..n): the longest
 * suffix of hist, ngram_max tokens down to ngram_min, that also occurs
 * earlier in hist; of its occurrences the latest; what followed it there,
 * up to n_max tokens (and never past the end of hist), into out. Returns
 * that count, or 0 when no suffix recurs or fewer than n_min tokens would
 * be proposed. O(n * ngram_max) per call. */
int sl_draft_lookup(const sl_draft_params *p, const int32_t *hist, int n,
                    int32_t *out);

/* ---- the drafter interface ----
 *
 * A drafter proposes the next tokens of sequences and learns, per
 * sequence, how many of its proposals the target kept. A sequence's state
 * (sl_draft_seq) is made when it first drafts and freed when it ends; a
 * drafter serves many sequences, from one thread at a time. */
typedef struct sl_drafter sl_drafter;
typedef struct sl_draft_seq sl_draft_seq;

typedef struct sl_drafter_ops {
  const char *name;
  /* A sequence's state; ref[0..n_ref) (may be NULL) is text the output is
   * expected to resemble (OpenAI's predicted output), copied; the sequence
   * holds max_len tokens at most (prompt and output). NULL when out of
   * memory. */
  sl_draft_seq *(*seq_begin)(sl_drafter *d, const int32_t *ref, int n_ref,
                             int max_len);
  /* Up to k tokens (1 <= k <= 64) to follow hist[0..n), the sequence's
   * tokens so far (prompt and output), into out; returns their count. */
  int (*propose)(sl_drafter *d, sl_draft_seq *s, const int32_t *hist, int n,
                 int k, int32_t *out);
  /* Of the last proposal's `drafted` tokens the target kept the first
   * `kept` (NULL: nothing to learn). */
  void (*accepted)(sl_drafter *d, sl_draft_seq *s, int drafted, int kept);
  void (*seq_end)(sl_drafter *d, sl_draft_seq *s);
  void (*destroy)(sl_drafter *d);
} sl_drafter_ops;

struct sl_drafter {
  const sl_drafter_ops *ops;
  /* The stream its work runs on (a draft model's forward passes), which
   * every clear of the engine that uses it drains too (DESIGN.md I3); NULL
   * for a drafter without device work (prompt lookup runs on the caller's
   * thread and holds no buffer). */
  sl_stream_t *stream;
};

/* Every sequence's state begins with this (the drafter's own follows). */
struct sl_draft_seq {
  sl_drafter *drafter;
  int64_t drafted, kept; /* over the sequence's life */
};

/* The calls through ops, and the counts kept in the sequence's head. */
sl_draft_seq *sl_drafter_seq_begin(sl_drafter *d, const int32_t *ref, int n_ref,
                                   int max_len);
int sl_drafter_propose(sl_draft_seq *s, const int32_t *hist, int n, int k,
                       int32_t *out);
void sl_drafter_accepted(sl_draft_seq *s, int drafted, int kept);
void sl_drafter_seq_end(sl_draft_seq *s); /* NULL: nothing */
void sl_drafter_free(sl_drafter *d);      /* NULL: nothing */

/* Prompt lookup behind the interface: sl_draft_lookup over the sequence's
 * tokens, then (when that finds nothing) the longest suffix of them found
 * in the sequence's reference text proposes what follows it there. p is
 * copied; NULL when out of memory or p is out of range. */
sl_drafter *sl_drafter_ngram_create(const sl_draft_params *p);

/* A draft model behind the interface (spec_model.c): each sequence gets a
 * context over m (max_len tokens) on `stream`, the drafter's own, whose
 * work every clear of the engine that uses it drains; a proposal catches
 * that context up to the sequence's tokens (their common prefix kept: a
 * rejection is rolled back there) and drafts the draft model's argmax, one
 * pass a token. m and stream are borrowed and outlive the drafter; m must
 * share the target's vocabulary (the caller checks). NULL when out of
 * memory. */
sl_drafter *sl_drafter_model_create(sl_model_t *m, sl_stream_t *stream,
                                    int n_threads);

/* What a draft model needs, made together: the model at `path` (its
 * vocabulary checked against the target's tokenizer, id for id), a CPU
 * stream of its own ("draft") and the drafter over both. On failure
 * nothing is left made, *out is zeroed and err says why. The caller frees
 * the drafter, then destroys the stream (drained), then frees the model. */
typedef struct sl_draft_side {
  sl_model_t *model;
  sl_stream_t *stream;
  sl_drafter *drafter;
} sl_draft_side;

sl_status sl_draft_side_open(const char *path, const sl_tokenizer_t *target,
                             int n_threads, sl_draft_side *out, char *err,
                             size_t errcap);

/* ---- sampled requests ----
 *
 * The standard rejection rule: a draft x drawn from the drafter's
 * distribution q is kept with probability min(1, p(x) / q(x)) (p the
 * target's distribution, as the request's sampler makes it); rejected, the
 * token is drawn from the residual max(0, p - q), normalised. The tokens
 * then follow p exactly, whatever q is. u1 decides the keeping, u2 the
 * residual's draw (uniform in [0, 1)); *kept says which happened. p and q
 * are probabilities over n tokens (each summing to 1); returns the token.
 *
 * For a drafter that proposes one token for certain (prompt lookup, a
 * predicted output, a greedy draft model: q(x) = 1) the rule keeps x with
 * probability p(x), and the residual is p without x: exactly "draw y from
 * p; keep x when y == x". The engine verifies such drafts that way, with
 * the request's own sampler and draws, so a seeded answer is the same with
 * speculation as without, token for token. */
int32_t sl_spec_accept(const float *p, const float *q, int64_t n, int32_t x,
                       double u1, double u2, bool *kept);

/* ---- when it pays: how many drafts a step verifies ----
 *
 * A step of n tokens costs about a + b n (a: reading the weights and the
 * step's fixed work; b: one more token's arithmetic). `cost` is b / (a + b),
 * one more token's share of a one-token step. A sequence's j-th draft is
 * kept with probability about alpha^j (alpha its drafts' acceptance, each
 * kept only while the ones before were). sl_spec_allocate adds drafts, the
 * most likely first, while a draft's expected tokens per its cost exceed
 * the step's (alpha^j / cost > E / C, E the step's expected tokens and C its
 * cost so far): at batch 1 a decode step is mostly a, so drafts are nearly
 * free; in a large batch the step is mostly b n and drafts stop paying,
 * first the unlikely ones. prop[s]: sequence s's proposal length; n_base:
 * the step's tokens without drafts (one per decoding sequence, any prefill
 * chunk). Writes take[s] <= prop[s]; returns their sum. cost <= 0: all. */
int sl_spec_allocate(const int *prop, const double *alpha, int n, int n_base,
                     double cost, int *take);

/* The step cost model, fitted from the engine's own steps: exponentially
 * weighted least squares of step time against tokens (recent steps count
 * most). Zero-initialise. */
typedef struct sl_spec_cost {
  double s0, s1, s2, sy, sny;
  uint64_t n_obs;
} sl_spec_cost;

void sl_spec_cost_observe(sl_spec_cost *c, int n_tokens, double ns);

/* b / (a + b) of the fit, or dflt until the steps decide it (fewer than 16
 * seen, too little spread in their sizes, or a fit that is not positive). */
double sl_spec_cost_ratio(const sl_spec_cost *c, double dflt);

/* A sequence's drafts' acceptance, alpha: per verification the share of
 * its drafts kept before the first rejection (kept / (kept + 1) when one
 * was rejected, 1 when none was), averaged with recent verifications
 * counting most (0.3 each); 0.5 before any. Zero-initialise. */
typedef struct sl_spec_accept_est {
  double a;
  uint32_t n;
} sl_spec_accept_est;

void sl_spec_accept_observe(sl_spec_accept_est *a, int drafted, int kept);
/* A step that gave a sequence no drafts: a low alpha drifts back up toward
 * the prior (5% of the way a step), so a sequence that stopped drafting
 * tries again. */
void sl_spec_accept_age(sl_spec_accept_est *a);
double sl_spec_alpha(const sl_spec_accept_est *a);

/* The lowest index of the largest of lg[0..n) (the engine's greedy rule). */
int32_t sl_spec_argmax(const float *lg, int64_t n);

typedef struct sl_spec_stats {
  int64_t passes;   /* forward passes over the sequence */
  int64_t drafted;  /* tokens proposed */
  int64_t accepted; /* of them, kept */
} sl_spec_stats;

/* Called for each generated token, in order, with its logits (n_vocab
 * floats: the target's row that chose it; argmax of it is tok). Returns
 * false to stop (an end-of-generation token, a stop condition). */
typedef bool (*sl_spec_emit_fn)(void *ud, int32_t tok, const float *logits);

/* Greedy generation of up to max_new tokens over c, which has evaluated
 * hist[0..n_hist) (the prompt) and whose last logits row is `last`. hist
 * has room for n_hist + max_new tokens and gains each generated token.
 * d NULL: one token a pass; else each pass feeds the last token and up to
 * k drafts (d's proposals for hist), keeps the drafts while the target's
 * argmax (the lowest index on a tie) agrees, and truncates c past the
 * tokens kept. The same tokens and logits either way. Needs room in c for
 * the drafts: n_past + 1 + k <= n_ctx, or drafts are cut. */
sl_status sl_spec_generate_greedy(sl_ctx_t *c, int n_ctx, int32_t *hist,
                                  int n_hist, const float *last,
                                  int64_t n_vocab, int max_new, sl_drafter *d,
                                  int k, sl_spec_emit_fn emit, void *ud,
                                  sl_spec_stats *stats);

#endif
