/* sluice — server: a request body's shape, checked before jansson builds
 * it. One pass over the bytes, no allocation: nesting depth, containers
 * (objects and arrays), elements (commas) and the size of each top-level
 * field. jansson spends ~270 bytes per empty object, so an 8 MiB body of
 * `[{},{},...]` became ~750 MB of heap before these limits; with them a
 * body costs at most SL__JSON_MAX_CONTAINERS objects and
 * SL__JSON_MAX_ELEMENTS scalars on top of its own bytes, and large bodies
 * are mmapped (sl__srv_malloc_init): RSS after a burst of them stays
 * within 10% of before (test_server_limits.py: ~19% up without the fixed
 * mmap threshold in 4 runs of 4). Since the HTTP threads became a pool
 * (http.c), the parse trees' small blocks stay in the pool threads' arenas:
 * http.c calls malloc_trim after a body over 1 MiB (300 MB vs 176 MB
 * after 8 such bodies without it, measured; mutant 27). That trim also
 * returns what the arenas would keep of the bodies themselves, so the
 * threshold below is a second guard now, not the one the test needs. */
#include <malloc.h>
#include <pthread.h>
#include <string.h>

#include "server/json.h"
#include "server/json_scan.h"

/* Every top-level field of the routes served, and those of the APIs that
 * sluice ignores or refuses with its own message: any other field larger
 * than SL__JSON_MAX_UNKNOWN_FIELD bytes is refused before parsing. */
static const char *const k_known[] = {"best_of",
                                      "echo",
                                      "frequency_penalty",
                                      "functions",
                                      "function_call",
                                      "ignore_eos",
                                      "include_usage",
                                      "input",
                                      "logit_bias",
                                      "logprobs",
                                      "max_completion_tokens",
                                      "max_tokens",
                                      "messages",
                                      "metadata",
                                      "min_p",
                                      "model",
                                      "n",
                                      "output_config",
                                      "parallel_tool_calls",
                                      "presence_penalty",
                                      "prompt",
                                      "repetition_penalty",
                                      "response_format",
                                      "seed",
                                      "service_tier",
                                      "speculative",
                                      "stop",
                                      "stop_sequences",
                                      "store",
                                      "stream",
                                      "stream_options",
                                      "suffix",
                                      "system",
                                      "temperature",
                                      "thinking",
                                      "tool_choice",
                                      "tools",
                                      "top_k",
                                      "top_logprobs",
                                      "top_p",
                                      "user",
                                      "encoding_format",
                                      "dimensions",
                                      "reasoning_effort",
                                      "chat_template_kwargs",
                                      "modalities",
                                      "audio",
                                      "prediction",
                                      "web_search_options",
                                      "cache_prompt",
                                      "add_special",
                                      "with_pieces",
                                      "content",
                                      "tokens"};

static bool known_field(const char *k, size_t n) {
  for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++)
    if (strlen(k_known[i]) == n && memcmp(k_known[i], k, n) == 0)
      return true;
  return false;
}

sl_status sl__srv_json_scan(const char *b, size_t len, sl_srv_error *err) {
  int depth = 0;
  size_t containers = 0, elements = 0;
  /* the current top-level field: its key, and where its value began */
  const char *key = NULL;
  size_t key_len = 0, value_at = 0;
  bool in_top_value = false;
  for (size_t i = 0; i < len; i++) {
    char c = b[i];
    if (c == '"') {
      size_t s = ++i;
      while (i < len && b[i] != '"')
        i += b[i] == '\\' ? 2 : 1;
      if (i > len)
        i = len; /* a truncated escape: jansson reports it */
      /* a key of the top-level object: a string at depth 1 followed by ':' */
      if (depth == 1 && !in_top_value) {
        size_t j = i + 1;
        while (j < len &&
               (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r'))
          j++;
        if (j < len && b[j] == ':') {
          key = b + s;
          key_len = i - s;
          value_at = j + 1;
          in_top_value = true;
          i = j;
        }
      }
      continue;
    }
    if (c == '{' || c == '[') {
      if (++depth > SL__JSON_MAX_DEPTH) {
        sl__srv_error_set(err, 400, "json_too_deep", NULL,
                          "the request body nests deeper than %d levels",
                          SL__JSON_MAX_DEPTH);
        return SL_ERR_FORMAT;
      }
      if (++containers > SL__JSON_MAX_CONTAINERS) {
        sl__srv_error_set(err, 400, "json_too_complex", NULL,
                          "the request body has more than %d objects and "
                          "arrays",
                          SL__JSON_MAX_CONTAINERS);
        return SL_ERR_FORMAT;
      }
      continue;
    }
    bool closes = c == '}' || c == ']';
    if (c == ',' && ++elements > SL__JSON_MAX_ELEMENTS) {
      sl__srv_error_set(err, 400, "json_too_complex", NULL,
                        "the request body has more than %d elements",
                        SL__JSON_MAX_ELEMENTS);
      return SL_ERR_FORMAT;
    }
    /* the end of a top-level field's value: a ',' at depth 1, or the
     * top-level object's '}' */
    if (in_top_value && ((c == ',' && depth == 1) || (closes && depth == 1))) {
      in_top_value = false;
      if (i - value_at > SL__JSON_MAX_UNKNOWN_FIELD &&
          !known_field(key, key_len)) {
        int kl = key_len > 64 ? 64 : (int)key_len;
        sl__srv_error_set(err, 400, "unknown_parameter", NULL,
                          "'%.*s' is not a parameter of this API, and its "
                          "%zu bytes are refused",
                          kl, key, i - value_at);
        return SL_ERR_FORMAT;
      }
    }
    if (closes && depth > 0)
      depth--;
  }
  return SL_OK;
}

/* Large bodies are mmapped whole and unmapped at free: glibc's default
 * threshold rises after each such free (up to 32 MiB), after which the next
 * 8 MiB bodies come from the arenas and stay resident after free. */
static void malloc_setup(void) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
}

void sl__srv_malloc_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, malloc_setup);
}
