/* Command-line flags from one table (sluice/flags.h). */
#include "sluice/flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sluice/util.h"

bool sl_parse_bytes(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v >= 0))
    return false;
  double mul = 1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1024.0;
    end++;
    break;
  case 'm':
  case 'M':
    mul = 1024.0 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    mul = 1024.0 * 1024 * 1024;
    end++;
    break;
  case 't':
  case 'T':
    mul = 1024.0 * 1024 * 1024 * 1024;
    end++;
    break;
  default:
    break;
  }
  if (*end == 'i' || *end == 'B')
    end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
  if (*end || v * mul > 1.8e19)
    return false;
  *out = (uint64_t)(v * mul);
  return true;
}

/* Whether `arg` is one of the flag's spellings: the whole of it, or (for a
 * flag with a value) followed by '=' (*inline_v then points past it). */
static bool spelled(const sl_flag *f, const char *arg, const char **inline_v) {
  const char *p = f->names;
  while (p && *p) {
    size_t n = strcspn(p, ",");
    if (!strncmp(arg, p, n)) {
      if (!arg[n])
        return true;
      if (arg[n] == '=' && f->kind != SL_FLAG_SWITCH) {
        *inline_v = arg + n + 1;
        return true;
      }
    }
    p += n;
    while (*p == ',' || *p == ' ')
      p++;
  }
  return false;
}

/* "1073741824" -> "1G": the largest unit that divides it. */
static void bytes_text(uint64_t v, char *b, size_t cap) {
  static const char units[] = "KMGT";
  int u = -1;
  while (u < 3 && v && v % 1024 == 0) {
    v /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(b, cap, "%llu", (unsigned long long)v);
  else
    snprintf(b, cap, "%llu%c", (unsigned long long)v, units[u]);
}

/* A number for the help: integers without a fraction. */
static void num_text(double v, char *b, size_t cap) {
  if (v == floor(v) && fabs(v) < 1e15)
    snprintf(b, cap, "%.0f", v);
  else
    snprintf(b, cap, "%g", v);
}

/* What a good value of f is, for the message of a bad one. */
static void range_text(const sl_flag *f, char *b, size_t cap) {
  char lo[32], hi[32];
  switch (f->kind) {
  case SL_FLAG_INT:
  case SL_FLAG_UINT:
  case SL_FLAG_LONG:
  case SL_FLAG_U64:
  case SL_FLAG_FLOAT:
  case SL_FLAG_DOUBLE:
    num_text(f->lo, lo, sizeof lo);
    num_text(f->hi, hi, sizeof hi);
    snprintf(b, cap, "%s from %s to %s",
             f->kind == SL_FLAG_FLOAT || f->kind == SL_FLAG_DOUBLE
                 ? "a number"
                 : "an integer",
             lo, hi);
    break;
  case SL_FLAG_BYTES:
    bytes_text((uint64_t)f->lo, lo, sizeof lo);
    bytes_text((uint64_t)f->hi, hi, sizeof hi);
    if (f->hi > 0)
      snprintf(b, cap,
               "a size from %s to %s bytes (K, M, G, T: powers of 1024)", lo,
               hi);
    else
      snprintf(b, cap,
               "a size of at least %s bytes (K, M, G, T: powers of "
               "1024)",
               lo);
    break;
  case SL_FLAG_CHOICE:
  case SL_FLAG_ENUM:
    snprintf(b, cap, "one of %s", f->choices);
    break;
  default:
    snprintf(b, cap, "%s", f->range ? f->range : "see --help");
    break;
  }
}

/* The index of v among choices ("a|b|c"), or -1. */
static int choice_index(const char *choices, const char *v) {
  size_t vl = strlen(v);
  int i = 0;
  for (const char *p = choices; *p; i++) {
    size_t n = strcspn(p, "|");
    if (n == vl && !strncmp(p, v, n))
      return i;
    p += n;
    if (*p == '|')
      p++;
  }
  return -1;
}

/* The i-th of choices into b ("?" when there is none). */
static void choice_text(const char *choices, int i, char *b, size_t cap) {
  const char *p = choices;
  for (; i > 0 && *p; i--) {
    p += strcspn(p, "|");
    if (*p == '|')
      p++;
  }
  size_t n = strcspn(p, "|");
  snprintf(b, cap, "%.*s", (int)n, i == 0 && n ? p : "?");
}

/* Stores v in f's destination; false when v is not a good value. */
static bool store(const sl_flag *f, void *opts, const char *v) {
  void *dst = (char *)opts + f->at;
  long lv;
  double dv;
  char *end;
  uint64_t bv;
  switch (f->kind) {
  case SL_FLAG_STR:
    *(const char **)dst = v;
    return true;
  case SL_FLAG_INT:
  case SL_FLAG_UINT:
  case SL_FLAG_LONG:
    if (!sl_parse_long(v, (long)f->lo, (long)f->hi, &lv))
      return false;
    if (f->kind == SL_FLAG_INT)
      *(int *)dst = (int)lv;
    else if (f->kind == SL_FLAG_UINT)
      *(unsigned *)dst = (unsigned)lv;
    else
      *(long *)dst = lv;
    return true;
  case SL_FLAG_U64:
    if (!sl_parse_long(v, (long)f->lo, f->hi >= 9.2e18 ? LONG_MAX : (long)f->hi,
                       &lv))
      return false;
    *(uint64_t *)dst = (uint64_t)lv;
    return true;
  case SL_FLAG_FLOAT:
  case SL_FLAG_DOUBLE:
    errno = 0;
    dv = strtod(v, &end);
    if (errno || end == v || *end || !(dv >= f->lo && dv <= f->hi))
      return false;
    if (f->kind == SL_FLAG_FLOAT)
      *(float *)dst = (float)dv;
    else
      *(double *)dst = dv;
    return true;
  case SL_FLAG_BYTES:
    if (!sl_parse_bytes(v, &bv) || (double)bv < f->lo ||
        (f->hi > 0 && (double)bv > f->hi))
      return false;
    *(uint64_t *)dst = bv;
    return true;
  case SL_FLAG_CHOICE:
    if (choice_index(f->choices, v) < 0)
      return false;
    *(const char **)dst = v;
    return true;
  case SL_FLAG_ENUM:
    if ((lv = choice_index(f->choices, v)) < 0)
      return false;
    *(int *)dst = (int)lv;
    return true;
  case SL_FLAG_FN:
    return f->fn(dst, v);
  default:
    return false;
  }
}

/* The default of f as the help shows it. */
static void value_text(const sl_flag *f, const void *opts, char *b,
                       size_t cap) {
  const void *dst = (const char *)opts + f->at;
  const char *s;
  switch (f->kind) {
  case SL_FLAG_SWITCH:
    snprintf(b, cap, "%s", *(const bool *)dst ? "on" : "off");
    break;
  case SL_FLAG_STR:
  case SL_FLAG_CHOICE:
    s = *(const char *const *)dst;
    snprintf(b, cap, "%s", s ? s : "none");
    break;
  case SL_FLAG_INT:
    snprintf(b, cap, "%d", *(const int *)dst);
    break;
  case SL_FLAG_ENUM:
    choice_text(f->choices, *(const int *)dst, b, cap);
    break;
  case SL_FLAG_UINT:
    snprintf(b, cap, "%u", *(const unsigned *)dst);
    break;
  case SL_FLAG_LONG:
    snprintf(b, cap, "%ld", *(const long *)dst);
    break;
  case SL_FLAG_U64:
    snprintf(b, cap, "%llu", (unsigned long long)*(const uint64_t *)dst);
    break;
  case SL_FLAG_FLOAT:
    snprintf(b, cap, "%g", (double)*(const float *)dst);
    break;
  case SL_FLAG_DOUBLE:
    snprintf(b, cap, "%g", *(const double *)dst);
    break;
  case SL_FLAG_BYTES:
    bytes_text(*(const uint64_t *)dst, b, cap);
    break;
  default:
    snprintf(b, cap, "-");
    break;
  }
}

static void default_text(const sl_flag *f, const void *opts, char *b,
                         size_t cap) {
  char v[96];
  const char *at = f->def ? strstr(f->def, "%s") : NULL;
  if (f->def && !at) {
    snprintf(b, cap, "%s", f->def);
    return;
  }
  value_text(f, opts, v, sizeof v);
  if (!f->def)
    snprintf(b, cap, "%s", v);
  else
    snprintf(b, cap, "%.*s%s%s", (int)(at - f->def), f->def, v, at + 2);
}

void sl_flags_usage(FILE *out, const sl_flag *flags, int n, const void *opts,
                    const char *head, const char *tail) {
  if (head)
    fputs(head, out);
  for (int i = 0; i < n; i++) {
    const sl_flag *f = &flags[i];
    if (f->kind == SL_FLAG_GROUP) {
      fprintf(out, "%s\n", f->names);
      continue;
    }
    char name[96], def[160];
    snprintf(name, sizeof name, "%s%s%s", f->names, f->value ? " " : "",
             f->value ? f->value : "");
    default_text(f, opts, def, sizeof def);
    fprintf(out, "  %-30s %s (default: %s)\n", name, f->help, def);
  }
  fprintf(out, "  %-30s %s (default: %s)\n", "-h, --help", "this text", "-");
  if (tail)
    fputs(tail, out);
}

int sl_flags_parse(const char *cmd, const sl_flag *flags, int n, void *opts,
                   int argc, char **argv, const char *head, const char *tail,
                   bool *help) {
  *help = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      sl_flags_usage(stdout, flags, n, opts, head, tail);
      *help = true;
      return 0;
    }
    const sl_flag *f = NULL;
    const char *v = NULL;
    for (int k = 0; k < n && !f; k++)
      if (flags[k].kind != SL_FLAG_GROUP && spelled(&flags[k], a, &v))
        f = &flags[k];
    if (!f) {
      fprintf(stderr, "sluice %s: unknown option '%s' (sluice %s --help)\n",
              cmd, a, cmd);
      return 2;
    }
    if (f->kind == SL_FLAG_SWITCH) {
      *(bool *)((char *)opts + f->at) = true;
    } else {
      if (!v) {
        if (i + 1 >= argc) {
          fprintf(stderr, "sluice %s: %s needs a value\n", cmd, a);
          return 2;
        }
        v = argv[++i];
      }
      if (!store(f, opts, v)) {
        char range[160];
        range_text(f, range, sizeof range);
        fprintf(stderr, "sluice %s: bad value '%s' for %.*s: %s\n", cmd, v,
                (int)strcspn(a, "="), a, range);
        return 2;
      }
    }
    if (f->seen)
      *(bool *)((char *)opts + f->seen - 1) = true;
  }
  return 0;
}
