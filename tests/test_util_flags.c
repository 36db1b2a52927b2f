/* test_util_flags: command-line flags from one table (sluice/flags.h):
 * every kind parses what is in range and refuses what is not, with a
 * message naming the flag, the value and the range and the exit code 2;
 * --name=value; an unknown flag and a missing value; repeated flags
 * through a function; the "given" field; and --help listing every flag
 * with its default, read from the options before the parse. */
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#include "sluice/flags.h"

typedef struct opts {
  int i;
  unsigned u;
  long l;
  uint64_t seed, bytes;
  float f;
  double d;
  const char *s, *choice;
  int e;
  bool sw, i_seen;
  int n_list;
  const char *list[4];
} opts;

static bool add(void *dst, const char *v) {
  opts *o = (opts *)((char *)dst - offsetof(opts, n_list));
  if (o->n_list == 4 || !v[0])
    return false;
  o->list[o->n_list++] = v;
  return true;
}

#define AT(f) SL_FLAG_AT(opts, f)
static const sl_flag flags[] = {
    {.kind = SL_FLAG_GROUP, .names = "numbers:"},
    {SL_FLAG_INT, "-i, --int", "N", AT(i), -5, 100, .help = "an int",
     .seen = SL_FLAG_SEEN(opts, i_seen)},
    {SL_FLAG_UINT, "--uint", "N", AT(u), 1, 7, .help = "an unsigned"},
    {SL_FLAG_LONG, "--long", "N", AT(l), 0, 1e12, .help = "a long"},
    {SL_FLAG_U64, "--seed", "S", AT(seed), 0, 9.3e18, .help = "a seed"},
    {SL_FLAG_BYTES, "--bytes", "BYTES", AT(bytes), 1024, 1ull << 32,
     .help = "a size"},
    {SL_FLAG_FLOAT, "--float", "X", AT(f), 0, 1, .help = "a float"},
    {SL_FLAG_DOUBLE, "--double", "X", AT(d), 0.5, 2, .help = "a double",
     .def = "%s, or what the model says"},
    {.kind = SL_FLAG_GROUP, .names = "words:"},
    {SL_FLAG_STR, "--str", "S", AT(s), .help = "a string"},
    {SL_FLAG_CHOICE, "--choice", "C", AT(choice), .choices = "red|green",
     .help = "a choice"},
    {SL_FLAG_ENUM, "--enum", "auto|cpu|cuda", AT(e), .choices = "auto|cpu|cuda",
     .help = "an enum"},
    {SL_FLAG_SWITCH, "--switch", NULL, AT(sw), .help = "a switch"},
    {SL_FLAG_FN, "--add", "X", AT(n_list), .fn = add, .help = "repeatable",
     .def = "none", .range = "a word (at most 4)"},
};
#undef AT

static opts defaults(void) {
  opts o = {.i = 3,
            .u = 2,
            .l = 10,
            .bytes = 8 << 20,
            .f = 0.25f,
            .d = 1,
            .choice = "red",
            .e = 1};
  return o;
}

/* Parses args (NULL-terminated) into *o; the exit code, what it printed
 * to stdout and to stderr. */
static int parse(opts *o, char **out, char **err, const char *first, ...) {
  char *argv[32];
  int argc = 0;
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a && argc < 32; a = va_arg(ap, const char *))
    argv[argc++] = (char *)a;
  va_end(ap);
  FILE *fo = tmpfile(), *fe = tmpfile();
  fflush(stdout);
  fflush(stderr);
  int so = dup(1), se = dup(2);
  dup2(fileno(fo), 1);
  dup2(fileno(fe), 2);
  bool help;
  int rc = sl_flags_parse("test", SL_FLAGS(flags), o, argc, argv, "HEAD\n",
                          "TAIL\n", &help);
  fflush(stdout);
  fflush(stderr);
  dup2(so, 1);
  dup2(se, 2);
  close(so);
  close(se);
  FILE *fs[2] = {fo, fe};
  char **dst[2] = {out, err};
  for (int k = 0; k < 2; k++) {
    long n = ftell(fs[k]);
    rewind(fs[k]);
    *dst[k] = calloc(1, (size_t)n + 1);
    if (n > 0 && fread(*dst[k], 1, (size_t)n, fs[k]) != (size_t)n)
      (*dst[k])[0] = 0;
    fclose(fs[k]);
  }
  if (help)
    CHECK(rc == 0);
  return rc;
}

static void test_good_values(void) {
  opts o = defaults();
  char *out, *err;
  int rc =
      parse(&o, &out, &err, "-i", "-5", "--uint=7", "--long", "1000000000000",
            "--seed", "18446744073709551", "--bytes", "1.5M", "--float", "1",
            "--double", "0.5", "--str", "x y", "--choice", "green", "--enum",
            "cuda", "--switch", "--add", "a", "--add", "b", NULL);
  CHECK_MSG(rc == 0 && !out[0] && !err[0], "rc %d, %s", rc, err);
  CHECK(o.i == -5 && o.i_seen && o.u == 7 && o.l == 1000000000000L);
  CHECK(o.seed == 18446744073709551ull && o.bytes == 1572864);
  CHECK(o.f == 1.0f && o.d == 0.5 && !strcmp(o.s, "x y"));
  CHECK(!strcmp(o.choice, "green") && o.e == 2 && o.sw);
  CHECK(o.n_list == 2 && !strcmp(o.list[0], "a") && !strcmp(o.list[1], "b"));
  free(out);
  free(err);
  /* nothing given: the defaults stay, the "given" field too */
  o = defaults();
  CHECK(parse(&o, &out, &err, NULL) == 0 && !o.i_seen && o.i == 3);
  free(out);
  free(err);
}

static void test_bad_values(void) {
  static const struct {
    const char *flag, *value, *range;
  } bad[] = {
      {"--int", "101", "an integer from -5 to 100"},
      {"-i", "x", "an integer from -5 to 100"},
      {"--uint", "0", "an integer from 1 to 7"},
      {"--long", "1e3", "an integer from 0 to 1000000000000"},
      {"--bytes", "1000", "a size from 1K to 4G bytes"},
      {"--bytes", "5G", "a size from 1K to 4G bytes"},
      {"--bytes", "12Q", "a size from 1K to 4G bytes"},
      {"--float", "1.01", "a number from 0 to 1"},
      {"--double", "nan", "a number from 0.5 to 2"},
      {"--choice", "blue", "one of red|green"},
      {"--enum", "gpu", "one of auto|cpu|cuda"},
      {"--add", "", "a word (at most 4)"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    opts o = defaults(), before = o;
    char *out, *err;
    int rc = parse(&o, &out, &err, bad[k].flag, bad[k].value, NULL);
    char want[256];
    snprintf(want, sizeof want, "sluice test: bad value '%s' for %s: %s",
             bad[k].value, bad[k].flag, bad[k].range);
    CHECK_MSG(rc == 2 && strstr(err, want), "%s %s: rc %d, '%s'", bad[k].flag,
              bad[k].value, rc, err);
    CHECK(!memcmp(&o, &before, sizeof o)); /* nothing stored */
    free(out);
    free(err);
  }
  /* the value after '=' is named, not the whole argument */
  opts o = defaults();
  char *out, *err;
  CHECK(parse(&o, &out, &err, "--int=500", NULL) == 2 &&
        strstr(err, "bad value '500' for --int: an integer"));
  free(out);
  free(err);
  /* a fifth --add is refused */
  o = defaults();
  CHECK(parse(&o, &out, &err, "--add", "1", "--add", "2", "--add", "3", "--add",
              "4", "--add", "5", NULL) == 2 &&
        strstr(err, "bad value '5' for --add"));
  free(out);
  free(err);
}

static void test_unknown_and_missing(void) {
  opts o = defaults();
  char *out, *err;
  CHECK(parse(&o, &out, &err, "--nope", NULL) == 2 &&
        strstr(err, "unknown option '--nope'"));
  free(out);
  free(err);
  CHECK(parse(&o, &out, &err, "--str", NULL) == 2 &&
        strstr(err, "--str needs a value"));
  free(out);
  free(err);
  /* a prefix of a flag is not the flag; a switch takes no "=" */
  CHECK(parse(&o, &out, &err, "--in", "3", NULL) == 2);
  free(out);
  free(err);
  CHECK(parse(&o, &out, &err, "--int5", "3", NULL) == 2 &&
        strstr(err, "unknown option '--int5'"));
  free(out);
  free(err);
  CHECK(parse(&o, &out, &err, "--switch=1", NULL) == 2);
  free(out);
  free(err);
}

static void test_help(void) {
  opts o = defaults();
  char *out, *err;
  CHECK(parse(&o, &out, &err, "--int", "7", "--help", NULL) == 0);
  CHECK(!err[0] && !strncmp(out, "HEAD\n", 5));
  CHECK(strstr(out, "\nTAIL\n") || strstr(out, "TAIL\n"));
  CHECK(strstr(out, "numbers:\n") && strstr(out, "words:\n"));
  /* every flag, on its own line, with its default (the value before
   * --help: the 7 parsed first) */
  static const char *want[] = {
      "  -i, --int N ",
      "(default: 7)",
      "  --uint N ",
      "(default: 2)",
      "  --long N ",
      "(default: 10)",
      "  --seed S ",
      "(default: 0)",
      "  --bytes BYTES ",
      "(default: 8M)",
      "  --float X ",
      "(default: 0.25)",
      "  --double X ",
      "(default: 1, or what the model says)",
      "  --str S ",
      "(default: none)",
      "  --choice C ",
      "(default: red)",
      "  --enum auto|cpu|cuda ",
      "(default: cpu)",
      "  --switch ",
      "(default: off)",
      "  --add X ",
      "(default: none)",
      "  -h, --help ",
      "(default: -)",
  };
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k += 2) {
    const char *line = strstr(out, want[k]);
    const char *eol = line ? strchr(line, '\n') : NULL;
    const char *def = line ? strstr(line, want[k + 1]) : NULL;
    CHECK_MSG(line && def && def < eol, "%s%s", want[k], want[k + 1]);
  }
  free(out);
  free(err);
}

static void test_bytes(void) {
  static const struct {
    const char *s;
    uint64_t v;
  } ok[] = {{"0", 0},           {"512", 512},         {"1K", 1024},
            {"1k", 1024},       {"2M", 2u << 20},     {"1.5G", 3ull << 29},
            {"1T", 1ull << 40}, {"4GiB", 4ull << 30}, {"3KB", 3072}};
  for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
    uint64_t v = 1;
    CHECK_MSG(sl_parse_bytes(ok[k].s, &v) && v == ok[k].v, "%s", ok[k].s);
  }
  static const char *bad[] = {"", "x", "-1", "1X", "1Kb", "1 K", "2e30"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    uint64_t v = 7;
    CHECK_MSG(!sl_parse_bytes(bad[k], &v) && v == 7, "%s", bad[k]);
  }
}

int main(void) {
  RUN(test_good_values);
  RUN(test_bad_values);
  RUN(test_unknown_and_missing);
  RUN(test_help);
  RUN(test_bytes);
  return sl_test_finish();
}
