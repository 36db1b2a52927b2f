/* sluice — server: JSON Schema -> GBNF, for constrained decoding
 * (response_format json_schema, Anthropic's output_config.format) and the
 * generic JSON grammars (json_object). The grammar is compiled by
 * src/grammar; what a schema asks that a grammar cannot say (pattern,
 * numeric bounds) is refused here with a message naming it, or, where JSON
 * Schema makes it an annotation (format, title, description), ignored.
 *
 * Objects: the listed properties in the schema's order, the required ones
 * always, the others each optional; no other property unless
 * additionalProperties allows it (then, with no properties listed, any
 * member of that schema). Arrays: items (or any value), minItems and
 * maxItems. Strings: minLength, maxLength, enum, const. $ref to
 * #/$defs/... or #/definitions/..., anyOf, oneOf, allOf of one schema,
 * type lists, nullable. */
#include <stdio.h>
#include <string.h>

#include "server/json.h"
#include "server/schema.h"
#include "sluice/util.h"

/* the rules every grammar may use */
static const char *const BASE =
    "ws ::= [ \\t\\n]{0,16}\n"
    "json-value ::= json-object | json-array | json-string | json-number | "
    "\"true\" | \"false\" | \"null\"\n"
    "json-object ::= \"{\" ws ( json-string ws \":\" ws json-value ( ws \",\" "
    "ws json-string ws \":\" ws json-value )* )? ws \"}\"\n"
    "json-array ::= \"[\" ws ( json-value ( ws \",\" ws json-value )* )? ws "
    "\"]\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
    "[0-9a-fA-F]{4} )\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-int ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "json-number ::= json-int ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} "
    ")?\n"
    "json-bool ::= \"true\" | \"false\"\n"
    "json-null ::= \"null\"\n";

#define MAX_RULES 512
#define MAX_DEPTH 32

typedef struct conv {
  json_t *root;
  sl_sbuf *out;
  int n_rules;
  /* $refs already given a rule: the pointer text and the rule's number */
  char *refs[64];
  int ref_rule[64];
  int n_refs;
  char *err;
  size_t errcap;
  bool failed;
  bool closed; /* no additionalProperties given: none allowed */
} conv;

static bool bad(conv *c, const char *fmt, const char *what) {
  if (!c->failed)
    snprintf(c->err, c->errcap, fmt, what);
  c->failed = true;
  return false;
}

/* A GBNF literal of the bytes s[0..n). */
static void literal(sl_sbuf *b, const char *s, size_t n) {
  sl__sbuf_adds(b, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      sl__sbuf_addf(b, "\\%c", ch);
    else if (ch < 0x20)
      sl__sbuf_addf(b, "\\x%02x", ch);
    else
      sl__sbuf_add(b, &s[i], 1);
  }
  sl__sbuf_adds(b, "\"");
}

/* The JSON text of v as a GBNF literal (const and enum). */
static bool json_literal(conv *c, sl_sbuf *b, json_t *v) {
  char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!t)
    return bad(c, "out of memory%s", "");
  literal(b, t, strlen(t));
  free(t);
  return true;
}

static int gen(conv *c, json_t *s, int depth);

/* The name of a result of gen(): r<N> for a rule of this schema, or one
 * of the base rules for the negative codes (see gen_type). */
static const char *name_of(int v, char *buf, size_t cap) {
  static const char *const named[] = {
      NULL,       NULL,        "json-value", "json-string", "json-number",
      "json-int", "json-bool", "json-null",  "json-object"};
  if (v >= 0) {
    snprintf(buf, cap, "r%d", v);
    return buf;
  }
  return named[-v];
}

/* A new rule number, its "name ::= " written to *body (appended to the
 * output by finish()). */
static int begin(conv *c, sl_sbuf *body) {
  if (c->n_rules >= MAX_RULES) {
    bad(c, "the schema is too large (more than %s rules)", "512");
    return -1;
  }
  int id = c->n_rules++;
  sl__sbuf_addf(body, "r%d ::= ", id);
  return id;
}

static void finish(conv *c, sl_sbuf *body) {
  sl__sbuf_adds(body, "\n");
  sl__sbuf_add(c->out, body->p, body->len);
  if (body->oom)
    c->out->oom = true;
  sl__sbuf_free(body);
}

/* Resolves "#/$defs/x" or "#/definitions/x" in the root schema. */
static json_t *resolve(conv *c, const char *ref) {
  const char *name = NULL;
  json_t *defs = NULL;
  if (!strncmp(ref, "#/$defs/", 8)) {
    defs = json_object_get(c->root, "$defs");
    name = ref + 8;
  } else if (!strncmp(ref, "#/definitions/", 14)) {
    defs = json_object_get(c->root, "definitions");
    name = ref + 14;
  } else if (!strcmp(ref, "#")) {
    return c->root;
  }
  return defs && name ? json_object_get(defs, name) : NULL;
}

static int gen_object(conv *c, json_t *s, int depth) {
  json_t *props = json_object_get(s, "properties");
  json_t *req = json_object_get(s, "required");
  json_t *addl = json_object_get(s, "additionalProperties");
  if (props && !json_is_object(props))
    return bad(c, "'properties' must be an object%s", ""), -1;
  if (req && !json_is_array(req))
    return bad(c, "'required' must be a list%s", ""), -1;
  size_t np = props ? json_object_size(props) : 0;
  if (np > 64)
    return bad(c, "an object with more than %s properties", "64"), -1;
  /* tool arguments: listed properties and no others, unless the schema
   * says otherwise (as models are told to call them) */
  if (!addl && props && c->closed)
    addl = json_false();
  if (!np) { /* a map: any object, or members of one schema */
    if (!addl || json_is_true(addl) ||
        (json_is_object(addl) && !json_object_size(addl)))
      return -8; /* json-object */
    if (json_is_false(addl)) {
      sl_sbuf b = {0};
      int id = begin(c, &b);
      sl__sbuf_adds(&b, "\"{\" ws \"}\"");
      finish(c, &b);
      return id;
    }
    int v = gen(c, addl, depth + 1);
    if (v == -1)
      return -1;
    sl_sbuf b = {0};
    int id = begin(c, &b);
    char vb[24];
    const char *val = name_of(v, vb, sizeof vb);
    sl__sbuf_addf(&b,
                  "\"{\" ws ( json-string ws \":\" ws %s ( ws \",\" ws "
                  "json-string ws \":\" ws %s )* )? ws \"}\"",
                  val, val);
    finish(c, &b);
    return id;
  }
  if (addl && !json_is_false(addl) && !json_is_true(addl) &&
      !(json_is_object(addl) && !json_object_size(addl)))
    return bad(c,
               "additionalProperties with a schema beside 'properties' "
               "is not supported%s",
               ""),
           -1;
  /* each property's "key": value, as a rule */
  const char *key;
  json_t *ps;
  int kv[64];
  bool required[64];
  const char *names[64];
  size_t i = 0;
  json_object_foreach(props, key, ps) {
    int v = gen(c, ps, depth + 1);
    if (v == -1)
      return -1;
    sl_sbuf b = {0};
    kv[i] = begin(c, &b);
    if (kv[i] < 0)
      return -1;
    json_t *ks = json_string(key);
    char *t = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
    json_decref(ks);
    if (!t) {
      sl__sbuf_free(&b);
      return bad(c, "out of memory%s", ""), -1;
    }
    literal(&b, t, strlen(t));
    free(t);
    char vb[24];
    sl__sbuf_addf(&b, " ws \":\" ws %s", name_of(v, vb, sizeof vb));
    finish(c, &b);
    names[i] = key;
    required[i] = false;
    i++;
  }
  size_t k;
  json_t *r;
  json_array_foreach(req, k, r) {
    if (!json_is_string(r))
      return bad(c, "'required' must hold strings%s", ""), -1;
    bool found = false;
    for (size_t j = 0; j < np; j++)
      if (!strcmp(names[j], json_string_value(r)))
        required[j] = found = true;
    if (!found)
      return bad(c, "'required' names '%s', which is not in 'properties'",
                 json_string_value(r)),
             -1;
  }
  /* the optional ones, in order, as a chain N_j: at least one of j.. */
  int opt[64], n_opt = 0, chain = -1;
  for (size_t j = 0; j < np; j++)
    if (!required[j])
      opt[n_opt++] = kv[j];
  for (int j = n_opt - 1; j >= 0; j--) {
    sl_sbuf b = {0};
    int id = begin(c, &b);
    if (id < 0)
      return -1;
    if (chain < 0)
      sl__sbuf_addf(&b, "r%d", opt[j]);
    else
      sl__sbuf_addf(&b, "r%d ( ws \",\" ws r%d )? | r%d", opt[j], chain, chain);
    finish(c, &b);
    chain = id;
  }
  sl_sbuf b = {0};
  int id = begin(c, &b);
  if (id < 0)
    return -1;
  sl__sbuf_adds(&b, "\"{\" ws");
  bool any = false;
  for (size_t j = 0; j < np; j++)
    if (required[j]) {
      sl__sbuf_addf(&b, any ? " ws \",\" ws r%d" : " r%d", kv[j]);
      any = true;
    }
  if (chain >= 0)
    sl__sbuf_addf(&b, any ? " ( ws \",\" ws r%d )?" : " ( r%d )?", chain);
  sl__sbuf_adds(&b, " ws \"}\"");
  finish(c, &b);
  return id;
}

static int gen_array(conv *c, json_t *s, int depth) {
  json_t *items = json_object_get(s, "items");
  if (json_object_get(s, "prefixItems"))
    return bad(c, "'prefixItems' is not supported%s", ""), -1;
  long lo = 0, hi = -1;
  json_t *mn = json_object_get(s, "minItems"),
         *mx = json_object_get(s, "maxItems");
  if (mn && (!json_is_integer(mn) || json_integer_value(mn) < 0 ||
             json_integer_value(mn) > 1000))
    return bad(c, "'minItems' must be an integer in 0..1000%s", ""), -1;
  if (mx && (!json_is_integer(mx) || json_integer_value(mx) < 0 ||
             json_integer_value(mx) > 1000))
    return bad(c, "'maxItems' must be an integer in 0..1000%s", ""), -1;
  if (mn)
    lo = (long)json_integer_value(mn);
  if (mx)
    hi = (long)json_integer_value(mx);
  if (hi >= 0 && hi < lo)
    return bad(c, "'maxItems' is below 'minItems'%s", ""), -1;
  int v = items ? gen(c, items, depth + 1) : -2;
  if (v == -1)
    return -1;
  char ib[24];
  const char *it = name_of(v, ib, sizeof ib);
  sl_sbuf b = {0};
  int id = begin(c, &b);
  if (id < 0)
    return -1;
  sl__sbuf_adds(&b, "\"[\" ws ");
  if (hi == 0) {
    /* nothing */
  } else {
    long rlo = lo > 0 ? lo - 1 : 0;
    sl__sbuf_addf(&b, "%s%s ( ws \",\" ws %s ){%ld,", lo == 0 ? "( " : "", it,
                  it, rlo);
    if (hi > 0)
      sl__sbuf_addf(&b, "%ld", hi - 1);
    sl__sbuf_adds(&b, "}");
    if (lo == 0)
      sl__sbuf_adds(&b, " )?");
  }
  sl__sbuf_adds(&b, " ws \"]\"");
  finish(c, &b);
  return id;
}

static int gen_string(conv *c, json_t *s) {
  if (json_object_get(s, "pattern"))
    return bad(c, "'pattern' is not supported%s", ""), -1;
  json_t *mn = json_object_get(s, "minLength"),
         *mx = json_object_get(s, "maxLength");
  if (!mn && !mx)
    return -3; /* json-string */
  long lo = mn && json_is_integer(mn) ? (long)json_integer_value(mn) : 0;
  long hi = mx && json_is_integer(mx) ? (long)json_integer_value(mx) : -1;
  if (lo < 0 || lo > 1000 || hi > 1000 || (hi >= 0 && hi < lo))
    return bad(c, "'minLength'/'maxLength' must be in 0..1000%s", ""), -1;
  sl_sbuf b = {0};
  int id = begin(c, &b);
  if (id < 0)
    return -1;
  sl__sbuf_addf(&b, "\"\\\"\" json-char{%ld,", lo);
  if (hi >= 0)
    sl__sbuf_addf(&b, "%ld", hi);
  sl__sbuf_adds(&b, "} \"\\\"\"");
  finish(c, &b);
  return id;
}

/* One type name's rule: -8 json-object, -2 json-value, -3 json-string, -4
 * json-number, -5 json-int, -6 json-bool, -7 json-null, >= 0 a rule, -1 failed.
 */
static int gen_type(conv *c, json_t *s, const char *t, int depth) {
  if (!strcmp(t, "object"))
    return gen_object(c, s, depth);
  if (!strcmp(t, "array"))
    return gen_array(c, s, depth);
  if (!strcmp(t, "string"))
    return gen_string(c, s);
  if (!strcmp(t, "number") || !strcmp(t, "integer")) {
    static const char *const bounds[] = {"minimum", "maximum",
                                         "exclusiveMinimum", "exclusiveMaximum",
                                         "multipleOf"};
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++)
      if (json_object_get(s, bounds[i]))
        return bad(c, "'%s' is not supported", bounds[i]), -1;
    return t[0] == 'n' ? -4 : -5;
  }
  if (!strcmp(t, "boolean"))
    return -6;
  if (!strcmp(t, "null"))
    return -7;
  return bad(c, "unknown type '%s'", t), -1;
}

static void ref_name(sl_sbuf *b, int v) {
  char buf[24];
  sl__sbuf_adds(b, name_of(v, buf, sizeof buf));
}

/* Alternatives of several sub-results as one rule. */
static int alternatives(conv *c, const int *v, size_t n) {
  if (n == 1)
    return v[0];
  sl_sbuf b = {0};
  int id = begin(c, &b);
  if (id < 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (i)
      sl__sbuf_adds(&b, " | ");
    ref_name(&b, v[i]);
  }
  finish(c, &b);
  return id;
}

/* The rule for schema s: its number, or a negative code (gen_type's). */
static int gen(conv *c, json_t *s, int depth) {
  if (c->failed)
    return -1;
  if (depth > MAX_DEPTH)
    return bad(c, "the schema nests deeper than %s levels", "32"), -1;
  if (json_is_true(s))
    return -2;
  if (!json_is_object(s))
    return bad(c, "a schema must be an object or true%s", ""), -1;
  /* keywords that change what is valid and that a grammar here does not
   * follow: refused, never silently dropped */
  static const char *const unsupported[] = {"not",
                                            "if",
                                            "then",
                                            "else",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "uniqueItems",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "patternProperties",
                                            "propertyNames",
                                            "minProperties",
                                            "maxProperties",
                                            "unevaluatedProperties",
                                            "unevaluatedItems"};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
    if (json_object_get(s, unsupported[i]))
      return bad(c, "'%s' is not supported", unsupported[i]), -1;
  json_t *ref = json_object_get(s, "$ref");
  if (ref) {
    if (!json_is_string(ref))
      return bad(c, "'$ref' must be a string%s", ""), -1;
    const char *r = json_string_value(ref);
    for (int i = 0; i < c->n_refs; i++)
      if (!strcmp(c->refs[i], r))
        return c->ref_rule[i];
    json_t *target = resolve(c, r);
    if (!target)
      return bad(c,
                 "'$ref' '%s' does not resolve (only #/$defs/... and "
                 "#/definitions/...)",
                 r),
             -1;
    if (c->n_refs >= 64)
      return bad(c, "more than %s $refs", "64"), -1;
    /* a rule of its own first, so that a recursive schema refers to it */
    sl_sbuf b = {0};
    int id = begin(c, &b);
    if (id < 0)
      return -1;
    c->refs[c->n_refs] = sl_strdup(r);
    c->ref_rule[c->n_refs++] = id;
    int v = gen(c, target, depth + 1);
    if (v == -1) {
      sl__sbuf_free(&b);
      return -1;
    }
    ref_name(&b, v);
    finish(c, &b);
    return id;
  }
  json_t *cst = json_object_get(s, "const");
  json_t *en = json_object_get(s, "enum");
  if (cst || en) {
    if (en && (!json_is_array(en) || !json_array_size(en)))
      return bad(c, "'enum' must be a non-empty list%s", ""), -1;
    sl_sbuf b = {0};
    int id = begin(c, &b);
    if (id < 0)
      return -1;
    if (cst) {
      json_literal(c, &b, cst);
    } else {
      size_t i;
      json_t *x;
      json_array_foreach(en, i, x) {
        if (i)
          sl__sbuf_adds(&b, " | ");
        json_literal(c, &b, x);
      }
    }
    finish(c, &b);
    return c->failed ? -1 : id;
  }
  const char *comb[] = {"anyOf", "oneOf", "allOf"};
  for (int k = 0; k < 3; k++) {
    json_t *l = json_object_get(s, comb[k]);
    if (!l)
      continue;
    if (!json_is_array(l) || !json_array_size(l) || json_array_size(l) > 32)
      return bad(c, "'%s' must be a list of 1 to 32 schemas", comb[k]), -1;
    if (k == 2 && json_array_size(l) != 1)
      return bad(c, "'allOf' of more than one schema is not supported%s", ""),
             -1;
    int v[32];
    size_t i;
    json_t *x;
    json_array_foreach(l, i, x) {
      if ((v[i] = gen(c, x, depth + 1)) == -1)
        return -1;
    }
    return alternatives(c, v, json_array_size(l));
  }
  json_t *type = json_object_get(s, "type");
  bool nullable = json_is_true(json_object_get(s, "nullable"));
  int v[8];
  size_t n = 0;
  if (json_is_string(type)) {
    if ((v[n++] = gen_type(c, s, json_string_value(type), depth)) == -1)
      return -1;
  } else if (json_is_array(type)) {
    size_t i;
    json_t *x;
    if (json_array_size(type) > 7)
      return bad(c, "'type' lists more than %s types", "7"), -1;
    json_array_foreach(type, i, x) {
      if (!json_is_string(x))
        return bad(c, "'type' must be a string or a list of strings%s", ""), -1;
      if ((v[n++] = gen_type(c, s, json_string_value(x), depth)) == -1)
        return -1;
    }
  } else if (type) {
    return bad(c, "'type' must be a string or a list of strings%s", ""), -1;
  } else if (json_object_get(s, "properties")) {
    if ((v[n++] = gen_object(c, s, depth)) == -1)
      return -1;
  } else if (json_object_get(s, "items")) {
    if ((v[n++] = gen_array(c, s, depth)) == -1)
      return -1;
  } else {
    v[n++] = -2; /* any value */
  }
  if (nullable)
    v[n++] = -7;
  return alternatives(c, v, n);
}

/* The rules of schemas[0..n) in one numbering, appended to out; names[i]
 * gets the rule that starts schemas[i]. closed: an object that lists
 * properties takes no others unless additionalProperties says so. */
static sl_status rules_of(json_t *const *schemas, int n, bool closed,
                          char (*names)[24], sl_sbuf *out, char *err,
                          size_t errcap) {
  conv c = {.err = err, .errcap = errcap, .closed = closed};
  sl_sbuf rules = {0};
  c.out = &rules;
  for (int i = 0; i < n && !c.failed; i++) {
    c.root = schemas[i];
    for (int k = 0; k < c.n_refs; k++) /* a $ref is the schema's own */
      sl_free(c.refs[k]);
    c.n_refs = 0;
    int v = gen(&c, schemas[i], 0);
    if (v == -1) {
      c.failed = true;
      break;
    }
    char buf[24];
    snprintf(names[i], 24, "%s", name_of(v, buf, sizeof buf));
  }
  for (int k = 0; k < c.n_refs; k++)
    sl_free(c.refs[k]);
  if (c.failed) {
    sl__sbuf_free(&rules);
    return SL_ERR_FORMAT;
  }
  sl__sbuf_add(out, rules.p, rules.len);
  bool oom = rules.oom || out->oom;
  sl__sbuf_free(&rules);
  if (oom) {
    snprintf(err, errcap, "out of memory");
    return SL_ERR_NOMEM;
  }
  return SL_OK;
}

sl_status sl__srv_schema_gbnf(json_t *schema, sl_sbuf *out, char *err,
                              size_t errcap) {
  char name[1][24];
  sl_sbuf rules = {0};
  sl_status st = rules_of(&schema, 1, false, name, &rules, err, errcap);
  if (st == SL_OK) {
    sl__sbuf_addf(out, "root ::= %s\n", name[0]);
    sl__sbuf_add(out, rules.p, rules.len);
    sl__sbuf_adds(out, BASE);
    if (out->oom) {
      snprintf(err, errcap, "out of memory");
      st = SL_ERR_NOMEM;
    }
  }
  sl__sbuf_free(&rules);
  return st;
}

sl_status sl__srv_schema_rules(json_t *const *schemas, int n, char (*names)[24],
                               sl_sbuf *out, char *err, size_t errcap) {
  return rules_of(schemas, n, true, names, out, err, errcap);
}

void sl__srv_json_base_gbnf(sl_sbuf *out) {
  sl__sbuf_adds(out, BASE);
}

void sl__srv_json_object_gbnf(sl_sbuf *out) {
  sl__sbuf_adds(out, "root ::= json-object\n");
  sl__sbuf_adds(out, BASE);
}
