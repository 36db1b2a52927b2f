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
#include "sluice/gguf.h"
#include "sluice/jinja.h"
#include "sluice/memsync.h"
#include "sluice/model.h"
#include "sluice/rt.h"
#include "sluice/sampler.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

static void run_usage(void) {
  fprintf(
      stderr,
      "usage: sluice run [-m MODEL] [-p PROMPT | --chat] [-n N] [--temp T]\n"
      "                  [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
      "                  [--repeat-penalty R] [-c CTX] [-t THREADS]\n"
      "                  [--device auto|cpu|cuda]\n"
      "  without -p the prompt is read from stdin; --chat wraps it as one\n"
      "  user message in the model's chat template; --temp 0 is greedy.\n");
}

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

int sl_cli_run_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  const char *model = NULL, *prompt = NULL;
  bool chat = false;
  long n_predict = 128, ctx = 2048, threads = 0;
  sl_sampler_params sp = sl_sampler_defaults();
  sl_engine_device devsel = SL_ENGINE_DEVICE_AUTO;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long lv;
    double dv;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
      SL_CLI_NEED_VALUE("run");
      model = v;
    } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
      SL_CLI_NEED_VALUE("run");
      prompt = v;
    } else if (!strcmp(a, "--chat")) {
      chat = true;
    } else if (!strcmp(a, "-n")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_parse_long(v, 0, 1 << 20, &n_predict))
        SL_CLI_BAD_VALUE("run");
    } else if (!strcmp(a, "-c")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_parse_long(v, 16, 1 << 20, &ctx))
        SL_CLI_BAD_VALUE("run");
    } else if (!strcmp(a, "-t")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_parse_long(v, 1, 1024, &threads))
        SL_CLI_BAD_VALUE("run");
    } else if (!strcmp(a, "--device")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_engine_device_parse(v, &devsel))
        SL_CLI_BAD_VALUE("run");
    } else if (!strcmp(a, "--temp")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_cli_parse_double(v, 0, 100, &dv))
        SL_CLI_BAD_VALUE("run");
      sp.temperature = (float)dv;
    } else if (!strcmp(a, "--top-p")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_cli_parse_double(v, 0, 1, &dv))
        SL_CLI_BAD_VALUE("run");
      sp.top_p = (float)dv;
    } else if (!strcmp(a, "--min-p")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_cli_parse_double(v, 0, 1, &dv))
        SL_CLI_BAD_VALUE("run");
      sp.min_p = (float)dv;
    } else if (!strcmp(a, "--top-k")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_parse_long(v, 0, 1 << 24, &lv))
        SL_CLI_BAD_VALUE("run");
      sp.top_k = (int)lv;
    } else if (!strcmp(a, "--repeat-penalty")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_cli_parse_double(v, 0.01, 100, &dv))
        SL_CLI_BAD_VALUE("run");
      sp.repeat_penalty = (float)dv;
    } else if (!strcmp(a, "--seed")) {
      SL_CLI_NEED_VALUE("run");
      if (!sl_parse_long(v, 0, LONG_MAX, &lv))
        SL_CLI_BAD_VALUE("run");
      sp.seed = (uint64_t)lv;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      run_usage();
      return 0;
    } else {
      fprintf(stderr, "sluice run: unknown option '%s'\n", a);
      run_usage();
      return 2;
    }
  }
  if (!model)
    model = sl_model_default_path(defbuf, sizeof defbuf);

  char *owned_prompt = NULL;
  if (!prompt) {
    size_t len;
    owned_prompt = read_all(stdin, &len);
    if (!owned_prompt) {
      fprintf(stderr, "sluice run: cannot read the prompt from stdin\n");
      return 1;
    }
    prompt = owned_prompt;
  }

  int rc = 1;
  char err[512] = "";
  sl_status st;
  sl_model_t *m = sl_model_load(model, &st, err, sizeof err);
  sl_tokenizer_t *tok = NULL;
  sl_ctx_t *c = NULL;
  sl_sampler_t *smp = NULL;
  char *text = NULL;
  int32_t *ids = NULL;
  float *logits = NULL;
  if (!m) {
    fprintf(stderr, "sluice run: cannot load '%s': %s\n", model, err);
    goto out;
  }
  sl_device_t *dev = sl_engine_resolve_device(devsel);
  if (sl_device_kind_of(dev) == SL_DEVICE_CPU)
    sl_model_prefault(m, true);
  if (sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err) != SL_OK) {
    fprintf(stderr, "sluice run: tokenizer: %s\n", err);
    goto out;
  }
  const char *input = prompt;
  if (chat) {
    text = render_chat(m, tok, prompt, err, sizeof err);
    if (!text) {
      fprintf(stderr, "sluice run: chat template: %s\n", err);
      goto out;
    }
    input = text;
  }
  size_t n_ids;
  if (sl_tokenizer_encode(tok, input, strlen(input), sl_tokenizer_add_bos(tok),
                          true, &ids, &n_ids) != SL_OK) {
    fprintf(stderr, "sluice run: cannot tokenize the prompt\n");
    goto out;
  }
  if (n_ids == 0) {
    fprintf(stderr, "sluice run: the prompt is empty\n");
    goto out;
  }
  if ((long)n_ids + n_predict > ctx) {
    fprintf(stderr,
            "sluice run: prompt (%zu tokens) + %ld to generate exceeds the "
            "context of %ld (-c)\n",
            n_ids, n_predict, ctx);
    goto out;
  }
  sl_stream_t *stream = sl_thread_stream(dev); /* this thread is the engine */
  if ((st = sl_ctx_create(m, stream, (int)ctx, (int)threads, &c)) != SL_OK) {
    fprintf(stderr, "sluice run: cannot make a context: %s\n",
            sl_status_str(st));
    goto out;
  }
  const sl_model_hparams *hp = sl_model_hparams_of(m);
  logits = sl_malloc((size_t)hp->n_vocab * sizeof *logits);
  smp = sl_sampler_create(&sp, (int)hp->n_vocab);
  if (!logits || !smp) {
    fprintf(stderr, "sluice run: out of memory\n");
    goto out;
  }
  for (size_t i = 0; i < n_ids; i++)
    sl_sampler_accept(smp, ids[i]);
  uint64_t t0 = sl_now_ns();
  if ((st = sl_ctx_eval(c, ids, (int)n_ids, logits, false)) != SL_OK) {
    fprintf(stderr, "sluice run: prefill failed: %s\n", sl_status_str(st));
    goto out;
  }
  uint64_t t1 = sl_now_ns();
  long generated = 0;
  for (; generated < n_predict; generated++) {
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
    if (generated + 1 == n_predict)
      break;
    if ((st = sl_ctx_eval(c, &next, 1, logits, false)) != SL_OK) {
      fprintf(stderr, "\nsluice run: decode failed: %s\n", sl_status_str(st));
      goto out;
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
  rc = 0;
out:
  sl_free(logits);
  sl_sampler_free(smp);
  sl_ctx_free(c);
  if (c || rc == 0)
    sl_sync_and_clear_cache(sl_thread_stream(sl_cpu_device()));
  sl_free(ids);
  sl_free(text);
  sl_tokenizer_free(tok);
  sl_model_free(m);
  sl_free(owned_prompt);
  sl_clear_thread_streams();
  return rc;
}

int sl_cli_tokenize_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  const char *model = NULL;
  bool decode = false, no_bos = false;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-m") && i + 1 < argc)
      model = argv[++i];
    else if (!strcmp(argv[i], "--decode"))
      decode = true;
    else if (!strcmp(argv[i], "--no-bos"))
      no_bos = true;
    else {
      fprintf(stderr, "usage: sluice tokenize [-m MODEL] [--decode] "
                      "[--no-bos] < input\n");
      return 2;
    }
  }
  if (!model)
    model = sl_model_default_path(defbuf, sizeof defbuf);
  char err[512] = "";
  sl_status st;
  sl_gguf_t *g = sl_gguf_open(model, &st, err, sizeof err);
  if (!g) {
    fprintf(stderr, "sluice tokenize: cannot open '%s': %s\n", model, err);
    return 1;
  }
  int rc = 1;
  sl_tokenizer_t *tok = NULL;
  size_t len;
  char *in = read_all(stdin, &len);
  if (!in || sl_tokenizer_load(g, &tok, err, sizeof err) != SL_OK) {
    fprintf(stderr, "sluice tokenize: %s\n", in ? err : "cannot read stdin");
    goto out;
  }
  if (!decode) {
    int32_t *ids;
    size_t n;
    if (sl_tokenizer_encode(tok, in, len, !no_bos && sl_tokenizer_add_bos(tok),
                            true, &ids, &n) != SL_OK) {
      fprintf(stderr, "sluice tokenize: encoding failed\n");
      goto out;
    }
    for (size_t i = 0; i < n; i++)
      printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    sl_free(ids);
  } else {
    size_t cap = 64, n = 0;
    int32_t *ids = sl_malloc(cap * sizeof *ids);
    char *p = in, *end;
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
        goto out;
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
      goto out;
    }
    fwrite(text, 1, tl, stdout);
    sl_free(text);
    sl_free(ids);
  }
  rc = 0;
out:
  sl_tokenizer_free(tok);
  sl_free(in);
  sl_gguf_close(g);
  return rc;
}
