/* Pre-tokenizers: split text (as code points) into words before BPE.
 *
 * A pre-tokenizer is a list of steps applied in turn, each refining the
 * previous split (a word never spans two fragments of an earlier step), as
 * llama.cpp's unicode_regex_split does. The GPT-2, Llama 3 and Qwen2 patterns
 * are hand-written matchers over code point categories (what llama.cpp runs
 * for them); any other pattern goes through PCRE2:
 *  - a pattern using \p{..} runs, byte per code point, over a "collapsed"
 *    text where each non-ASCII code point is replaced by a marker byte for
 *    its category (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark,
 *    0xD5 symbol, 0xD0 other, 0x0B whitespace), the \p{..} classes being
 *    rewritten to match those markers and their ASCII members;
 *  - any other pattern runs in UTF mode over the text with non-ASCII
 *    whitespace replaced by 0x0B.
 * That reproduces llama.cpp's std::regex behaviour, category tables included.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

typedef enum step_kind {
  STEP_GPT2,
  STEP_LLAMA3,
  STEP_QWEN2,
  STEP_REGEX_COLLAPSED,
  STEP_REGEX_UTF,
} step_kind;

typedef struct step {
  step_kind kind;
  pcre2_code *re; /* REGEX steps */
} step;

struct sl__pre {
  sl__pre_kind kind;
  size_t n_steps;
  step steps[8];
  bool need_collapse;
};

/* ---- the hand-written matchers ------------------------------------------ */

typedef struct frag {
  const uint32_t *cpts;
  size_t ini, end; /* the fragment is cpts[ini..end) */
  size_t prev_end;
  sl__ivec *out;
} frag;

#define OUT_OF_RANGE 0xFFFFFFFFu

static uint32_t get_cpt(const frag *f, size_t pos) {
  return (pos >= f->ini && pos < f->end) ? f->cpts[pos] : OUT_OF_RANGE;
}

/* Flags, 0 outside the fragment. */
static uint16_t get_flags(const frag *f, size_t pos) {
  return (pos >= f->ini && pos < f->end) ? sl__cpt_flags(f->cpts[pos]) : 0;
}

/* Ends the current word at `end`; returns its length. */
static sl_status add_word(frag *f, size_t end, size_t *len) {
  size_t n = end - f->prev_end;
  f->prev_end = end;
  if (len)
    *len = n;
  if (n == 0)
    return SL_OK;
  return sl__ivec_push(f->out, (int32_t)n);
}

#define F_WS(fl) (((fl)&SL__CPT_WHITESPACE) != 0)
#define F_L(fl)  (((fl)&SL__CPT_LETTER) != 0)
#define F_N(fl)  (((fl)&SL__CPT_NUMBER) != 0)
/* [^\s\p{L}\p{N}] inside the fragment */
#define F_OTHER(fl)                                                            \
  (!((fl) & (SL__CPT_WHITESPACE | SL__CPT_LETTER | SL__CPT_NUMBER)) &&         \
   (fl) != 0)

static uint32_t ascii_lower(uint32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d at pos (case-insensitive when `ci`); returns the
 * match length or 0. */
static size_t contraction(const frag *f, size_t pos, bool ci) {
  if (get_cpt(f, pos) != '\'' || pos + 1 >= f->end)
    return 0;
  uint32_t a = get_cpt(f, pos + 1);
  if (ci)
    a = ascii_lower(a);
  if (a == 's' || a == 't' || a == 'm' || a == 'd')
    return 2;
  if (pos + 2 >= f->end)
    return 0;
  uint32_t b = get_cpt(f, pos + 2);
  if (ci)
    b = ascii_lower(b);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
      (a == 'l' && b == 'l'))
    return 3;
  return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static sl_status split_gpt2(frag *f) {
  sl_status st = SL_OK;
  size_t pos = f->ini, n;
  while (pos < f->end && st == SL_OK) {
    uint32_t cpt = get_cpt(f, pos);
    uint16_t fl = get_flags(f, pos);
    size_t c = contraction(f, pos, false);
    if (c) {
      st = add_word(f, pos + c, &n);
      pos += n;
      continue;
    }
    uint16_t fl2 = cpt == ' ' ? get_flags(f, pos + 1) : fl;
    if (F_L(fl2) || F_N(fl2) || F_OTHER(fl2)) {
      int cls = F_L(fl2) ? 0 : F_N(fl2) ? 1 : 2;
      pos += (cpt == ' ');
      for (;;) {
        bool in = cls == 0 ? F_L(fl2) : cls == 1 ? F_N(fl2) : F_OTHER(fl2);
        if (!in)
          break;
        fl2 = get_flags(f, ++pos);
      }
      st = add_word(f, pos, NULL);
      continue;
    }
    size_t nws = 0;
    while (F_WS(get_flags(f, pos + nws)))
      nws++;
    if (nws > 1 && get_cpt(f, pos + nws) != OUT_OF_RANGE) {
      pos += nws - 1; /* \s+(?!\S) */
      st = add_word(f, pos, NULL);
      continue;
    }
    if (nws > 0) {
      pos += nws;
      st = add_word(f, pos, NULL);
      continue;
    }
    st = add_word(f, ++pos, NULL);
  }
  return st;
}

/* Llama 3 (digits in runs of at most 3) and Qwen2 (single digits):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 * ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static sl_status split_llama3(frag *f, size_t max_digits) {
  sl_status st = SL_OK;
  size_t pos = f->ini, n;
  while (pos < f->end && st == SL_OK) {
    uint32_t cpt = get_cpt(f, pos);
    uint16_t fl = get_flags(f, pos);
    size_t c = contraction(f, pos, true);
    if (c) {
      st = add_word(f, pos + c, &n);
      pos += n;
      continue;
    }
    if (!(cpt == '\r' || cpt == '\n' || F_N(fl))) {
      if (F_L(fl) || F_L(get_flags(f, pos + 1))) {
        pos++;
        while (F_L(get_flags(f, pos)))
          pos++;
        st = add_word(f, pos, NULL);
        continue;
      }
    }
    if (F_N(fl)) {
      size_t ini = pos;
      while (st == SL_OK && F_N(get_flags(f, pos))) {
        if (++pos - ini >= max_digits) {
          st = add_word(f, pos, NULL);
          ini = pos;
        }
      }
      if (st == SL_OK)
        st = add_word(f, pos, NULL);
      continue;
    }
    uint16_t fl2 = cpt == ' ' ? get_flags(f, pos + 1) : fl;
    /* (a lone space at the fragment's end falls to \s+ below: same word) */
    if (F_OTHER(fl2)) {
      pos += (cpt == ' ');
      while (F_OTHER(fl2))
        fl2 = get_flags(f, ++pos);
      uint32_t c2 = get_cpt(f, pos);
      while (c2 == '\r' || c2 == '\n')
        c2 = get_cpt(f, ++pos);
      st = add_word(f, pos, NULL);
      continue;
    }
    size_t nws = 0, last_rn = 0;
    while (F_WS(get_flags(f, pos + nws))) {
      uint32_t c2 = get_cpt(f, pos + nws);
      if (c2 == '\r' || c2 == '\n')
        last_rn = pos + nws + 1;
      nws++;
    }
    if (last_rn > 0) { /* \s*[\r\n]+ */
      pos = last_rn;
      st = add_word(f, pos, NULL);
      continue;
    }
    if (nws > 1 && get_cpt(f, pos + nws) != OUT_OF_RANGE) {
      pos += nws - 1;
      st = add_word(f, pos, NULL);
      continue;
    }
    if (nws > 0) {
      pos += nws;
      st = add_word(f, pos, NULL);
      continue;
    }
    st = add_word(f, ++pos, NULL);
  }
  return st;
}

/* ---- PCRE2 steps --------------------------------------------------------- */

static unsigned char collapse_cpt(uint32_t c) {
  if (c < 128)
    return (unsigned char)c;
  uint16_t fl = sl__cpt_flags(c);
  if (fl & SL__CPT_WHITESPACE)
    return 0x0B;
  switch (fl & SL__CPT_CATEGORY_MASK) {
  case SL__CPT_NUMBER:
    return 0xD1;
  case SL__CPT_LETTER:
    return 0xD2;
  case SL__CPT_PUNCTUATION:
    return 0xD3;
  case SL__CPT_ACCENT_MARK:
    return 0xD4;
  case SL__CPT_SYMBOL:
    return 0xD5;
  default:
    return 0xD0;
  }
}

typedef struct ucat {
  const char *name;
  const char *repl; /* marker byte + ASCII members, class-body syntax */
} ucat;

static const ucat k_ucats[] = {
    {"\\p{N}", "\xD1\x30-\x39"},
    {"\\p{L}", "\xD2\x41-\x5A\x61-\x7A"},
    {"\\p{P}", "\xD3\x21-\x23\x25-\x2A\x2C-\x2F\x3A-\x3B\x3F-\x40\\\x5B-\\\x5D"
               "\x5F\\\x7B\\\x7D"},
    {"\\p{M}", "\xD4"},
    {"\\p{S}", "\xD5\\\x24\\\x2B\x3C-\x3E\x5E\x60\\\x7C\\\x7E"},
    {"\\p{Lu}", "\xD2\x41-\x5A\x61-\x7A"},
    {"\\p{Ll}", "\xD2\x41-\x5A\x61-\x7A"},
    {"\\p{Lt}", "\xD2\x41-\x5A\x61-\x7A"},
    {"\\p{Lm}", "\xD2\x41-\x5A\x61-\x7A"},
    {"\\p{Lo}", "\xD2\x41-\x5A\x61-\x7A"},
};

static bool uses_ucat(const char *re) {
  for (size_t i = 0; i < sizeof k_ucats / sizeof k_ucats[0]; i++)
    if (strstr(re, k_ucats[i].name))
      return true;
  return false;
}

/* Rewrites `re` for the collapsed text into out (cap bytes). */
static bool collapse_regex(const char *re, char *out, size_t cap) {
  size_t o = 0, n = strlen(re);
  bool inside = false;
#define PUT(c)                                                                 \
  do {                                                                         \
    if (o + 1 >= cap)                                                          \
      return false;                                                            \
    out[o++] = (char)(c);                                                      \
  } while (0)
  for (size_t i = 0; i < n; i++) {
    if ((unsigned char)re[i] >= 0x80)
      return false; /* categories and non-ASCII together: unsupported */
    if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
      PUT('[');
      inside = true;
      continue;
    }
    if (inside && re[i] == ']' && re[i - 1] != '\\') {
      PUT(']');
      inside = false;
      continue;
    }
    if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
      const char *close = strchr(re + i + 3, '}');
      if (close && (size_t)(close - re) <= i + 10) {
        size_t plen = (size_t)(close - re) - i + 1;
        const ucat *u = NULL;
        for (size_t k = 0; k < sizeof k_ucats / sizeof k_ucats[0]; k++)
          if (strlen(k_ucats[k].name) == plen &&
              memcmp(k_ucats[k].name, re + i, plen) == 0)
            u = &k_ucats[k];
        if (u) {
          if (!inside)
            PUT('[');
          for (const char *r = u->repl; *r; r++)
            PUT(*r);
          if (!inside)
            PUT(']');
          i += plen - 1;
          continue;
        }
      }
    }
    PUT(re[i]);
  }
  out[o] = 0;
  return true;
#undef PUT
}

static sl_status add_regex(sl__pre *p, const char *re, char *err,
                           size_t errcap) {
  SL_ASSERT(p->n_steps < sizeof p->steps / sizeof p->steps[0]);
  step *s = &p->steps[p->n_steps];
  char buf[1024];
  const char *pat = re;
  uint32_t opts = PCRE2_DOLLAR_ENDONLY;
  if (uses_ucat(re)) {
    if (!collapse_regex(re, buf, sizeof buf)) {
      snprintf(err, errcap, "pre-tokenizer regex not supported: %s", re);
      return SL_ERR_UNSUPPORTED;
    }
    pat = buf;
    s->kind = STEP_REGEX_COLLAPSED;
    p->need_collapse = true;
  } else {
    s->kind = STEP_REGEX_UTF;
    opts |= PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  }
  int ec;
  PCRE2_SIZE eo;
  s->re = pcre2_compile((PCRE2_SPTR)pat, strlen(pat), opts, &ec, &eo, NULL);
  if (!s->re) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(ec, msg, sizeof msg);
    snprintf(err, errcap, "pre-tokenizer regex: %s at %zu", (char *)msg,
             (size_t)eo);
    return SL_ERR_UNSUPPORTED;
  }
  p->n_steps++;
  return SL_OK;
}

static void add_custom(sl__pre *p, step_kind k) {
  SL_ASSERT(p->n_steps < sizeof p->steps / sizeof p->steps[0]);
  p->steps[p->n_steps].kind = k;
  p->steps[p->n_steps].re = NULL;
  p->n_steps++;
}

sl_status sl__pre_create(sl__pre_kind kind, sl__pre **out, char *err,
                         size_t errcap) {
  *out = NULL;
  sl__pre *p = sl_calloc(1, sizeof *p);
  if (!p)
    return SL_ERR_NOMEM;
  p->kind = kind;
  sl_status st = SL_OK;
  switch (kind) {
  case SL__PRE_GPT2:
    add_custom(p, STEP_GPT2);
    break;
  case SL__PRE_LLAMA3:
    add_custom(p, STEP_LLAMA3);
    break;
  case SL__PRE_QWEN2:
    add_custom(p, STEP_QWEN2);
    break;
  case SL__PRE_STARCODER:
    st = add_regex(p, "\\p{N}", err, errcap);
    add_custom(p, STEP_GPT2);
    break;
  case SL__PRE_DEEPSEEK_LLM: {
    /* From DeepSeek LLM's tokenizer.json (as llama.cpp uses it). */
    static const char *const res[] = {
        "[\r\n]",
        "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA"
        "\xC6\xBC-\xC6\xBF\xC7\x84-\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3"
        "\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A"
        "\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-"
        "\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-\xE1"
        "\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2"
        "\xBD-\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7"
        "\xE1\xB5\xB9-\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1"
        "\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD"
        "\x90-\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-"
        "\xE1\xBD\xBD\xE1\xBE\x80-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1"
        "\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-\xE1\xBF\x8C\xE1\xBF"
        "\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-\xE1\xBF\xAC"
        "\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2"
        "\x84\x87\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84"
        "\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2"
        "\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85"
        "-\xE2\x85\x89\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2"
        "\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3"
        "\xB2\xE2\xB3\xB3\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B"
        "\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-\xEA\x9E\x87\xEA\x9E\x8B-\xEA"
        "\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-\xEF\xAC\x86\xEF\xAC"
        "\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-\xEF\xBD\x9A"
        "\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93"
        "\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2"
        "\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F"
        "\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
        "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80"
        "\x98-\xE2\x80\x9F\xE3\x80\x80-\xE3\x80\x82]+",
        "\\s+$",
        "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED"
        "\x9F\xBF]+",
        "\\p{N}+",
    };
    for (size_t i = 0; i < sizeof res / sizeof res[0] && st == SL_OK; i++)
      st = add_regex(p, res[i], err, errcap);
    break;
  }
  case SL__PRE_DEFAULT:
  default:
    st = add_regex(p, "[\\p{P}\\$\\+<=>\\^~\\|]+", err, errcap);
    add_custom(p, STEP_GPT2);
    if (st == SL_OK)
      st = add_regex(p, "\\p{N}+", err, errcap);
    if (st == SL_OK)
      st = add_regex(p, "[0-9][0-9][0-9]", err, errcap);
    break;
  }
  if (st != SL_OK) {
    sl__pre_free(p);
    return st;
  }
  *out = p;
  return SL_OK;
}

void sl__pre_free(sl__pre *p) {
  if (!p)
    return;
  for (size_t i = 0; i < p->n_steps; i++)
    if (p->steps[i].re)
      pcre2_code_free(p->steps[i].re);
  sl_free(p);
}

/* Runs `re` over each fragment of subject (units of `unit_cpt`: for the
 * collapsed text one byte is one code point; for UTF-8 text byte offsets are
 * turned back into code point counts via `b2c`, which maps a byte offset at
 * a code point boundary to the code point index). */
static sl_status regex_step(const pcre2_code *re, const char *subj,
                            const size_t *frag_b, const sl__ivec *in,
                            const uint32_t *b2c, sl__ivec *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
  if (!md)
    return SL_ERR_NOMEM;
  sl_status st = SL_OK;
  size_t cstart = 0; /* code point start of the fragment */
  for (size_t fi = 0; fi < in->n && st == SL_OK; fi++) {
    size_t clen = (size_t)in->v[fi];
    size_t b0 = frag_b[fi], b1 = frag_b[fi + 1];
    const char *s = subj + b0;
    size_t slen = b1 - b0;
    size_t at = 0;       /* byte offset within the fragment */
    size_t last_end = 0; /* byte offset of the end of the last match */
#define CP(boff) ((size_t)(b2c ? b2c[b0 + (boff)] : b0 + (boff)) - cstart)
    while (at <= slen && st == SL_OK) {
      int rc = pcre2_match(re, (PCRE2_SPTR)s, slen, at, 0, md, NULL);
      if (rc < 0)
        break;
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      size_t ms = ov[0], me = ov[1];
      if (me == ms) { /* empty match: no word; step one unit on */
        if (ms >= slen)
          break;
        at = ms + 1;
        if (b2c)
          while (at < slen && sl_utf8_is_cont((unsigned char)s[at]))
            at++;
        continue;
      }
      if (ms > last_end)
        st = sl__ivec_push(out, (int32_t)(CP(ms) - CP(last_end)));
      if (st == SL_OK)
        st = sl__ivec_push(out, (int32_t)(CP(me) - CP(ms)));
      last_end = me;
      at = me;
    }
    if (st == SL_OK && CP(last_end) < clen)
      st = sl__ivec_push(out, (int32_t)(clen - CP(last_end)));
#undef CP
    cstart += clen;
  }
  pcre2_match_data_free(md);
  return st;
}

sl_status sl__pre_split(const sl__pre *p, const uint32_t *cpts, size_t n,
                        sl__ivec *lens) {
  sl_status st = SL_OK;
  sl__ivec cur = {0}, next = {0};
  unsigned char *collapsed = NULL;
  char *utf = NULL;
  uint32_t *b2c = NULL;
  size_t *frag_b = NULL;
  memset(lens, 0, sizeof *lens);
  if (n == 0)
    return SL_OK;
  if (n > INT32_MAX)
    return SL_ERR_INVALID_ARG;
  st = sl__ivec_push(&cur, (int32_t)n);
  if (st != SL_OK)
    goto fail;
  if (p->need_collapse) {
    collapsed = sl_malloc(n);
    if (!collapsed) {
      st = SL_ERR_NOMEM;
      goto fail;
    }
    for (size_t i = 0; i < n; i++)
      collapsed[i] = collapse_cpt(cpts[i]);
  }
  for (size_t si = 0; si < p->n_steps; si++) {
    const step *s = &p->steps[si];
    next.n = 0;
    if (s->kind == STEP_GPT2 || s->kind == STEP_LLAMA3 ||
        s->kind == STEP_QWEN2) {
      size_t start = 0;
      for (size_t fi = 0; fi < cur.n && st == SL_OK; fi++) {
        frag f = {cpts, start, start + (size_t)cur.v[fi], start, &next};
        if (s->kind == STEP_GPT2)
          st = split_gpt2(&f);
        else
          st = split_llama3(&f, s->kind == STEP_LLAMA3 ? 3 : 1);
        start = f.end;
      }
    } else {
      /* fragment boundaries in the subject's units */
      sl_free(frag_b);
      frag_b = sl_calloc(cur.n + 1, sizeof *frag_b);
      if (!frag_b) {
        st = SL_ERR_NOMEM;
        goto fail;
      }
      if (s->kind == STEP_REGEX_COLLAPSED) {
        size_t acc = 0;
        for (size_t fi = 0; fi < cur.n; fi++) {
          frag_b[fi] = acc;
          acc += (size_t)cur.v[fi];
        }
        frag_b[cur.n] = acc;
        st = regex_step(s->re, (const char *)collapsed, frag_b, &cur, NULL,
                        &next);
      } else {
        if (!utf) {
          size_t cap;
          if (!sl_mul_ok(n, 4, &cap)) {
            st = SL_ERR_NOMEM;
            goto fail;
          }
          utf = sl_malloc(cap + 1);
          b2c = sl_calloc(cap + 1, sizeof *b2c);
          if (!utf || !b2c) {
            st = SL_ERR_NOMEM;
            goto fail;
          }
        }
        /* rebuilt each time: cheap, and keeps b2c in step with cpts */
        size_t bl = 0;
        size_t *cpt_b = sl_calloc(n + 1, sizeof *cpt_b);
        if (!cpt_b) {
          st = SL_ERR_NOMEM;
          goto fail;
        }
        for (size_t i = 0; i < n; i++) {
          uint32_t c = cpts[i];
          if (c > 0x7F && (sl__cpt_flags(c) & SL__CPT_WHITESPACE))
            c = 0x0B;
          cpt_b[i] = bl;
          size_t k = sl_utf8_encode(c, utf + bl);
          for (size_t j = 0; j < k; j++)
            b2c[bl + j] = (uint32_t)i;
          bl += k;
        }
        cpt_b[n] = bl;
        b2c[bl] = (uint32_t)n;
        size_t acc = 0;
        for (size_t fi = 0; fi < cur.n; fi++) {
          frag_b[fi] = cpt_b[acc];
          acc += (size_t)cur.v[fi];
        }
        frag_b[cur.n] = cpt_b[acc];
        sl_free(cpt_b);
        st = regex_step(s->re, utf, frag_b, &cur, b2c, &next);
      }
    }
    if (st != SL_OK)
      goto fail;
    sl__ivec tmp = cur;
    cur = next;
    next = tmp;
  }
  *lens = cur;
  cur.v = NULL;
fail:
  sl_free(cur.v);
  sl_free(next.v);
  sl_free(collapsed);
  sl_free(utf);
  sl_free(b2c);
  sl_free(frag_b);
  return st;
}
