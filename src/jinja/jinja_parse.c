/* sluice — jinja: the Jinja parser (tokens -> AST), after jinja2's parser.
 *
 * Precedence, loosest first: `a if c else b`; or; and; not; comparisons and
 * (not) in; + -; ~; * / // %; **; unary - +; then postfix (.attr, [item],
 * [a:b:c], call), filters (|f) and tests (is t), which bind tightest.
 * Errors longjmp to sl__jinja_parse (the AST lives in the template arena).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "jinja_impl.h"
#include "sluice/util.h"

#define PARSE_MAX_DEPTH 200

typedef struct parser {
  sl__jarena *a;
  const sl__jtok *t;
  size_t n, i;
  int depth;
  jmp_buf jmp;
  sl_status st;
  char *err;
  size_t errcap;
} parser;

__attribute__((format(printf, 4, 5))) _Noreturn static void
pfail(parser *P, sl_status st, int line, const char *fmt, ...) {
  if (P->err && P->errcap) {
    int k = snprintf(P->err, P->errcap, "line %d: ", line);
    if (k < 0 || (size_t)k >= P->errcap)
      k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->err + k, P->errcap - (size_t)k, fmt, ap);
    va_end(ap);
  }
  P->st = st;
  longjmp(P->jmp, 1);
}

static void *palloc(parser *P, size_t n) {
  void *p = sl__ja_alloc(P->a, n);
  if (!p)
    pfail(P, SL_ERR_NOMEM, 0, "out of memory");
  memset(p, 0, n);
  return p;
}

/* A growable array of pointers in the arena. */
typedef struct pvec {
  void **v;
  size_t n, cap;
} pvec;

static void pvec_push(parser *P, pvec *pv, void *x) {
  if (pv->n == pv->cap) {
    size_t cap = pv->cap ? pv->cap * 2 : 4;
    void **nv = palloc(P, cap * sizeof(void *));
    if (pv->n)
      memcpy(nv, pv->v, pv->n * sizeof(void *));
    pv->v = nv;
    pv->cap = cap;
  }
  pv->v[pv->n++] = x;
}

static const sl__jtok *cur(parser *P) {
  return &P->t[P->i];
}
static const sl__jtok *peek(parser *P, size_t k) {
  size_t j = P->i + k;
  return &P->t[j < P->n ? j : P->n - 1];
}
static void advance(parser *P) {
  if (P->i + 1 < P->n)
    P->i++;
}

static bool is_op(const sl__jtok *t, const char *op) {
  return t->kind == JT_OP && strcmp(t->s, op) == 0;
}
static bool is_name(const sl__jtok *t, const char *name) {
  return t->kind == JT_NAME && strcmp(t->s, name) == 0;
}

static const char *tok_desc(const sl__jtok *t) {
  switch (t->kind) {
  case JT_EOF:
    return "end of template";
  case JT_TEXT:
    return "template data";
  case JT_VAR_BEGIN:
    return "'{{'";
  case JT_VAR_END:
    return "'}}'";
  case JT_BLOCK_BEGIN:
    return "'{%'";
  case JT_BLOCK_END:
    return "'%}'";
  case JT_STRING:
    return "string";
  case JT_INT:
    return "integer";
  case JT_FLOAT:
    return "float";
  default:
    return t->s;
  }
}

static void expect_op(parser *P, const char *op) {
  if (!is_op(cur(P), op))
    pfail(P, SL_ERR_FORMAT, cur(P)->line, "expected '%s', got %s", op,
          tok_desc(cur(P)));
  advance(P);
}

static const char *expect_name(parser *P) {
  if (cur(P)->kind != JT_NAME)
    pfail(P, SL_ERR_FORMAT, cur(P)->line, "expected a name, got %s",
          tok_desc(cur(P)));
  const char *s = cur(P)->s;
  advance(P);
  return s;
}

static void expect_kind(parser *P, sl__jtok_kind k) {
  if (cur(P)->kind != k) {
    sl__jtok fake = {.kind = k};
    pfail(P, SL_ERR_FORMAT, cur(P)->line, "expected %s, got %s",
          tok_desc(&fake), tok_desc(cur(P)));
  }
  advance(P);
}

static sl__jnode *mk(parser *P, int kind, int line) {
  sl__jnode *nd = palloc(P, sizeof *nd);
  nd->kind = (uint8_t)kind;
  nd->line = line;
  return nd;
}

static sl__jnode *mk_const(parser *P, int line, int kind) {
  sl__jnode *nd = mk(P, JN_CONST, line);
  nd->v = palloc(P, sizeof(sl_jv));
  nd->v->kind = (uint8_t)kind;
  return nd;
}

static void enter(parser *P) {
  if (++P->depth > PARSE_MAX_DEPTH)
    pfail(P, SL_ERR_RANGE, cur(P)->line, "template nested too deeply");
}
static void leave(parser *P) {
  P->depth--;
}

static sl__jnode *parse_expr(parser *P, bool with_cond);
static sl__jnode *parse_unary(parser *P, bool with_filter);
static sl__jnode *parse_or(parser *P);

/* (a, b=c, ...) after the '(' has been seen */
static void parse_call_args(parser *P, sl__jnode *nd) {
  expect_op(P, "(");
  pvec pos = {0}, kwn = {0}, kwv = {0};
  while (!is_op(cur(P), ")")) {
    if (pos.n + kwn.n)
      expect_op(P, ",");
    if (is_op(cur(P), ")"))
      break;
    if (is_op(cur(P), "*") || is_op(cur(P), "**"))
      pfail(P, SL_ERR_UNSUPPORTED, cur(P)->line,
            "unsupported construct: *args / **kwargs in a call");
    if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), "=")) {
      pvec_push(P, &kwn, (void *)cur(P)->s);
      advance(P);
      advance(P);
      pvec_push(P, &kwv, parse_expr(P, true));
    } else {
      if (kwn.n)
        pfail(P, SL_ERR_FORMAT, cur(P)->line,
              "positional argument follows keyword argument");
      pvec_push(P, &pos, parse_expr(P, true));
    }
  }
  advance(P);
  nd->l1 = (sl__jnode **)pos.v;
  nd->n1 = pos.n;
  nd->names = (const char **)kwn.v;
  nd->nnames = kwn.n;
  nd->l2 = (sl__jnode **)kwv.v;
  nd->n2 = kwv.n;
}

static sl__jnode *parse_tuple_rest(parser *P, sl__jnode *first, bool with_cond,
                                   bool explicit_parens) {
  pvec items = {0};
  pvec_push(P, &items, first);
  while (is_op(cur(P), ",")) {
    advance(P);
    const sl__jtok *t = cur(P);
    if (is_op(t, ")") || t->kind == JT_VAR_END || t->kind == JT_BLOCK_END ||
        is_op(t, "]") || is_op(t, "}") || is_name(t, "in") || is_op(t, "="))
      break;
    pvec_push(P, &items, parse_expr(P, with_cond));
  }
  (void)explicit_parens;
  sl__jnode *nd = mk(P, JN_LIST, first->line);
  nd->op = 1;
  nd->l1 = (sl__jnode **)items.v;
  nd->n1 = items.n;
  return nd;
}

/* An expression, or a tuple when followed by ','. Tuples become lists. */
static sl__jnode *parse_tuple(parser *P, bool with_cond) {
  sl__jnode *e = parse_expr(P, with_cond);
  if (is_op(cur(P), ","))
    return parse_tuple_rest(P, e, with_cond, false);
  return e;
}

static sl__jnode *parse_primary(parser *P) {
  const sl__jtok *t = cur(P);
  int line = t->line;
  sl__jnode *nd;
  switch (t->kind) {
  case JT_NAME:
    advance(P);
    if (!strcmp(t->s, "true") || !strcmp(t->s, "True") ||
        !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
      nd = mk_const(P, line, SL_JV_BOOL);
      nd->v->u.b = t->s[0] == 't' || t->s[0] == 'T';
      return nd;
    }
    if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
      return mk_const(P, line, SL_JV_NULL);
    nd = mk(P, JN_NAME, line);
    nd->s = t->s;
    return nd;
  case JT_STRING: {
    /* adjacent string literals concatenate */
    size_t total = 0, j = P->i;
    while (P->t[j].kind == JT_STRING)
      total += P->t[j++].n;
    char *buf = palloc(P, total + 1);
    size_t k = 0;
    while (cur(P)->kind == JT_STRING) {
      memcpy(buf + k, cur(P)->s, cur(P)->n);
      k += cur(P)->n;
      advance(P);
    }
    nd = mk_const(P, line, SL_JV_STRING);
    nd->v->u.s.p = buf;
    nd->v->u.s.n = total;
    return nd;
  }
  case JT_INT:
    advance(P);
    nd = mk_const(P, line, SL_JV_INT);
    nd->v->u.i = t->i;
    return nd;
  case JT_FLOAT:
    advance(P);
    nd = mk_const(P, line, SL_JV_FLOAT);
    nd->v->u.f = t->f;
    return nd;
  case JT_OP:
    if (is_op(t, "(")) {
      advance(P);
      if (is_op(cur(P), ")")) {
        advance(P);
        sl__jnode *empty = mk(P, JN_LIST, line);
        empty->op = 1;
        return empty;
      }
      sl__jnode *e = parse_expr(P, true);
      if (is_op(cur(P), ","))
        e = parse_tuple_rest(P, e, true, true);
      expect_op(P, ")");
      return e;
    }
    if (is_op(t, "[")) {
      advance(P);
      pvec items = {0};
      while (!is_op(cur(P), "]")) {
        if (items.n)
          expect_op(P, ",");
        if (is_op(cur(P), "]"))
          break;
        pvec_push(P, &items, parse_expr(P, true));
      }
      advance(P);
      nd = mk(P, JN_LIST, line);
      nd->l1 = (sl__jnode **)items.v;
      nd->n1 = items.n;
      return nd;
    }
    if (is_op(t, "{")) {
      advance(P);
      pvec keys = {0}, vals = {0};
      while (!is_op(cur(P), "}")) {
        if (keys.n)
          expect_op(P, ",");
        if (is_op(cur(P), "}"))
          break;
        pvec_push(P, &keys, parse_expr(P, true));
        expect_op(P, ":");
        pvec_push(P, &vals, parse_expr(P, true));
      }
      advance(P);
      nd = mk(P, JN_DICT, line);
      nd->l1 = (sl__jnode **)keys.v;
      nd->n1 = keys.n;
      nd->l2 = (sl__jnode **)vals.v;
      nd->n2 = vals.n;
      return nd;
    }
    break;
  default:
    break;
  }
  pfail(P, SL_ERR_FORMAT, line, "unexpected %s in expression", tok_desc(t));
}

static sl__jnode *parse_postfix(parser *P, sl__jnode *nd) {
  for (;;) {
    const sl__jtok *t = cur(P);
    if (is_op(t, ".")) {
      advance(P);
      if (cur(P)->kind == JT_NAME) {
        sl__jnode *a = mk(P, JN_ATTR, t->line);
        a->a = nd;
        a->s = cur(P)->s;
        advance(P);
        nd = a;
      } else if (cur(P)->kind == JT_INT) {
        sl__jnode *it = mk(P, JN_ITEM, t->line);
        it->a = nd;
        it->b = mk_const(P, t->line, SL_JV_INT);
        it->b->v->u.i = cur(P)->i;
        advance(P);
        nd = it;
      } else {
        pfail(P, SL_ERR_FORMAT, t->line, "expected a name after '.'");
      }
    } else if (is_op(t, "[")) {
      advance(P);
      sl__jnode *start = NULL, *stop = NULL, *step = NULL;
      bool slice = false;
      if (!is_op(cur(P), ":"))
        start = parse_expr(P, true);
      if (is_op(cur(P), ":")) {
        slice = true;
        advance(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ":"))
          stop = parse_expr(P, true);
        if (is_op(cur(P), ":")) {
          advance(P);
          if (!is_op(cur(P), "]"))
            step = parse_expr(P, true);
        }
      }
      if (is_op(cur(P), ","))
        pfail(P, SL_ERR_UNSUPPORTED, t->line,
              "unsupported construct: tuple subscript");
      expect_op(P, "]");
      sl__jnode *s = mk(P, slice ? JN_SLICE : JN_ITEM, t->line);
      s->a = nd;
      s->b = start;
      s->c = stop;
      s->d = step;
      nd = s;
    } else if (is_op(t, "(")) {
      sl__jnode *c = mk(P, JN_CALL, t->line);
      c->a = nd;
      parse_call_args(P, c);
      nd = c;
    } else {
      return nd;
    }
  }
}

/* name(.name)* -> an arena string "a.b" */
static const char *parse_dotted(parser *P) {
  const char *name = expect_name(P);
  while (is_op(cur(P), ".") && peek(P, 1)->kind == JT_NAME) {
    const char *more = peek(P, 1)->s;
    size_t a = strlen(name), b = strlen(more);
    char *s = palloc(P, a + b + 2);
    memcpy(s, name, a);
    s[a] = '.';
    memcpy(s + a + 1, more, b + 1);
    name = s;
    advance(P);
    advance(P);
  }
  return name;
}

static sl__jnode *parse_filter(parser *P, sl__jnode *nd) {
  int line = cur(P)->line;
  advance(P); /* | */
  sl__jnode *f = mk(P, JN_FILTER, line);
  f->a = nd;
  f->s = parse_dotted(P);
  if (is_op(cur(P), "("))
    parse_call_args(P, f);
  return f;
}

static sl__jnode *parse_test(parser *P, sl__jnode *nd) {
  int line = cur(P)->line;
  advance(P); /* is */
  sl__jnode *t = mk(P, JN_TEST, line);
  t->a = nd;
  if (is_name(cur(P), "not")) {
    t->op = 1;
    advance(P);
  }
  t->s = parse_dotted(P);
  const sl__jtok *c = cur(P);
  if (is_op(c, "(")) {
    parse_call_args(P, t);
  } else if ((c->kind == JT_NAME || c->kind == JT_STRING || c->kind == JT_INT ||
              c->kind == JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") &&
             !is_name(c, "if") && !is_name(c, "in") && !is_name(c, "not")) {
    if (is_name(c, "is"))
      pfail(P, SL_ERR_FORMAT, c->line,
            "you cannot chain multiple tests with is");
    sl__jnode *arg = parse_postfix(P, parse_primary(P));
    t->l1 = palloc(P, sizeof(sl__jnode *));
    t->l1[0] = arg;
    t->n1 = 1;
  }
  return t;
}

static sl__jnode *parse_filter_expr(parser *P, sl__jnode *nd) {
  for (;;) {
    if (is_op(cur(P), "|"))
      nd = parse_filter(P, nd);
    else if (is_name(cur(P), "is"))
      nd = parse_test(P, nd);
    else if (is_op(cur(P), "(")) {
      sl__jnode *c = mk(P, JN_CALL, cur(P)->line);
      c->a = nd;
      parse_call_args(P, c);
      nd = c;
    } else
      return nd;
  }
}

static sl__jnode *parse_unary(parser *P, bool with_filter) {
  enter(P);
  const sl__jtok *t = cur(P);
  sl__jnode *nd;
  if (is_op(t, "-") || is_op(t, "+")) {
    advance(P);
    nd = mk(P, JN_UNARY, t->line);
    nd->op = t->s[0] == '-' ? JOP_NEG : JOP_POS;
    nd->a = parse_unary(P, false);
  } else {
    nd = parse_primary(P);
  }
  nd = parse_postfix(P, nd);
  if (with_filter)
    nd = parse_filter_expr(P, nd);
  leave(P);
  return nd;
}

static sl__jnode *binary(parser *P, int op, sl__jnode *a, sl__jnode *b,
                         int line) {
  sl__jnode *nd = mk(P, JN_BINARY, line);
  nd->op = (uint8_t)op;
  nd->a = a;
  nd->b = b;
  return nd;
}

static sl__jnode *parse_pow(parser *P) {
  sl__jnode *l = parse_unary(P, true);
  while (is_op(cur(P), "**")) {
    int line = cur(P)->line;
    advance(P);
    l = binary(P, JOP_POW, l, parse_unary(P, true), line);
  }
  return l;
}

static sl__jnode *parse_math2(parser *P) {
  sl__jnode *l = parse_pow(P);
  for (;;) {
    const sl__jtok *t = cur(P);
    int op = is_op(t, "*")    ? JOP_MUL
             : is_op(t, "/")  ? JOP_DIV
             : is_op(t, "//") ? JOP_FLOORDIV
             : is_op(t, "%")  ? JOP_MOD
                              : 0;
    if (!op)
      return l;
    advance(P);
    l = binary(P, op, l, parse_pow(P), t->line);
  }
}

static sl__jnode *parse_concat(parser *P) {
  sl__jnode *l = parse_math2(P);
  while (is_op(cur(P), "~")) {
    int line = cur(P)->line;
    advance(P);
    l = binary(P, JOP_CONCAT, l, parse_math2(P), line);
  }
  return l;
}

static sl__jnode *parse_math1(parser *P) {
  sl__jnode *l = parse_concat(P);
  for (;;) {
    const sl__jtok *t = cur(P);
    int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
    if (!op)
      return l;
    advance(P);
    l = binary(P, op, l, parse_concat(P), t->line);
  }
}

static sl__jnode *parse_compare(parser *P) {
  sl__jnode *l = parse_math1(P);
  bool made =
      false; /* l is a comparison built here, not a (parenthesized) operand */
  for (;;) {
    const sl__jtok *t = cur(P);
    int op = is_op(t, "==")                                     ? JOP_EQ
             : is_op(t, "!=")                                   ? JOP_NE
             : is_op(t, "<")                                    ? JOP_LT
             : is_op(t, "<=")                                   ? JOP_LE
             : is_op(t, ">")                                    ? JOP_GT
             : is_op(t, ">=")                                   ? JOP_GE
             : is_name(t, "in")                                 ? JOP_IN
             : (is_name(t, "not") && is_name(peek(P, 1), "in")) ? JOP_NOTIN
                                                                : 0;
    if (!op)
      return l;
    advance(P);
    if (op == JOP_NOTIN)
      advance(P);
    sl__jnode *rhs = parse_math1(P);
    if (made && l->kind == JN_BINARY) {
      /* a second comparison: turn a op b into the chain a op b op c */
      sl__jnode *ch = mk(P, JN_COMPARE, l->line);
      ch->l1 = palloc(P, 3 * sizeof(sl__jnode *));
      ch->l1[0] = l->a;
      ch->l1[1] = l->b;
      ch->l1[2] = rhs;
      ch->n1 = 3;
      uint8_t *ops = palloc(P, 2);
      ops[0] = l->op;
      ops[1] = (uint8_t)op;
      ch->ops = ops;
      l = ch;
    } else if (made && l->kind == JN_COMPARE) {
      sl__jnode **nl = palloc(P, (l->n1 + 1) * sizeof(sl__jnode *));
      memcpy(nl, l->l1, l->n1 * sizeof(sl__jnode *));
      nl[l->n1] = rhs;
      uint8_t *ops = palloc(P, l->n1);
      memcpy(ops, l->ops, l->n1 - 1);
      ops[l->n1 - 1] = (uint8_t)op;
      l->l1 = nl;
      l->ops = ops;
      l->n1++;
    } else {
      l = binary(P, op, l, rhs, t->line);
    }
    made = true;
  }
}

static sl__jnode *parse_not(parser *P) {
  if (is_name(cur(P), "not")) {
    enter(P);
    sl__jnode *nd = mk(P, JN_NOT, cur(P)->line);
    advance(P);
    nd->a = parse_not(P);
    leave(P);
    return nd;
  }
  return parse_compare(P);
}

static sl__jnode *parse_and(parser *P) {
  sl__jnode *l = parse_not(P);
  while (is_name(cur(P), "and")) {
    sl__jnode *nd = mk(P, JN_AND, cur(P)->line);
    advance(P);
    nd->a = l;
    nd->b = parse_not(P);
    l = nd;
  }
  return l;
}

static sl__jnode *parse_or(parser *P) {
  sl__jnode *l = parse_and(P);
  while (is_name(cur(P), "or")) {
    sl__jnode *nd = mk(P, JN_OR, cur(P)->line);
    advance(P);
    nd->a = l;
    nd->b = parse_and(P);
    l = nd;
  }
  return l;
}

static sl__jnode *parse_expr(parser *P, bool with_cond) {
  enter(P);
  sl__jnode *e = parse_or(P);
  if (with_cond) {
    while (is_name(cur(P), "if")) {
      sl__jnode *nd = mk(P, JN_COND, cur(P)->line);
      advance(P);
      nd->a = parse_or(P);
      nd->b = e;
      if (is_name(cur(P), "else")) {
        advance(P);
        nd->c = parse_expr(P, true);
      }
      e = nd;
    }
  }
  leave(P);
  return e;
}

/* ---- statements
 * -------------------------------------------------------------- */

typedef struct body {
  sl__jnode **v;
  size_t n;
} body;

static body parse_body(parser *P, const char *const *ends, const char **hit);

static void end_block(parser *P) {
  expect_kind(P, JT_BLOCK_END);
}

/* Assignment targets: name | name, name | (name, name). */
static void parse_targets(parser *P, sl__jnode *nd) {
  pvec names = {0};
  bool paren = is_op(cur(P), "(");
  if (paren)
    advance(P);
  for (;;) {
    pvec_push(P, &names, (void *)expect_name(P));
    if (!is_op(cur(P), ","))
      break;
    advance(P);
    if (cur(P)->kind != JT_NAME)
      break;
  }
  if (paren)
    expect_op(P, ")");
  nd->names = (const char **)names.v;
  nd->nnames = names.n;
}

static sl__jnode *parse_for(parser *P, int line) {
  sl__jnode *nd = mk(P, JN_FOR, line);
  parse_targets(P, nd);
  if (!is_name(cur(P), "in"))
    pfail(P, SL_ERR_FORMAT, cur(P)->line, "expected 'in' in for loop");
  advance(P);
  nd->a = parse_tuple(P, false);
  if (is_name(cur(P), "if")) {
    advance(P);
    nd->b = parse_expr(P, true);
  }
  if (is_name(cur(P), "recursive"))
    pfail(P, SL_ERR_UNSUPPORTED, cur(P)->line,
          "unsupported construct: recursive for loop");
  end_block(P);
  static const char *const ends[] = {"endfor", "else", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  if (!strcmp(hit, "else")) {
    static const char *const ends2[] = {"endfor", NULL};
    body e = parse_body(P, ends2, &hit);
    nd->l2 = e.v;
    nd->n2 = e.n;
  }
  return nd;
}

static sl__jnode *parse_if(parser *P, int line) {
  sl__jnode *nd = mk(P, JN_IF, line);
  nd->a = parse_tuple(P, false);
  end_block(P);
  static const char *const ends[] = {"endif", "elif", "else", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  if (!strcmp(hit, "elif")) {
    /* parse_body left us after the 'elif' name */
    sl__jnode *e = parse_if(P, P->t[P->i].line);
    nd->l2 = palloc(P, sizeof(sl__jnode *));
    nd->l2[0] = e;
    nd->n2 = 1;
  } else if (!strcmp(hit, "else")) {
    static const char *const ends2[] = {"endif", NULL};
    body e = parse_body(P, ends2, &hit);
    nd->l2 = e.v;
    nd->n2 = e.n;
  }
  return nd;
}

static sl__jnode *parse_set(parser *P, int line) {
  if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), ".") &&
      peek(P, 2)->kind == JT_NAME) {
    sl__jnode *nd = mk(P, JN_SET_ATTR, line);
    nd->s = cur(P)->s;
    nd->s2 = peek(P, 2)->s;
    advance(P);
    advance(P);
    advance(P);
    expect_op(P, "=");
    nd->a = parse_tuple(P, true);
    end_block(P);
    return nd;
  }
  sl__jnode *nd = mk(P, JN_SET, line);
  parse_targets(P, nd);
  if (is_op(cur(P), "=")) {
    advance(P);
    nd->a = parse_tuple(P, true);
    end_block(P);
    return nd;
  }
  if (is_op(cur(P), "|"))
    pfail(P, SL_ERR_UNSUPPORTED, line,
          "unsupported construct: filtered block set");
  end_block(P);
  nd->kind = JN_SET_BLOCK;
  static const char *const ends[] = {"endset", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  return nd;
}

static sl__jnode *parse_macro(parser *P, int line) {
  sl__jnode *nd = mk(P, JN_MACRO, line);
  nd->s = expect_name(P);
  expect_op(P, "(");
  pvec names = {0}, defs = {0};
  bool any_default = false;
  while (!is_op(cur(P), ")")) {
    if (names.n)
      expect_op(P, ",");
    if (is_op(cur(P), ")"))
      break;
    pvec_push(P, &names, (void *)expect_name(P));
    if (is_op(cur(P), "=")) {
      advance(P);
      pvec_push(P, &defs, parse_expr(P, true));
      any_default = true;
    } else {
      if (any_default)
        pfail(P, SL_ERR_FORMAT, cur(P)->line,
              "non-default argument follows default argument");
      pvec_push(P, &defs, NULL);
    }
  }
  advance(P);
  end_block(P);
  nd->names = (const char **)names.v;
  nd->nnames = names.n;
  nd->l2 = (sl__jnode **)defs.v;
  nd->n2 = defs.n;
  static const char *const ends[] = {"endmacro", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  return nd;
}

static sl__jnode *parse_with(parser *P, int line) {
  sl__jnode *nd = mk(P, JN_WITH, line);
  pvec names = {0}, vals = {0};
  while (cur(P)->kind != JT_BLOCK_END) {
    if (names.n)
      expect_op(P, ",");
    pvec_push(P, &names, (void *)expect_name(P));
    expect_op(P, "=");
    pvec_push(P, &vals, parse_expr(P, true));
  }
  end_block(P);
  nd->names = (const char **)names.v;
  nd->nnames = names.n;
  nd->l2 = (sl__jnode **)vals.v;
  nd->n2 = vals.n;
  static const char *const ends[] = {"endwith", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  return nd;
}

static sl__jnode *parse_filter_block(parser *P, int line) {
  sl__jnode *nd = mk(P, JN_FILTER_BLOCK, line);
  sl__jnode *chain = NULL;
  /* a chain of filters applied to the captured body (a NULL operand) */
  for (;;) {
    sl__jnode *f = mk(P, JN_FILTER, cur(P)->line);
    f->a = chain;
    f->s = parse_dotted(P);
    if (is_op(cur(P), "("))
      parse_call_args(P, f);
    chain = f;
    if (!is_op(cur(P), "|"))
      break;
    advance(P);
  }
  end_block(P);
  nd->a = chain;
  static const char *const ends[] = {"endfilter", NULL};
  const char *hit;
  body b = parse_body(P, ends, &hit);
  nd->l1 = b.v;
  nd->n1 = b.n;
  return nd;
}

/* Parses one {% ... %} statement; P is just past the tag's name. */
static sl__jnode *parse_statement(parser *P, const char *name, int line) {
  if (!strcmp(name, "for"))
    return parse_for(P, line);
  if (!strcmp(name, "if"))
    return parse_if(P, line);
  if (!strcmp(name, "set"))
    return parse_set(P, line);
  if (!strcmp(name, "macro"))
    return parse_macro(P, line);
  if (!strcmp(name, "with"))
    return parse_with(P, line);
  if (!strcmp(name, "filter"))
    return parse_filter_block(P, line);
  if (!strcmp(name, "break") || !strcmp(name, "continue")) {
    end_block(P);
    return mk(P, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
  }
  if (!strcmp(name, "generation")) {
    end_block(P);
    sl__jnode *nd = mk(P, JN_BLOCK, line);
    static const char *const ends[] = {"endgeneration", NULL};
    const char *hit;
    body b = parse_body(P, ends, &hit);
    nd->l1 = b.v;
    nd->n1 = b.n;
    return nd;
  }
  static const char *const known[] = {
      "call",  "include",    "import", "from",  "extends",
      "block", "autoescape", "do",     "trans", NULL};
  for (size_t i = 0; known[i]; i++)
    if (!strcmp(name, known[i]))
      pfail(P, SL_ERR_UNSUPPORTED, line, "unsupported construct: {%% %s %%}",
            name);
  pfail(P, SL_ERR_FORMAT, line, "unknown tag '%s'", name);
}

/* Parses nodes until a {% <end> %} tag named in `ends` (NULL-terminated), or
 * to EOF when ends is NULL. On an end tag, consumes "{% name" and, unless the
 * name is "elif" (whose condition follows), the closing "%}"; *hit names it.
 */
static body parse_body(parser *P, const char *const *ends, const char **hit) {
  enter(P);
  pvec nodes = {0};
  for (;;) {
    const sl__jtok *t = cur(P);
    if (t->kind == JT_EOF) {
      if (ends)
        pfail(P, SL_ERR_FORMAT, t->line,
              "unexpected end of template, expected '%s'", ends[0]);
      break;
    }
    if (t->kind == JT_TEXT) {
      sl__jnode *nd = mk(P, JN_TEXT, t->line);
      nd->s = t->s;
      nd->n = t->n;
      pvec_push(P, &nodes, nd);
      advance(P);
      continue;
    }
    if (t->kind == JT_VAR_BEGIN) {
      advance(P);
      sl__jnode *nd = mk(P, JN_OUTPUT, t->line);
      nd->a = parse_tuple(P, true);
      expect_kind(P, JT_VAR_END);
      pvec_push(P, &nodes, nd);
      continue;
    }
    if (t->kind != JT_BLOCK_BEGIN)
      pfail(P, SL_ERR_FORMAT, t->line, "unexpected %s", tok_desc(t));
    advance(P);
    const sl__jtok *nt = cur(P);
    if (nt->kind != JT_NAME)
      pfail(P, SL_ERR_FORMAT, nt->line, "expected a tag name, got %s",
            tok_desc(nt));
    if (ends)
      for (size_t i = 0; ends[i]; i++)
        if (!strcmp(nt->s, ends[i])) {
          advance(P);
          if (strcmp(nt->s, "elif"))
            end_block(P);
          *hit = ends[i];
          leave(P);
          return (body){(sl__jnode **)nodes.v, nodes.n};
        }
    if (!strncmp(nt->s, "end", 3) || !strcmp(nt->s, "else") ||
        !strcmp(nt->s, "elif"))
      pfail(P, SL_ERR_FORMAT, nt->line, "unexpected '%s'%s%s", nt->s,
            ends ? ", expected " : "", ends ? ends[0] : "");
    advance(P);
    pvec_push(P, &nodes, parse_statement(P, nt->s, nt->line));
  }
  leave(P);
  return (body){(sl__jnode **)nodes.v, nodes.n};
}

sl_status sl__jinja_parse(sl_jinja_template_t *t, const sl__jtok *toks,
                          size_t ntoks, char *err, size_t errcap) {
  parser P = {
      .a = &t->arena, .t = toks, .n = ntoks, .err = err, .errcap = errcap};
  if (setjmp(P.jmp))
    return P.st;
  body b = parse_body(&P, NULL, NULL);
  t->body = b.v;
  t->nbody = b.n;
  return SL_OK;
}
