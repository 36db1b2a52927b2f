/* `sluice run` and `sluice tokenize`. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "sluice/engine.h"
#include "sluice/flags.h"
#include "sluice/gguf.h"
#include "sluice/jinja.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/sampler.h"
#include "sluice/spec.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

/* What `sluice run`'s command line says. */
typedef struct run_opts {
  const char *model, *prompt;
  bool chat;
  long n_predict, ctx, threads;
  sl_sampler_params sp;
  sl_engine_device dev;
  int spec; /* 0 off, 1 ngram, 2 draft */
  const char *draft_model;
  long draft_max, draft_min, draft_ngram;
} run_opts;
_Static_assert(sizeof(sl_engine_device) == sizeof(int), "an SL_FLAG_ENUM");

#define AT(f) SL_FLAG_AT(run_opts, f)
static const sl_flag run_flags[] = {
    {SL_FLAG_STR, "-m, --model", "FILE", AT(model), .help = "the GGUF file",
     .def = "the default model"},
    {SL_FLAG_STR, "-p, --prompt", "TEXT", AT(prompt), .help = "the prompt",
     .def = "read from stdin"},
    {SL_FLAG_SWITCH, "--chat", NULL, AT(chat),
     .help = "wrap the prompt as one user message in the model's chat "
             "template"},
    {SL_FLAG_LONG, "-n", "N", AT(n_predict), 0, 1 << 20,
     .help = "tokens to generate"},
    {SL_FLAG_FLOAT, "--temp", "T", AT(sp.temperature), 0, 100,
     .help = "sampling temperature (0: greedy)"},
    {SL_FLAG_INT, "--top-k", "K", AT(sp.top_k), 0, 1 << 24,
     .help = "keep the K most likely tokens (0: off)"},
    {SL_FLAG_FLOAT, "--top-p", "P", AT(sp.top_p), 0, 1,
     .help = "keep the most likely tokens up to P of the mass (1: off)"},
    {SL_FLAG_FLOAT, "--min-p", "P", AT(sp.min_p), 0, 1,
     .help = "drop tokens below P times the best's probability (0: off)"},
    {SL_FLAG_U64, "--seed", "S", AT(sp.seed), 0, 9.3e18,
     .help = "the sampler's seed"},
    {SL_FLAG_FLOAT, "--repeat-penalty", "R", AT(sp.repeat_penalty), 0.01, 100,
     .help = "llama.cpp's repeat penalty (1: off)"},
    {SL_FLAG_LONG, "-c", "CTX", AT(ctx), 16, 1 << 20,
     .help = "the context, in tokens"},
    {SL_FLAG_LONG, "-t", "THREADS", AT(threads), 1, 1024,
     .help = "compute threads", .def = "all CPUs"},
    {SL_FLAG_ENUM, "--device", "auto|cpu|cuda", AT(dev),
     .choices = "auto|cpu|cuda", .help = "where the model runs"},
    {SL_FLAG_ENUM, "--speculative", "off|ngram|draft", AT(spec),
     .choices = "off|ngram|draft",
     .help = "speculative decoding: prompt-lookup drafts (ngram) or a draft "
             "model's (draft), verified in one pass (greedy only; the same "
             "output as without)"},
    {SL_FLAG_STR, "--draft-model", "FILE", AT(draft_model),
     .help = "the draft model: a smaller GGUF model with the same vocabulary "
             "(implies --speculative draft)"},
    {SL_FLAG_LONG, "--draft-max", "N", AT(draft_max), 1, 64,
     .help = "tokens drafted at most per pass"},
    {SL_FLAG_LONG, "--draft-min", "N", AT(draft_min), 1, 64,
     .help = "draft nothing when fewer would be drafted"},
    {SL_FLAG_LONG, "--draft-ngram", "N", AT(draft_ngram), 1, 64,
     .help = "the longest suffix prompt lookup matches (down to 2 tokens)"},
};
#undef AT

static const char run_head[] =
    "usage: sluice run [options]\n"
    "  generates from a prompt with one model, no server: the prompt\n"
    "  (-p, else stdin), wrapped in the chat template with --chat.\n";

static char *read_all(FILE *f, size_t *len) {
  size_t cap = 4096, n = 0;
  char *buf = sl_malloc(cap);
  if (!buf)
    return NULL;
  size_t r;
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (cap - n - 1 == 0) {
      char *nb = sl_realloc(buf, cap * 2);
      if (!nb) {
        sl_free(buf);
        return NULL;
      }
      buf = nb;
      cap *= 2;
    }
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* Renders the chat template of the model for one user message. Returns a
 * string the caller frees with sl_free, or NULL with a message in err. */
static char *render_chat(const sl_model_t *m, const sl_tokenizer_t *tok,
                         const char *user, char *err, size_t errcap) {
  sl_str tmpl;
  if (!sl_gguf_get_str(sl_model_gguf(m), "tokenizer.chat_template", &tmpl)) {
    snprintf(err, errcap, "the model has no tokenizer.chat_template");
    return NULL;
  }
  char *src = sl_malloc(tmpl.len + 1);
  sl_jv *msgs = sl_jv_list(), *msg = sl_jv_dict();
  char *out = NULL;
  if (!src || !msgs || !msg)
    goto done;
  memcpy(src, tmpl.ptr, tmpl.len);
  src[tmpl.len] = 0;
  sl_jv_dict_set(msg, "role", sl_jv_string("user"));
  sl_jv_dict_set(msg, "content", sl_jv_string(user));
  sl_jv_list_append(msgs, msg);
  msg = NULL;
  char bos[256] = "", eos[256] = "";
  size_t len;
  int32_t b = sl_tokenizer_bos(tok), e = sl_tokenizer_eos(tok);
  const char *p;
  if (b >= 0 && (p = sl_tokenizer_token_text(tok, b, &len)))
    snprintf(bos, sizeof bos, "%.*s", (int)len, p);
  if (e >= 0 && (p = sl_tokenizer_token_text(tok, e, &len)))
    snprintf(eos, sizeof eos, "%.*s", (int)len, p);
  size_t out_len;
  if (sl_chat_template_render(src, msgs, true, bos, eos, NULL, &out, &out_len,
                              err, errcap) != SL_OK)
    out = NULL;
done:
  sl_jv_free(msg);
  sl_jv_free(msgs);
  sl_free(src);
  return out;
}

/* The prompt as token ids (in the model's chat template with --chat); NULL
 * with a message printed. */
static int32_t *prompt_ids(const run_opts *o, const sl_model_t *m,
                           const sl_tokenizer_t *tok, const char *prompt,
                           size_t *n_ids) {
  char err[512] = "";
  char *text = NULL;
  int32_t *ids = NULL;
  const char *input = prompt;
  if (o->chat) {
    if (!(text = render_chat(m, tok, prompt, err, sizeof err))) {
      fprintf(stderr, "sluice run: chat template: %s\n", err);
      return NULL;
    }
    input = text;
  }
  if (sl_tokenizer_encode(tok, input, strlen(input), sl_tokenizer_add_bos(tok),
                          true, &ids, n_ids) != SL_OK) {
    fprintf(stderr, "sluice run: cannot tokenize the prompt\n");
    ids = NULL;
  } else if (*n_ids == 0) {
    fprintf(stderr, "sluice run: the prompt is empty\n");
    sl_free(ids);
    ids = NULL;
  } else if ((long)*n_ids + o->n_predict > o->ctx) {
    fprintf(stderr,
            "sluice run: prompt (%zu tokens) + %ld to generate exceeds the "
            "context of %ld (-c)\n",
            *n_ids, o->n_predict, o->ctx);
    sl_free(ids);
    ids = NULL;
  }
  sl_free(text);
  return ids;
}

typedef struct spec_out {
  const sl_tokenizer_t *tok;
  long printed;
} spec_out;

/* Prints a speculative pass's token; false at the end of generation. */
static bool spec_emit(void *ud, int32_t t, const float *logits) {
  (void)logits;
  spec_out *so = ud;
  if (sl_tokenizer_is_eog(so->tok, t))
    return false;
  char piece[256];
  size_t plen;
  if (sl_tokenizer_token_to_piece(so->tok, t, false, piece, sizeof piece,
                                  &plen) == SL_OK) {
    fwrite(piece, 1, plen, stdout);
    fflush(stdout);
  }
  so->printed++;
  return true;
}

static void draft_close(sl_draft_side *ds) {
  sl_drafter_free(ds->drafter);  /* its sequence's context went with it */
  sl_stream_destroy(ds->stream); /* drained */
  sl_model_free(ds->model);
}

/* Greedy generation with drafts (prompt lookup or a draft model) after the
 * prefill; the tokens generated, or -1 with a message printed. */
static long generate_spec(const run_opts *o, sl_ctx_t *c,
                          const sl_tokenizer_t *tok, const int32_t *ids,
                          size_t n_ids, const float *logits, int64_t n_vocab,
                          sl_spec_stats *ss) {
  sl_draft_params dp = sl_draft_defaults();
  dp.n_max = (int)o->draft_max;
  dp.n_min = (int)o->draft_min;
  dp.ngram_max = (int)o->draft_ngram;
  dp.ngram_min = dp.ngram_max < 2 ? dp.ngram_max : 2;
  char err[512];
  if (!sl_draft_params_ok(&dp, err, sizeof err)) {
    fprintf(stderr, "sluice run: %s\n", err);
    return -1;
  }
  int32_t *hist = sl_malloc(sizeof(int32_t) * (n_ids + (size_t)o->n_predict));
  sl_draft_side ds = {0};
  sl_drafter *d = NULL;
  if (o->spec == 2) {
    if (sl_draft_side_open(o->draft_model, tok, (int)o->threads, &ds, err,
                           sizeof err) != SL_OK) {
      fprintf(stderr, "sluice run: draft model '%s': %s\n", o->draft_model,
              err);
      sl_free(hist);
      return -1;
    }
    d = ds.drafter;
  } else {
    d = sl_drafter_ngram_create(&dp);
  }
  if (!hist || !d) {
    sl_free(hist);
    if (o->spec == 2)
      draft_close(&ds);
    else
      sl_drafter_free(d);
    fprintf(stderr, "sluice run: out of memory\n");
    return -1;
  }
  memcpy(hist, ids, sizeof(int32_t) * n_ids);
  spec_out so = {tok, 0};
  sl_status st = sl_spec_generate_greedy(c, (int)o->ctx, hist, (int)n_ids,
                                         logits, n_vocab, (int)o->n_predict, d,
                                         dp.n_max, spec_emit, &so, ss);
  sl_free(hist);
  if (o->spec == 2)
    draft_close(&ds);
  else
    sl_drafter_free(d);
  if (st != SL_OK) {
    fprintf(stderr, "\nsluice run: decode failed: %s\n", sl_status_str(st));
    return -1;
  }
  return so.printed;
}

/* Prefills ids, then samples and prints up to -n tokens with their
 * speeds; 0, or 1 with a message printed. */
static int generate(const run_opts *o, sl_ctx_t *c, const sl_tokenizer_t *tok,
                    sl_sampler_t *smp, const int32_t *ids, size_t n_ids,
                    float *logits, int64_t n_vocab) {
  sl_status st;
  for (size_t i = 0; i < n_ids; i++)
    sl_sampler_accept(smp, ids[i]);
  uint64_t t0 = sl_now_ns();
  if ((st = sl_ctx_eval(c, ids, (int)n_ids, logits, false)) != SL_OK) {
    fprintf(stderr, "sluice run: prefill failed: %s\n", sl_status_str(st));
    return 1;
  }
  uint64_t t1 = sl_now_ns();
  long generated = 0;
  sl_spec_stats ss = {0};
  if (o->spec) {
    generated = generate_spec(o, c, tok, ids, n_ids, logits, n_vocab, &ss);
    if (generated < 0)
      return 1;
  }
  for (; !o->spec && generated < o->n_predict; generated++) {
    int32_t next = sl_sampler_sample(smp, logits);
    if (sl_tokenizer_is_eog(tok, next))
      break;
    sl_sampler_accept(smp, next);
    char piece[256];
    size_t plen;
    if (sl_tokenizer_token_to_piece(tok, next, false, piece, sizeof piece,
                                    &plen) == SL_OK) {
      fwrite(piece, 1, plen, stdout);
      fflush(stdout);
    }
    if (generated + 1 == o->n_predict) { /* printed: counted, not fed */
      generated++;
      break;
    }
    if ((st = sl_ctx_eval(c, &next, 1, logits, false)) != SL_OK) {
      fprintf(stderr, "\nsluice run: decode failed: %s\n", sl_status_str(st));
      return 1;
    }
  }
  uint64_t t2 = sl_now_ns();
  fputc('\n', stdout);
  fprintf(stderr,
          "sluice run: prompt %zu tokens in %.1f ms (%.1f tok/s); generated "
          "%ld tokens in %.1f ms (%.1f tok/s)\n",
          n_ids, sl_ns_to_ms(t1 - t0), n_ids / (sl_ns_to_ms(t1 - t0) / 1e3),
          generated, sl_ns_to_ms(t2 - t1),
          generated ? generated / (sl_ns_to_ms(t2 - t1) / 1e3) : 0.0);
  if (o->spec)
    fprintf(stderr,
            "sluice run: speculative: %lld passes, %lld tokens drafted, %lld "
            "accepted (%.0f%%)\n",
            (long long)ss.passes, (long long)ss.drafted, (long long)ss.accepted,
            ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted
                       : 0.0);
  return 0;
}

/* Loads the model and its tokenizer, makes the context and the sampler,
 * generates; 0, or 1 with a message printed. */
static int run_model(const run_opts *o, const char *prompt) {
  int rc = 1;
  char err[512] = "";
  sl_status st;
  sl_model_t *m = sl_model_load(o->model, &st, err, sizeof err);
  sl_tokenizer_t *tok = NULL;
  sl_ctx_t *c = NULL;
  sl_sampler_t *smp = NULL;
  int32_t *ids = NULL;
  float *logits = NULL;
  size_t n_ids;
  if (!m) {
    fprintf(stderr, "sluice run: cannot load '%s': %s\n", o->model, err);
    goto out;
  }
  sl_device_t *dev = sl_engine_resolve_device(o->dev);
  if (sl_device_kind_of(dev) == SL_DEVICE_CPU)
    sl_model_prefault(m, true);
  if (sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err) != SL_OK) {
    fprintf(stderr, "sluice run: tokenizer: %s\n", err);
    goto out;
  }
  if (!(ids = prompt_ids(o, m, tok, prompt, &n_ids)))
    goto out;
  sl_stream_t *stream = sl_thread_stream(dev); /* this thread is the engine */
  char cerr[320];
  if ((st = sl_ctx_create2(m, stream, (int)o->ctx, (int)o->threads, &c, cerr,
                           sizeof cerr)) != SL_OK) {
    fprintf(stderr, "sluice run: cannot make a context on %s: %s\n",
            sl_device_name(dev), cerr[0] ? cerr : sl_status_str(st));
    goto out;
  }
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  logits = sl_malloc((size_t)hp->n_vocab * sizeof *logits);
  smp = sl_sampler_create(&o->sp, (int)hp->n_vocab);
  if (!logits || !smp)
    fprintf(stderr, "sluice run: out of memory\n");
  else if (o->spec && !sl_sampler_is_argmax(smp))
    fprintf(stderr, "sluice run: --speculative needs greedy decoding here "
                    "for now (--temp 0, no repeat penalty; the server "
                    "speculates for sampled requests too)\n");
  else
    rc = generate(o, c, tok, smp, ids, n_ids, logits, hp->n_vocab);
out:
  sl_free(logits);
  sl_sampler_free(smp);
  sl_ctx_free(c);
  if (c || rc == 0)
    sl_sync_and_clear_cache(sl_thread_stream(sl_cpu_device()));
  sl_free(ids);
  sl_tokenizer_free(tok);
  sl_model_free(m);
  return rc;
}

int sl_cli_run_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  run_opts o = {.n_predict = 128,
                .ctx = 2048,
                .sp = sl_sampler_defaults(),
                .draft_max = 8,
                .draft_min = 1,
                .draft_ngram = 4};
  bool help;
  int rc = sl_flags_parse("run", SL_FLAGS(run_flags), &o, argc, argv, run_head,
                          NULL, &help);
  if (rc || help)
    return rc;
  if (!o.model)
    o.model = sl_model_default_path(defbuf, sizeof defbuf);
  if (o.draft_model && o.spec == 0)
    o.spec = 2; /* --draft-model alone: draft */
  if ((o.spec == 2) != (o.draft_model != NULL)) {
    fprintf(stderr, "sluice run: %s\n",
            o.draft_model
                ? "--draft-model goes with --speculative draft, not ngram"
                : "--speculative draft needs --draft-model FILE");
    return 2;
  }
  char *owned_prompt = NULL;
  const char *prompt = o.prompt;
  if (!prompt) {
    size_t len;
    if (!(owned_prompt = read_all(stdin, &len))) {
      fprintf(stderr, "sluice run: cannot read the prompt from stdin\n");
      return 1;
    }
    prompt = owned_prompt;
  }
  rc = run_model(&o, prompt);
  sl_free(owned_prompt);
  sl_clear_thread_streams();
  return rc;
}

/* What `sluice tokenize`'s command line says. */
typedef struct tok_opts {
  const char *model;
  bool decode, no_bos;
} tok_opts;

#define AT(f) SL_FLAG_AT(tok_opts, f)
static const sl_flag tok_flags[] = {
    {SL_FLAG_STR, "-m, --model", "FILE", AT(model), .help = "the GGUF file",
     .def = "the default model"},
    {SL_FLAG_SWITCH, "--decode", NULL, AT(decode),
     .help = "token ids on stdin -> their text"},
    {SL_FLAG_SWITCH, "--no-bos", NULL, AT(no_bos),
     .help = "no BOS token first, even where the model adds one"},
};
#undef AT

static const char tok_head[] =
    "usage: sluice tokenize [options] < input\n"
    "  text on stdin -> token ids; with --decode, token ids -> text\n";

/* Text in[0..len) -> token ids on stdout; 0, or 1 with a message. */
static int encode_text(const sl_tokenizer_t *tok, const char *in, size_t len,
                       bool bos) {
  int32_t *ids;
  size_t n;
  if (sl_tokenizer_encode(tok, in, len, bos, true, &ids, &n) != SL_OK) {
    fprintf(stderr, "sluice tokenize: encoding failed\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    printf(i ? " %d" : "%d", ids[i]);
  printf("\n");
  sl_free(ids);
  return 0;
}

/* Token ids in the text at p -> their text on stdout; 0, or 1 with a
 * message. */
static int decode_ids(const sl_tokenizer_t *tok, char *p) {
  size_t cap = 64, n = 0;
  int32_t *ids = sl_malloc(cap * sizeof *ids);
  char *end;
  while (ids) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
      p++;
    if (!*p)
      break;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 ||
        (size_t)v >= sl_tokenizer_vocab_size(tok)) {
      fprintf(stderr, "sluice tokenize: bad token id near '%.16s'\n", p);
      sl_free(ids);
      return 1;
    }
    if (n == cap) {
      int32_t *ni = sl_realloc(ids, 2 * cap * sizeof *ids);
      if (!ni)
        break;
      ids = ni;
      cap *= 2;
    }
    ids[n++] = (int32_t)v;
    p = end;
  }
  char *text;
  size_t tl;
  if (!ids ||
      sl_tokenizer_decode(tok, ids, n, false, true, &text, &tl) != SL_OK) {
    fprintf(stderr, "sluice tokenize: decoding failed\n");
    sl_free(ids);
    return 1;
  }
  fwrite(text, 1, tl, stdout);
  sl_free(text);
  sl_free(ids);
  return 0;
}

int sl_cli_tokenize_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  tok_opts o = {0};
  bool help;
  int rc = sl_flags_parse("tokenize", SL_FLAGS(tok_flags), &o, argc, argv,
                          tok_head, NULL, &help);
  if (rc || help)
    return rc;
  const char *model =
      o.model ? o.model : sl_model_default_path(defbuf, sizeof defbuf);
  char err[512] = "";
  sl_status st;
  sl_gguf_t *g = sl_gguf_open(model, &st, err, sizeof err);
  if (!g) {
    fprintf(stderr, "sluice tokenize: cannot open '%s': %s\n", model, err);
    return 1;
  }
  rc = 1;
  sl_tokenizer_t *tok = NULL;
  size_t len;
  char *in = read_all(stdin, &len);
  if (!in || sl_tokenizer_load(g, &tok, err, sizeof err) != SL_OK)
    fprintf(stderr, "sluice tokenize: %s\n", in ? err : "cannot read stdin");
  else if (!o.decode)
    rc = encode_text(tok, in, len, !o.no_bos && sl_tokenizer_add_bos(tok));
  else
    rc = decode_ids(tok, in);
  sl_tokenizer_free(tok);
  sl_free(in);
  sl_gguf_close(g);
  return rc;
}
