/* sluice — grammar: GBNF compiled to rules of elements, a pushdown matcher
 * over code points (a set of stacks, one per live parse), and the token mask
 * by a walk of the vocabulary's byte trie (include/sluice/grammar.h).
 *
 * A rule is an array of elements: its alternatives one after another,
 * separated by E_ALT, the last followed by E_END. A character class is a
 * run: E_CHAR (or E_NOT, negated) with a code point, each range's upper end
 * as an E_UPPER after its lower end, more members as E_CALT (+ E_UPPER).
 * E_ANY is '.', E_REF a rule. A stack holds element positions: its top is
 * a character element to match next; below it, where each enclosing rule
 * goes on. An empty stack is a finished parse. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

/* ---- stacks -------------------------------------------------------------- */

typedef struct gstack {
  size_t off; /* its positions: the set's pos[off .. off + n) */
  int n;
  uint32_t h; /* its hash (stack_hash) */
  int32_t at; /* its slot in the set's table */
} gstack;

/* The live parses: each stack once, found by its hash: in a large set, in
 * an open addressing table (slot[i]: index + 1 into s, 0: empty; nslot a
 * power of two, at least twice the stacks), so that adding one costs O(1)
 * however many there are (a 500-value enum keeps ~600 alive). The stacks'
 * positions lie end to end in one array, kept across clears: a set is
 * cleared and refilled at every byte, and copied at every node of a mask's
 * walk of the vocabulary, with no allocation once it has grown. */
typedef struct stackset {
  gstack *s;
  int n, cap;
  const gel **pos;
  size_t npos, poscap;
  bool oom;
  bool over; /* (with oom) an expansion ran out of EXPAND_BUDGET */
  int32_t *slot;
  int nslot;
} stackset;

static const gel **ss_p(const stackset *ss, const gstack *s) {
  return ss->pos + s->off;
}

static void ss_clear(stackset *ss) {
  if (ss->nslot)
    for (int i = 0; i < ss->n; i++)
      ss->slot[ss->s[i].at] = 0;
  ss->n = 0;
  ss->npos = 0;
  ss->oom = ss->over = false;
}

static void ss_free(stackset *ss) {
  free(ss->s);
  free(ss->pos);
  free(ss->slot);
  memset(ss, 0, sizeof *ss);
}

static _Thread_local uint64_t tl_work; /* sl_grammar_work_done */

uint64_t sl_grammar_work_done(void) {
  return tl_work;
}

static uint32_t stack_hash(const gel **p, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uintptr_t)p[i];
    h *= 1099511628211ull;
  }
  return (uint32_t)(h ^ (h >> 32));
}

/* The slot where p[0..n) (hash h) is, or the empty one where it would go;
 * *found says which. The table is not full (nslot > 2 * n). */
static int32_t ss_probe(const stackset *ss, const gel **p, int n, uint32_t h,
                        bool *found) {
  uint32_t mask = (uint32_t)ss->nslot - 1;
  for (uint32_t i = h & mask;; i = (i + 1) & mask) {
    int32_t k = ss->slot[i];
    if (!k) {
      *found = false;
      return (int32_t)i;
    }
    const gstack *s = &ss->s[k - 1];
    if (s->h == h && s->n == n &&
        !memcmp(ss_p(ss, s), p, sizeof *p * (size_t)n)) {
      *found = true;
      return (int32_t)i;
    }
  }
}

/* Sets smaller than this find a stack by a linear scan (most sets hold a
 * few: a JSON schema's); the table is made when a set first grows to it. */
#define SS_TABLE_FROM 32

/* Room for one more stack (the array, and a table at least twice as large
 * once the set is that large); false when out of memory. */
static bool ss_room(stackset *ss) {
  if (ss->n == ss->cap) {
    int cap = ss->cap ? ss->cap * 2 : 8;
    gstack *s = realloc(ss->s, sizeof *s * (size_t)cap);
    if (!s)
      return false;
    ss->s = s;
    ss->cap = cap;
  }
  if (ss->n + 1 < SS_TABLE_FROM || ss->nslot > 2 * (ss->n + 1))
    return true;
  int nslot = ss->nslot ? ss->nslot * 2 : 4 * SS_TABLE_FROM;
  int32_t *slot = calloc((size_t)nslot, sizeof *slot);
  if (!slot)
    return false;
  free(ss->slot);
  ss->slot = slot;
  ss->nslot = nslot;
  for (int i = 0; i < ss->n; i++) { /* rehash */
    bool found;
    gstack *s = &ss->s[i];
    s->at = ss_probe(ss, ss_p(ss, s), s->n, s->h, &found);
    ss->slot[s->at] = i + 1;
  }
  return true;
}

/* Room for n more positions; false when out of memory. The array exists
 * once a stack is added, even an empty one (a stack's positions are then
 * never a null pointer plus an offset). */
static bool ss_pos_room(stackset *ss, size_t n) {
  if (ss->pos && ss->npos + n <= ss->poscap)
    return true;
  size_t cap = ss->poscap ? ss->poscap : 64;
  while (cap < ss->npos + n)
    cap *= 2;
  const gel **pos = realloc(ss->pos, sizeof *pos * cap);
  if (!pos)
    return false;
  ss->pos = pos;
  ss->poscap = cap;
  return true;
}

/* Adds a copy of p[0..n) unless the set holds it already. p does not point
 * into the set's own positions (their array may move). */
static void ss_add(stackset *ss, const gel **p, int n) {
  uint32_t h = stack_hash(p, n);
  bool found = false;
  if (ss->nslot) {
    ss_probe(ss, p, n, h, &found);
  } else {
    for (int i = 0; i < ss->n && !found; i++)
      found = ss->s[i].h == h && ss->s[i].n == n &&
              !memcmp(ss_p(ss, &ss->s[i]), p, sizeof *p * (size_t)n);
  }
  if (found)
    return;
  if (ss->n >= MAX_STACKS) { /* too ambiguous to follow: never a parse
                                 dropped in silence (an overrun) */
    ss->oom = ss->over = true;
    return;
  }
  if (!ss_room(ss) || !ss_pos_room(ss, (size_t)n)) {
    ss->oom = true;
    return;
  }
  size_t off = ss->npos;
  if (n)
    memcpy(ss->pos + off, p, sizeof *p * (size_t)n);
  ss->npos += (size_t)n;
  int32_t at = -1;
  if (ss->nslot) {
    at = ss_probe(ss, p, n, h, &found);
    ss->slot[at] = ss->n + 1;
  }
  ss->s[ss->n++] = (gstack){off, n, h, at};
  tl_work++;
}

/* Adds to out every stack that p[0..n) becomes once its top is a character
 * element (or it is empty): references are replaced by each alternative of
 * their rule. In place: p has room for MAX_STACK + 1 positions, and a call
 * may change p[n - 1] and what lies past it, never p[0..n - 1) (a rule's
 * alternatives are tried one after another on the same array). */
static void expand(const sl_grammar_t *g, stackset *out, const gel **p, int n,
                   long *budget) {
  tl_work++;
  if (--*budget < 0) { /* an explosive grammar: the parses stop here */
    out->oom = out->over = true;
    return;
  }
  if (n == 0) {
    ss_add(out, p, 0);
    return;
  }
  const gel *top = p[n - 1];
  if (top->type != E_REF) {
    ss_add(out, p, n);
    return;
  }
  if (n >= MAX_STACK)
    return; /* nested too deep: this parse ends */
  int base = n - 1;
  if (top[1].type != E_END && top[1].type != E_ALT)
    p[base++] = top + 1; /* where this rule goes on after the reference */
  for (const gel *a = g->rules[top->value]; a; a = next_alt(a)) {
    if (a->type == E_END || a->type == E_ALT) {
      /* an empty alternative: the stack below goes on, and its call may
       * change p[base - 1], which the next alternatives need */
      const gel *keep = base > 0 ? p[base - 1] : NULL;
      expand(g, out, p, base, budget);
      if (base > 0)
        p[base - 1] = keep;
    } else {
      p[base] = a;
      expand(g, out, p, base + 1, budget);
    }
  }
}

/* Whether the class at p admits some code point in [lo, hi]; *next: the
 * element after the class. */
static bool class_admits(const gel *p, uint32_t lo, uint32_t hi,
                         const gel **next) {
  if (p->type == E_ANY) {
    *next = p + 1;
    return true;
  }
  bool neg = p->type == E_NOT, hit = false, covers = false;
  do {
    uint32_t a = p->value, b = a;
    if (p[1].type == E_UPPER) {
      b = p[1].value;
      p++;
    }
    if (a <= hi && b >= lo)
      hit = true;
    if (a <= lo && b >= hi)
      covers = true;
    p++;
  } while (p->type == E_CALT);
  *next = p;
  return neg ? !covers : hit;
}

/* The stacks after the code point cp (out is cleared first). *work (when
 * not NULL) is a budget shared with earlier calls: what this one spends
 * comes off it, and it stops (out->oom) when it runs out. */
static void advance(const sl_grammar_t *g, const stackset *in, uint32_t cp,
                    stackset *out, long *work) {
  ss_clear(out);
  long budget = EXPAND_BUDGET;
  if (work && *work < budget)
    budget = *work;
  long given = budget;
  const gel *buf[MAX_STACK + 1];
  for (int i = 0; i < in->n; i++) {
    const gstack *s = &in->s[i];
    if (!s->n)
      continue; /* a finished parse takes nothing more */
    const gel *next;
    const gel **sp = ss_p(in, s);
    if (!class_admits(sp[s->n - 1], cp, cp, &next))
      continue;
    memcpy(buf, sp, sizeof *buf * (size_t)(s->n - 1));
    int n = s->n - 1;
    if (next->type != E_END && next->type != E_ALT)
      buf[n++] = next;
    expand(g, out, buf, n, &budget);
  }
  if (work)
    *work -= given - budget;
}

/* Whether some stack admits a code point in [lo, hi] (a partial UTF-8
 * sequence's possible completions). */
static bool admits_range(const stackset *ss, uint32_t lo, uint32_t hi) {
  for (int i = 0; i < ss->n; i++) {
    const gel *next;
    if (ss->s[i].n &&
        class_admits(ss_p(ss, &ss->s[i])[ss->s[i].n - 1], lo, hi, &next))
      return true;
  }
  return false;
}

/* dst becomes a copy of src (its arrays and table copied whole, no stack
 * looked up again); false when out of memory. */
static bool ss_copy(stackset *dst, const stackset *src) {
  ss_clear(dst);
  if (src->n > dst->cap) {
    gstack *s = realloc(dst->s, sizeof *s * (size_t)src->cap);
    if (!s) {
      dst->oom = true;
      return false;
    }
    dst->s = s;
    dst->cap = src->cap;
  }
  if (!ss_pos_room(dst, src->npos)) {
    dst->oom = true;
    return false;
  }
  if (dst->nslot != src->nslot) { /* the same table, or none */
    free(dst->slot);
    dst->slot = NULL;
    dst->nslot = 0;
    if (src->nslot) {
      dst->slot = malloc(sizeof *dst->slot * (size_t)src->nslot);
      if (!dst->slot) {
        dst->oom = true;
        return false;
      }
      dst->nslot = src->nslot;
    }
  }
  if (src->nslot)
    memcpy(dst->slot, src->slot, sizeof *dst->slot * (size_t)src->nslot);
  if (src->n)
    memcpy(dst->s, src->s, sizeof *dst->s * (size_t)src->n);
  if (src->npos)
    memcpy(dst->pos, src->pos, sizeof *dst->pos * src->npos);
  dst->n = src->n;
  dst->npos = src->npos;
  tl_work += (uint64_t)src->n; /* as many as adding them one by one */
  return true;
}

/* ---- the matcher ----------------------------------------------------------
 */

/* A mask computed before, by the state it was computed in and the
 * vocabulary it was computed for: a state comes back again and again
 * (every character of a long string leaves the same stacks, and every
 * request of a schema goes through the same states), and its mask is then
 * a copy, not a walk of the trie. One cache per grammar, shared by its
 * matchers (sl_grammar_compile_shared shares the grammar between requests
 * of one text). */
#define MASK_CACHE 64

typedef struct mask_ent {
  stackset key;
  sl_utf8_state part;
  uint64_t vocab; /* the vocabulary's id */
  uint8_t *bits;  /* one per token */
  size_t n_vocab, n_allowed;
  uint64_t used; /* 0: empty */
} mask_ent;

struct sl__mask_cache {
  pthread_mutex_t mu;
  mask_ent e[MASK_CACHE];
  uint64_t clock;
};

sl__mask_cache *sl__mask_cache_new(void) {
  sl__mask_cache *c = calloc(1, sizeof *c);
  if (c)
    pthread_mutex_init(&c->mu, NULL);
  return c;
}

void sl__mask_cache_free(sl__mask_cache *c) {
  if (!c)
    return;
  for (int i = 0; i < MASK_CACHE; i++) {
    ss_free(&c->e[i].key);
    free(c->e[i].bits);
  }
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* Here, not in compile.c: the grammar's end frees its mask cache, and
 * compile.c calls into this file only (no cycle between the two). */
void sl_grammar_unref(sl_grammar_t *g) {
  if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
    return;
  for (int i = 0; i < g->n_rules; i++)
    free(g->rules[i]);
  free(g->rules);
  sl__mask_cache_free(g->masks);
  free(g);
}

struct sl_grammar_matcher {
  sl_grammar_t *g;
  stackset cur, tmp;
  /* a code point begun: util/utf8 takes well-formed UTF-8 only (no overlong
   * form, surrogate or value past U+10FFFF), a byte refused as soon as no
   * completion is valid */
  sl_utf8_state part;
  bool overrun; /* a mask ran out of MASK_WORK */
};

bool sl_grammar_matcher_overrun(const sl_grammar_matcher_t *m) {
  return m->overrun;
}

sl_grammar_matcher_t *sl_grammar_matcher_create(sl_grammar_t *g) {
  sl_grammar_matcher_t *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  atomic_fetch_add(&g->refs, 1);
  m->g = g;
  gel start = {E_REF, (uint32_t)g->root};
  gel seq[2] = {start, {E_END, 0}};
  const gel *buf[MAX_STACK + 1] = {seq};
  /* the root reference alone: expand drops it, keeping its alternatives
   * (seq[1] is E_END, so nothing goes on after it) */
  long budget = EXPAND_BUDGET;
  expand(g, &m->cur, buf, 1, &budget);
  if (m->cur.oom) {
    sl_grammar_matcher_free(m);
    return NULL;
  }
  return m;
}

void sl_grammar_matcher_free(sl_grammar_matcher_t *m) {
  if (!m)
    return;
  ss_free(&m->cur);
  ss_free(&m->tmp);
  sl_grammar_unref(m->g);
  free(m);
}

/* One byte on (ss, part): false when the grammar cannot take it. Uses tmp
 * as scratch; the result is in ss. */
static bool step_byte(const sl_grammar_t *g, stackset *ss, stackset *tmp,
                      sl_utf8_state *part, unsigned char b, long *work) {
  uint32_t cp = 0;
  switch (sl_utf8_feed(part, b, &cp)) {
  case SL_UTF8_STEP_BAD:
    return false;
  case SL_UTF8_STEP_MORE: {
    /* still partial: can any completion match? */
    uint32_t lo, hi;
    sl_utf8_state_range(part, &lo, &hi);
    return admits_range(ss, lo, hi);
  }
  case SL_UTF8_STEP_DONE:
    break;
  }
  advance(g, ss, cp, tmp, work);
  stackset t = *ss;
  *ss = *tmp;
  *tmp = t;
  return ss->n > 0 && !ss->oom;
}

bool sl_grammar_matcher_accept(sl_grammar_matcher_t *m, const char *bytes,
                               size_t n) {
  stackset work = {0}, tmp = {0};
  sl_utf8_state part = m->part;
  bool ok = ss_copy(&work, &m->cur);
  for (size_t i = 0; ok && i < n; i++)
    ok = step_byte(m->g, &work, &tmp, &part, (unsigned char)bytes[i], NULL);
  ss_free(&tmp);
  if (!ok) {
    ss_free(&work);
    return false;
  }
  ss_free(&m->cur);
  m->cur = work;
  m->part = part;
  return true;
}

bool sl_grammar_matcher_done(const sl_grammar_matcher_t *m) {
  if (m->part.left)
    return false;
  for (int i = 0; i < m->cur.n; i++)
    if (m->cur.s[i].n == 0)
      return true;
  return false;
}

bool sl_grammar_matcher_complete(const sl_grammar_matcher_t *m) {
  if (m->part.left)
    return false;
  for (int i = 0; i < m->cur.n; i++)
    if (m->cur.s[i].n != 0)
      return false;
  return m->cur.n > 0;
}

/* ---- the vocabulary trie and the mask ------------------------------------ */

typedef struct tnode {
  int32_t child, sibling; /* first child, next sibling (-1: none) */
  int32_t token;          /* the first token whose bytes end here, or -1 */
  uint8_t byte;
} tnode;

struct sl_grammar_vocab {
  tnode *n;
  int32_t n_nodes, cap;
  int32_t *next_tok; /* tokens of equal bytes: a list per node */
  size_t n_vocab;
  uint64_t id; /* unique in the process: the mask cache's key */
};

static int32_t trie_child(sl_grammar_vocab_t *v, int32_t at, uint8_t b) {
  for (int32_t c = v->n[at].child; c >= 0; c = v->n[c].sibling)
    if (v->n[c].byte == b)
      return c;
  if (v->n_nodes == v->cap) {
    int32_t cap = v->cap * 2;
    tnode *n = realloc(v->n, sizeof *n * (size_t)cap);
    if (!n)
      return -1;
    v->n = n;
    v->cap = cap;
  }
  int32_t c = v->n_nodes++;
  v->n[c] = (tnode){-1, v->n[at].child, -1, b};
  v->n[at].child = c;
  return c;
}

sl_grammar_vocab_t *sl_grammar_vocab_create(const sl_tokenizer_t *tok) {
  sl_grammar_vocab_t *v = calloc(1, sizeof *v);
  if (!v)
    return NULL;
  static atomic_uint_fast64_t next_id;
  v->id = atomic_fetch_add(&next_id, 1) + 1;
  v->n_vocab = sl_tokenizer_vocab_size(tok);
  v->cap = 1 << 16;
  v->n = malloc(sizeof *v->n * (size_t)v->cap);
  v->next_tok = malloc(sizeof *v->next_tok * (v->n_vocab ? v->n_vocab : 1));
  if (!v->n || !v->next_tok) {
    sl_grammar_vocab_free(v);
    return NULL;
  }
  v->n[0] = (tnode){-1, -1, -1, 0};
  v->n_nodes = 1;
  char buf[512];
  for (size_t id = 0; id < v->n_vocab; id++) {
    v->next_tok[id] = -1;
    size_t len = 0;
    /* as generated text: control tokens are empty, and never allowed */
    if (sl_tokenizer_token_to_piece(tok, (int32_t)id, false, buf, sizeof buf,
                                    &len) != SL_OK ||
        len == 0)
      continue;
    int32_t at = 0;
    for (size_t i = 0; i < len && at >= 0; i++)
      at = trie_child(v, at, (uint8_t)buf[i]);
    if (at < 0) {
      sl_grammar_vocab_free(v);
      return NULL;
    }
    v->next_tok[id] = v->n[at].token;
    v->n[at].token = (int32_t)id;
  }
  return v;
}

void sl_grammar_vocab_free(sl_grammar_vocab_t *v) {
  if (!v)
    return;
  free(v->n);
  free(v->next_tok);
  free(v);
}

typedef struct mask_walk {
  const sl_grammar_t *g;
  const sl_grammar_vocab_t *v;
  uint8_t *allowed;
  size_t n_allowed;
  long work; /* left of MASK_WORK */
  bool oom;
} mask_walk;

/* Every child of node `at`, from the state (ss, part): a token whose bytes
 * end at a child that the grammar can take is allowed; its subtree is walked
 * only while a parse survives. */
static void walk(mask_walk *w, int32_t at, const stackset *ss,
                 sl_utf8_state part) {
  stackset cur = {0}, tmp = {0};
  for (int32_t c = w->v->n[at].child; c >= 0 && !w->oom;
       c = w->v->n[c].sibling) {
    sl_utf8_state p = part;
    /* a node costs its copy of the stacks, then the expansions of its
     * byte: an ambiguous grammar (hundreds of live parses, each byte
     * expanding thousands of ways) runs out here, in bounded time */
    w->work -= 1 + ss->n;
    if (w->work <= 0 || !ss_copy(&cur, ss)) {
      w->oom = true;
      break;
    }
    if (!step_byte(w->g, &cur, &tmp, &p, w->v->n[c].byte, &w->work)) {
      if (cur.over || tmp.over)
        w->work = 0; /* too ambiguous to follow: an overrun */
      if (cur.oom || tmp.oom)
        w->oom = true;
      continue;
    }
    for (int32_t t = w->v->n[c].token; t >= 0; t = w->v->next_tok[t]) {
      w->allowed[t] = 1;
      w->n_allowed++;
    }
    if (w->v->n[c].child >= 0)
      walk(w, c, &cur, p);
  }
  ss_free(&cur);
  ss_free(&tmp);
}

static size_t mask_walk_all(sl_grammar_matcher_t *m,
                            const sl_grammar_vocab_t *v,
                            const sl_tokenizer_t *tok, uint8_t *allowed);

static bool ss_equal(const stackset *a, const stackset *b) {
  if (a->n != b->n)
    return false;
  for (int i = 0; i < a->n; i++)
    if (a->s[i].n != b->s[i].n ||
        memcmp(ss_p(a, &a->s[i]), ss_p(b, &b->s[i]),
               sizeof(const gel *) * (size_t)a->s[i].n))
      return false;
  return true;
}

/* The cached mask of m's state for v, copied into allowed: its count, or
 * 0 when there is none (mc->mu held). */
static size_t cache_find(sl__mask_cache *mc, const sl_grammar_matcher_t *m,
                         const sl_grammar_vocab_t *v, uint8_t *allowed) {
  for (int i = 0; i < MASK_CACHE; i++) {
    mask_ent *c = &mc->e[i];
    if (c->used && c->vocab == v->id && c->n_vocab == v->n_vocab &&
        c->part.left == m->part.left && c->part.cp == m->part.cp &&
        c->part.lo == m->part.lo && c->part.hi == m->part.hi &&
        ss_equal(&c->key, &m->cur)) {
      c->used = ++mc->clock;
      for (size_t id = 0; id < v->n_vocab; id++)
        allowed[id] = (c->bits[id >> 3] >> (id & 7)) & 1;
      return c->n_allowed;
    }
  }
  return 0;
}

size_t sl_grammar_matcher_mask(sl_grammar_matcher_t *m,
                               const sl_grammar_vocab_t *v,
                               const sl_tokenizer_t *tok, uint8_t *allowed) {
  sl__mask_cache *mc = m->g->masks;
  pthread_mutex_lock(&mc->mu);
  size_t n = cache_find(mc, m, v, allowed);
  pthread_mutex_unlock(&mc->mu);
  if (n)
    return n;
  /* the walk runs without the lock: other matchers of this grammar (other
   * engines) are not held up by it */
  if (!(n = mask_walk_all(m, v, tok, allowed)))
    return 0;
  /* kept for the next time this state comes back (a failed copy only
   * costs that) */
  size_t nb = (v->n_vocab + 7) / 8;
  pthread_mutex_lock(&mc->mu);
  mask_ent *lru = &mc->e[0];
  for (int i = 1; i < MASK_CACHE; i++)
    if (mc->e[i].used < lru->used)
      lru = &mc->e[i];
  lru->used = 0;
  if (lru->n_vocab != v->n_vocab) {
    free(lru->bits);
    lru->bits = NULL;
  }
  if ((lru->bits || (lru->bits = malloc(nb ? nb : 1))) &&
      ss_copy(&lru->key, &m->cur)) {
    memset(lru->bits, 0, nb);
    for (size_t id = 0; id < v->n_vocab; id++)
      if (allowed[id])
        lru->bits[id >> 3] |= (uint8_t)(1u << (id & 7));
    lru->n_vocab = v->n_vocab;
    lru->vocab = v->id;
    lru->part = m->part;
    lru->n_allowed = n;
    lru->used = ++mc->clock;
  }
  pthread_mutex_unlock(&mc->mu);
  return n;
}

static size_t mask_walk_all(sl_grammar_matcher_t *m,
                            const sl_grammar_vocab_t *v,
                            const sl_tokenizer_t *tok, uint8_t *allowed) {
  memset(allowed, 0, v->n_vocab);
  mask_walk w = {m->g, v, allowed, 0, MASK_WORK, false};

  walk(&w, 0, &m->cur, m->part);
  if (w.work <= 0)
    m->overrun = true;
  if (w.oom)
    return 0;
  if (sl_grammar_matcher_done(m))
    for (size_t id = 0; id < v->n_vocab; id++)
      if (sl_tokenizer_is_eog(tok, (int32_t)id) && !allowed[id]) {
        allowed[id] = 1;
        w.n_allowed++;
      }
  return w.n_allowed;
}
