/* libFuzzer harness: the HTTP request path end to end, request bytes to
 * response status. One real server (the default model, a small context)
 * listens on a loopback port for the whole run; each input is sent over a
 * fresh TCP connection, the client's side is then shut, and the answer is
 * read until the server closes.
 *
 * The first byte picks how the bytes go out (bit 0: in two writes, bit 1:
 * after a 0.2 ms pause; top three bits set: the write side stays open, so
 * that a generation is not aborted by the client's hang-up), the rest is
 * the request. A kept-open connection is shut after 100 ms without an
 * answer, past the server's head and request deadlines. Oracles:
 *   - an answer is an HTTP/1.1 status line with a 1xx..5xx code, and the
 *     first final answer (but a CORS preflight's 204, which has no body)
 *     has a JSON, SSE or text Content-Type, or is the dashboard's page
 *     (text/html, told by its text): never
 *     libmicrohttpd's own HTML page or an empty one (the door answers
 *     every head it refuses in JSON). Known exception, not checked: a
 *     chunked body whose chunk framing is broken gets libmicrohttpd's
 *     HTML 400 (it de-chunks before sluice sees a byte; docs/RELIABILITY.md);
 *   - a head the door's check accepts (sl__srv_head_check) is never
 *     answered 400/414/431/505 by libmicrohttpd in HTML either;
 *   - the server keeps serving: every 256 inputs, /health answers 200.
 * ASan and UBSan watch the server's threads as well as this one. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "default_model.h"
#include "server/server_impl.h"
#include "sluice/engine.h"
#include "sluice/server.h"

static sl_pool_t *g_pool;
static sl_server_t *g_srv;
static int g_port;
static char g_buf[1 << 20];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char path[4096], err[256];
  sl_pool_config pc = sl_pool_config_defaults();
  pc.engine.n_ctx = 96; /* a request without max_tokens generates to the
                         * end of the context: keep that short */
  pc.n_ctx_fixed = true;
  pc.engine.max_seqs = 4;
  pc.engine.n_threads = 1;
  if (sl_pool_create(&pc, &g_pool) != SL_OK ||
      sl_pool_add(g_pool, "smollm2", default_model_path(path, sizeof path), err,
                  sizeof err) != SL_OK ||
      sl_pool_load(g_pool, "smollm2", err, sizeof err) != SL_OK) {
    fprintf(stderr, "fuzz_http: needs the default model (SLUICE_MODEL)\n");
    exit(1);
  }
  sl_server_config sc = sl_server_config_defaults();
  sc.port = 0;
  sc.max_body_bytes = 64 * 1024;
  sc.http_timeout_s = 1;
  /* short deadlines, so that the kept-open inputs (below) reach the
   * server's 408 paths without costing the campaign a second each */
  sc.head_timeout_ms = 20;
  sc.request_timeout_ms = 60;
  sc.grace_ms = 0;
  if (sl_server_start(g_pool, &sc, &g_srv, err, sizeof err) != SL_OK) {
    fprintf(stderr, "fuzz_http: %s\n", err);
    exit(1);
  }
  g_port = sl_server_port(g_srv);
  return 0;
}

static int connect_local(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    abort();
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)g_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    abort();   /* the server stopped accepting */
  int one = 1; /* two writes: no 40 ms wait for a delayed ACK */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void send_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0)
      return; /* the server closed early: fine, it answered or refused */
    p += k;
    n -= (size_t)k;
  }
}

/* Reads until EOF, reset or `ms` without a byte; returns the bytes read.
 * shut: the write side is still open; it is shut once the answer's first
 * bytes came, or after `open_ms` without any (a kept-open connection
 * would otherwise idle until the server's timeout). */
static size_t read_all(int fd, int ms, bool shut, int open_ms) {
  size_t got = 0;
  for (;;) {
    if (shut && got) {
      shutdown(fd, SHUT_WR);
      shut = false;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, shut ? open_ms : ms) <= 0) {
      if (!shut)
        break;
      shutdown(fd, SHUT_WR);
      shut = false;
      continue;
    }
    ssize_t k = recv(fd, g_buf + got, sizeof g_buf - 1 - got, 0);
    if (k <= 0)
      break;
    got += (size_t)k;
    if (got == sizeof g_buf - 1)
      break;
  }
  g_buf[got] = 0;
  return got;
}

static int status_of(const char *p, size_t n) {
  if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ')
    abort(); /* not an HTTP answer */
  int st = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
  if (st < 100 || st > 599)
    abort();
  return st;
}

static void check_health(void) {
  int fd = connect_local();
  static const char req[] = "GET /health HTTP/1.1\r\nHost: localhost\r\n"
                            "Connection: close\r\n\r\n";
  send_all(fd, (const uint8_t *)req, sizeof req - 1);
  size_t n = read_all(fd, 10000, false, 0);
  close(fd);
  if (status_of(g_buf, n) != 200)
    abort(); /* the server stopped serving */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static unsigned runs;
  if (size < 1 || size > 64 * 1024)
    return 0;
  unsigned mode = data[0];
  data++;
  size--;
  int fd = connect_local();
  size_t cut = (mode & 1) && size > 1 ? size / 2 : size;
  send_all(fd, data, cut);
  if (mode & 2) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  send_all(fd, data + cut, size - cut);
  bool keep_open = (mode & 0xE0) == 0xE0;
  if (!keep_open)
    shutdown(fd, SHUT_WR);
  size_t n = read_all(fd, 3000, keep_open, 100);
  close(fd);
  if (n) {
    /* the first final answer (past any "100 Continue") */
    char *p = g_buf, *end;
    int st;
    for (;;) {
      st = status_of(p, n - (size_t)(p - g_buf));
      end = strstr(p, "\r\n\r\n");
      if (st >= 200 || !end)
        break;
      p = end + 4;
      if (p == g_buf + n) { /* a 100 Continue and no final answer: the */
        end = NULL;         /* client's hang-up ended the request */
        break;
      }
    }
    size_t head_n = 0;
    const char *hend = memmem(data, size, "\r\n\r\n", 4);
    head_n = hend ? (size_t)(hend - (const char *)data) : size;
    bool chunked = false; /* any Transfer-Encoding, in any case */
    for (size_t i = 0; i + 9 <= head_n && !chunked; i++)
      chunked = strncasecmp((const char *)data + i, "transfer-", 9) == 0;
    if (end && !chunked && st != 204) { /* a CORS preflight: no body */
      /* sluice's one HTML page, the dashboard, is told by its text */
      const char *body = end + 4;
      bool dashboard =
          memmem(body, n - (size_t)(body - g_buf), "sluice's admin dashboard",
                 strlen("sluice's admin dashboard")) != NULL;
      *end = 0; /* the head alone */
      if (!strcasestr(p, "\r\nContent-Type: application/json") &&
          !strcasestr(p, "\r\nContent-Type: text/event-stream") &&
          !strcasestr(p, "\r\nContent-Type: text/plain") &&
          !(dashboard && strcasestr(p, "\r\nContent-Type: text/html")))
        abort(); /* libmicrohttpd's own page reached a client */
    }
    sl_srv_head_info hi;
    sl_srv_error e;
    if (sl__srv_head_check((const char *)data, size, &hi, &e) ==
            SL_SRV_HEAD_OK &&
        (st == 414 || st == 431 || st == 505))
      abort(); /* a head the door passed, refused by libmicrohttpd */
  }
  if (++runs % 256 == 0)
    check_health();
  return 0;
}
