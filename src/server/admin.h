/* sluice — server: /health, /metrics, /admin/api/stats and the counters
 * behind them (admin.c). */
#ifndef SLUICE_SERVER_ADMIN_H
#define SLUICE_SERVER_ADMIN_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/json.h"
#include "server/parse.h"
#include "sluice/memsync.h"
#include "sluice/server.h"

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

typedef struct sl_srv_job sl_srv_job; /* job.h */

void sl__srv_metrics_init(sl_srv_metrics *m);
void sl__srv_metrics_destroy(sl_srv_metrics *m);
/* Records a finished generation request (ttft/tpot from the job's times;
 * reasoning_tokens: how many of its tokens were thinking). `m` is an
 * sl_srv_metrics: this is the jobs' record hook (sl_srv_job_record). */
void sl__srv_metrics_job(void *m, const sl_srv_job *j, bool failed,
                         int reasoning_tokens);
/* A request answered with an error before it reached an engine (`http`:
 * the status; the request may be NULL). */
void sl__srv_metrics_failed(sl_server_t *s, const sl_srv_request *r, int http);
/* A request refused for who sent it: one of SL_SRV_REFUSED_*. */
enum { SL_SRV_REFUSED_HOST = 1, SL_SRV_REFUSED_ORIGIN, SL_SRV_REFUSED_TYPE };
void sl__srv_metrics_refused(sl_server_t *s, int why);
/* Prometheus text (new sl_sbuf contents) / stats JSON / models JSON. */
void sl__srv_metrics_text(sl_server_t *s, sl_sbuf *out);
json_t *sl__srv_stats_json(sl_server_t *s);

#endif
