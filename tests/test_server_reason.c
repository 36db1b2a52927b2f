/* Reasoning split out of a model's text (issue 45): the <think> family on
 * the texts its models write (a block and an answer, a block the template
 * opened, no block, a block cut by max_tokens, tags cut at a piece's end),
 * each fed whole, in every split at one byte boundary, in every split at
 * two, and byte by byte: the same reasoning and content every time. Also
 * the family picked from real templates, a template-opened block read from
 * the prompt's text, and an allocation failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "server/server_impl.h"
#include "sluice/util.h"

typedef struct rcase {
  bool opened;         /* the prompt opened the block */
  const char *text;    /* the model's text */
  const char *reason;  /* the reasoning it gives */
  const char *content; /* and the content */
  bool thinking;       /* the text ends inside the block */
} rcase;

static const rcase CASES[] = {
    /* Qwen3: the model opens the block itself */
    {false, "<think>\nThe user greets me.\n</think>\n\nHello!",
     "The user greets me.", "Hello!", false},
    /* DeepSeek-R1 / Qwen3-thinking: the template opened it */
    {true, "Let me think.\nTwo and two.\n</think>\n\nFour.",
     "Let me think.\nTwo and two.", "Four.", false},
    /* no block at all: the text as it is, leading blanks included */
    {false, "  Just an answer, with <b>tags</b>.", "",
     "  Just an answer, with <b>tags</b>.", false},
    /* a block cut by max_tokens: all reasoning */
    {true, "I should count: 1, 2, 3", "I should count: 1, 2, 3", "", true},
    {false, "<think>\nStill going  \n", "Still going", "", true},
    /* cut inside the closing tag: the part of the tag is reasoning text */
    {true, "almost done\n</thi", "almost done\n</thi", "", true},
    /* a tag only at the start: later it is content */
    {false, "Sure. <think>not thinking</think> done", "",
     "Sure. <think>not thinking</think> done", false},
    /* "<" and blanks inside the thinking are kept */
    {true, "a < b and  \n  b <= c\n</think>ok", "a < b and  \n  b <= c", "ok",
     false},
    /* an empty block (Qwen3 with enable_thinking false writes it) */
    {false, "<think>\n\n</think>\n\nThe answer.", "", "The answer.", false},
    /* a second <think> after the template's (R1 distills) */
    {true, "\n<think>\nhmm\n</think>yes", "hmm", "yes", false},
    /* a close tag inside content after the block stays content */
    {true, "x</think>a</think>b", "x", "a</think>b", false},
    /* tool calls after the block are content for the tool parser */
    {true, "I need the weather.</think>\n\n<tool_call>\n{\"name\": \"w\"}",
     "I need the weather.", "<tool_call>\n{\"name\": \"w\"}", false},
    /* the start of "<think>" that is not one */
    {false, "<thinking>", "", "<thinking>", false},
    {false, "<thi", "", "<thi", false},
    {false, "   ", "", "   ", false},
    /* UTF-8 in both parts */
    {true, "café ☕\n</think>\n日本", "café ☕", "日本", false},
    {true, "", "", "", true},
};

typedef struct got {
  char *reason, *content;
  bool thinking;
} got;

/* Feeds text[0..n) cut at the given points (sorted, in [0, n]). */
static got feed(const rcase *c, const size_t *cuts, int n_cuts) {
  sl_srv_rsplit p;
  sl__srv_rsplit_init(&p, SL_RFMT_DEEPSEEK, c->opened);
  size_t n = strlen(c->text), at = 0;
  for (int i = 0; i <= n_cuts; i++) {
    size_t to = i < n_cuts ? cuts[i] : n;
    sl__srv_rsplit_feed(&p, c->text + at, to - at);
    at = to;
  }
  got g;
  g.thinking = sl__srv_rsplit_thinking(&p);
  sl__srv_rsplit_finish(&p);
  sl__srv_rsplit_finish(&p); /* idempotent */
  g.reason = strndup(p.reasoning.p ? p.reasoning.p : "", p.reasoning.len);
  g.content = strndup(p.content.p ? p.content.p : "", p.content.len);
  CHECK(!sl__srv_rsplit_oom(&p));
  sl__srv_rsplit_free(&p);
  return g;
}

static bool same(const rcase *c, got g, const char *how) {
  bool ok = !strcmp(g.reason, c->reason) && !strcmp(g.content, c->content);
  if (!ok)
    fprintf(stderr, "text %.40s (%s): reason '%s' content '%s'\n", c->text, how,
            g.reason, g.content);
  free(g.reason);
  free(g.content);
  return ok;
}

static void test_whole(void) {
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    got g = feed(&CASES[i], NULL, 0);
    CHECK_MSG(g.thinking == CASES[i].thinking, "case %zu: thinking %d", i,
              g.thinking);
    CHECK(same(&CASES[i], g, "whole"));
  }
}

/* Every split at one and at two byte boundaries, and byte by byte. */
static void test_every_split(void) {
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    const rcase *c = &CASES[i];
    size_t n = strlen(c->text);
    int bad = 0;
    for (size_t a = 0; a <= n; a++) {
      size_t one[1] = {a};
      if (!same(c, feed(c, one, 1), "one split"))
        bad++;
      for (size_t b = a; b <= n; b++) {
        size_t two[2] = {a, b};
        if (!same(c, feed(c, two, 2), "two splits"))
          bad++;
      }
    }
    size_t *all = malloc(sizeof *all * (n + 1));
    for (size_t k = 0; k < n; k++)
      all[k] = k;
    if (!same(c, feed(c, all, (int)n), "byte by byte"))
      bad++;
    free(all);
    CHECK_MSG(bad == 0, "case %zu: %d splits differ", i, bad);
  }
}

/* While streaming, what is out already is never taken back: the texts
 * only grow as pieces come, and a tag cut at a piece's end is held. */
static void test_hold_back(void) {
  sl_srv_rsplit p;
  sl__srv_rsplit_init(&p, SL_RFMT_DEEPSEEK, true);
  sl__srv_rsplit_feed(&p, "abc\n</th", 8);
  CHECK(p.reasoning.len == 3 && !memcmp(p.reasoning.p, "abc", 3));
  CHECK(p.content.len == 0 && sl__srv_rsplit_thinking(&p));
  sl__srv_rsplit_feed(&p, "ink>", 4);
  CHECK(!sl__srv_rsplit_thinking(&p) && p.reasoning.len == 3);
  sl__srv_rsplit_feed(&p, "\n\nHi", 4);
  CHECK(p.content.len == 2 && !memcmp(p.content.p, "Hi", 2));
  sl__srv_rsplit_free(&p);
  /* before any tag: "<thi" waits, then turns out to be content */
  sl__srv_rsplit_init(&p, SL_RFMT_DEEPSEEK, false);
  sl__srv_rsplit_feed(&p, " <thi", 5);
  CHECK(p.content.len == 0 && p.reasoning.len == 0);
  sl__srv_rsplit_feed(&p, "s", 1);
  CHECK(p.content.len == 6 && !memcmp(p.content.p, " <this", 6));
  sl__srv_rsplit_free(&p);
  /* NONE: everything is content, tags included */
  sl__srv_rsplit_init(&p, SL_RFMT_NONE, true);
  sl__srv_rsplit_feed(&p, "<think>x</think>y", 17);
  CHECK(p.content.len == 17 && p.reasoning.len == 0);
  CHECK(!sl__srv_rsplit_thinking(&p));
  sl__srv_rsplit_free(&p);
}

/* An allocation that fails shows as oom; nothing leaks. */
static void test_oom(void) {
  size_t live = sl_malloc_live_bytes();
  sl_srv_rsplit p;
  sl__srv_rsplit_init(&p, SL_RFMT_DEEPSEEK, true);
  sl_malloc_fail_after(1);
  sl__srv_rsplit_feed(&p, "thinking", 8);
  sl_malloc_fail_after(0);
  CHECK(sl__srv_rsplit_oom(&p));
  sl__srv_rsplit_finish(&p);
  sl__srv_rsplit_free(&p);
  CHECK(sl_malloc_live_bytes() == live);
}

/* The family picked from real templates (qwen3 writes <think>, the others
 * none), the settings, and a block opened by the prompt's text. */
static void test_families(void) {
  static const struct {
    const char *file;
    sl_srv_rfmt f;
  } want[] = {
      {"qwen3.jinja", SL_RFMT_DEEPSEEK},
      {"qwen2.5.jinja", SL_RFMT_NONE},
      {"smollm2.jinja", SL_RFMT_NONE},
      {"llama3.1.jinja", SL_RFMT_NONE},
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
    CHECK_EQ_INT(sl__srv_rfmt_of_template(t), want[i].f);
    CHECK_EQ_INT(sl__srv_rfmt_pick(SL_RFMT_AUTO, t), want[i].f);
    CHECK_EQ_INT(sl__srv_rfmt_pick(SL_RFMT_NONE, t), SL_RFMT_NONE);
    CHECK_EQ_INT(sl__srv_rfmt_pick(SL_RFMT_DEEPSEEK, t), SL_RFMT_DEEPSEEK);
    free(t);
  }
  printf("   %d of %zu templates found\n", seen, sizeof want / sizeof *want);
  CHECK(seen == (int)(sizeof want / sizeof *want));
  sl_srv_rfmt f;
  CHECK(sl__srv_rfmt_parse("deepseek", &f) && f == SL_RFMT_DEEPSEEK);
  CHECK(sl__srv_rfmt_parse("none", &f) && f == SL_RFMT_NONE);
  CHECK(sl__srv_rfmt_parse("auto", &f) && f == SL_RFMT_AUTO);
  CHECK(!sl__srv_rfmt_parse("harmonyx", &f));
  static const char opened[] = "<|im_start|>assistant\n<think>\n";
  static const char closed[] = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  static const char plain[] = "<|im_start|>assistant\n";
  CHECK(sl__srv_think_opened_text(SL_RFMT_DEEPSEEK, opened, strlen(opened)));
  CHECK(!sl__srv_think_opened_text(SL_RFMT_DEEPSEEK, closed, strlen(closed)));
  CHECK(!sl__srv_think_opened_text(SL_RFMT_DEEPSEEK, plain, strlen(plain)));
  CHECK(!sl__srv_think_opened_text(SL_RFMT_NONE, opened, strlen(opened)));
}

/* A done job's answer: the thinking split first, the tool-call parser on
 * the content (a call after the block is read; the same call inside the
 * block stays thinking); streamed, the content goes out around the call. */
static void test_job_tool_calls(void) {
  static const char text[] =
      "I should call the tool.\n</think>\n\nLet me look.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
      "\n</tool_call>";
  for (int open = 0; open < 2; open++) {
    sl_srv_job *j = calloc(1, sizeof *j);
    j->req.api = SL_SRV_CHAT;
    j->req.rfmt = SL_RFMT_DEEPSEEK;
    j->req.think_open = open; /* closed: the call is in no block at all */
    j->req.toolfmt = SL_TOOLFMT_HERMES;
    const char *t = open ? text : strstr(text, "Let me");
    j->text = (char *)t;
    j->text_len = strlen(t);
    /* streamed while running, then done */
    j->text_len = strlen(t) / 2;
    const char *p;
    size_t n1 = sl__srv_tool_stream_text(j, &p);
    char sent[256] = "";
    memcpy(sent, p, n1);
    j->text_len = strlen(t);
    j->done = true;
    size_t n2 = sl__srv_tool_stream_text(j, &p);
    memcpy(sent + n1, p, n2);
    sent[n1 + n2] = 0;
    const sl_srv_toolcalls *tc = sl__srv_job_calls(j);
    CHECK(tc && tc->n == 1 && !strcmp(tc->v[0].name, "get_weather"));
    CHECK(tc && !strcmp(tc->content, "Let me look."));
    CHECK_MSG(!strcmp(sent, "Let me look."), "streamed '%s'", sent);
    sl_srv_rsplit *rs = sl__srv_job_split(j, j->text_len);
    CHECK(rs && rs->finished);
    if (open)
      CHECK(rs->reasoning.len == 23 &&
            !memcmp(rs->reasoning.p, "I should call the tool.", 23));
    else
      CHECK(rs->reasoning.len == 0);
    sl__srv_toolcalls_free(&j->calls);
    sl__srv_rsplit_free(&j->rs);
    free(j);
  }
  /* a call inside a block never closed is thinking, not a call */
  sl_srv_job *j = calloc(1, sizeof *j);
  j->req.api = SL_SRV_CHAT;
  j->req.rfmt = SL_RFMT_DEEPSEEK;
  j->req.think_open = true;
  j->req.toolfmt = SL_TOOLFMT_HERMES;
  j->text = (char *)"<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
  j->text_len = strlen(j->text);
  j->done = true;
  CHECK(sl__srv_job_calls(j) == NULL);
  size_t clen;
  sl__srv_job_content(j, &clen);
  CHECK(clen == 0 && j->rs.reasoning.len == j->text_len);
  sl__srv_toolcalls_free(&j->calls);
  sl__srv_rsplit_free(&j->rs);
  free(j);
}

/* usage's reasoning_tokens: the tokens whose text starts inside the think
 * block, its tags included, however the text was cut into tokens and
 * pieces; the content's are not counted; none without a block. */
static void test_reasoning_tokens(void) {
  static const struct {
    bool open;
    const char *pieces[8]; /* each a token's text */
    int want;
  } cases[] = {
      /* the model opens the block: "<think>" ... "</think>" are 5 tokens */
      {false, {"<think>", "\nab", " cd", "\n</", "think>", "\n\nEF", " gh"}, 5},
      /* the template opened it: the answer starts inside */
      {true, {"ab", " cd", "</think>", "\n\n", "EF"}, 3},
      /* a tag split across tokens, blanks after it */
      {true, {"x", "</th", "ink", ">\n", "\n", "y"}, 4},
      /* never closed (max_tokens): every token */
      {true, {"ab", " cd", " </th"}, 3},
      /* no block at all */
      {false, {"Hello", " there", " <think>"}, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    sl_srv_job *j = calloc(1, sizeof *j);
    j->req.api = SL_SRV_CHAT;
    j->req.rfmt = SL_RFMT_DEEPSEEK;
    j->req.think_open = cases[c].open;
    char text[256] = "";
    sl_srv_tok toks[8];
    int n = 0;
    for (; n < 8 && cases[c].pieces[n]; n++) {
      toks[n] = (sl_srv_tok){.id = n,
                             .text_off = strlen(text),
                             .text_len = strlen(cases[c].pieces[n])};
      strcat(text, cases[c].pieces[n]);
    }
    j->text = text;
    j->text_len = strlen(text);
    j->toks = toks;
    j->n_toks = n;
    /* streamed: the split fed a piece at a time, then done */
    for (int i = 0; i < n; i++)
      sl__srv_job_split(j, toks[i].text_off + toks[i].text_len);
    j->done = true;
    int got = sl__srv_job_reasoning_tokens(j);
    CHECK_MSG(got == cases[c].want, "case %zu: %d reasoning tokens, not %d", c,
              got, cases[c].want);
    sl__srv_rsplit_free(&j->rs);
    free(j);
  }
}

int main(void) {
  RUN(test_reasoning_tokens);
  RUN(test_whole);
  RUN(test_every_split);
  RUN(test_hold_back);
  RUN(test_oom);
  RUN(test_families);
  RUN(test_job_tool_calls);
  return sl_test_finish();
}
