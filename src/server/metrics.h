/* sluice — server: the counters behind /metrics and /admin/api/stats, as
 * a type (the server's state holds them; admin.c fills and reads them).
 * Types only. */
#ifndef SLUICE_SERVER_METRICS_H
#define SLUICE_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "sluice/memsync.h"

#define SL_SRV_TTFT_BUCKETS 12
#define SL_SRV_TPOT_BUCKETS 11

/* One answered request, for the dashboard's list (admin.c). */
typedef struct sl_srv_recent {
  double t;        /* when it ended, Unix seconds */
  char model[64];  /* as the request named it */
  char api[16];    /* "chat", "completions", "messages", "embeddings", "" */
  int http;        /* the status it was answered with */
  char finish[16]; /* stop, length, abort, error, "" */
  int prompt_tokens, cached_tokens, completion_tokens;
  double ttft_ms, tpot_ms; /* 0: none */
} sl_srv_recent;

#define SL_SRV_RECENT 64

typedef struct sl_srv_metrics {
  pthread_mutex_t mu;
  sl_srv_recent recent[SL_SRV_RECENT]; /* a ring, newest at recent_n - 1 */
  uint64_t recent_n;
  uint64_t http_requests;   /* every HTTP request */
  uint64_t requests;        /* generation requests */
  uint64_t requests_failed; /* answered with an error */
  /* refused for who sent them (origin.h): a foreign Host, a foreign
   * Origin, a POST body not sent as application/json */
  uint64_t refused_host, refused_origin, refused_type;
  uint64_t prompt_tokens, cached_tokens, generated_tokens, reasoning_tokens;
  uint64_t ttft_counts[SL_SRV_TTFT_BUCKETS]; /* cumulative at output */
  double ttft_sum;
  uint64_t ttft_n;
  uint64_t tpot_counts[SL_SRV_TPOT_BUCKETS];
  double tpot_sum;
  uint64_t tpot_n;
  sl_unreleased_est unreleased; /* guarded by mu */
} sl_srv_metrics;

extern const double sl__srv_ttft_bounds[SL_SRV_TTFT_BUCKETS];
extern const double sl__srv_tpot_bounds[SL_SRV_TPOT_BUCKETS];

#endif
