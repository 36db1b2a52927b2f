/* sluice — grammar: GBNF text compiled to rules of elements (see
 * grammar_impl.h), with the checks that keep the matcher finite: every
 * rule defined, no left recursion, a bounded size once repetitions are
 * expanded. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"
#include "sluice/utf8.h"
#include "sluice/util.h"

/* ---- building ------------------------------------------------------------ */

typedef struct gvec {
  gel *p;
  size_t n, cap;
} gvec;

typedef struct parser {
  const char *start, *s, *end;
  char **names;
  gvec *bodies; /* per rule; defined[i] once its "::=" was read */
  bool *defined;
  int n, cap;
  bool oom;
  char *err;
  size_t errcap;
  bool failed;
  size_t total; /* elements in all rules */
} parser;

/* fmt has one %d: the byte offset of `at` in the source. */
static bool fail(parser *ps, const char *fmt, const char *at) {
  if (!ps->failed)
    snprintf(ps->err, ps->errcap, fmt, (int)(at - ps->start));
  ps->failed = true;
  return false;
}

static bool push(parser *ps, gvec *v, uint32_t type, uint32_t value) {
  if (ps->failed)
    return false;
  if (++ps->total > MAX_ELEMENTS) /* repetitions expanded past reason */
    return fail(ps, "grammar: too large once expanded (at byte %d)", ps->s);
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 16;
    gel *p = realloc(v->p, sizeof *p * cap);
    if (!p) {
      ps->oom = ps->failed = true;
      return false;
    }
    v->p = p;
    v->cap = cap;
  }
  v->p[v->n++] = (gel){type, value};
  return true;
}

static int rule_id(parser *ps, const char *name, size_t len) {
  for (int i = 0; i < ps->n; i++)
    if (strlen(ps->names[i]) == len && !memcmp(ps->names[i], name, len))
      return i;
  if (ps->n == ps->cap) {
    int cap = ps->cap ? ps->cap * 2 : 32;
    char **nm = realloc(ps->names, sizeof *nm * (size_t)cap);
    if (nm)
      ps->names = nm;
    gvec *b = realloc(ps->bodies, sizeof *b * (size_t)cap);
    if (b)
      ps->bodies = b;
    bool *d = realloc(ps->defined, sizeof *d * (size_t)cap);
    if (d)
      ps->defined = d;
    if (!nm || !b || !d) {
      ps->oom = ps->failed = true;
      return -1;
    }
    ps->cap = cap;
  }
  char *c = malloc(len + 1);
  if (!c) {
    ps->oom = ps->failed = true;
    return -1;
  }
  memcpy(c, name, len);
  c[len] = 0;
  ps->names[ps->n] = c;
  ps->bodies[ps->n] = (gvec){0};
  ps->defined[ps->n] = false;
  return ps->n++;
}

/* A new rule with a made-up name (for groups and repetitions). */
static int new_rule(parser *ps) {
  char name[32];
  snprintf(name, sizeof name, "\x01%d", ps->n);
  int id = rule_id(ps, name, strlen(name));
  if (id >= 0)
    ps->defined[id] = true;
  return id;
}

static bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(parser *ps) {
  while (ps->s < ps->end) {
    char c = *ps->s;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
      ps->s++;
    else if (c == '#')
      while (ps->s < ps->end && *ps->s != '\n')
        ps->s++;
    else
      break;
  }
}

/* Whether a rule definition (name ::=) starts at ps->s. */
static bool at_definition(parser *ps) {
  const char *q = ps->s;
  while (q < ps->end && is_name_char(*q))
    q++;
  if (q == ps->s)
    return false;
  while (q < ps->end && (*q == ' ' || *q == '\t'))
    q++;
  return ps->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* One character of a literal or class (escapes decoded, UTF-8 read). */
static bool read_char(parser *ps, uint32_t *cp) {
  if (ps->s >= ps->end)
    return fail(ps, "grammar: unexpected end (at byte %d)", ps->s);
  unsigned char c = (unsigned char)*ps->s++;
  if (c == '\\') {
    if (ps->s >= ps->end)
      return fail(ps, "grammar: a lone '\\' at the end (at byte %d)", ps->s);
    char e = *ps->s++;
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
      uint32_t v = 0;
      for (int i = 0; i < digits; i++) {
        int h = ps->s < ps->end ? hexval(*ps->s) : -1;
        if (h < 0)
          return fail(ps, "grammar: a bad \\x/\\u escape (at byte %d)", ps->s);
        v = v * 16 + (uint32_t)h;
        ps->s++;
      }
      *cp = v;
      return true;
    }
    switch (e) {
    case 'n':
      *cp = '\n';
      return true;
    case 'r':
      *cp = '\r';
      return true;
    case 't':
      *cp = '\t';
      return true;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/':
      *cp = (uint32_t)e;
      return true;
    default:
      return fail(ps, "grammar: an unknown escape (at byte %d)", ps->s);
    }
  }
  if (c < 0x80) {
    *cp = c;
    return true;
  }
  /* well-formed only: an overlong form, a surrogate or a value past
   * U+10FFFF is no character the matcher can ever take */
  const char *at = ps->s - 1;
  size_t off = 0;
  if (!sl_utf8_decode_valid(at, (size_t)(ps->end - at), &off, cp))
    return fail(ps, "grammar: invalid UTF-8 (at byte %d)", at);
  ps->s = at + off;
  return true;
}

/* A count of {m,n}: 0..1000 from the digits at *q (moved past them);
 * -2 when there are none or it is larger. */
static long read_count(parser *ps, const char **q) {
  long v = 0;
  const char *d = *q;
  while (d < ps->end && *d >= '0' && *d <= '9' && v <= 1000)
    v = v * 10 + (*d++ - '0');
  if (d == *q || v > 1000)
    return -2;
  *q = d;
  return v;
}

static bool parse_alts(parser *ps, gvec *out, int depth);

/* Appends items to out until '|', ')', the end or the next definition. */
static bool parse_seq(parser *ps, gvec *out, int depth) {
  for (;;) {
    skip_space(ps);
    if (ps->s >= ps->end || *ps->s == '|' || *ps->s == ')' || at_definition(ps))
      return true;
    size_t start = out->n;
    char c = *ps->s;
    bool single = true; /* the item is one class or one reference */
    if (c == '"') {
      ps->s++;
      size_t k = 0;
      while (ps->s < ps->end && *ps->s != '"') {
        uint32_t cp;
        if (!read_char(ps, &cp) || !push(ps, out, E_CHAR, cp))
          return false;
        k++;
      }
      if (ps->s >= ps->end)
        return fail(ps, "grammar: an unterminated literal (at byte %d)", ps->s);
      ps->s++;
      single = k == 1;
      if (k == 0)
        continue; /* "" matches the empty string */
    } else if (c == '[') {
      ps->s++;
      bool neg = ps->s < ps->end && *ps->s == '^';
      if (neg)
        ps->s++;
      bool first = true;
      while (ps->s < ps->end && *ps->s != ']') {
        uint32_t lo, hi;
        if (!read_char(ps, &lo))
          return false;
        if (!push(ps, out, first ? (neg ? E_NOT : E_CHAR) : E_CALT, lo))
          return false;
        first = false;
        if (ps->end - ps->s >= 2 && ps->s[0] == '-' && ps->s[1] != ']') {
          ps->s++;
          if (!read_char(ps, &hi))
            return false;
          if (hi < lo)
            return fail(ps,
                        "grammar: a range whose end is below its "
                        "start (at byte %d)",
                        ps->s);
          if (!push(ps, out, E_UPPER, hi))
            return false;
        }
      }
      if (ps->s >= ps->end)
        return fail(ps, "grammar: an unterminated class (at byte %d)", ps->s);
      if (first)
        return fail(ps, "grammar: an empty class [] (at byte %d)", ps->s);
      ps->s++;
    } else if (c == '.') {
      ps->s++;
      if (!push(ps, out, E_ANY, 0))
        return false;
    } else if (c == '(') {
      ps->s++;
      if (depth > 64)
        return fail(ps, "grammar: groups nested too deep (at byte %d)", ps->s);
      int id = new_rule(ps);
      if (id < 0)
        return false;
      gvec body = {0};
      bool ok = parse_alts(ps, &body, depth + 1) && push(ps, &body, E_END, 0);
      ps->bodies[id] = body; /* freed with the parser, whatever ok says */
      if (!ok)
        return false;
      skip_space(ps);
      if (ps->s >= ps->end || *ps->s != ')')
        return fail(ps, "grammar: a '(' without its ')' (at byte %d)", ps->s);
      ps->s++;
      if (!push(ps, out, E_REF, (uint32_t)id))
        return false;
    } else if (is_name_char(c)) {
      const char *n0 = ps->s;
      while (ps->s < ps->end && is_name_char(*ps->s))
        ps->s++;
      int id = rule_id(ps, n0, (size_t)(ps->s - n0));
      if (id < 0 || !push(ps, out, E_REF, (uint32_t)id))
        return false;
    } else {
      return fail(ps, "grammar: an unexpected character (at byte %d)", ps->s);
    }
    /* a repetition */
    if (ps->s >= ps->end)
      return true;
    char op = *ps->s;
    long lo = 1, hi = 1; /* hi < 0: no upper bound */
    if (op == '*')
      lo = 0, hi = -1;
    else if (op == '+')
      lo = 1, hi = -1;
    else if (op == '?')
      lo = 0, hi = 1;
    else if (op == '{') {
      /* {m}, {m,}, {m,n}: digits read within the source (which need not
       * end in a NUL) */
      const char *q = ps->s + 1;
      lo = read_count(ps, &q);
      if (lo < 0)
        return fail(ps, "grammar: a bad {m,n} (at byte %d)", ps->s);
      hi = lo;
      if (q < ps->end && *q == ',') {
        q++;
        hi = q < ps->end && *q == '}' ? -1 : read_count(ps, &q);
        if (hi == -2 || (hi >= 0 && hi < lo))
          return fail(ps, "grammar: a bad {m,n} (at byte %d)", ps->s);
      }
      if (q >= ps->end || *q != '}')
        return fail(ps, "grammar: a bad {m,n} (at byte %d)", ps->s);
      ps->s = q;
    } else {
      continue;
    }
    ps->s++;
    /* the item as one unit: a reference to a rule of its own unless it is
     * one class or one reference already */
    size_t len = out->n - start;
    if (!single) {
      int id = new_rule(ps);
      if (id < 0)
        return false;
      gvec body = {0};
      for (size_t i = 0; i < len; i++)
        if (!push(ps, &body, out->p[start + i].type, out->p[start + i].value))
          break;
      ps->bodies[id] = body;
      if (ps->failed || !push(ps, &ps->bodies[id], E_END, 0))
        return false;
      out->n = start;
      if (!push(ps, out, E_REF, (uint32_t)id))
        return false;
      len = 1;
    }
    gel atom[MAX_STACK];
    if (len > MAX_STACK)
      return fail(ps, "grammar: a class too long (at byte %d)", ps->s);
    memcpy(atom, out->p + start, sizeof *atom * len);
    out->n = start;
    for (long i = 0; i < lo; i++)
      for (size_t k = 0; k < len; k++)
        if (!push(ps, out, atom[k].type, atom[k].value))
          return false;
    if (hi == lo)
      continue;
    int id = new_rule(ps);
    if (id < 0)
      return false;
    gvec body = {0};
    if (hi < 0) { /* R ::= atom R | (empty) */
      for (size_t k = 0; k < len; k++)
        push(ps, &body, atom[k].type, atom[k].value);
      push(ps, &body, E_REF, (uint32_t)id);
      push(ps, &body, E_ALT, 0);
      push(ps, &body, E_END, 0);
      ps->bodies[id] = body;
    } else { /* O_k ::= atom O_(k-1) | (empty), nested hi - lo deep */
      for (size_t k = 0; k < len; k++)
        push(ps, &body, atom[k].type, atom[k].value);
      push(ps, &body, E_ALT, 0);
      push(ps, &body, E_END, 0);
      ps->bodies[id] = body;
      for (long j = lo + 1; j < hi && !ps->failed; j++) {
        int outer = new_rule(ps);
        if (outer < 0)
          return false;
        gvec ob = {0};
        for (size_t k = 0; k < len; k++)
          push(ps, &ob, atom[k].type, atom[k].value);
        push(ps, &ob, E_REF, (uint32_t)id);
        push(ps, &ob, E_ALT, 0);
        push(ps, &ob, E_END, 0);
        ps->bodies[outer] = ob;
        id = outer;
      }
    }
    if (ps->failed || !push(ps, out, E_REF, (uint32_t)id))
      return false;
  }
}

static bool parse_alts(parser *ps, gvec *out, int depth) {
  if (!parse_seq(ps, out, depth))
    return false;
  for (;;) {
    skip_space(ps);
    if (ps->s >= ps->end || *ps->s != '|')
      return true;
    ps->s++;
    if (!push(ps, out, E_ALT, 0) || !parse_seq(ps, out, depth))
      return false;
  }
}

/* ---- checks: nullable rules and left recursion --------------------------- */

/* Whether the alternative starting at p can match the empty string. */
static bool alt_nullable(const gel *p, const bool *nullable) {
  for (; p->type != E_END && p->type != E_ALT; p++)
    if (p->type != E_REF || !nullable[p->value])
      return false;
  return true;
}

static bool left_cycle(gel **rules, const bool *nullable, int r,
                       uint8_t *mark) {
  if (mark[r] == 1)
    return true;
  if (mark[r] == 2)
    return false;
  mark[r] = 1;
  const gel *p = rules[r];
  for (;;) { /* each alternative's leading references */
    const gel *q = p;
    for (; q->type == E_REF; q++) {
      if (left_cycle(rules, nullable, (int)q->value, mark))
        return true;
      if (!nullable[q->value])
        break;
    }
    if (!(p = next_alt(p)))
      break;
  }
  mark[r] = 2;
  return false;
}

sl_status sl_grammar_compile(const char *src, size_t len, const char *root,
                             sl_grammar_t **out, char *err, size_t errcap) {
  *out = NULL;
  char dummy[8];
  if (!err || !errcap)
    err = dummy, errcap = sizeof dummy;
  err[0] = 0;
  parser ps = {
      .start = src, .s = src, .end = src + len, .err = err, .errcap = errcap};
  sl_status st = SL_ERR_FORMAT;
  sl_grammar_t *g = NULL;
  bool *nullable = NULL;
  uint8_t *mark = NULL;
  for (;;) {
    skip_space(&ps);
    if (ps.s >= ps.end || ps.failed)
      break;
    const char *n0 = ps.s;
    while (ps.s < ps.end && is_name_char(*ps.s))
      ps.s++;
    if (ps.s == n0) {
      fail(&ps, "grammar: a rule name expected (at byte %d)", ps.s);
      break;
    }
    int id = rule_id(&ps, n0, (size_t)(ps.s - n0));
    if (id < 0)
      break;
    if (ps.defined[id]) {
      fail(&ps, "grammar: a rule defined twice (at byte %d)", ps.s);
      break;
    }
    skip_space(&ps);
    if (ps.end - ps.s < 3 || memcmp(ps.s, "::=", 3)) {
      fail(&ps, "grammar: '::=' expected (at byte %d)", ps.s);
      break;
    }
    ps.s += 3;
    ps.defined[id] = true;
    gvec body = {0};
    bool ok = parse_alts(&ps, &body, 0) && push(&ps, &body, E_END, 0);
    ps.bodies[id] = body;
    if (!ok)
      break;
    skip_space(&ps);
    if (ps.s < ps.end && *ps.s == ')') {
      fail(&ps, "grammar: a ')' without its '(' (at byte %d)", ps.s);
      break;
    }
  }
  if (ps.oom) {
    st = SL_ERR_NOMEM;
    snprintf(err, errcap, "out of memory");
    goto done;
  }
  if (ps.failed)
    goto done;
  int r = -1;
  const char *rn = root ? root : "root";
  for (int i = 0; i < ps.n; i++) {
    if (!ps.defined[i]) {
      snprintf(err, errcap, "grammar: the rule '%.64s' is used but not defined",
               ps.names[i]);
      goto done;
    }
    if (!strcmp(ps.names[i], rn))
      r = i;
  }
  if (r < 0) {
    snprintf(err, errcap, "grammar: no rule '%.64s'", rn);
    goto done;
  }
  st = SL_ERR_NOMEM;
  if (!(g = calloc(1, sizeof *g)) || !(g->masks = sl__mask_cache_new()) ||
      !(g->rules = calloc((size_t)ps.n, sizeof *g->rules)) ||
      !(nullable = calloc((size_t)ps.n, sizeof *nullable)) ||
      !(mark = calloc((size_t)ps.n, 1)))
    goto done;
  g->n_rules = ps.n;
  g->root = r;
  atomic_init(&g->refs, 1);
  for (int i = 0; i < ps.n; i++) {
    g->rules[i] = ps.bodies[i].p;
    ps.bodies[i].p = NULL;
  }
  for (bool changed = true; changed;) { /* nullable: a fixpoint */
    changed = false;
    for (int i = 0; i < ps.n; i++) {
      if (nullable[i])
        continue;
      for (const gel *p = g->rules[i]; p; p = next_alt(p))
        if (alt_nullable(p, nullable)) {
          nullable[i] = changed = true;
          break;
        }
    }
  }
  st = SL_ERR_FORMAT;
  for (int i = 0; i < ps.n; i++)
    if (left_cycle(g->rules, nullable, i, mark)) {
      snprintf(err, errcap,
               "grammar: the rule '%.64s' recurses on the left (not "
               "supported)",
               ps.names[i][0] == 1 ? "(a group)" : ps.names[i]);
      goto done;
    }
  *out = g;
  g = NULL;
  st = SL_OK;
done:
  if (g)
    sl_grammar_unref(g);
  free(nullable);
  free(mark);
  for (int i = 0; i < ps.n; i++) {
    free(ps.names[i]);
    free(ps.bodies[i].p);
  }
  free(ps.names);
  free(ps.bodies);
  free(ps.defined);
  return st;
}

/* ---- grammars shared by their text --------------------------------------
 * Requests with the same schema compile the same GBNF; sharing the compiled
 * grammar shares its mask cache, so the states every request of that
 * schema goes through are walked once, not once per request. A few
 * grammars are kept (LRU), each at most SHARED_MAX_SRC bytes of source. */
#define SHARED_N       16
#define SHARED_MAX_SRC (64 * 1024)

static struct {
  pthread_mutex_t mu;
  struct {
    char *src;
    size_t len;
    sl_grammar_t *g;
    uint64_t used;
  } e[SHARED_N];
  uint64_t clock;
} shared = {.mu = PTHREAD_MUTEX_INITIALIZER};

sl_status sl_grammar_compile_shared(const char *src, size_t len,
                                    sl_grammar_t **out, char *err,
                                    size_t errcap) {
  *out = NULL;
  pthread_mutex_lock(&shared.mu);
  shared.clock++;
  for (int i = 0; i < SHARED_N; i++)
    if (shared.e[i].g && shared.e[i].len == len &&
        !memcmp(shared.e[i].src, src, len)) {
      atomic_fetch_add(&shared.e[i].g->refs, 1);
      shared.e[i].used = shared.clock;
      *out = shared.e[i].g;
      pthread_mutex_unlock(&shared.mu);
      return SL_OK;
    }
  pthread_mutex_unlock(&shared.mu);
  sl_status st = sl_grammar_compile(src, len, NULL, out, err, errcap);
  char *copy = st == SL_OK && len <= SHARED_MAX_SRC ? malloc(len + 1) : NULL;
  if (!copy)
    return st; /* not kept: only shared by later requests */
  memcpy(copy, src, len);
  pthread_mutex_lock(&shared.mu);
  int lru = 0;
  for (int i = 1; i < SHARED_N; i++)
    if (shared.e[i].used < shared.e[lru].used)
      lru = i;
  sl_grammar_t *old = shared.e[lru].g;
  char *old_src = shared.e[lru].src;
  atomic_fetch_add(&(*out)->refs, 1); /* the cache's */
  shared.e[lru].g = *out;
  shared.e[lru].src = copy;
  shared.e[lru].len = len;
  shared.e[lru].used = shared.clock;
  pthread_mutex_unlock(&shared.mu);
  sl_grammar_unref(old);
  free(old_src);
  return SL_OK;
}
