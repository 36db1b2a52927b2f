/* sluice — command-line flags from one table: each flag is one line (its
 * spellings, its value, its range, its help, where it goes), and that line
 * drives both the parse and `--help`, so the two cannot drift. A flag's
 * destination is a field of the command's options struct (`at`, its
 * offset: SL_FLAG_AT), so the table is a constant. The default shown is
 * that field's value before the parse (or `def` where a value alone says
 * too little, as "0, none"). */
#ifndef SLUICE_FLAGS_H
#define SLUICE_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum sl_flag_kind {
  SL_FLAG_GROUP = 0, /* no flag: a heading of the help ("engine:") */
  SL_FLAG_SWITCH,    /* no value: *(bool *)dst = true */
  SL_FLAG_STR,       /* *(const char **)dst = the value (argv's) */
  SL_FLAG_INT,       /* *(int *)dst, an integer in [lo, hi] */
  SL_FLAG_UINT,      /* *(unsigned *)dst, an integer in [lo, hi] */
  SL_FLAG_LONG,      /* *(long *)dst, an integer in [lo, hi] */
  SL_FLAG_U64,       /* *(uint64_t *)dst, an integer in [lo, hi] */
  SL_FLAG_FLOAT,     /* *(float *)dst, a number in [lo, hi] */
  SL_FLAG_DOUBLE,    /* *(double *)dst, a number in [lo, hi] */
  SL_FLAG_BYTES,     /* *(uint64_t *)dst: 4G, 512M, 1.5K (powers of 1024),
                        in [lo, hi] (hi 0: no upper bound) */
  SL_FLAG_CHOICE,    /* *(const char **)dst = one of `choices` ("a|b|c") */
  SL_FLAG_ENUM,      /* *(int *)dst = the index of the value in `choices`
                        (an enum field whose values are 0, 1, ...) */
  SL_FLAG_FN,        /* fn(dst, value): false for a bad value (the range
                        then says what a good one is) */
} sl_flag_kind;

typedef struct sl_flag {
  sl_flag_kind kind;
  const char *names; /* "-c, --ctx": every spelling, ", "-separated; for
                        SL_FLAG_GROUP the heading */
  const char *value; /* the value's name in the help ("N", "BYTES") */
  size_t at;         /* the destination: offset in the options struct */
  double lo, hi;
  const char *choices; /* SL_FLAG_CHOICE */
  bool (*fn)(void *dst, const char *v);
  const char *help;
  const char *def;   /* the default as shown (NULL: the field's value; a
                        "%s" in it: replaced by the field's value) */
  const char *range; /* SL_FLAG_FN: what a good value is */
  size_t seen;       /* SL_FLAG_SEEN: a bool field set when the flag is
                        given (0: none) */
} sl_flag;

/* The destination of a flag: field f of options struct type T. */
#define SL_FLAG_AT(T, f) offsetof(T, f)
/* A table's flags and their count, as sl_flags_parse and sl_flags_usage
 * take them. */
#define SL_FLAGS(t) (t), (int)(sizeof(t) / sizeof((t)[0]))
/* The bool field f of T that says whether the flag was given. */
#define SL_FLAG_SEEN(T, f) (offsetof(T, f) + 1)

/* Parses argv[0..argc) with the table flags[0..n) into the options struct
 * at `opts` (its defaults already set). -h / --help prints
 * the usage (head, then every flag, then tail) to stdout and gives 0 with
 * *help set. An unknown flag, a missing value or a bad one prints one line
 * naming the flag (and the value and its range) to stderr and gives 2.
 * Otherwise 0. cmd names the command in messages ("serve", "bench model"). */
int sl_flags_parse(const char *cmd, const sl_flag *flags, int n, void *opts,
                   int argc, char **argv, const char *head, const char *tail,
                   bool *help);

/* The usage: head, each flag with its value, help and default (read from
 * opts), tail. */
void sl_flags_usage(FILE *f, const sl_flag *flags, int n, const void *opts,
                    const char *head, const char *tail);

/* "4G", "512M", "123456", "1.5G", "2GiB" -> bytes (powers of 1024). */
bool sl_parse_bytes(const char *s, uint64_t *out);

#endif
