/* sluice — server: thinking split out of a model's text (reasoning.h).
 *
 * One step function per family works on the bytes held back: it moves
 * every byte it can decide into the reasoning or the content and keeps
 * only the undecided tail. What it decides depends on the bytes alone,
 * never on where the pieces were cut, so that any split of the text gives
 * the same two texts (the streamed answer is the non-streamed one).
 *
 * The <think> family (DeepSeek-R1, Qwen3), as llama.cpp's deepseek format
 * reads it: a think block counts only at the start of the answer (after
 * blanks), or from the first byte when the prompt opened it; the blanks
 * around the thinking and those after "</think>" are dropped; a block
 * never closed (max_tokens) is all reasoning; text with no block is
 * content, byte for byte as without a splitter. A second family (gpt-oss's
 * harmony channels) is one more step function and its states. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/reasoning.h"
#include "sluice/util.h"

static const char k_open[] = "<think>", k_close[] = "</think>";
#define OPEN_LEN  (sizeof k_open - 1)
#define CLOSE_LEN (sizeof k_close - 1)

/* The <think> family's states. */
enum {
  R_START = 0, /* at the answer's start: a block may open */
  R_LEAD,      /* inside a block, before its first non-blank */
  R_THINK,     /* inside a block */
  R_AFTER,     /* after "</think>", before the content's first non-blank */
  R_CONTENT,   /* the rest is content */
};

static const char *const k_names[] = {"none", "auto", "deepseek"};

bool sl__srv_rfmt_parse(const char *s, sl_srv_rfmt *out) {
  for (int f = SL_RFMT_NONE; f <= SL_RFMT_DEEPSEEK; f++)
    if (!strcmp(s, k_names[f])) {
      *out = (sl_srv_rfmt)f;
      return true;
    }
  return false;
}

const char *sl__srv_rfmt_name(sl_srv_rfmt f) {
  return f >= SL_RFMT_NONE && f <= SL_RFMT_DEEPSEEK ? k_names[f] : "none";
}

sl_srv_rfmt sl__srv_rfmt_of_template(const char *tmpl) {
  if (tmpl && strstr(tmpl, k_close))
    return SL_RFMT_DEEPSEEK; /* Qwen3, DeepSeek-R1, QwQ, SmolLM3 */
  return SL_RFMT_NONE;
}

sl_srv_rfmt sl__srv_rfmt_pick(sl_srv_rfmt setting, const char *tmpl) {
  return setting == SL_RFMT_AUTO ? sl__srv_rfmt_of_template(tmpl) : setting;
}

static bool is_blank(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool sl__srv_think_opened_text(sl_srv_rfmt f, const char *p, size_t n) {
  if (f != SL_RFMT_DEEPSEEK)
    return false;
  while (n > 0 && is_blank(p[n - 1]))
    n--;
  return n >= OPEN_LEN && !memcmp(p + n - OPEN_LEN, k_open, OPEN_LEN);
}

bool sl__srv_think_opened(sl_srv_rfmt f, const sl_tokenizer_t *tok,
                          const int32_t *ids, int n) {
  if (f != SL_RFMT_DEEPSEEK || n <= 0)
    return false;
  char tail[256];
  size_t len = 0;
  /* the pieces of the last few tokens, back to front, until the tag and
   * the blanks after it fit */
  int from = n;
  while (from > 0 && n - from < 16) {
    size_t pl = 0;
    const char *piece = sl_tokenizer_piece(tok, ids[from - 1], &pl);
    if (!piece || len + pl > sizeof tail)
      break;
    memmove(tail + pl, tail, len);
    memcpy(tail, piece, pl);
    len += pl;
    from--;
    size_t k = len;
    while (k > 0 && is_blank(tail[k - 1]))
      k--;
    if (k >= OPEN_LEN)
      break;
  }
  return sl__srv_think_opened_text(f, tail, len);
}

const char *sl__srv_think_close(sl_srv_rfmt f) {
  return f == SL_RFMT_DEEPSEEK ? "\n</think>\n\n" : "";
}

void sl__srv_rsplit_init(sl_srv_rsplit *p, sl_srv_rfmt f, bool opened) {
  memset(p, 0, sizeof *p);
  p->f = f == SL_RFMT_AUTO ? SL_RFMT_NONE : f;
  p->state = p->f == SL_RFMT_NONE ? R_CONTENT : opened ? R_LEAD : R_START;
  p->thought = p->state == R_LEAD;
}

size_t sl__srv_rsplit_think_bytes(const sl_srv_rsplit *p) {
  if (!p->thought)
    return 0;
  return p->think_end ? p->think_end : p->fed;
}

void sl__srv_rsplit_free(sl_srv_rsplit *p) {
  sl__sbuf_free(&p->hold);
  sl__sbuf_free(&p->reasoning);
  sl__sbuf_free(&p->content);
  memset(p, 0, sizeof *p);
}

bool sl__srv_rsplit_oom(const sl_srv_rsplit *p) {
  return p->hold.oom || p->reasoning.oom || p->content.oom;
}

bool sl__srv_rsplit_thinking(const sl_srv_rsplit *p) {
  return p->state == R_LEAD || p->state == R_THINK;
}

/* Drops the first n held bytes. */
static void consume(sl_srv_rsplit *p, size_t n) {
  memmove(p->hold.p, p->hold.p + n, p->hold.len - n);
  p->hold.len -= n;
}

static size_t blanks(const char *s, size_t n) {
  size_t i = 0;
  while (i < n && is_blank(s[i]))
    i++;
  return i;
}

/* The length of the longest proper prefix of tag[0..tl) that s[0..n) ends
 * with (0: none). */
static size_t partial_tag(const char *s, size_t n, const char *tag, size_t tl) {
  for (size_t k = tl - 1; k > 0; k--)
    if (k <= n && !memcmp(s + n - k, tag, k))
      return k;
  return 0;
}

/* True when s[0..n) (n < tl) is the start of tag. */
static bool tag_start(const char *s, size_t n, const char *tag, size_t tl) {
  return n < tl && !memcmp(s, tag, n);
}

/* The <think> family: decides what it can of the held bytes. `end`: the
 * text is complete (nothing more comes). */
static void step_think(sl_srv_rsplit *p, bool end) {
  for (;;) {
    char *s = p->hold.p;
    size_t n = p->hold.len, b;
    switch (p->state) {
    case R_START:
      b = blanks(s, n);
      if (n - b >= OPEN_LEN && !memcmp(s + b, k_open, OPEN_LEN)) {
        consume(p, b + OPEN_LEN);
        p->state = R_LEAD;
        p->thought = true;
        continue;
      }
      if (!end && (b == n || tag_start(s + b, n - b, k_open, OPEN_LEN)))
        return;             /* blanks, or the start of the tag: undecided */
      p->state = R_CONTENT; /* the blanks are content as they were */
      continue;
    case R_LEAD:
      /* blanks before the thinking are dropped, and a second "<think>"
       * (some R1 distills write it after the template's) */
      b = blanks(s, n);
      if (n - b >= OPEN_LEN && !memcmp(s + b, k_open, OPEN_LEN)) {
        consume(p, b + OPEN_LEN);
        continue;
      }
      if (b == n || (!end && tag_start(s + b, n - b, k_open, OPEN_LEN))) {
        if (end)
          p->hold.len = 0;
        return;
      }
      consume(p, b);
      p->state = R_THINK;
      continue;
    case R_THINK: {
      /* the thinking runs to "</think>"; without one, a tag may be
       * starting at the end, and blanks before it (or at the end) may be
       * the thinking's last, which are dropped: both held */
      const char *c = n ? memmem(s, n, k_close, CLOSE_LEN) : NULL;
      size_t cut = c     ? (size_t)(c - s)
                   : end ? n
                         : n - partial_tag(s, n, k_close, CLOSE_LEN);
      size_t text_end = cut;
      while (text_end > 0 && is_blank(s[text_end - 1]))
        text_end--;
      sl__sbuf_add(&p->reasoning, s, text_end);
      if (c) { /* (the held bytes are the input's last n) */
        p->think_end = p->fed - n + cut + CLOSE_LEN;
        consume(p, cut + CLOSE_LEN);
        p->state = R_AFTER;
        continue;
      }
      if (end)
        p->hold.len = 0;
      else
        consume(p, text_end);
      return;
    }
    case R_AFTER:
      b = blanks(s, n);
      consume(p, b);
      if (b == n)
        return;
      p->state = R_CONTENT;
      continue;
    default: /* R_CONTENT */
      sl__sbuf_add(&p->content, s, n);
      p->hold.len = 0;
      return;
    }
  }
}

void sl__srv_rsplit_feed(sl_srv_rsplit *p, const char *s, size_t n) {
  SL_ASSERT(!p->finished);
  if (!n)
    return;
  p->fed += n;
  if (p->state == R_CONTENT && !p->hold.len) { /* the common case */
    sl__sbuf_add(&p->content, s, n);
    return;
  }
  sl__sbuf_add(&p->hold, s, n);
  if (p->hold.oom)
    return;
  step_think(p, false);
}

void sl__srv_rsplit_finish(sl_srv_rsplit *p) {
  if (p->finished)
    return;
  p->finished = true;
  if (!p->hold.oom)
    step_think(p, true);
  p->hold.len = 0;
}
