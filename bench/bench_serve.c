/* `sluice bench serve`: N concurrent streaming clients (N = 1, 4, 16 by
 * default) with fixed prompt and output lengths against a `sluice serve` that
 * this command starts itself, and optionally the same load, in the same run,
 * against llama-cpp-python's OpenAI server on the same GGUF
 * (scripts/peer_llamacpp_server.py). Prints one JSON object on stdout;
 * progress and errors go to stderr.
 *
 * The client speaks raw HTTP/1.1 over TCP (Content-Length request body,
 * chunked or plain response) and reads the SSE stream of
 * POST /v1/completions. Per request:
 *   TTFT = first non-empty text chunk - request sent (ns clock)
 *   TPOT = (last text chunk - first text chunk) / (completion_tokens - 1)
 * completion_tokens is usage.completion_tokens when the server sends it
 * (stream_options.include_usage), else the number of non-empty text chunks.
 * tokens_per_s of a phase = all completion tokens / wall time of the phase.
 *
 * With the peer, both servers stay up and the phases alternate (sluice N=1,
 * peer N=1, sluice N=4, ...), so that drift in the machine's load touches
 * both engines alike.
 *
 * Threads: the main thread spawns and stops the servers; each phase runs N
 * client threads that share nothing but their own result slots. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "sluice/flags.h"
#include "sluice/model.h"
#include "sluice/tokenizer.h"
#include "sluice/util.h"

#define MAX_PHASES       8
#define MAX_CLIENTS      256
#define IO_TIMEOUT_S     600 /* default --timeout */
#define HEALTH_TIMEOUT_S 60.0

/* The fixed text the prompts are cut from. Written as the opening of a long
 * story so that the model keeps going; repeated as often as needed. */
static const char STORY[] =
    "The old lighthouse keeper had kept a journal for forty years, and every "
    "evening he wrote down what the sea had done that day, which ships had "
    "passed, how the wind had turned, and what the gulls had argued about on "
    "the rocks below the lamp room. One winter a storm came that was unlike "
    "any he had recorded before: the waves climbed the cliff, the glass of "
    "the lamp rattled in its frame, and out in the dark he saw a small boat "
    "with a single lantern fighting its way toward the harbour. He put on "
    "his coat, took the brass telescope from its hook, and went down the "
    "spiral stairs to the door that faced the water. ";

/* --response-format: a JSON object; or a schema of strings (inside one the
 * mask is at its widest: nearly the whole vocabulary is allowed, and the
 * walk visits the whole trie unless the matcher's cache has the state). */
static const char RF_JSON_OBJECT[] = "{\"type\": \"json_object\"}";
static const char RF_JSON_SCHEMA[] =
    "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"story\", "
    "\"schema\": {\"type\": \"object\", \"properties\": {\"title\": "
    "{\"type\": \"string\"}, \"story\": {\"type\": \"string\"}, "
    "\"words\": {\"type\": \"array\", \"items\": {\"type\": "
    "\"string\"}}}, \"required\": [\"title\", \"story\", \"words\"], "
    "\"additionalProperties\": false}}}";

typedef struct bench_cfg {
  const char *model;
  char model_name[256]; /* the file's name without ".gguf": the API's id */
  int threads;
  int clients[MAX_PHASES];
  int n_phases;
  int prompt_tokens; /* target */
  int max_tokens;
  int requests_per_client;
  int port; /* 0: pick a free one per server */
  int max_seqs;
  int timeout_s; /* per-socket send/receive timeout */
  bool peer;
  const char *peer_server; /* llama-server binary (--peer llama-server=PATH) */
  const char *device;      /* --device, passed to sluice serve */
  size_t story_bytes;      /* bytes of the repeated STORY after the header */
  /* --response-format: NULL (none), or the JSON of a response_format
   * that constrains every request */
  const char *json_schema;
} bench_cfg;

typedef struct req_result {
  bool ok;
  bool usage_seen;
  int chunks;            /* SSE chunks with non-empty text */
  int completion_tokens; /* usage.completion_tokens, else chunks */
  int prompt_tokens;     /* usage.prompt_tokens, or -1 */
  double ttft_ms;
  double tpot_ms; /* < 0 when fewer than two tokens came */
  char err[160];
} req_result;

typedef struct phase_stats {
  int n, requests, failed;
  long long completion_tokens;
  long long text_chunks; /* SSE chunks with non-empty text, all requests */
  double wall_s, tokens_per_s;
  double ttft_p50, ttft_p99, tpot_p50, tpot_p99;
  double mean_completion_tokens;
  int prompt_tokens; /* from usage (first request that reported it), or -1 */
  bool all_usage;    /* every ok request reported usage */
} phase_stats;

typedef struct server_proc {
  pid_t pid;
  int port;
  char log[64];
  const char *what;
} server_proc;

/* ---- small helpers ------------------------------------------------------- */

static double ms_between(uint64_t a, uint64_t b) {
  return (double)(b - a) / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Linear-interpolated percentile q (0..100) of v[0..n); sorts v. 0 if n=0. */
static double percentile(double *v, int n, double q) {
  if (n <= 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  double pos = q / 100.0 * (n - 1);
  int lo = (int)pos;
  if (lo >= n - 1)
    return v[n - 1];
  return v[lo] + (pos - lo) * (v[lo + 1] - v[lo]);
}

/* Writes s as a JSON string literal to f. */
static void json_put_str(FILE *f, const char *s) {
  sl_fput_json_str(f, s, strlen(s));
}

/* "1,4,16" -> out[], returns the count, or -1 when malformed. */
static int parse_clients(const char *s, int *out, int cap) {
  int n = 0;
  while (*s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || v < 1 || v > MAX_CLIENTS || n == cap)
      return -1;
    out[n++] = (int)v;
    if (*end == ',')
      end++;
    else if (*end)
      return -1;
    s = end;
  }
  return n > 0 ? n : -1;
}

/* ---- the prompt ---------------------------------------------------------- */

/* The prompt of request `r` of client `c`: a per-request header at the very
 * start (so that no prefix cache can serve one request from another's
 * prompt), then cfg->story_bytes bytes of the repeated story. Returns a new
 * string (sl_free), or NULL on out-of-memory. */
static char *make_prompt(const bench_cfg *cfg, int c, int r) {
  char head[64];
  int hn = snprintf(head, sizeof head, "%d-%d. ", c, r);
  size_t n = (size_t)hn + cfg->story_bytes;
  char *p = sl_malloc(n + 1);
  if (!p)
    return NULL;
  memcpy(p, head, (size_t)hn);
  size_t sl = sizeof STORY - 1;
  for (size_t i = 0; i < cfg->story_bytes; i++)
    p[hn + i] = STORY[i % sl];
  p[n] = 0;
  return p;
}

/* Sizes cfg->story_bytes so that the prompt of client 0, request 0 tokenizes
 * (with BOS, as the servers do) to about cfg->prompt_tokens tokens, with the
 * model's own tokenizer. Falls back to 4.5 bytes a token when the tokenizer
 * cannot be loaded (a message on stderr says so). Returns the token count
 * measured, or -1 after the fallback. */
static int size_prompt(bench_cfg *cfg) {
  char err[256];
  sl_status st;
  int measured = -1;
  sl_tokenizer_t *tok = NULL;
  sl_model_t *m = sl_model_load(cfg->model, &st, err, sizeof err);
  if (!m ||
      sl_tokenizer_load(sl_model_gguf(m), &tok, err, sizeof err) != SL_OK) {
    fprintf(stderr,
            "sluice bench serve: no tokenizer (%s); sizing the prompt "
            "at 4.5 bytes a token\n",
            err);
    cfg->story_bytes = (size_t)(cfg->prompt_tokens * 4.5);
    goto out_model;
  }
  /* bisect on the byte count: token counts grow monotonically enough */
  size_t lo = 1, hi = (size_t)cfg->prompt_tokens * 16 + 16;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    cfg->story_bytes = mid;
    char *p = make_prompt(cfg, 0, 0);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!p || sl_tokenizer_encode(tok, p, strlen(p), true, false, &ids, &n) !=
                  SL_OK) {
      sl_free(p);
      cfg->story_bytes = (size_t)(cfg->prompt_tokens * 4.5);
      goto out_tok;
    }
    sl_free(p);
    sl_free(ids);
    if ((int)n < cfg->prompt_tokens)
      lo = mid + 1;
    else
      hi = mid;
  }
  cfg->story_bytes = lo;
  {
    char *p = make_prompt(cfg, 0, 0);
    int32_t *ids = NULL;
    size_t n = 0;
    if (p &&
        sl_tokenizer_encode(tok, p, strlen(p), true, false, &ids, &n) == SL_OK)
      measured = (int)n;
    sl_free(ids);
    sl_free(p);
  }
out_tok:
  sl_tokenizer_free(tok);
out_model:
  sl_model_free(m);
  return measured;
}

/* ---- sockets ---------------------------------------------------------------
 */

/* A free TCP port on 127.0.0.1 (bound then released), or -1. */
static int pick_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &al) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* A connected socket to 127.0.0.1:port with timeout_s send/receive
 * timeouts, or -1 (errno set). */
static int tcp_connect(int port, int timeout_s) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct timeval tv = {.tv_sec = timeout_s};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

/* A buffered reader over a socket. */
typedef struct reader {
  int fd;
  size_t pos, len;
  bool eof, timeout;
  char buf[16384];
} reader;

/* Makes sure at least one unread byte is buffered; false at EOF or error. */
static bool rd_fill(reader *r) {
  if (r->pos < r->len)
    return true;
  if (r->eof)
    return false;
  for (;;) {
    ssize_t k = recv(r->fd, r->buf, sizeof r->buf, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      r->eof = true;
      r->timeout = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      return false;
    }
    r->pos = 0;
    r->len = (size_t)k;
    return true;
  }
}

/* Reads one CRLF- or LF-terminated line (terminator stripped) into out
 * (truncated at cap - 1). False at EOF before any byte. */
static bool rd_line(reader *r, char *out, size_t cap) {
  size_t n = 0;
  bool any = false;
  while (rd_fill(r)) {
    any = true;
    char c = r->buf[r->pos++];
    if (c == '\n') {
      if (n > 0 && out[n - 1] == '\r')
        n--;
      out[n] = 0;
      return true;
    }
    if (n + 1 < cap)
      out[n++] = c;
  }
  out[n] = 0;
  return any;
}

/* ---- SSE parsing ------------------------------------------------------------
 */

typedef struct sse_state {
  char *line; /* the partial line */
  size_t len, cap;
  bool done, error, nomem;
  uint64_t t_first, t_last;
  int chunks;
  int completion_tokens, prompt_tokens;
  bool usage_seen;
  char err[160];
} sse_state;

/* True when the JSON member "key" in s has a string value that is not "". */
static bool has_nonempty_str(const char *s, const char *key) {
  const char *p = strstr(s, key);
  if (!p)
    return false;
  p += strlen(key);
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p++ != ':')
    return false;
  while (*p == ' ' || *p == '\t')
    p++;
  return p[0] == '"' && p[1] != '"';
}

/* The integer value of the JSON member "key" in s, or -1. */
static int int_member(const char *s, const char *key) {
  const char *p = strstr(s, key);
  if (!p)
    return -1;
  p += strlen(key);
  while (*p == ' ' || *p == '\t' || *p == ':')
    p++;
  if (*p < '0' || *p > '9')
    return -1;
  return (int)strtol(p, NULL, 10);
}

/* One complete SSE line. The payloads are the servers' own compact JSON
 * chunks; this reads only the members the benchmark needs. */
static void sse_line(sse_state *s, const char *line) {
  if (strncmp(line, "data:", 5) != 0)
    return; /* blank separator, comment, event: ... */
  const char *d = line + 5;
  while (*d == ' ')
    d++;
  if (strcmp(d, "[DONE]") == 0) {
    s->done = true;
    return;
  }
  if (!strstr(d, "\"choices\"") && strstr(d, "\"error\"")) {
    s->error = true;
    snprintf(s->err, sizeof s->err, "error event: %.120s", d);
    return;
  }
  if (has_nonempty_str(d, "\"text\"")) {
    uint64_t now = sl_now_ns();
    if (s->chunks++ == 0)
      s->t_first = now;
    s->t_last = now;
  }
  int ct = int_member(d, "\"completion_tokens\"");
  if (ct >= 0) {
    s->usage_seen = true;
    s->completion_tokens = ct;
    s->prompt_tokens = int_member(d, "\"prompt_tokens\"");
  }
}

/* Feeds n decoded body bytes. */
static void sse_feed(sse_state *s, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n') {
      if (s->len > 0 && s->line[s->len - 1] == '\r')
        s->len--;
      if (s->line) {
        s->line[s->len] = 0;
        sse_line(s, s->line);
      }
      s->len = 0;
      continue;
    }
    if (s->len + 2 > s->cap) {
      size_t nc = s->cap ? s->cap * 2 : 1024;
      char *nl = sl_realloc(s->line, nc);
      if (!nl) {
        s->nomem = true;
        return;
      }
      s->line = nl;
      s->cap = nc;
    }
    s->line[s->len++] = p[i];
  }
}

/* Reads the body: chunked, Content-Length, or to EOF. Stops after [DONE].
 * Returns false on a transport error (message in s->err). */
static bool read_body(reader *r, sse_state *s, bool chunked, long clen) {
  char line[256];
  if (!chunked) {
    long left = clen;
    while (!s->done && !s->nomem && (clen < 0 || left > 0) && rd_fill(r)) {
      size_t k = r->len - r->pos;
      if (clen >= 0 && (long)k > left)
        k = (size_t)left;
      sse_feed(s, r->buf + r->pos, k);
      r->pos += k;
      left -= (long)k;
    }
    if (!s->done && r->timeout)
      snprintf(s->err, sizeof s->err, "timed out");
    return s->done || clen < 0 || left == 0;
  }
  while (!s->done && !s->nomem) {
    if (!rd_line(r, line, sizeof line))
      goto fail_eof;
    char *end;
    unsigned long sz = strtoul(line, &end, 16);
    if (end == line)
      goto fail_eof;
    if (sz == 0)
      break;
    while (sz > 0) {
      if (!rd_fill(r))
        goto fail_eof;
      size_t k = r->len - r->pos;
      if (k > sz)
        k = sz;
      sse_feed(s, r->buf + r->pos, k);
      r->pos += k;
      sz -= k;
    }
    if (!rd_line(r, line, sizeof line)) /* the CRLF after the data */
      goto fail_eof;
  }
  return true;
fail_eof:
  snprintf(s->err, sizeof s->err, "%s in the chunked body",
           r->timeout ? "timed out" : "connection closed or bad framing");
  return false;
}

/* ---- one request ------------------------------------------------------------
 */

/* Appends s to buf as a JSON string literal; returns the new length. */
static size_t put_json_str(char *buf, size_t at, const char *s) {
  buf[at++] = '"';
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      buf[at++] = '\\';
      buf[at++] = (char)c;
    } else if (c < 0x20) {
      at += (size_t)sprintf(buf + at, "\\u%04x", c);
    } else
      buf[at++] = (char)c;
  }
  buf[at++] = '"';
  buf[at] = 0;
  return at;
}

/* Sends one streaming POST /v1/completions and reads it to the end, filling
 * *res. Never blocks longer than the socket timeouts. */
static void do_request(int port, int timeout_s, const char *model_name,
                       const char *prompt, int max_tokens,
                       const char *json_schema, req_result *res) {
  memset(res, 0, sizeof *res);
  res->prompt_tokens = -1;
  res->tpot_ms = -1;
  size_t plen = strlen(prompt), mlen = strlen(model_name);
  size_t cap =
      6 * (plen + mlen) + 512 + (json_schema ? strlen(json_schema) : 0);
  char *body = sl_malloc(cap), *head = sl_malloc(512);
  reader *r = sl_malloc(sizeof *r);
  sse_state s = {0};
  int fd = -1;
  if (!body || !head || !r) {
    snprintf(res->err, sizeof res->err, "out of memory");
    goto out;
  }
  size_t n = (size_t)sprintf(body, "{\"model\": ");
  n = put_json_str(body, n, model_name);
  n += (size_t)sprintf(body + n, ", \"prompt\": ");
  n = put_json_str(body, n, prompt);
  n += (size_t)sprintf(body + n,
                       ", \"max_tokens\": %d, \"temperature\": 0, "
                       "\"stream\": true, "
                       "\"stream_options\": {\"include_usage\": true}%s%s}",
                       max_tokens, json_schema ? ", \"response_format\": " : "",
                       json_schema ? json_schema : "");
  int hn = snprintf(head, 512,
                    "POST /v1/completions HTTP/1.1\r\n"
                    "Host: 127.0.0.1:%d\r\n"
                    "Content-Type: application/json\r\n"
                    "Accept: text/event-stream\r\n"
                    "Content-Length: %zu\r\n"
                    "Connection: close\r\n\r\n",
                    port, n);
  uint64_t t0 = sl_now_ns();
  if ((fd = tcp_connect(port, timeout_s)) < 0) {
    snprintf(res->err, sizeof res->err, "connect: %s", strerror(errno));
    goto out;
  }
  if (!send_all(fd, head, (size_t)hn) || !send_all(fd, body, n)) {
    snprintf(res->err, sizeof res->err, "send: %s", strerror(errno));
    goto out_fd;
  }
  r->fd = fd;
  r->pos = r->len = 0;
  r->eof = r->timeout = false;
  char line[1024];
  if (!rd_line(r, line, sizeof line)) {
    snprintf(res->err, sizeof res->err, "no response%s",
             r->timeout ? " (timed out)" : "");
    goto out_fd;
  }
  int status = 0;
  if (sscanf(line, "HTTP/%*d.%*d %d", &status) != 1 || status != 200) {
    snprintf(res->err, sizeof res->err, "status line '%.100s'", line);
    goto out_fd;
  }
  bool chunked = false;
  long clen = -1;
  for (;;) {
    if (!rd_line(r, line, sizeof line)) {
      snprintf(res->err, sizeof res->err, "truncated headers");
      goto out_fd;
    }
    if (!line[0])
      break;
    if (!strncasecmp(line, "Transfer-Encoding:", 18) &&
        strcasestr(line + 18, "chunked"))
      chunked = true;
    else if (!strncasecmp(line, "Content-Length:", 15))
      clen = strtol(line + 15, NULL, 10);
  }
  bool framed = read_body(r, &s, chunked, clen);
  if (s.nomem)
    snprintf(res->err, sizeof res->err, "out of memory");
  else if (s.error)
    snprintf(res->err, sizeof res->err, "%s", s.err);
  else if (!framed)
    snprintf(res->err, sizeof res->err, "%s", s.err);
  else if (s.chunks == 0)
    snprintf(res->err, sizeof res->err, "no text came back");
  else
    res->ok = true;
  res->chunks = s.chunks;
  res->usage_seen = s.usage_seen;
  res->completion_tokens = s.usage_seen ? s.completion_tokens : s.chunks;
  res->prompt_tokens = s.usage_seen ? s.prompt_tokens : -1;
  if (s.chunks > 0)
    res->ttft_ms = ms_between(t0, s.t_first);
  if (res->completion_tokens > 1 && s.chunks > 1)
    res->tpot_ms =
        ms_between(s.t_first, s.t_last) / (double)(res->completion_tokens - 1);
out_fd:
  close(fd);
out:
  sl_free(s.line);
  sl_free(r);
  sl_free(head);
  sl_free(body);
}

/* ---- one phase: N clients -------------------------------------------------
 */

/* Holds the client threads until every one exists, so that a phase's clock
 * starts with all of them. */
typedef struct start_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open, abort;
} start_gate;

typedef struct client_job {
  const bench_cfg *cfg;
  int port, client;
  start_gate *gate;
  req_result *res; /* [requests_per_client], owned by the phase */
} client_job;

static void *client_main(void *p) {
  client_job *j = p;
  pthread_mutex_lock(&j->gate->mu);
  while (!j->gate->open)
    pthread_cond_wait(&j->gate->cv, &j->gate->mu);
  bool abort = j->gate->abort;
  pthread_mutex_unlock(&j->gate->mu);
  if (abort)
    return NULL;
  for (int r = 0; r < j->cfg->requests_per_client; r++) {
    char *prompt = make_prompt(j->cfg, j->client, r);
    if (!prompt) {
      memset(&j->res[r], 0, sizeof j->res[r]);
      snprintf(j->res[r].err, sizeof j->res[r].err, "out of memory");
      continue;
    }
    do_request(j->port, j->cfg->timeout_s, j->cfg->model_name, prompt,
               j->cfg->max_tokens, j->cfg->json_schema, &j->res[r]);
    sl_free(prompt);
  }
  return NULL;
}

/* Runs one phase of n clients against port; fills *ps. Returns SL_OK, or
 * SL_ERR_NOMEM / SL_ERR_IO when the phase could not run at all. */
static sl_status run_phase(const bench_cfg *cfg, int port, int n,
                           phase_stats *ps) {
  int rpc = cfg->requests_per_client, total = n * rpc;
  sl_status st = SL_ERR_NOMEM;
  memset(ps, 0, sizeof *ps);
  ps->n = n;
  ps->requests = total;
  ps->prompt_tokens = -1;
  req_result *res = sl_calloc((size_t)total, sizeof *res);
  client_job *jobs = sl_calloc((size_t)n, sizeof *jobs);
  pthread_t *th = sl_calloc((size_t)n, sizeof *th);
  double *ttft = sl_calloc((size_t)total, sizeof *ttft);
  double *tpot = sl_calloc((size_t)total, sizeof *tpot);
  start_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false,
                     false};
  if (!res || !jobs || !th || !ttft || !tpot)
    goto out_mem;
  int started = 0;
  for (; started < n; started++) {
    jobs[started] = (client_job){cfg, port, started, &gate,
                                 res + (size_t)started * (size_t)rpc};
    if (pthread_create(&th[started], NULL, client_main, &jobs[started]) != 0)
      break;
  }
  pthread_mutex_lock(&gate.mu);
  gate.open = true;
  gate.abort = started < n;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  uint64_t t0 = sl_now_ns();
  if (started < n) {
    fprintf(stderr, "sluice bench serve: cannot start client threads\n");
    for (int i = 0; i < started; i++)
      pthread_join(th[i], NULL);
    st = SL_ERR_IO;
    goto out_gate;
  }
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  uint64_t t1 = sl_now_ns();
  ps->wall_s = (double)(t1 - t0) / 1e9;
  int nt = 0, np = 0;
  ps->all_usage = true;
  for (int i = 0; i < total; i++) {
    req_result *q = &res[i];
    if (!q->ok) {
      if (ps->failed++ == 0)
        fprintf(stderr, "sluice bench serve: request failed: %s\n", q->err);
      continue;
    }
    ps->completion_tokens += q->completion_tokens;
    ps->text_chunks += q->chunks;
    ps->all_usage &= q->usage_seen;
    if (ps->prompt_tokens < 0 && q->prompt_tokens >= 0)
      ps->prompt_tokens = q->prompt_tokens;
    ttft[nt++] = q->ttft_ms;
    if (q->tpot_ms >= 0)
      tpot[np++] = q->tpot_ms;
  }
  int okn = total - ps->failed;
  ps->mean_completion_tokens = okn ? (double)ps->completion_tokens / okn : 0;
  ps->tokens_per_s =
      ps->wall_s > 0 ? (double)ps->completion_tokens / ps->wall_s : 0;
  ps->ttft_p50 = percentile(ttft, nt, 50);
  ps->ttft_p99 = percentile(ttft, nt, 99);
  ps->tpot_p50 = percentile(tpot, np, 50);
  ps->tpot_p99 = percentile(tpot, np, 99);
  st = SL_OK;
out_gate:
  pthread_cond_destroy(&gate.cv);
  pthread_mutex_destroy(&gate.mu);
out_mem:
  if (st == SL_ERR_NOMEM)
    fprintf(stderr, "sluice bench serve: out of memory\n");
  sl_free(tpot);
  sl_free(ttft);
  sl_free(th);
  sl_free(jobs);
  sl_free(res);
  return st;
}

/* ---- server processes -----------------------------------------------------
 */

/* GET path; returns the HTTP status, or -1 when nothing answered. */
static int http_get_status(int port, const char *path) {
  int fd = tcp_connect(port, 5);
  if (fd < 0)
    return -1;
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char req[256], resp[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                   "Connection: close\r\n\r\n",
                   path, port);
  int status = -1;
  if (send_all(fd, req, (size_t)n)) {
    ssize_t k = recv(fd, resp, sizeof resp - 1, 0);
    if (k > 0) {
      resp[k] = 0;
      if (sscanf(resp, "HTTP/%*d.%*d %d", &status) != 1)
        status = -1;
    }
  }
  close(fd);
  return status;
}

/* Prints the last lines of the server's log on stderr. */
static void dump_log_tail(const server_proc *p) {
  FILE *f = fopen(p->log, "r");
  if (!f)
    return;
  char buf[4096];
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, sz > (long)sizeof buf - 1 ? sz - (long)sizeof buf + 1 : 0, SEEK_SET);
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  buf[k] = 0;
  fclose(f);
  fprintf(stderr, "---- %s log (%s), last bytes ----\n%s\n----\n", p->what,
          p->log, buf);
}

/* SIGTERM, then SIGKILL after 10 s; reaps the child. */
static void server_stop(server_proc *p) {
  if (p->pid <= 0)
    return;
  kill(p->pid, SIGTERM);
  for (int i = 0; i < 1000; i++) {
    int wst;
    pid_t w = waitpid(p->pid, &wst, WNOHANG);
    if (w == p->pid || (w < 0 && errno != EINTR)) {
      p->pid = 0;
      return;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "sluice bench serve: %s did not stop on SIGTERM; killing\n",
          p->what);
  kill(p->pid, SIGKILL);
  waitpid(p->pid, NULL, 0);
  p->pid = 0;
}

/* Starts argv[0] (PATH searched) with stdout and stderr into a new temp log,
 * then polls GET /health on p->port until 200. The child gets SIGTERM if
 * this process dies. Returns SL_OK, or SL_ERR_IO with the child stopped and
 * its log's tail on stderr. */
static sl_status server_start(server_proc *p, char *const argv[]) {
  snprintf(p->log, sizeof p->log, "/tmp/sluice-bench-serve-XXXXXX");
  int lfd = mkstemp(p->log);
  if (lfd < 0) {
    fprintf(stderr, "sluice bench serve: mkstemp: %s\n", strerror(errno));
    return SL_ERR_IO;
  }
  fprintf(stderr, "sluice bench serve: starting %s on port %d (log %s)\n",
          p->what, p->port, p->log);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "sluice bench serve: fork: %s\n", strerror(errno));
    close(lfd);
    return SL_ERR_IO;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(127);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0)
      dup2(nul, 0);
    dup2(lfd, 1);
    dup2(lfd, 2);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(lfd);
  p->pid = pid;
  uint64_t t0 = sl_now_ns();
  while ((double)(sl_now_ns() - t0) / 1e9 < HEALTH_TIMEOUT_S) {
    int wst;
    if (waitpid(pid, &wst, WNOHANG) == pid) {
      p->pid = 0;
      fprintf(stderr,
              "sluice bench serve: %s exited before serving "
              "(status %d)\n",
              p->what, WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
      dump_log_tail(p);
      return SL_ERR_IO;
    }
    if (http_get_status(p->port, "/health") == 200) {
      fprintf(stderr, "sluice bench serve: %s is up after %.1f s\n", p->what,
              (double)(sl_now_ns() - t0) / 1e9);
      return SL_OK;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr,
          "sluice bench serve: %s did not answer /health within "
          "%.0f s\n",
          p->what, HEALTH_TIMEOUT_S);
  server_stop(p);
  dump_log_tail(p);
  return SL_ERR_IO;
}

/* The directory of the running binary in buf (no trailing slash), or NULL. */
static const char *exe_dir(char *buf, size_t cap) {
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n <= 0)
    return NULL;
  buf[n] = 0;
  char *slash = strrchr(buf, '/');
  if (!slash)
    return NULL;
  *slash = 0;
  return buf;
}

/* Finds scripts/peer_llamacpp_server.py: $SLUICE_SOURCE_DIR/scripts/, else
 * <exe dir>/../scripts/. Returns buf, or NULL when not found. */
static const char *peer_script(char *buf, size_t cap) {
  const char *src = getenv("SLUICE_SOURCE_DIR");
  char dir[PATH_MAX];
  struct stat sb;
  if (src) {
    snprintf(buf, cap, "%s/scripts/peer_llamacpp_server.py", src);
    if (stat(buf, &sb) == 0)
      return buf;
  }
  if (exe_dir(dir, sizeof dir)) {
    snprintf(buf, cap, "%s/../scripts/peer_llamacpp_server.py", dir);
    if (stat(buf, &sb) == 0)
      return buf;
  }
  return NULL;
}

/* One short request, not measured, so that neither engine's first phase
 * pays for lazy start-up work. */
static void warm_up(const bench_cfg *cfg, const server_proc *p) {
  char *prompt = make_prompt(cfg, 999, 999);
  if (!prompt)
    return;
  req_result w;
  do_request(p->port, cfg->timeout_s, cfg->model_name, prompt, 4,
             cfg->json_schema, &w);
  sl_free(prompt);
  if (!w.ok)
    fprintf(stderr, "sluice bench serve: %s: warm-up request failed: %s\n",
            p->what, w.err);
}

/* One phase of n clients against p, with a progress line on stderr. */
static sl_status run_one(const bench_cfg *cfg, const server_proc *p, int n,
                         phase_stats *out) {
  sl_status st = run_phase(cfg, p->port, n, out);
  if (st != SL_OK)
    return st;
  fprintf(stderr,
          "sluice bench serve: %-22s N=%-3d %7.1f tok/s  ttft p50 %8.1f ms  "
          "tpot p50 %7.1f ms  (%d/%d ok, %.1f tokens each, %.1f s)\n",
          p->what, out->n, out->tokens_per_s, out->ttft_p50, out->tpot_p50,
          out->requests - out->failed, out->requests,
          out->mean_completion_tokens, out->wall_s);
  return SL_OK;
}

static void print_runs(const phase_stats *ps, int n) {
  printf("[");
  for (int i = 0; i < n; i++) {
    const phase_stats *p = &ps[i];
    printf("%s\n   {\"n\": %d, \"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, "
           "\"tpot_p50_ms\": %.3f, \"tpot_p99_ms\": %.3f, "
           "\"tokens_per_s\": %.2f, \"requests\": %d, \"failed\": %d, "
           "\"completion_tokens\": %lld, \"text_chunks\": %lld, "
           "\"mean_completion_tokens\": %.1f, "
           "\"wall_s\": %.3f, \"tokens_counted_by\": \"%s\"}",
           i ? "," : "", p->n, p->ttft_p50, p->ttft_p99, p->tpot_p50,
           p->tpot_p99, p->tokens_per_s, p->requests, p->failed,
           p->completion_tokens, p->text_chunks, p->mean_completion_tokens,
           p->wall_s, p->all_usage ? "usage" : "text_chunks");
  }
  printf("]");
}

static int find_phase(const phase_stats *ps, int n, int clients) {
  for (int i = 0; i < n; i++)
    if (ps[i].n == clients)
      return i;
  return -1;
}

/* --clients 1,4,16: the phases' client counts. */
static bool set_clients(void *dst, const char *v) {
  bench_cfg *c = (bench_cfg *)((char *)dst - offsetof(bench_cfg, clients));
  int n = parse_clients(v, c->clients, MAX_PHASES);
  if (n <= 0)
    return false;
  c->n_phases = n;
  return true;
}

static bool set_response_format(void *dst, const char *v) {
  if (strcmp(v, "none") && strcmp(v, "json_object") && strcmp(v, "json_schema"))
    return false;
  *(const char **)dst = !strcmp(v, "json_object")   ? RF_JSON_OBJECT
                        : !strcmp(v, "json_schema") ? RF_JSON_SCHEMA
                                                    : NULL;
  return true;
}

static bool set_peer(void *dst, const char *v) {
  bench_cfg *c = (bench_cfg *)((char *)dst - offsetof(bench_cfg, peer));
  if (strcmp(v, "llama-cpp") && strncmp(v, "llama-server=", 13))
    return false;
  c->peer = true;
  if (!strncmp(v, "llama-server=", 13))
    c->peer_server = v + 13;
  return true;
}

#define AT(f) SL_FLAG_AT(bench_cfg, f)
static const sl_flag serve_flags[] = {
    {SL_FLAG_STR, "-m, --model", "FILE", AT(model), .help = "the GGUF file",
     .def = "the default model"},
    {SL_FLAG_INT, "-t, --threads", "N", AT(threads), 1, 1024,
     .help = "compute threads of each server", .def = "all CPUs"},
    {SL_FLAG_FN, "--clients", "N,N,...", AT(clients), .fn = set_clients,
     .help = "one phase per count: that many clients at once", .def = "1,4,16",
     .range = "1 to 8 counts of 1..256, comma-separated"},
    {SL_FLAG_INT, "--prompt-tokens", "N", AT(prompt_tokens), 1, 32768,
     .help = "each prompt's length (about)"},
    {SL_FLAG_INT, "--max-tokens", "N", AT(max_tokens), 1, 32768,
     .help = "tokens each request generates"},
    {SL_FLAG_INT, "--requests-per-client", "N", AT(requests_per_client), 1,
     10000, .help = "requests each client sends, one after another"},
    {SL_FLAG_INT, "--port", "P", AT(port), 0, 65535,
     .help = "the servers' port", .def = "0, a free one per server"},
    {SL_FLAG_INT, "--max-seqs", "N", AT(max_seqs), 1, 4096,
     .help = "sluice serve's --max-seqs"},
    {SL_FLAG_INT, "--timeout", "S", AT(timeout_s), 1, 86400,
     .help = "seconds a socket may wait (llama-cpp-python serves one request "
             "at a time, so at N = 16 the last client waits for the other 15)"},
    {SL_FLAG_FN, "--peer", "llama-cpp|llama-server=PATH", AT(peer),
     .fn = set_peer,
     .help = "the same phases against llama.cpp's server (llama-cpp-python, "
             "or the llama-server binary at PATH)",
     .def = "none", .range = "llama-cpp or llama-server=PATH"},
    {SL_FLAG_CHOICE, "--device", "auto|cpu|cuda", AT(device),
     .choices = "auto|cpu|cuda", .help = "sluice serve's --device",
     .def = "auto"},
    {SL_FLAG_FN, "--response-format", "none|json_object|json_schema",
     AT(json_schema), .fn = set_response_format,
     .help = "every request constrained (constrained decoding) to a JSON "
             "object, or to a schema of strings; compare with none",
     .def = "none", .range = "none, json_object or json_schema"},
};
#undef AT

static const char serve_head[] =
    "usage: sluice bench serve [options]\n"
    "  TTFT, TPOT and aggregate tokens/s of sluice serve (and a peer) under\n"
    "  N concurrent streaming clients, one phase per N; prints JSON.\n";
static const char serve_tail[] =
    "  llama-server runs with one slot per client of the largest phase\n"
    "  (-np), its context that many times 2048, all layers on the GPU.\n";

int sl_bench_serve_main(int argc, char **argv) {
  char defbuf[PATH_MAX];
  bench_cfg cfg = {.clients = {1, 4, 16},
                   .n_phases = 3,
                   .prompt_tokens = 128,
                   .max_tokens = 64,
                   .requests_per_client = 2,
                   .max_seqs = 16,
                   .timeout_s = IO_TIMEOUT_S};
  bool help;
  int prc = sl_flags_parse("bench serve", SL_FLAGS(serve_flags), &cfg, argc,
                           argv, serve_head, serve_tail, &help);
  if (prc || help)
    return prc;
  if (cfg.threads <= 0)
    cfg.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (!cfg.model)
    cfg.model = sl_model_default_path(defbuf, sizeof defbuf);
  struct stat sb;
  if (stat(cfg.model, &sb) != 0) {
    fprintf(stderr, "sluice bench serve: no model at '%s'\n", cfg.model);
    return 1;
  }
  {
    const char *b = strrchr(cfg.model, '/');
    snprintf(cfg.model_name, sizeof cfg.model_name, "%s",
             b ? b + 1 : cfg.model);
    size_t n = strlen(cfg.model_name);
    if (n > 5 && !strcmp(cfg.model_name + n - 5, ".gguf"))
      cfg.model_name[n - 5] = 0;
  }
  char script[PATH_MAX + 64];
  if (cfg.peer && !cfg.peer_server && !peer_script(script, sizeof script)) {
    fprintf(stderr, "sluice bench serve: scripts/peer_llamacpp_server.py not "
                    "found (set SLUICE_SOURCE_DIR)\n");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  int measured_prompt = size_prompt(&cfg);
  fprintf(stderr,
          "sluice bench serve: prompt of %d tokens (%zu story bytes), "
          "max_tokens %d, %d request(s) per client\n",
          measured_prompt, cfg.story_bytes, cfg.max_tokens,
          cfg.requests_per_client);

  phase_stats ours[MAX_PHASES], theirs[MAX_PHASES];
  char self[PATH_MAX], port_s[16], thr_s[16], seqs_s[16];
  ssize_t sn = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sn <= 0) {
    fprintf(stderr, "sluice bench serve: cannot read /proc/self/exe\n");
    return 1;
  }
  self[sn] = 0;

  /* Both servers stay up for the whole run and the phases alternate
   * (sluice N=1, peer N=1, sluice N=4, ...): only one engine has work at a
   * time, and a slow drift in the machine's load touches both alike. An idle
   * server blocks (sluice's pool spins briefly after a job, then sleeps). */
  server_proc sp = {.what = "sluice serve"}, pp = {.what = "llama-cpp peer"};
  sp.port = cfg.port ? cfg.port : pick_free_port();
  snprintf(port_s, sizeof port_s, "%d", sp.port);
  snprintf(thr_s, sizeof thr_s, "%d", cfg.threads);
  snprintf(seqs_s, sizeof seqs_s, "%d", cfg.max_seqs);
  char *sargv[] = {self,         "serve",
                   "-m",         (char *)cfg.model,
                   "--port",     port_s,
                   "-t",         thr_s,
                   "--max-seqs", seqs_s,
                   "--device",   (char *)(cfg.device ? cfg.device : "auto"),
                   NULL};
  if (sp.port <= 0 || server_start(&sp, sargv) != SL_OK) {
    fprintf(stderr, "sluice bench serve: sluice serve did not start\n");
    return 1;
  }
  if (cfg.peer) {
    pp.port =
        cfg.port ? (cfg.port < 65535 ? cfg.port + 1 : 0) : pick_free_port();
    snprintf(port_s, sizeof port_s, "%d", pp.port);
    char *pargv[] = {"python3", script, "-m", (char *)cfg.model,
                     "--port",  port_s, "-t", thr_s,
                     NULL};
    int slots = 1;
    for (int i = 0; i < cfg.n_phases; i++)
      if (cfg.clients[i] > slots)
        slots = cfg.clients[i];
    char np_s[16], ctx_s[24];
    snprintf(np_s, sizeof np_s, "%d", slots);
    snprintf(ctx_s, sizeof ctx_s, "%d", slots * 2048);
    char *largv[] = {(char *)cfg.peer_server,
                     "-m",
                     (char *)cfg.model,
                     "--port",
                     port_s,
                     "-t",
                     thr_s,
                     "-np",
                     np_s,
                     "-c",
                     ctx_s,
                     "-ngl",
                     "99",
                     "--cont-batching",
                     NULL};
    if (cfg.peer_server)
      pp.what = "llama-server peer";
    if (pp.port <= 0 ||
        server_start(&pp, cfg.peer_server ? largv : pargv) != SL_OK) {
      fprintf(stderr, "sluice bench serve: the llama-cpp peer did not start "
                      "(is llama-cpp-python installed?)\n");
      goto fail_servers;
    }
    warm_up(&cfg, &pp);
  }
  warm_up(&cfg, &sp);
  for (int i = 0; i < cfg.n_phases; i++) {
    if (run_one(&cfg, &sp, cfg.clients[i], &ours[i]) != SL_OK ||
        (cfg.peer && run_one(&cfg, &pp, cfg.clients[i], &theirs[i]) != SL_OK))
      goto fail_servers;
  }
  server_stop(&pp);
  server_stop(&sp);

  int actual_prompt = ours[0].prompt_tokens;
  printf("{\"bench\": \"serve\", \"device\": \"%s\", \"model\": ",
         cfg.device ? cfg.device : "auto");
  json_put_str(stdout, cfg.model);
  printf(", \"threads\": %d, \"max_seqs\": %d, \"prompt_tokens\": %d, "
         "\"prompt_tokens_actual\": %d, \"max_tokens\": %d, "
         "\"requests_per_client\": %d, \"temperature\": 0, "
         "\"response_format\": \"%s\",\n"
         " \"prefix_cache_note\": \"every request's prompt starts with its "
         "own 'client-request. ' header, then the same story text, so no "
         "prefix cache can serve one request from another's prompt; the "
         "prompts are identical for both engines\",\n"
         " \"runs\": ",
         cfg.threads, cfg.max_seqs, cfg.prompt_tokens,
         actual_prompt >= 0 ? actual_prompt : measured_prompt, cfg.max_tokens,
         cfg.requests_per_client,
         cfg.json_schema == RF_JSON_OBJECT   ? "json_object"
         : cfg.json_schema == RF_JSON_SCHEMA ? "json_schema"
                                             : "none");
  print_runs(ours, cfg.n_phases);
  int failed = 0;
  for (int i = 0; i < cfg.n_phases; i++)
    failed += ours[i].failed + (cfg.peer ? theirs[i].failed : 0);
  if (cfg.peer) {
    printf(",\n \"peer\": {\"engine\": \"%s\", \"schedule\": "
           "\"both servers up at once, phases alternate (sluice N, then "
           "peer N), warm-up request each, not counted\", \"runs\": ",
           cfg.peer_server ? "llama-server" : "llama-cpp-python");
    print_runs(theirs, cfg.n_phases);
    printf("}");
    /* sluice / peer tokens per second, per phase */
    printf(",\n \"ratio_tokens_per_s\": {");
    for (int i = 0; i < cfg.n_phases; i++) {
      bool okr =
          !ours[i].failed && !theirs[i].failed && theirs[i].tokens_per_s > 0;
      printf("%s\"%d\": ", i ? ", " : "", cfg.clients[i]);
      if (okr)
        printf("%.3f", ours[i].tokens_per_s / theirs[i].tokens_per_s);
      else
        printf("null");
    }
    printf("}");
    int a16 = find_phase(ours, cfg.n_phases, 16);
    int a1 = find_phase(ours, cfg.n_phases, 1);
    if (a16 >= 0 && (ours[a16].failed || theirs[a16].failed))
      fprintf(stderr, "sluice bench serve: N=16 had failed requests; no "
                      "ratio\n");
    if (a16 >= 0 && !ours[a16].failed && !theirs[a16].failed &&
        theirs[a16].tokens_per_s > 0)
      printf(",\n \"ratio_tokens_per_s_n16\": %.3f",
             ours[a16].tokens_per_s / theirs[a16].tokens_per_s);
    else
      printf(",\n \"ratio_tokens_per_s_n16\": null");
    /* > 1 means sluice's first token comes sooner (peer / ours) */
    if (a1 >= 0 && !ours[a1].failed && !theirs[a1].failed &&
        ours[a1].ttft_p50 > 0)
      printf(", \"ratio_ttft_p50_n1\": %.3f",
             theirs[a1].ttft_p50 / ours[a1].ttft_p50);
    else
      printf(", \"ratio_ttft_p50_n1\": null");
    printf(",\n \"ratio_note\": \"ratio_tokens_per_s_n16 = sluice / peer, "
           "ratio_ttft_p50_n1 = peer / sluice: above 1 means sluice is "
           "better in both\"");
  }
  printf("}\n");
  fflush(stdout);
  if (failed)
    fprintf(stderr, "sluice bench serve: %d request(s) failed\n", failed);
  else {
    unlink(sp.log);
    if (cfg.peer)
      unlink(pp.log);
  }
  return failed ? 1 : 0;

fail_servers:
  server_stop(&pp);
  server_stop(&sp);
  return 1;
}
