/* libFuzzer harness: tool calls read out of model text (a model's output
 * follows the user's lead, so it is outside input too). The first byte
 * picks the format family, the rest is the text. Every call found has a
 * name and arguments that are a JSON object; the content is NUL-terminated
 * and of its stated length; nothing leaks through the allocation funnel. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"
#include "sluice/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 16)
    return 0;
  sl_srv_toolfmt f = (sl_srv_toolfmt)(data[0] % 5);
  size_t live = sl_malloc_live_bytes();
  sl_srv_toolcalls t;
  if (sl__srv_toolcalls_parse(f, (const char *)data + 1, size - 1, &t) != SL_OK)
    abort(); /* no allocation fails here */
  if (!t.content || strlen(t.content) > t.content_len ||
      t.content_len > size - 1)
    abort();
  /* a name is never empty, nor holds a NUL (it reaches the client as a
   * JSON string) */
  for (int i = 0; i < t.n; i++) {
    if (!t.v[i].name || !t.v[i].name[0] || !t.v[i].arguments)
      abort();
    json_t *a = json_loads(t.v[i].arguments, 0, NULL);
    if (!json_is_object(a))
      abort();
    json_decref(a);
  }
  sl__srv_toolcalls_free(&t);
  if (sl_malloc_live_bytes() != live)
    abort();
  return 0;
}
