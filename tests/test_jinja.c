/* Tests for the chat-template engine (include/sluice/jinja.h). The broad
 * byte-for-byte comparison with Python jinja2 lives in
 * tests/py/test_chat_templates.py; these cover the C API, errors, limits and
 * allocation failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sluice/jinja.h"
#include "sluice/util.h"

static char g_err[512];
static sl_status g_st;

/* Renders `src` with `ctx`; returns the output (free with sl_free) or NULL,
 * leaving the status in g_st and the message in g_err. */
static char *render(const char *src, const sl_jv *ctx) {
  g_err[0] = 0;
  sl_jinja_template_t *t =
      sl_jinja_compile(src, strlen(src), g_err, sizeof g_err);
  if (!t) {
    g_st = SL_ERR_FORMAT;
    return NULL;
  }
  char *out = NULL;
  size_t n = 0;
  g_st = sl_jinja_render(t, ctx, &out, &n, g_err, sizeof g_err);
  sl_jinja_free(t);
  if (g_st == SL_OK && strlen(out) != n) {
    sl_free(out);
    g_st = SL_ERR_STATE;
    return NULL;
  }
  return g_st == SL_OK ? out : NULL;
}

#define EXPECT(src, ctx, want)                                                 \
  do {                                                                         \
    char *o_ = render((src), (ctx));                                           \
    CHECK_MSG(o_ &&strcmp(o_, (want)) == 0,                                    \
              "%s\n  got  [%s]\n  want [%s]\n  err %s", (src),                 \
              o_ ? o_ : "(null)", (want), g_err);                              \
    sl_free(o_);                                                               \
  } while (0)

#define EXPECT_ERR(src, ctx, status, needle)                                   \
  do {                                                                         \
    char *o_ = render((src), (ctx));                                           \
    CHECK_MSG(!o_ && g_st == (status) && strstr(g_err, (needle)),              \
              "%s\n  got [%s] status %d err [%s], want status %d with [%s]",   \
              (src), o_ ? o_ : "(null)", g_st, g_err, (status), (needle));     \
    sl_free(o_);                                                               \
  } while (0)

static sl_jv *msg(const char *role, const char *content) {
  sl_jv *m = sl_jv_dict();
  if (sl_jv_dict_set(m, "role", sl_jv_string(role)) ||
      sl_jv_dict_set(m, "content", sl_jv_string(content))) {
    sl_jv_free(m);
    return NULL;
  }
  return m;
}

/* {"name": "sluice", "n": 3, "xs": [1, 2, 3], "d": {"a": 1, "b": "two"},
 *  "f": 2.5, "flag": true, "nothing": null} */
static sl_jv *make_ctx(void) {
  sl_jv *c = sl_jv_dict();
  sl_jv *xs = sl_jv_list();
  sl_jv_list_append(xs, sl_jv_int(1));
  sl_jv_list_append(xs, sl_jv_int(2));
  sl_jv_list_append(xs, sl_jv_int(3));
  sl_jv *d = sl_jv_dict();
  sl_jv_dict_set(d, "a", sl_jv_int(1));
  sl_jv_dict_set(d, "b", sl_jv_string("two"));
  sl_jv_dict_set(c, "name", sl_jv_string("sluice"));
  sl_jv_dict_set(c, "n", sl_jv_int(3));
  sl_jv_dict_set(c, "xs", xs);
  sl_jv_dict_set(c, "d", d);
  sl_jv_dict_set(c, "f", sl_jv_float(2.5));
  sl_jv_dict_set(c, "flag", sl_jv_bool(true));
  sl_jv_dict_set(c, "nothing", sl_jv_null());
  return c;
}

static void test_values(void) {
  sl_jv *d = sl_jv_dict();
  CHECK_OK(sl_jv_dict_set(d, "k", sl_jv_int(1)));
  CHECK_OK(sl_jv_dict_set(d, "k", sl_jv_string("again"))); /* replaces */
  CHECK_EQ_INT(sl_jv_len(d), 1);
  CHECK(strcmp(sl_jv_str(sl_jv_dict_get(d, "k")), "again") == 0);
  CHECK(sl_jv_dict_get(d, "nope") == NULL);
  CHECK_EQ_INT(sl_jv_dict_set(d, "x", NULL), SL_ERR_NOMEM);
  sl_jv *l = sl_jv_list();
  CHECK_EQ_INT(sl_jv_list_append(l, NULL), SL_ERR_NOMEM);
  CHECK_EQ_INT(sl_jv_list_append(d, sl_jv_int(1)), SL_ERR_INVALID_ARG);
  CHECK_OK(sl_jv_list_append(l, sl_jv_string_n("a\0b", 3)));
  CHECK_EQ_INT(sl_jv_len(sl_jv_list_get(l, 0)), 3);
  CHECK(sl_jv_list_get(l, 1) == NULL);
  CHECK_EQ_INT(sl_jv_kind_of(l), SL_JV_LIST);
  CHECK_OK(sl_jv_dict_set(d, "l", l));
  sl_jv_free(d);
  sl_jv_free(NULL);
}

static void test_expressions(void) {
  sl_jv *c = make_ctx();
  EXPECT("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 10 / 4 }}",
         c, "7|3|-4|2|2.5");
  EXPECT("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 2.0 }} {{ 1/3 }}", c,
         "0.30000000000000004 1e+20 2.0 0.3333333333333333");
  EXPECT("{{ name ~ '-' ~ n }} {{ 'a' + 'b' }} {{ 'ab' * 2 }}", c,
         "sluice-3 ab abab");
  EXPECT("{{ xs }} {{ d }} {{ nothing }} {{ flag }} {{ (1, 'x') }}", c,
         "[1, 2, 3] {'a': 1, 'b': 'two'} None True (1, 'x')");
  EXPECT("{{ d.a }} {{ d['b'] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[::-1] }}", c,
         "1 two 3 [2, 3] [3, 2, 1]");
  EXPECT("[{{ missing }}][{{ d.zzz }}][{{ xs[10] }}]", c, "[][][]");
  EXPECT("{{ 2 in xs }} {{ 'a' in d }} {{ 'lu' in name }} {{ 9 not in xs }}", c,
         "True True True True");
  EXPECT("{{ 'y' if flag else 'n' }} {{ 'y' if nothing else 'n' }} {{ n > 2 "
         "and n < 4 }}",
         c, "y n True");
  EXPECT("{{ nothing or 'dflt' }} {{ not xs }} {{ 1 == 1.0 }} {{ 'b' > 'a' }}",
         c, "dflt False True True");
  EXPECT(
      "{{ 1 < 2 < 3 }} {{ 3 < 2 < 4 }} {{ (1 == 1) != (2 == 3) }} {{ xs.0 }}",
      c, "True False True 1");
  EXPECT("{{ 'tab\\there' }}|{{ \"q\\\"\" }}|{{ '\\u00e9' }}", c,
         "tab\there|q\"|\xc3\xa9");
  EXPECT("{{ 'héllo'[1] }} {{ 'héllo' | length }} {{ 'héllo'[::-1] }}", c,
         "\xc3\xa9 5 oll\xc3\xa9h");
  sl_jv_free(c);
}

/* Case mapping beyond Latin, Greek and Cyrillic (Armenian, Cyrillic
 * Extended-B, Latin Extended Additional): the expected strings are Python
 * 3's str.upper / lower / title / capitalize / isupper / islower. */
static void test_unicode_case(void) {
  sl_jv *c = make_ctx();
  const char *src = "{% set s = 'Ωμέγα straße Ärger աբգ ꙁꙃ ḁḃ' %}"
                    "{{ s | upper }}|{{ s | lower }}|{{ s.title() }}|"
                    "{{ s | capitalize }}|{{ 'ԱԲԳ'.isupper() }}"
                    "{{ 'աբգ'.isupper() }}{{ 'աբգ'.islower() }}"
                    "{{ 'ꙀꙂ'.islower() }}";
  EXPECT(src, c,
         "ΩΜΈΓΑ STRASSE ÄRGER ԱԲԳ ꙀꙂ ḀḂ|ωμέγα straße ärger աբգ ꙁꙃ ḁḃ|"
         "Ωμέγα Straße Ärger Աբգ Ꙁꙃ Ḁḃ|Ωμέγα straße ärger աբգ ꙁꙃ ḁḃ|"
         "TrueFalseTrueFalse");
  sl_jv_free(c);
}

static void test_filters_and_methods(void) {
  sl_jv *c = make_ctx();
  EXPECT("{{ '  x  ' | trim }}|{{ name | upper }}|{{ xs | join('-') }}|{{ xs | "
         "length }}",
         c, "x|SLUICE|1-2-3|3");
  EXPECT("{{ xs | first }}{{ xs | last }} {{ missing | default('d') }} {{ '' | "
         "d('e', true) }}",
         c, "13 d e");
  EXPECT("{{ d | tojson }} {{ d | tojson(indent=2) }}", c,
         "{\"a\": 1, \"b\": \"two\"} {\n  \"a\": 1,\n  \"b\": \"two\"\n}");
  EXPECT("{{ [3, 1, 2] | sort | list }} {{ [1, 1, 2] | unique | list }} {{ xs "
         "| reverse | list }}",
         c, "[1, 2, 3] [1, 2] [3, 2, 1]");
  EXPECT("{{ '5' | int + 1 }} {{ '2.5' | float }} {{ 2.5 | round }} {{ -3 | "
         "abs }} {{ 3 | string }}",
         c, "6 2.5 2.0 3 3");
  EXPECT("{{ d | items | list }} {% for k, v in d.items() %}{{ k }}{{ v }}{% "
         "endfor %}",
         c, "[('a', 1), ('b', 'two')] a1btwo");
  EXPECT("{{ 'a,b'.split(',') }} {{ 'xhix'.strip('x') }} {{ "
         "'abc'.startswith('ab') }} "
         "{{ 'abc'.endswith('x') }} {{ 'Ab'.lower() }} {{ 'a-b'.replace('-', "
         "'+') }}",
         c, "['a', 'b'] hi True False ab a+b");
  EXPECT("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys() | list }} {{ "
         "d.values() | list }}",
         c, "1 0 ['a', 'b'] [1, 'two']");
  EXPECT(
      "{{ '<&>' | e }} {{ 'hello world' | title }} {{ 'hELLO' | capitalize }}",
      c, "&lt;&amp;&gt; Hello World Hello");
  sl_jv *ms = sl_jv_list();
  sl_jv_list_append(ms, msg("system", "s"));
  sl_jv_list_append(ms, msg("user", "u1"));
  sl_jv_list_append(ms, msg("user", "u2"));
  sl_jv_dict_set(c, "ms", ms);
  EXPECT("{{ ms | selectattr('role', 'equalto', 'user') | "
         "map(attribute='content') | join(',') }}"
         " {{ ms | rejectattr('role', 'equalto', 'user') | list | length }}",
         c, "u1,u2 1");
  EXPECT("{{ missing is defined }} {{ n is number }} {{ name is string }} {{ n "
         "is odd }} "
         "{{ xs is iterable }} {{ d is mapping }} {{ nothing is none }} {{ n "
         "is not even }}",
         c, "False True True True True True True True");
  sl_jv_free(c);
}

static void test_control_flow(void) {
  sl_jv *c = make_ctx();
  EXPECT("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ "
         "loop.last }}"
         "{{ loop.length }}{{ loop.revindex }};{% endfor %}",
         c, "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
  EXPECT("{% for x in [] %}a{% else %}empty{% endfor %}", c, "empty");
  EXPECT("{% for x in xs if x != 2 %}{{ x }}/{{ loop.length }}{% endfor %}", c,
         "1/23/2");
  EXPECT("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% "
         "endfor %}",
         c, "13");
  EXPECT("{% for x in xs %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% "
         "endfor %}",
         c, "1");
  EXPECT("{% if n == 1 %}one{% elif n == 3 %}three{% else %}other{% endif %}",
         c, "three");
  EXPECT("{% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}",
         c, "1");
  EXPECT(
      "{% set ns = namespace(x=1) %}{% for i in xs %}{% set ns.x = ns.x + i %}"
      "{% endfor %}{{ ns.x }}",
      c, "7");
  EXPECT("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ "
         "m(2, b=3) }}",
         c, "<1B><23>");
  EXPECT("{% set s %}x{{ n }}{% endset %}{{ s }}{{ s | length }}", c, "x32");
  EXPECT("{% generation %}kept{% endgeneration %}", c, "kept");
  EXPECT("{% for i in range(2, 8, 2) %}{{ i }}{% endfor %}", c, "246");
  EXPECT_ERR(
      "{% for m in messages[::-1] %}{{ m }}{% endfor %}", c, SL_ERR_FORMAT,
      "'messages' is undefined"); /* as jinja2: slicing undefined fails */
  EXPECT("{% for m in messages %}{{ m }}{% endfor %}", c, "");
  sl_jv_free(c);
}

static void test_whitespace(void) {
  /* trim_blocks + lstrip_blocks as HF sets them */
  EXPECT("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
  EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
  EXPECT("{{ 'x' }}\n{{ 'y' }}", NULL, "x\ny");
  EXPECT("x\n{# c #}\ny", NULL, "x\ny");
  EXPECT("  {%+ if true %}k{% endif %}", NULL, "  k");
  EXPECT("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
  EXPECT("a\r\nb\n", NULL,
         "a\nb"); /* newline normalized, trailing one dropped */
  EXPECT("{{- '  a  ' -}}   {{ 'b' }}", NULL, "  a  b");
}

static void test_errors(void) {
  sl_jv *c = make_ctx();
  EXPECT_ERR("{% for x in xs %}", c, SL_ERR_FORMAT, "endfor");
  EXPECT_ERR("line1\n{{ 1 + }}", c, SL_ERR_FORMAT, "line 2");
  EXPECT_ERR("{{ 'unterminated }}", c, SL_ERR_FORMAT, "unterminated");
  EXPECT_ERR("{% include 'x' %}", c, SL_ERR_FORMAT, "include");
  EXPECT_ERR("\n\n{{ xs | frobnicate }}", c, SL_ERR_UNSUPPORTED, "line 3");
  EXPECT_ERR("{{ xs | frobnicate }}", c, SL_ERR_UNSUPPORTED, "frobnicate");
  EXPECT_ERR("{{ n is frob }}", c, SL_ERR_UNSUPPORTED, "frob");
  EXPECT_ERR("{{ raise_exception('No system role!') }}", c, SL_ERR_FORMAT,
             "No system role!");
  EXPECT_ERR("{{ missing.attr }}", c, SL_ERR_FORMAT, "'missing' is undefined");
  EXPECT_ERR("{{ 1 + 'a' }}", c, SL_ERR_FORMAT, "unsupported operand");
  EXPECT_ERR("{{ 1 / 0 }}", c, SL_ERR_FORMAT, "division by zero");
  EXPECT_ERR("{% set x.y = 1 %}", c, SL_ERR_FORMAT, "namespace");
  EXPECT_ERR("{{ '%s' % 1 }}", c, SL_ERR_UNSUPPORTED, "formatting");
  EXPECT_ERR("{{ 'a'.format(1) }}", c, SL_ERR_UNSUPPORTED, "format");
  EXPECT_ERR("{{ (((((1 }}", c, SL_ERR_FORMAT, "line 1");
  /* ctx must be a dict */
  sl_jinja_template_t *t = sl_jinja_compile("x", 1, NULL, 0);
  char *out = (char *)1;
  sl_jv *not_dict = sl_jv_list();
  CHECK_EQ_INT(sl_jinja_render(t, not_dict, &out, NULL, NULL, 0),
               SL_ERR_INVALID_ARG);
  CHECK(out == NULL);
  sl_jv_free(not_dict);
  sl_jinja_free(t);
  sl_jv_free(c);
}

static void test_limits(void) {
  /* runaway loops, recursion and output are bounded, never hang or crash */
  EXPECT_ERR("{% for a in range(100000) %}{% for b in range(100000) %}{% "
             "endfor %}{% endfor %}",
             NULL, SL_ERR_RANGE, "limit");
  {
    const char *s = "{% for a in range(100) %}{% for b in range(100) %}{% "
                    "endfor %}{% endfor %}";
    sl_jinja_limits few = {.max_steps = 5000};
    sl_jinja_template_t *t = sl_jinja_compile(s, strlen(s), NULL, 0);
    char *out = NULL, err[200];
    CHECK_EQ_INT(sl_jinja_render_ex(t, NULL, &few, &out, NULL, err, sizeof err),
                 SL_ERR_RANGE);
    CHECK(strstr(err, "step limit") != NULL);
    sl_jinja_free(t);
  }
  EXPECT_ERR("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL,
             SL_ERR_RANGE, "deeper");
  EXPECT_ERR("{{ range(1000000) }}", NULL, SL_ERR_RANGE, "range");
  char deep[2100];
  memset(deep, '(', 1000);
  deep[1000] = '1';
  memset(deep + 1001, ')', 1000);
  deep[2001] = 0;
  char *src = sl_malloc(4100);
  snprintf(src, 4100, "{{ %s }}", deep);
  EXPECT_ERR(src, NULL, SL_ERR_FORMAT, "nested too deeply"); /* compile fails */
  sl_free(src);
  /* values a template nests without bound are compared without recursing
   * past a fixed depth */
  EXPECT_ERR("{% set ns = namespace(x=[], y=[]) %}{% for i in range(20000) %}"
             "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}"
             "{{ ns.x == ns.y }}{{ ns.x < ns.y }}",
             NULL, SL_ERR_RANGE, "nested too deeply");
  sl_jinja_limits lim = {.max_output = 100};
  sl_jinja_template_t *t = sl_jinja_compile(
      "{% for i in range(1000) %}xxxx{% endfor %}", 42, NULL, 0);
  CHECK(t != NULL);
  char *out = NULL, err[200];
  CHECK_EQ_INT(sl_jinja_render_ex(t, NULL, &lim, &out, NULL, err, sizeof err),
               SL_ERR_RANGE);
  CHECK(out == NULL && strstr(err, "output"));
  sl_jinja_limits lim2 = {.max_memory = 1 << 20};
  sl_jinja_template_t *t2 =
      sl_jinja_compile("{% set ns = namespace(s='x') %}{% for i in range(30) "
                       "%}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s | length }}",
                       strlen("{% set ns = namespace(s='x') %}{% for i in "
                              "range(30) %}{% set ns.s = ns.s ~ ns.s %}"
                              "{% endfor %}{{ ns.s | length }}"),
                       NULL, 0);
  CHECK(t2 != NULL);
  CHECK_EQ_INT(sl_jinja_render_ex(t2, NULL, &lim2, &out, NULL, err, sizeof err),
               SL_ERR_RANGE);
  sl_jinja_free(t);
  sl_jinja_free(t2);
}

static char *read_fixture(const char *name) {
  const char *dir = getenv("SLUICE_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/fixtures/templates/%s", dir ? dir : ".",
           name);
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *buf = sl_malloc(1 << 16);
  size_t n = fread(buf, 1, (1 << 16) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void test_chat_smollm2(void) {
  char *tpl = read_fixture("smollm2.jinja");
  CHECK_MSG(tpl != NULL,
            "fixture smollm2.jinja not found (SLUICE_SOURCE_DIR?)");
  if (!tpl)
    return;
  sl_jv *ms = sl_jv_list();
  sl_jv_list_append(ms, msg("user", "Hi"));
  sl_jv_list_append(ms, msg("assistant", "Hello!"));
  sl_jv_list_append(ms, msg("user", "Bye"));
  char *out = NULL, err[256];
  size_t n = 0;
  CHECK_OK(sl_chat_template_render(tpl, ms, true, "", "<|im_end|>", NULL, &out,
                                   &n, err, sizeof err));
  const char *want =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
      "trained by "
      "Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
      "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>"
      "assistant\n";
  CHECK_MSG(out && strcmp(out, want) == 0, "got [%s]", out ? out : err);
  CHECK_EQ_INT(n, strlen(want));
  sl_free(out);
  /* a syntax error is SL_ERR_FORMAT with a message */
  CHECK_EQ_INT(sl_chat_template_render("{% if %}", ms, false, NULL, NULL, NULL,
                                       &out, NULL, err, sizeof err),
               SL_ERR_FORMAT);
  CHECK(out == NULL && err[0]);
  /* extra variables */
  sl_jv *extra = sl_jv_dict();
  sl_jv_dict_set(extra, "enable_thinking", sl_jv_bool(false));
  CHECK_OK(sl_chat_template_render(
      "{{ messages | length }}{{ enable_thinking }}{{ bos_token }}{{ "
      "add_generation_prompt }}",
      ms, false, "<s>", NULL, extra, &out, NULL, err, sizeof err));
  CHECK(out && strcmp(out, "3False<s>False") == 0);
  sl_free(out);
  sl_jv_free(extra);
  sl_jv_free(ms);
  sl_free(tpl);
}

/* Renders src over one untrusted message {user, " Hi, you "} with bos_token
 * "<s>" and shows the output with each run of untrusted bytes in [ ]. */
static char *render_marked(const char *src, bool mark) {
  sl_jv *ms = sl_jv_list();
  sl_jv_list_append(ms, msg("user", " Hi, you "));
  if (mark)
    sl_jv_mark_untrusted(ms);
  char *out = NULL, err[256];
  size_t n = 0;
  uint8_t *u = (uint8_t *)1;
  sl_status st = sl_chat_template_render_marked(src, ms, false, "<s>", "", NULL,
                                                &out, &n, &u, err, sizeof err);
  sl_jv_free(ms);
  CHECK_MSG(st == SL_OK, "%s: %s", src, err);
  if (st != SL_OK)
    return NULL;
  char *vis = sl_malloc(3 * n + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    bool in = u && u[i], prev = u && i > 0 && u[i - 1];
    if (in && !prev)
      vis[o++] = '[';
    if (!in && prev)
      vis[o++] = ']';
    vis[o++] = out[i];
  }
  if (u && n && u[n - 1])
    vis[o++] = ']';
  vis[o] = 0;
  sl_free(out);
  sl_free(u);
  return vis;
}

/* Which output bytes came from untrusted (request) values: kept through
 * concatenation, filters, methods, slicing, macros and captures; the
 * template's own text and bos_token are trusted. */
static void test_untrusted_marks(void) {
  static const char *const cases[][2] = {
      {"{{ '<|a|>' + messages[0].content + '<|b|>' }}",
       "<|a|>[ Hi, you ]<|b|>"},
      {"<|a|>{{ messages[0].content | trim }}<|b|>", "<|a|>[Hi, you]<|b|>"},
      {"{{ bos_token ~ messages[0].content | upper }}", "<s>[ HI, YOU ]"},
      {"{{ (bos_token + messages[0].content) | title }}", "<S>[ Hi, You ]"},
      {"{{ messages[0].content[1:3] }}", "[Hi]"},
      {"{{ messages[0].content.split(',') | join('<|x|>') }}",
       "[ Hi]<|x|>[ you ]"},
      {"{{ messages[0].content.replace('you', '<|y|>') }}", "[ Hi, ]<|y|>[ ]"},
      {"{% macro m(x) %}<t>{{ x }}</t>{% endmacro %}{{ m(messages[0].content) "
       "| trim }}",
       "<t>[ Hi, you ]</t>"},
      {"{% set s %}<t>{{ messages[0].role }}{% endset %}{{ s }}", "<t>[user]"},
      {"{{ messages[0] | tojson }}",
       "{[\"role\"]: [\"user\"], [\"content\"]: [\" Hi, you \"]}"},
      {"{% for c in messages[0].role %}{{ c }}-{% endfor %}",
       "[u]-[s]-[e]-[r]-"},
      {"{{ messages[0].content | length }}{{ messages | length }}", "91"},
      {"{{ messages[0].content * 2 }}", "[ Hi, you  Hi, you ]"},
      {"{{ messages[0].content | replace(' ', '_') }}", "_[Hi,]_[you]_"},
      {"{{ messages[0].content | trim | reverse | list | first }}", "[u]"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *got = render_marked(cases[i][0], true);
    CHECK_MSG(got && strcmp(got, cases[i][1]) == 0, "%s: got %s want %s",
              cases[i][0], got ? got : "(error)", cases[i][1]);
    sl_free(got);
  }
  /* nothing marked: no marks reported */
  char *got = render_marked("{{ messages[0].content }}", false);
  CHECK(got && strcmp(got, " Hi, you ") == 0);
  sl_free(got);
}

/* Every model template of the fixtures, over a conversation whose text has
 * no '<' or '[': no untrusted byte falls in the template's own markup
 * (<|im_start|>, <start_of_turn>, [INST], ...), and the message text is all
 * untrusted. */
static void test_untrusted_marks_fixtures(void) {
  static const char *const files[] = {
      "gemma2.jinja",  "gemma3.jinja",       "llama3.1.jinja",
      "llama3.jinja",  "mistral-v0.3.jinja", "phi3.jinja",
      "qwen2.5.jinja", "qwen3.jinja",        "smollm2.jinja"};
  for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
    char *tpl = read_fixture(files[k]);
    CHECK_MSG(tpl != NULL, "fixture %s", files[k]);
    if (!tpl)
      continue;
    sl_jv *ms = sl_jv_list();
    sl_jv_list_append(ms, msg("user", "Hello there, how are you?"));
    sl_jv_list_append(ms, msg("assistant", "Fine, thanks."));
    sl_jv_list_append(ms, msg("user", "Tell me a joke"));
    sl_jv_mark_untrusted(ms);
    char *out = NULL, err[256];
    size_t n = 0;
    uint8_t *u = NULL;
    CHECK_OK(sl_chat_template_render_marked(tpl, ms, true, "<s>", "</s>", NULL,
                                            &out, &n, &u, err, sizeof err));
    size_t marked = 0;
    for (size_t i = 0; out && u && i < n; i++) {
      CHECK_MSG(!u[i] || (out[i] != '<' && out[i] != '['),
                "%s: markup byte %zu marked untrusted", files[k], i);
      marked += u[i];
    }
    /* trims aside, the three texts are all there and untrusted */
    CHECK_MSG(marked >= 45, "%s: %zu bytes marked", files[k], marked);
    sl_free(out);
    sl_free(u);
    sl_jv_free(ms);
    sl_free(tpl);
  }
}

/* Fails the Nth allocation for N = 1, 2, ... until a run succeeds: every
 * failure must be a clean SL_ERR_NOMEM, with nothing leaked. */
static void test_alloc_failures(void) {
  const char *src = "{% set ns = namespace(n=0) %}{% macro m(x) %}[{{ x | "
                    "upper }}]{% endmacro %}"
                    "{% for msg in messages %}{{ m(msg.content) }}{% set ns.n "
                    "= ns.n + 1 %}{% endfor %}"
                    "{{ ns.n }}{{ messages | tojson }}";
  sl_jv *ms = sl_jv_list();
  sl_jv_list_append(ms, msg("user", "a"));
  sl_jv_list_append(ms, msg("assistant", "b"));
  size_t base = sl_malloc_live_bytes();
  int failures = 0;
  for (uint64_t n = 1; n < 2000; n++) {
    char *out = NULL, err[256];
    sl_malloc_fail_after(n);
    sl_status st = sl_chat_template_render(src, ms, true, "", "", NULL, &out,
                                           NULL, err, sizeof err);
    sl_malloc_fail_after(0);
    if (st == SL_OK) {
      CHECK(strcmp(out, "[A][B]2[{\"role\": \"user\", \"content\": \"a\"}, "
                        "{\"role\": \"assistant\", \"content\": \"b\"}]") == 0);
      sl_free(out);
      break;
    }
    failures++;
    CHECK_MSG(st == SL_ERR_NOMEM, "n=%llu status %d err %s",
              (unsigned long long)n, st, err);
    CHECK(out == NULL);
    CHECK_EQ_INT(sl_malloc_live_bytes(), base);
  }
  CHECK(failures > 3);
  CHECK_EQ_INT(sl_malloc_live_bytes(), base);
  sl_jv_free(ms);
}

int main(void) {
  RUN(test_values);
  RUN(test_expressions);
  RUN(test_filters_and_methods);
  RUN(test_unicode_case);
  RUN(test_control_flow);
  RUN(test_whitespace);
  RUN(test_errors);
  RUN(test_limits);
  RUN(test_chat_smollm2);
  RUN(test_untrusted_marks);
  RUN(test_untrusted_marks_fixtures);
  RUN(test_alloc_failures);
  return sl_test_finish();
}
