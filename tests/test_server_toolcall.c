/* Tool calls read back out of a model's text (issue 12): each format family
 * on the texts its models write (one call, several, text around them, a
 * call cut at max_tokens), what only looks like a call kept as text, and
 * the family picked from real chat templates (tests/fixtures/templates). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "server/server_impl.h"
#include "sluice/util.h"

typedef struct tcase {
  sl_srv_toolfmt f;
  const char *text;
  int n;                /* calls */
  const char *names[3]; /* their names */
  const char *args[3];  /* their arguments, compact JSON */
  const char *content;  /* the rest */
} tcase;

static const tcase CASES[] = {
    {SL_TOOLFMT_HERMES,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>",
     1,
     {"get_weather"},
     {"{\"city\":\"Paris\"}"},
     ""},
    {SL_TOOLFMT_HERMES,
     "Let me check.\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>"
     "\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}\n"
     "</tool_call>",
     2,
     {"a", "b"},
     {"{}", "{\"x\":1}"},
     "Let me check."},
    {SL_TOOLFMT_HERMES, /* cut by max_tokens after a whole JSON */
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": [1, 2]}}",
     1,
     {"f"},
     {"{\"q\":[1,2]}"},
     ""},
    {SL_TOOLFMT_HERMES, /* broken JSON: text */
     "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> done",
     0,
     {NULL},
     {NULL},
     "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call> done"},
    {SL_TOOLFMT_HERMES, /* no name: text */
     "<tool_call>{\"arguments\": {}}</tool_call>",
     0,
     {NULL},
     {NULL},
     "<tool_call>{\"arguments\": {}}</tool_call>"},
    {SL_TOOLFMT_HERMES,
     "Just an answer.",
     0,
     {NULL},
     {NULL},
     "Just an answer."},
    {SL_TOOLFMT_LLAMA3,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
     1,
     {"get_weather"},
     {"{\"city\":\"Oslo\"}"},
     ""},
    {SL_TOOLFMT_LLAMA3,
     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
     "\"parameters\": {\"k\": true}}",
     2,
     {"a", "b"},
     {"{}", "{\"k\":true}"},
     ""},
    {SL_TOOLFMT_LLAMA3,
     "The weather is {\"name\": \"x\"} nice",
     0,
     {NULL},
     {NULL},
     "The weather is {\"name\": \"x\"} nice"},
    {SL_TOOLFMT_LLAMA3,
     "{\"name\": \"a\", \"parameters\": {}} and more",
     0,
     {NULL},
     {NULL},
     "{\"name\": \"a\", \"parameters\": {}} and more"},
    {SL_TOOLFMT_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": "
     "\"b\", \"arguments\": {}}]",
     2,
     {"a", "b"},
     {"{\"n\":1}", "{}"},
     ""},
    {SL_TOOLFMT_MISTRAL,
     "Sure.[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}[TOOL_CALLS]ping[ARGS]{}",
     2,
     {"get_time", "ping"},
     {"{\"tz\":\"UTC\"}", "{}"},
     "Sure."},
    {SL_TOOLFMT_MISTRAL, /* not a name (found by fuzz_toolcall) */
     "[TOOL_CALLS][{ime[ARGS]{}",
     0,
     {NULL},
     {NULL},
     "[TOOL_CALLS][{ime[ARGS]{}"},
    {SL_TOOLFMT_MISTRAL,
     "[TOOL_CALLS][{\"name\": 5}]",
     0,
     {NULL},
     {NULL},
     "[TOOL_CALLS][{\"name\": 5}]"},
    {SL_TOOLFMT_GENERIC,
     "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {\"u\": "
     "\"\\u00e9\"}}]}",
     1,
     {"a"},
     {"{\"u\":\"\xc3\xa9\"}"}, /* UTF-8 as it is */
     ""},
    {SL_TOOLFMT_GENERIC,
     "{\"tool_call\": {\"name\": \"a\", \"arguments\": {}}}",
     1,
     {"a"},
     {"{}"},
     ""},
    {SL_TOOLFMT_GENERIC,
     "[{\"name\": \"a\", \"arguments\": {}}]",
     1,
     {"a"},
     {"{}"},
     ""},
    {SL_TOOLFMT_GENERIC,
     "{\"response\": \"hello\"}",
     0,
     {NULL},
     {NULL},
     "{\"response\": \"hello\"}"},
    {SL_TOOLFMT_GENERIC, "", 0, {NULL}, {NULL}, ""},
    {SL_TOOLFMT_NONE,
     "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>",
     0,
     {NULL},
     {NULL},
     "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>"},
};

static void test_parsers(void) {
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    const tcase *c = &CASES[i];
    sl_srv_toolcalls t;
    CHECK_OK(sl__srv_toolcalls_parse(c->f, c->text, strlen(c->text), &t));
    if (t.n != c->n || strcmp(t.content, c->content))
      fprintf(stderr, "case %zu (%s): %d calls, content '%s'\n", i,
              sl__srv_toolfmt_name(c->f), t.n, t.content);
    CHECK_EQ_INT(t.n, c->n);
    CHECK(strcmp(t.content, c->content) == 0);
    CHECK(t.content_len == strlen(t.content));
    for (int k = 0; k < t.n && k < c->n; k++) {
      CHECK(strcmp(t.v[k].name, c->names[k]) == 0);
      if (strcmp(t.v[k].arguments, c->args[k]))
        fprintf(stderr, "case %zu call %d: arguments %s\n", i, k,
                t.v[k].arguments);
      CHECK(strcmp(t.v[k].arguments, c->args[k]) == 0);
    }
    sl__srv_toolcalls_free(&t);
  }
}

/* Every prefix of every case parses without a fault (a stream cut
 * anywhere), under the allocation funnel's failures too. */
static void test_prefixes_and_oom(void) {
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    const tcase *c = &CASES[i];
    for (size_t n = 0; n <= strlen(c->text); n++) {
      sl_srv_toolcalls t;
      CHECK_OK(sl__srv_toolcalls_parse(c->f, c->text, n, &t));
      CHECK(t.content != NULL);
      sl__srv_toolcalls_free(&t);
    }
    for (int k = 1; k < 12; k++) {
      sl_malloc_fail_after((uint64_t)k);
      sl_srv_toolcalls t;
      sl_status st =
          sl__srv_toolcalls_parse(c->f, c->text, strlen(c->text), &t);
      sl_malloc_fail_after(0);
      CHECK(st == SL_OK || st == SL_ERR_NOMEM);
      if (st == SL_OK)
        sl__srv_toolcalls_free(&t);
    }
  }
}

/* The family picked from real templates: those that write tool calls in
 * their own format, and those with none (generic). */
static void test_template_families(void) {
  static const struct {
    const char *file;
    sl_srv_toolfmt f;
  } want[] = {
      {"qwen2.5.jinja", SL_TOOLFMT_HERMES},
      {"llama3.1.jinja", SL_TOOLFMT_LLAMA3},
      {"mistral-v0.3.jinja", SL_TOOLFMT_MISTRAL},
      {"smollm2.jinja", SL_TOOLFMT_GENERIC},
  };
  const char *src = getenv("SLUICE_SOURCE_DIR");
  int seen = 0;
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/%s",
             src ? src : ".", want[i].file);
    char *t = sl_test_read_file(path);
    if (!t)
      continue;
    seen++;
    CHECK_EQ_INT(sl__srv_toolfmt_of_template(t), want[i].f);
    free(t);
  }
  printf("   %d of %zu templates found\n", seen, sizeof want / sizeof *want);
  CHECK_EQ_INT(sl__srv_toolfmt_of_template(NULL), SL_TOOLFMT_GENERIC);
  sl_srv_toolfmt f;
  CHECK(sl__srv_toolfmt_parse("mistral", &f) && f == SL_TOOLFMT_MISTRAL);
  CHECK(!sl__srv_toolfmt_parse("xml", &f));
}

/* While streaming: what may go out as content before the answer is done */
static void test_safe_prefix(void) {
  static const struct {
    sl_srv_toolfmt f;
    const char *text;
    size_t safe;
  } cases[] = {
      {SL_TOOLFMT_HERMES, "Let me look. <tool_call>{\"name\"", 12},
      {SL_TOOLFMT_HERMES, "Let me look. <tool", 12}, /* the mark, cut */
      {SL_TOOLFMT_HERMES, "Let me look. <b>", 16},
      {SL_TOOLFMT_HERMES, "Sure  \n", 4}, /* blanks wait */
      {SL_TOOLFMT_MISTRAL, "ok [TOOL_CALLS][", 2},
      {SL_TOOLFMT_MISTRAL, "ok [TOOL", 2},
      {SL_TOOLFMT_GENERIC, "  {\"tool_calls\"", 0}, /* may all be calls */
      {SL_TOOLFMT_GENERIC, "[", 0},
      {SL_TOOLFMT_GENERIC, "Paris is sunny", 14},
      {SL_TOOLFMT_GENERIC, "   ", 0},
      {SL_TOOLFMT_LLAMA3, "<|python", 0},
      {SL_TOOLFMT_LLAMA3, "It is {", 7},
      {SL_TOOLFMT_NONE, "{", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t got =
        sl__srv_toolcall_safe(cases[i].f, cases[i].text, strlen(cases[i].text));
    if (got != cases[i].safe)
      fprintf(stderr, "case %zu: %zu, want %zu\n", i, got, cases[i].safe);
    CHECK(got == cases[i].safe);
  }
}

int main(void) {
  RUN(test_parsers);
  RUN(test_prefixes_and_oom);
  RUN(test_template_families);
  RUN(test_safe_prefix);
  return sl_test_finish();
}
