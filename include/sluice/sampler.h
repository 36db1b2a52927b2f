/* sluice — sampling: greedy, temperature, top-k, top-p, min-p, repetition /
 * presence / frequency penalties, and a seeded generator (the same seed and
 * logits give the same tokens). One sampler per sequence; not thread-safe. */
#ifndef SLUICE_SAMPLER_H
#define SLUICE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "sluice/status.h"

typedef struct sl_sampler_params {
  float temperature;       /* <= 0: greedy */
  int top_k;               /* <= 0: off */
  float top_p;             /* >= 1: off */
  float min_p;             /* <= 0: off */
  float repeat_penalty;    /* 1: off (llama.cpp semantics) */
  float presence_penalty;  /* 0: off (OpenAI semantics) */
  float frequency_penalty; /* 0: off */
  int penalty_last_n;      /* tokens of history the penalties look at */
  uint64_t seed;
} sl_sampler_params;

/* Defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties,
 * penalty_last_n 64, seed 0. */
sl_sampler_params sl_sampler_defaults(void);

typedef struct sl_sampler sl_sampler_t;

/* A value added to one token's logit before sampling (OpenAI's
 * logit_bias: -100 bans a token, +100 all but forces it). */
typedef struct sl_logit_bias {
  int32_t id;
  float bias;
} sl_logit_bias;

/* Returns NULL on allocation failure or n_vocab <= 0. Free with
 * sl_sampler_free. */
sl_sampler_t *sl_sampler_create(const sl_sampler_params *p, int n_vocab);
void sl_sampler_free(sl_sampler_t *s);

/* Sets the logit biases (copied; replaces any before). SL_ERR_INVALID_ARG
 * for an id outside the vocabulary or a bias that is not finite. */
sl_status sl_sampler_set_bias(sl_sampler_t *s, const sl_logit_bias *b, int n);
bool sl_sampler_has_bias(const sl_sampler_t *s);

/* Records a token (prompt or generated) in the penalty history. */
void sl_sampler_accept(sl_sampler_t *s, int32_t token);

/* Picks the next token from logits[n_vocab]. The logits are modified
 * (penalties applied). */
int32_t sl_sampler_sample(sl_sampler_t *s, float *logits);

/* What a device needs to sample as sl_sampler_sample does. */
const sl_sampler_params *sl_sampler_params_of(const sl_sampler_t *s);

/* The one uniform number in [0, 1) that sl_sampler_sample draws (advancing
 * the generator); 0, and no draw, when greedy. */
double sl_sampler_draw(sl_sampler_t *s);

/* sl_sampler_sample with its draw given: sl_sampler_sample(s, l) is
 * sl_sampler_sample_with(s, l, sl_sampler_draw(s)). */
int32_t sl_sampler_sample_with(sl_sampler_t *s, float *logits, double u);

/* The distinct tokens of the penalty window (newest first) and their counts,
 * into ids / counts (at most max_pen); *n = 0 when no penalty is on.
 * Returns false when there are more than max_pen of them. */
bool sl_sampler_penalties(const sl_sampler_t *s, int max_pen, int32_t *ids,
                          int32_t *counts, int *n);

/* True when sl_sampler_sample returns the argmax of the logits as given
 * (lowest id on a tie): greedy, with no penalty or bias that changes them. Then
 * a device's argmax may stand in for the sampler. */
bool sl_sampler_is_argmax(const sl_sampler_t *s);

#endif
