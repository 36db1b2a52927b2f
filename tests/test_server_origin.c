/* Whom a request may come from (issue 43 stage 1, src/server/origin.h):
 * the Host names a server on loopback, on an address or on every
 * interface answers, --allowed-host entries, malformed Host values; the
 * Origin rule (the server's own origin, --cors-origin); the JSON content
 * type. The same rules through real sockets, and a page of another origin
 * in Chromium, are tests/py/test_http_origin.py. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "server/origin.h"

typedef struct host_case {
  const char *host, *bound, *allowed;
  bool ok;
} host_case;

static const host_case HOSTS[] = {
    /* the default bind: loopback names and addresses only */
    {"localhost", "127.0.0.1", NULL, true},
    {"localhost:8080", "127.0.0.1", NULL, true},
    {"LocalHost.:8080", "127.0.0.1", NULL, true},
    {"127.0.0.1:8080", "127.0.0.1", NULL, true},
    {"127.1.2.3", "127.0.0.1", NULL, true},
    {"[::1]:8080", "127.0.0.1", NULL, true},
    {"[::ffff:127.0.0.1]", "127.0.0.1", NULL, true},
    {"app.localhost:8080", "127.0.0.1", NULL, true},
    {"attacker.example", "127.0.0.1", NULL, false},
    {"attacker.example:8080", "127.0.0.1", NULL, false},
    {"localhost.attacker.example", "127.0.0.1", NULL, false},
    {"evillocalhost", "127.0.0.1", NULL, false},
    {"192.168.1.5:8080", "127.0.0.1", NULL, false},
    {"[2001:db8::1]", "127.0.0.1", NULL, false},
    /* malformed */
    {"", "127.0.0.1", NULL, false},
    {":8080", "127.0.0.1", NULL, false},
    {"localhost:", "127.0.0.1", NULL, false},
    {"localhost:80a", "127.0.0.1", NULL, false},
    {"localhost:123456", "127.0.0.1", NULL, false},
    {"::1", "127.0.0.1", NULL, false},
    {"[::1", "127.0.0.1", NULL, false},
    {"[::1]x", "127.0.0.1", NULL, false},
    {"user@localhost", "127.0.0.1", NULL, false},
    {"local host", "127.0.0.1", NULL, false},
    {"localhost/x", "127.0.0.1", NULL, false},
    /* bound to one address or name */
    {"192.168.1.5:8080", "192.168.1.5", NULL, true},
    {"192.168.1.6:8080", "192.168.1.5", NULL, false},
    {"box.lan:8080", "Box.Lan", NULL, true},
    {"[fe80::1]:8080", "fe80::1", NULL, true},
    {"[fe80:0::1]", "fe80::1", NULL, true},
    /* bound to every interface: any address, still no foreign name */
    {"192.168.1.5:8080", "0.0.0.0", NULL, true},
    {"[2001:db8::1]:8080", "::", NULL, true},
    {"attacker.example", "0.0.0.0", NULL, false},
    /* --allowed-host */
    {"box.lan:8080", "0.0.0.0", "box.lan", true},
    {"box.lan:8080", "0.0.0.0", "other.lan,box.lan", true},
    {"BOX.lan.", "0.0.0.0", "box.lan", true},
    {"a.box.lan", "0.0.0.0", "box.lan", false},
    {"a.box.lan", "0.0.0.0", ".box.lan", true},
    {"box.lan", "0.0.0.0", ".box.lan", true},
    {"xbox.lan", "0.0.0.0", ".box.lan", false},
    {"attacker.example", "127.0.0.1", "*", true},
    {"10.0.0.2", "127.0.0.1", "10.0.0.2", true},
    {"[2001:db8::2]", "127.0.0.1", "2001:db8::2", true},
};

static void test_hosts(void) {
  for (size_t i = 0; i < sizeof HOSTS / sizeof *HOSTS; i++) {
    const host_case *h = &HOSTS[i];
    bool got = sl__srv_host_allowed(h->host, h->bound, h->allowed);
    CHECK_MSG(got == h->ok, "Host '%s' bound '%s' allowed '%s': %d", h->host,
              h->bound, h->allowed ? h->allowed : "", got);
  }
  CHECK(!sl__srv_host_allowed(NULL, "127.0.0.1", NULL));
  /* a 300-byte name: refused, not overrun */
  char big[301];
  memset(big, 'a', 300);
  big[300] = 0;
  CHECK(!sl__srv_host_allowed(big, "127.0.0.1", "*.a"));
}

typedef struct origin_case {
  const char *origin, *host, *cors;
  bool ok;
} origin_case;

static const origin_case ORIGINS[] = {
    {"http://127.0.0.1:8080", "127.0.0.1:8080", NULL, true},
    {"http://localhost:8080", "localhost:8080", NULL, true},
    {"HTTP://LOCALHOST:8080", "localhost:8080", NULL, true},
    {"https://box.lan", "box.lan", NULL, true},
    {"http://localhost:8081", "localhost:8080", NULL, false},
    {"http://evil.example", "127.0.0.1:8080", NULL, false},
    {"http://evil.example", "127.0.0.1:8080", "", false},
    {"null", "127.0.0.1:8080", NULL, false},
    {"http://127.0.0.1:8080", NULL, NULL, false},
    {"ftp://127.0.0.1:8080", "127.0.0.1:8080", NULL, false},
    {"http:/127.0.0.1:8080", "127.0.0.1:8080", NULL, false},
    {"http://evil.example", "127.0.0.1:8080", "*", true},
    {"http://evil.example", "127.0.0.1:8080",
     "http://a.example,"
     "http://evil.example",
     true},
    {"http://evil.example", "127.0.0.1:8080", "http://evil.example.com", false},
    {"null", "127.0.0.1:8080", "null", true},
};

static void test_origins(void) {
  for (size_t i = 0; i < sizeof ORIGINS / sizeof *ORIGINS; i++) {
    const origin_case *o = &ORIGINS[i];
    bool got = sl__srv_origin_allowed(o->origin, o->host, o->cors);
    CHECK_MSG(got == o->ok, "Origin '%s' Host '%s' cors '%s': %d", o->origin,
              o->host ? o->host : "(none)", o->cors ? o->cors : "", got);
  }
  CHECK(!sl__srv_origin_allowed(NULL, "localhost", "*"));
}

static void test_content_types(void) {
  CHECK(sl__srv_content_type_json("application/json"));
  CHECK(sl__srv_content_type_json("Application/JSON"));
  CHECK(sl__srv_content_type_json("application/json; charset=utf-8"));
  CHECK(sl__srv_content_type_json(" application/json ;charset=UTF-8"));
  CHECK(!sl__srv_content_type_json(NULL));
  CHECK(!sl__srv_content_type_json(""));
  CHECK(!sl__srv_content_type_json("text/plain"));
  CHECK(!sl__srv_content_type_json("text/plain; application/json"));
  CHECK(!sl__srv_content_type_json("application/x-www-form-urlencoded"));
  CHECK(!sl__srv_content_type_json("multipart/form-data; boundary=x"));
  CHECK(!sl__srv_content_type_json("application/jsonx"));
  CHECK(!sl__srv_content_type_json("application/json-seq"));
}

int main(void) {
  RUN(test_hosts);
  RUN(test_origins);
  RUN(test_content_types);
  return sl_test_finish();
}
