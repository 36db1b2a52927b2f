/* sluice — server: /health, /metrics, /admin/api/stats and the counters
 * behind them (admin.c). */
#ifndef SLUICE_SERVER_ADMIN_H
#define SLUICE_SERVER_ADMIN_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/json.h"
#include "server/metrics.h"
#include "server/parse.h"
#include "sluice/memsync.h"
#include "sluice/server.h"

typedef struct sl_srv_job sl_srv_job; /* job.h */

void sl__srv_metrics_init(sl_srv_metrics *m);
void sl__srv_metrics_destroy(sl_srv_metrics *m);
/* Records a finished generation request (ttft/tpot from the job's times,
 * and how many of its tokens were thinking, counted under j->mu). `m` is
 * an sl_srv_metrics: this is the jobs' record hook (sl_srv_job_record). */
void sl__srv_metrics_job(void *m, sl_srv_job *j, bool failed);
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
