/* sluice — server: JSON Schema -> GBNF, for constrained decoding
 * (schema.c). */
#ifndef SLUICE_SERVER_SCHEMA_H
#define SLUICE_SERVER_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "server/json.h"
#include "sluice/status.h"

/* Appends to *out a GBNF grammar (start rule "root") of the JSON texts that
 * `schema` (borrowed) describes. SL_ERR_FORMAT with a message in err for
 * what a grammar here cannot say (pattern, numeric bounds, ...) or a
 * malformed schema; SL_ERR_NOMEM. */
sl_status sl__srv_schema_gbnf(json_t *schema, sl_sbuf *out, char *err,
                              size_t errcap);
/* Rules for several schemas (tool arguments) in one numbering (no root, no
 * base rules): names[i] gets the rule that starts schemas[i]. An object
 * that lists properties and says nothing of additionalProperties takes no
 * others here. Errors as above. */
sl_status sl__srv_schema_rules(json_t *const *schemas, int n, char (*names)[24],
                               sl_sbuf *out, char *err, size_t errcap);
/* The base rules (ws, json-value, json-string, ...) the rules above use. */
void sl__srv_json_base_gbnf(sl_sbuf *out);
/* Appends the grammar of any JSON object (response_format json_object). */
void sl__srv_json_object_gbnf(sl_sbuf *out);

#endif
