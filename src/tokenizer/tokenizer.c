/* Tokenizer: special-token partitioning, the encode driver, detokenization
 * and accessors (loading is in tokenizer_load.c). Behaviour follows
 * llama.cpp's llama-vocab. */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/util.h"
#include "tokenizer_impl.h"

/* ---- encode -------------------------------------------------------------- */

typedef struct fragment {
  int32_t id; /* SL_TOKEN_NULL: raw text */
  size_t off, len;
} fragment;

typedef struct fragvec {
  fragment *v;
  size_t n, cap;
} fragvec;

static sl_status frag_push(fragvec *f, fragment x) {
  if (f->n == f->cap) {
    size_t nc = f->cap ? f->cap * 2 : 16, bytes;
    if (!sl_mul_ok(nc, sizeof *f->v, &bytes))
      return SL_ERR_NOMEM;
    fragment *nv = sl_realloc(f->v, bytes);
    if (!nv)
      return SL_ERR_NOMEM;
    f->v = nv;
    f->cap = nc;
  }
  f->v[f->n++] = x;
  return SL_OK;
}

static const char *find_bytes(const char *h, size_t hl, const char *nd,
                              size_t nl) {
  if (nl == 0 || nl > hl)
    return NULL;
  return memmem(h, hl, nd, nl);
}

/* Whether any of plain[off, off + n) is set (plain may be NULL). */
static bool any_plain(const uint8_t *plain, size_t off, size_t n) {
  return plain && memchr(plain + off, 1, n) != NULL;
}

/* Splits raw fragments on special tokens, one token at a time in the cache
 * order (longest first), as llama.cpp's tokenizer_st_partition. A control
 * or unknown token is matched only when `parse_special` and none of its
 * bytes is set in `plain` (NULL: none is). */
static sl_status partition(const sl_tokenizer_t *t, const char *text,
                           size_t len, bool parse_special, const uint8_t *plain,
                           fragvec *out) {
  fragvec cur = {0}, nxt = {0};
  sl_status st = frag_push(&cur, (fragment){SL_TOKEN_NULL, 0, len});
  for (size_t si = 0; si < t->n_special && st == SL_OK; si++) {
    int32_t sid = t->special[si];
    uint32_t a = t->attr[sid];
    bool ctl = (a & (SL__TA_CONTROL | SL__TA_UNKNOWN)) != 0;
    if (!parse_special && ctl)
      continue;
    const char *tt = sl__tok_text(t, sid);
    size_t tl = t->text_len[sid];
    nxt.n = 0;
    for (size_t fi = 0; fi < cur.n && st == SL_OK; fi++) {
      fragment f = cur.v[fi];
      if (f.id != SL_TOKEN_NULL) {
        st = frag_push(&nxt, f);
        continue;
      }
      size_t off = f.off, flen = f.len, skip = 0;
      for (;;) {
        /* [off, off + skip) holds only matches in plain text, passed over */
        const char *m = find_bytes(text + off + skip, flen - skip, tt, tl);
        if (m && ctl && any_plain(plain, (size_t)(m - text), tl)) {
          skip = (size_t)(m - text) + 1 - off;
          continue;
        }
        if (!m) {
          if (flen > 0)
            st = frag_push(&nxt, (fragment){SL_TOKEN_NULL, off, flen});
          break;
        }
        size_t mo = (size_t)(m - text);
        if (mo > off) {
          size_t ll = mo - off;
          if (a & SL__TA_LSTRIP)
            while (ll > 0 && isspace((unsigned char)text[off + ll - 1]))
              ll--;
          if (ll > 0)
            st = frag_push(&nxt, (fragment){SL_TOKEN_NULL, off, ll});
        }
        if (st == SL_OK)
          st = frag_push(&nxt, (fragment){sid, 0, 0});
        if (st != SL_OK)
          break;
        size_t ro = mo + tl, rl = off + flen - ro;
        if (rl == 0)
          break;
        if (a & SL__TA_RSTRIP)
          while (rl > 0 && isspace((unsigned char)text[ro])) {
            ro++;
            rl--;
          }
        off = ro;
        flen = rl;
        skip = 0;
        if (flen == 0)
          break;
      }
    }
    fragvec tmp = cur;
    cur = nxt;
    nxt = tmp;
  }
  sl_free(nxt.v);
  if (st != SL_OK) {
    sl_free(cur.v);
    return st;
  }
  *out = cur;
  return SL_OK;
}

/* ceil(a / b); b > 0 */
static size_t div_up(size_t a, size_t b) {
  return a / b + (a % b != 0);
}

/* The longest token that a word made only of the bytes in `set` (256 bits)
 * can tokenize into: a BPE token of a word is a piece of it, so its bytes
 * are in the word's set. No such word of B bytes makes fewer than
 * ceil(B / this) tokens. One pass over the vocabulary's pieces. */
static size_t longest_within(const sl_tokenizer_t *t, const uint64_t set[4]) {
  size_t m = 1;
  for (size_t id = 0; id < t->n_vocab; id++) {
    size_t n = t->piece_len[id];
    if (n <= m ||
        (t->attr[id] & (SL__TA_CONTROL | SL__TA_USER_DEFINED | SL__TA_UNKNOWN)))
      continue;
    const uint8_t *p = (const uint8_t *)t->piece_arena + t->piece_off[id];
    size_t k = 0;
    while (k < n && (set[p[k] >> 6] >> (p[k] & 63) & 1))
      k++;
    if (k == n)
      m = n;
  }
  return m;
}

/* The per-word bound of encode_bpe_text, with the last byte set's answer
 * kept (a long text of one kind of word asks once). */
typedef struct word_bound {
  uint64_t set[4];
  size_t longest; /* 0: none kept */
} word_bound;

/* The fewest tokens a word of `bytes` bytes over `set` can make. */
static size_t word_fewest(const sl_tokenizer_t *t, word_bound *wb,
                          const uint64_t set[4], size_t bytes) {
  if (!wb->longest || memcmp(wb->set, set, sizeof wb->set)) {
    memcpy(wb->set, set, sizeof wb->set);
    wb->longest = longest_within(t, set);
  }
  return div_up(bytes, wb->longest);
}

/* `limit`: SL_ERR_RANGE as soon as out would hold more ids than that
 * (SIZE_MAX: no limit); before each word, the ids so far and the fewest
 * the fragment's remaining code points can make (each token covers at most
 * max_token_bytes bytes, so at most that many code points) decide. A word
 * longer in bytes than the ids still allowed (at most max_token_bytes such
 * words pass the first bound) is bounded on its own: its bytes over the
 * longest token made only of its bytes (600 KB of spaces or of one letter
 * is refused before BPE merges it, issue 43). */
static sl_status encode_bpe_text(const sl_tokenizer_t *t, const char *s,
                                 size_t len, size_t limit, sl__ivec *out) {
  uint32_t *cpts = NULL;
  size_t nc = 0;
  sl__ivec lens = {0};
  char *word = NULL;
  sl_status st = sl__utf8_decode(s, len, &cpts, &nc);
  if (st != SL_OK)
    return st;
  st = sl__pre_split(t->pre, cpts, nc, &lens);
  if (st != SL_OK)
    goto done;
  size_t maxw = 0;
  for (size_t i = 0; i < lens.n; i++)
    if ((size_t)lens.v[i] > maxw)
      maxw = (size_t)lens.v[i];
  /* each code point: up to 4 UTF-8 bytes, each up to 2 after byte-encoding */
  size_t cap;
  if (!sl_mul_ok(maxw, 8, &cap)) {
    st = SL_ERR_NOMEM;
    goto done;
  }
  word = sl_malloc(cap + 1);
  if (!word) {
    st = SL_ERR_NOMEM;
    goto done;
  }
  size_t c0 = 0;
  const size_t mtb = t->max_token_bytes;
  word_bound wb = {{0}, 0};
  for (size_t i = 0; i < lens.n && st == SL_OK; i++) {
    if (limit != SIZE_MAX &&
        (out->n > limit || (mtb && out->n + div_up(nc - c0, mtb) > limit))) {
      st = SL_ERR_RANGE;
      break;
    }
    size_t wl = 0, bytes = 0;
    uint64_t set[4] = {0};
    for (size_t k = c0; k < c0 + (size_t)lens.v[i]; k++) {
      char u[4];
      size_t ul = sl_utf8_encode(cpts[k], u);
      bytes += ul;
      for (size_t j = 0; j < ul; j++) {
        uint8_t b = (uint8_t)u[j];
        set[b >> 6] |= 1ull << (b & 63);
        wl += sl__byte_to_unicode(b, word + wl);
      }
    }
    c0 += (size_t)lens.v[i];
    if (limit != SIZE_MAX && mtb && bytes > limit - out->n &&
        out->n + word_fewest(t, &wb, set, bytes) + div_up(nc - c0, mtb) >
            limit) {
      st = SL_ERR_RANGE;
      break;
    }
    st = sl__bpe_word(t, word, wl, out);
  }
done:
  sl_free(word);
  sl_free(lens.v);
  sl_free(cpts);
  return st;
}

static sl_status encode_spm_text(const sl_tokenizer_t *t, const char *s,
                                 size_t len, bool prefix, sl__ivec *out) {
  size_t cap;
  if (!sl_mul_ok(len + 1, 3, &cap))
    return SL_ERR_NOMEM;
  char *buf = sl_malloc(cap);
  if (!buf)
    return SL_ERR_NOMEM;
  size_t o = 0;
  if (prefix) {
    memcpy(buf, "\xE2\x96\x81", 3);
    o = 3;
  }
  for (size_t i = 0; i < len; i++) {
    if (s[i] == ' ') {
      memcpy(buf + o, "\xE2\x96\x81", 3);
      o += 3;
    } else {
      buf[o++] = s[i];
    }
  }
  sl_status st = sl__spm_fragment(t, buf, o, out);
  sl_free(buf);
  return st;
}

/* `limit`: SL_ERR_RANGE (nothing stored) once the ids are known to number
 * more than that; SIZE_MAX: no limit. */
static sl_status encode(const sl_tokenizer_t *t, const char *text, size_t len,
                        bool add_bos, bool parse_special, const uint8_t *plain,
                        size_t limit, int32_t **ids, size_t *n) {
  if (!t || !ids || !n || (!text && len))
    return SL_ERR_INVALID_ARG;
  *ids = NULL;
  *n = 0;
  sl__ivec out = {0};
  fragvec frags = {0};
  sl_status st = SL_OK;
  bool bos = add_bos && t->add_bos && t->bos != SL_TOKEN_NULL;
  bool eos = add_bos && t->add_eos && t->eos != SL_TOKEN_NULL;
  /* the fewest ids the text can make, before reading it */
  if (limit != SIZE_MAX && t->max_token_bytes &&
      (size_t)bos + eos + div_up(len, t->max_token_bytes) > limit)
    return SL_ERR_RANGE;
  if (len > 0) {
    st = partition(t, text, len, parse_special, plain, &frags);
    if (st != SL_OK)
      return st;
  }
  if (bos)
    st = sl__ivec_push(&out, t->bos);
  bool prev_special = true;
  for (size_t i = 0; i < frags.n && st == SL_OK; i++) {
    if (out.n > limit) {
      st = SL_ERR_RANGE;
      break;
    }
    fragment f = frags.v[i];
    if (f.id != SL_TOKEN_NULL) {
      st = sl__ivec_push(&out, f.id);
      prev_special = true;
      continue;
    }
    if (t->kind == SL_VOCAB_BPE) {
      st = encode_bpe_text(t, text + f.off, f.len, limit, &out);
    } else {
      st = encode_spm_text(t, text + f.off, f.len,
                           t->add_space_prefix && prev_special, &out);
      prev_special = false;
    }
  }
  if (st == SL_OK && eos)
    st = sl__ivec_push(&out, t->eos);
  if (st == SL_OK && out.n > limit)
    st = SL_ERR_RANGE;
  sl_free(frags.v);
  if (st != SL_OK) {
    sl_free(out.v);
    return st;
  }
  *ids = out.v;
  *n = out.n;
  if (out.n == 0) {
    sl_free(out.v);
    *ids = NULL;
  }
  return SL_OK;
}

sl_status sl_tokenizer_encode(const sl_tokenizer_t *t, const char *text,
                              size_t len, bool add_bos, bool parse_special,
                              int32_t **ids, size_t *n) {
  return encode(t, text, len, add_bos, parse_special, NULL, SIZE_MAX, ids, n);
}

sl_status sl_tokenizer_encode_marked(const sl_tokenizer_t *t, const char *text,
                                     size_t len, bool add_bos,
                                     const uint8_t *plain, int32_t **ids,
                                     size_t *n) {
  return encode(t, text, len, add_bos, true, plain, SIZE_MAX, ids, n);
}

sl_status sl_tokenizer_encode_limited(const sl_tokenizer_t *t, const char *text,
                                      size_t len, bool add_bos,
                                      const uint8_t *plain, size_t max_tokens,
                                      int32_t **ids, size_t *n) {
  return encode(t, text, len, add_bos, true, plain, max_tokens, ids, n);
}

size_t sl_tokenizer_max_token_bytes(const sl_tokenizer_t *t) {
  return t ? t->max_token_bytes : 0;
}

/* ---- decode -------------------------------------------------------------- */

const char *sl_tokenizer_piece(const sl_tokenizer_t *t, int32_t id,
                               size_t *len) {
  if (!t || id < 0 || (size_t)id >= t->n_vocab) {
    if (len)
      *len = 0;
    return NULL;
  }
  if (len)
    *len = t->piece_len[id];
  return t->piece_arena + t->piece_off[id];
}

sl_status sl_tokenizer_token_to_piece(const sl_tokenizer_t *t, int32_t id,
                                      bool special, char *buf, size_t cap,
                                      size_t *len) {
  if (!t || !len || (!buf && cap))
    return SL_ERR_INVALID_ARG;
  *len = 0;
  if (id < 0 || (size_t)id >= t->n_vocab)
    return SL_ERR_RANGE;
  size_t n = t->piece_len[id];
  if (!special && (t->attr[id] & (SL__TA_UNKNOWN | SL__TA_CONTROL)))
    n = 0;
  *len = n;
  if (cap < n)
    return SL_ERR_OVERFLOW;
  if (n)
    memcpy(buf, t->piece_arena + t->piece_off[id], n);
  return SL_OK;
}

/* llama.cpp's clean_up_tokenization_spaces passes, in place. */
static size_t clean_spaces(char *s, size_t total) {
  /* " ?", " !", " .", " ," lose the space */
  size_t t1 = total, o = total ? 1 : 0;
  for (size_t i = 1; i < t1; i++) {
    char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
      o--;
    s[o++] = x;
  }
  /* " ' " -> "'" */
  size_t t2 = o;
  o = t2 ? 1 : 0;
  for (size_t i = 1; i < t2; i++) {
    char x = s[i];
    if (x == '\'' && i + 1 < t2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
      o--;
      s[++i] = 0;
    }
    s[o++] = x;
  }
  /* " 's", " 'm", " 're", " 've" lose the space */
  size_t t3 = o;
  o = t3 ? 1 : 0;
  for (size_t i = 1; i < t3; i++) {
    char x = s[i];
    if (s[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
      char x1 = s[i + 1];
      if (x1 == 's' || x1 == 'm')
        o--;
      else if (i + 2 < t3 && ((x1 == 'r' && s[i + 2] == 'e') ||
                              (x1 == 'v' && s[i + 2] == 'e')))
        o--;
    }
    s[o++] = x;
  }
  return o;
}

sl_status sl_tokenizer_decode(const sl_tokenizer_t *t, const int32_t *ids,
                              size_t n, bool remove_special,
                              bool unparse_special, char **out,
                              size_t *out_len) {
  if (!t || !out || !out_len || (!ids && n))
    return SL_ERR_INVALID_ARG;
  *out = NULL;
  *out_len = 0;
  bool remove_space = t->add_space_prefix;
  if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
    remove_space = false;
    ids++;
    n--;
  }
  if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos)
    n--;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || (size_t)ids[i] >= t->n_vocab)
      return SL_ERR_RANGE;
    total += t->piece_len[ids[i]];
  }
  char *s = sl_malloc(total + 1);
  if (!s)
    return SL_ERR_NOMEM;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    size_t pl;
    sl_status st = sl_tokenizer_token_to_piece(t, ids[i], unparse_special,
                                               s + o, total - o, &pl);
    SL_ASSERT(st == SL_OK);
    if (remove_space && pl > 0 && s[o] == ' ') {
      memmove(s + o, s + o + 1, pl - 1);
      pl--;
    }
    remove_space = false;
    o += pl;
  }
  if (t->clean_spaces)
    o = clean_spaces(s, o);
  s[o] = 0;
  *out = s;
  *out_len = o;
  return SL_OK;
}

/* ---- accessors ------------------------------------------------------------
 */

size_t sl_tokenizer_vocab_size(const sl_tokenizer_t *t) {
  return t->n_vocab;
}
sl_vocab_kind sl_tokenizer_kind(const sl_tokenizer_t *t) {
  return t->kind;
}
int32_t sl_tokenizer_bos(const sl_tokenizer_t *t) {
  return t->bos;
}
int32_t sl_tokenizer_eos(const sl_tokenizer_t *t) {
  return t->eos;
}
int32_t sl_tokenizer_eot(const sl_tokenizer_t *t) {
  return t->eot;
}
int32_t sl_tokenizer_unk(const sl_tokenizer_t *t) {
  return t->unk;
}
int32_t sl_tokenizer_pad(const sl_tokenizer_t *t) {
  return t->pad;
}
bool sl_tokenizer_add_bos(const sl_tokenizer_t *t) {
  return t->add_bos;
}
bool sl_tokenizer_add_eos(const sl_tokenizer_t *t) {
  return t->add_eos;
}
const char *sl_tokenizer_pre_name(const sl_tokenizer_t *t) {
  return t->pre_name;
}

bool sl_tokenizer_is_eog(const sl_tokenizer_t *t, int32_t id) {
  if (id < 0 || (size_t)id >= t->n_vocab)
    return false;
  return bsearch(&id, t->eog, t->n_eog, sizeof *t->eog, sl__cmp_i32) != NULL;
}

sl_token_type sl_tokenizer_token_type(const sl_tokenizer_t *t, int32_t id) {
  if (id < 0 || (size_t)id >= t->n_vocab)
    return SL_TOKEN_TYPE_UNDEFINED;
  uint32_t a = t->attr[id];
  if (a & SL__TA_UNUSED)
    return SL_TOKEN_TYPE_UNUSED;
  if (a & SL__TA_CONTROL)
    return SL_TOKEN_TYPE_CONTROL;
  if (a & SL__TA_USER_DEFINED)
    return SL_TOKEN_TYPE_USER_DEFINED;
  if (a & SL__TA_BYTE)
    return SL_TOKEN_TYPE_BYTE;
  if (a & SL__TA_UNKNOWN)
    return SL_TOKEN_TYPE_UNKNOWN;
  if (a & SL__TA_NORMAL)
    return SL_TOKEN_TYPE_NORMAL;
  return SL_TOKEN_TYPE_UNDEFINED;
}

const char *sl_tokenizer_token_text(const sl_tokenizer_t *t, int32_t id,
                                    size_t *len) {
  if (id < 0 || (size_t)id >= t->n_vocab) {
    if (len)
      *len = 0;
    return NULL;
  }
  if (len)
    *len = t->text_len[id];
  return sl__tok_text(t, id);
}

int32_t sl_tokenizer_find(const sl_tokenizer_t *t, const char *text,
                          size_t len) {
  return sl__tok_lookup(t, text, len);
}

bool sl_tokenizer_same_vocab(const sl_tokenizer_t *a, const sl_tokenizer_t *b,
                             char *err, size_t errcap) {
  size_t n = sl_tokenizer_vocab_size(a);
  if (sl_tokenizer_vocab_size(b) != n) {
    if (err && errcap)
      snprintf(err, errcap,
               "its vocabulary has %zu tokens and the model's %zu: a draft "
               "model must share the model's vocabulary",
               sl_tokenizer_vocab_size(b), n);
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    char pa[256], pb[256];
    size_t la = 0, lb = 0;
    sl_status sa =
        sl_tokenizer_token_to_piece(a, (int32_t)i, true, pa, sizeof pa, &la);
    sl_status sb =
        sl_tokenizer_token_to_piece(b, (int32_t)i, true, pb, sizeof pb, &lb);
    if (sa != sb || la != lb || (sa == SL_OK && memcmp(pa, pb, la) != 0)) {
      if (err && errcap)
        snprintf(err, errcap,
                 "its token %zu is not the model's: a draft model must "
                 "share the model's vocabulary",
                 i);
      return false;
    }
  }
  return true;
}
