/* sluice — server: a body's shape, scanned before jansson builds it
 * (json_scan.c). */
#ifndef SLUICE_SERVER_JSON_SCAN_H
#define SLUICE_SERVER_JSON_SCAN_H

#include "server/json.h"
#include "sluice/status.h"

#define SL__JSON_MAX_DEPTH         64
#define SL__JSON_MAX_CONTAINERS    20000  /* objects and arrays */
#define SL__JSON_MAX_ELEMENTS      262144 /* commas: 2^18 */
#define SL__JSON_MAX_UNKNOWN_FIELD 65536  /* bytes of an unknown field */

/* SL_OK, or SL_ERR_FORMAT with a 400 in *err for a body past one of
 * the limits above (a body that is not JSON passes: jansson says why). */
sl_status sl__srv_json_scan(const char *body, size_t len, sl_srv_error *err);
/* Once per process (sl_server_create): bodies of 1 MiB and more mmapped,
 * so freed at once. */
void sl__srv_malloc_init(void);

#endif
