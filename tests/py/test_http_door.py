"""The front door, through real sockets: slow and idle clients cannot deny
service, heads libmicrohttpd would answer in HTML get JSON, and connection
limits refuse at once.

- While 2,000 idle or slow sockets are held (from 127.0.0.2, as one
  attacker), a client from 127.0.0.1 gets /health and a chat answer within
  2 s: with the default per-address limit (most of the 2,000 refused at
  once) and with no per-address limit (all 2,000 held by the server).
- A head that trickles in (one header line a second) gets a 408 at
  --head-timeout-ms; a body that trickles gets a 408 at
  --request-timeout-ms.
- Every head the door refuses gets JSON in the API's shape, never HTML.
- A client that sends its whole request and then shuts its sending side
  (shutdown(SHUT_WR)) gets the same answer as over an open connection,
  streamed or not, on both APIs; one that closes its socket while its
  answer is generated has its job aborted at once.
"""
import json
import resource
import socket
import threading
import time
import urllib.request

import pytest

from conftest import MODEL_NAME
from test_http import exchange

DEADLINE = 2.0
ATTACKER = "127.0.0.2"


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip("the open-file limit (%d) is below %d" % (hard, n))
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def metric(srv, name):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for ln in text.splitlines():
        if ln.startswith(name) and not ln.startswith("#"):
            total += float(ln.rsplit(" ", 1)[1])
    return total


def timed_client(srv):
    """/health and a one-token chat answer from 127.0.0.1: seconds each."""
    t0 = time.time()
    with urllib.request.urlopen(srv.base + "/health", timeout=30) as r:
        assert r.status == 200
    t1 = time.time()
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(srv.base + "/v1/chat/completions",
                                 body.encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and json.load(r)["choices"]
    return t1 - t0, time.time() - t1


class Horde:
    """n sockets from ATTACKER: half idle (connected, silent), half slow
    (one header line every `every` seconds, never ending the head)."""

    def __init__(self, srv, n, every=1.0):
        self.socks, self.refused, self.stop = [], 0, False
        for i in range(n):
            s = socket.socket()
            s.bind((ATTACKER, 0))
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", srv.port))
            except OSError:
                self.refused += 1
                s.close()
                continue
            self.socks.append(s)
        # the slow half starts its head
        for s in self.socks[::2]:
            try:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
            except OSError:
                pass
        self.t = threading.Thread(target=self.trickle, args=(every,))
        self.t.start()

    def trickle(self, every):
        k = 0
        while not self.stop:
            time.sleep(every)
            for s in self.socks[::2]:
                try:
                    s.sendall(b"X-Slow-%d: y\r\n" % k)
                except OSError:
                    pass
            k += 1

    def alive(self):
        """Sockets the server still holds open (no EOF, no reset)."""
        n = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                d = s.recv(1, socket.MSG_PEEK)
                if d:
                    n += 1  # an answer came; still open
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    def close(self):
        self.stop = True
        self.t.join()
        for s in self.socks:
            s.close()


@pytest.fixture(scope="module")
def door_default(sluice_server):
    return sluice_server(["-c", "512"])


@pytest.fixture(scope="module")
def door_open(sluice_server):
    return sluice_server(["-c", "512", "--max-conns-per-ip", "0",
                          "--max-conns", "3000"])


@pytest.mark.parametrize("which", ["door_default", "door_open"])
def test_2000_slow_sockets_do_not_deny_service(which, request):
    srv = request.getfixturevalue(which)
    raise_nofile(4096)
    h = Horde(srv, 2000)
    try:
        time.sleep(1.5)  # every socket accepted (or refused) by now
        held = h.alive()
        t_health, t_chat = timed_client(srv)
        assert t_health < DEADLINE and t_chat < DEADLINE, (t_health, t_chat)
        open_now = metric(srv, "sluice_http_connections_open")
        refused = metric(srv, "sluice_http_connections_refused_total")
        if which == "door_default":
            # 256 per address: the rest were refused at once (reset or EOF)
            assert held <= 256 + 8, held
            assert refused >= 2000 - 256 - 8, refused
        else:
            assert held >= 1990, held
            assert open_now >= 1990, open_now
        # still served while they trickle on
        time.sleep(2)
        t_health, t_chat = timed_client(srv)
        assert t_health < DEADLINE and t_chat < DEADLINE, (t_health, t_chat)
    finally:
        h.close()


def test_per_address_limit_refuses_at_once(sluice_server):
    srv = sluice_server(["-c", "512", "--max-conns-per-ip", "4"])
    held = []
    for _ in range(4):
        s = socket.socket()
        s.bind((ATTACKER, 0))
        s.connect(("127.0.0.1", srv.port))
        held.append(s)
    time.sleep(0.3)
    s = socket.socket()
    s.bind((ATTACKER, 0))
    s.settimeout(DEADLINE)
    t0 = time.time()
    try:
        # closed at once: EOF or reset, and the reset may come back before
        # connect() itself returns (the door closes right at accept)
        s.connect(("127.0.0.1", srv.port))
        got = s.recv(1)
    except ConnectionResetError:
        got = b""
    assert got == b"" and time.time() - t0 < 1.0
    s.close()
    assert metric(srv, "sluice_http_connections_refused_total") >= 1
    # another address is not limited by this one's connections
    t_health, t_chat = timed_client(srv)
    assert t_health < DEADLINE and t_chat < DEADLINE
    for s in held:
        s.close()


@pytest.fixture(scope="module")
def door_fast(sluice_server):
    return sluice_server(["-c", "512", "--head-timeout-ms", "2000",
                          "--request-timeout-ms", "3000"])


def read_answer(s, wait):
    s.settimeout(wait)
    got = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
    except (socket.timeout, ConnectionResetError):
        pass
    return got


def trickle(s, pieces, limit):
    """Sends one piece every 0.5 s until the server answers or closes, or
    `limit` seconds pass; returns (the answer, seconds from the start)."""
    t0 = time.time()
    got = b""
    for piece in pieces:
        if time.time() - t0 >= limit or got:
            break
        time.sleep(0.5)
        try:
            s.sendall(piece)
        except OSError:
            break
        s.setblocking(False)
        try:
            got += s.recv(65536)
        except BlockingIOError:
            pass
        except OSError:
            break
        s.setblocking(True)
    dt = time.time() - t0
    return got + read_answer(s, 2), dt


def test_trickled_head_gets_408(door_fast):
    s = socket.create_connection(("127.0.0.1", door_fast.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    got, dt = trickle(s, (b"X-Slow-%d: y\r\n" % k for k in range(100)), 6)
    assert got.startswith(b"HTTP/1.1 408"), got
    assert 1.9 < dt < 3.5, dt
    body = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_timeout"


def test_trickled_body_gets_408(door_fast):
    s = socket.create_connection(("127.0.0.1", door_fast.port))
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    got, dt = trickle(s, (b" " for _ in range(100)), 8)
    assert got.startswith(b"HTTP/1.1 408"), got
    assert 2.9 < dt < 4.5, dt


BAD_HEADS = [
    # (bytes, status, anthropic shape)
    (b"GARBAGE\r\n\r\n", 400, False),
    (b"GET\r\n\r\n", 400, False),
    (b"GET /health\r\n\r\n", 400, False),
    (b"GET  /health HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, False),
    (b"GET /health HTTP/2.0\r\nHost: localhost\r\n\r\n", 505, False),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, False),
    (b"GET /health HTTP/1.1 extra\r\nHost: localhost\r\n\r\n", 400, False),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414, False),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-Pad: 0123456789\r\n" * 1200
     + b"\r\n", 431, False),
    # 101 short fields (a 1.4 KB head): libmicrohttpd answered ~500 of them
    # with its own HTML 431 (its connection memory); the door answers JSON
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\n" +
     b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n", 431, False),
    (b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\n" +
     b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n", 431, True),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\n folded\r\n\r\n", 400, False),
    (b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n", 400, False),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nNo colon here\r\n\r\n", 400, False),
    (b"GET /health HTTP/1.1\r\nHost: x\x00y\r\n\r\n", 400, False),
    (b"GET /health HTTP/1.1\r\nHost: x\ry\r\n\r\n", 400, False),
    (b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 12a\r\n\r\n",
     400, True),
    (b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: localhost\r\n"
     b"Content-Length: -1\r\n\r\n", 400, True),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
     b"Content-Length: 99999999999999999999\r\n\r\n", 400, False),
    # a chunk declaring more than the body limit: 413 at once (it used to
    # hold the connection until the request's deadline); its line's end
    # need not come
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
     b"\r\nffffffffffffffff", 413, False),
    (b"POST /v1/messages HTTP/1.1\r\nHost: localhost\r\n"
     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
     b"\r\n900000\r\n{", 413, True),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
     b"\r\nzz\r\n", 400, False),
]


@pytest.mark.parametrize("data,status,anthropic", BAD_HEADS,
                         ids=range(len(BAD_HEADS)))
def test_bad_heads_get_json(door_default, data, status, anthropic):
    st, hdr, body, dt, closed = exchange(door_default, data)
    assert st == status, (st, body)
    assert hdr.get("content-type") == "application/json"
    assert closed and dt < DEADLINE
    assert b"<html" not in body.lower()
    e = json.loads(body)
    if anthropic:
        assert e["type"] == "error" and e["error"]["message"], e
    else:
        assert e["error"]["message"] and e["error"]["code"], e


def test_good_heads_pass(door_default):
    # bare LF line ends (accepted, as RFC 9112 section 2.2 lets a server:
    # docs/RELIABILITY.md), HTTP/1.0 without Host, a query string, 100
    # header fields in a head of nearly 16 KiB (libmicrohttpd holds them)
    for data in [b"GET /health HTTP/1.1\nHost: localhost\n\n",
                 b"GET /health HTTP/1.1\r\nHost: localhost\r\n" +
                 b"".join(b"X-%02d: %s\r\n" % (i, b"v" * 150)
                          for i in range(99)) + b"\r\n",
                 b"GET /health HTTP/1.0\r\n\r\n",
                 b"GET /health?x=1 HTTP/1.1\r\nHost: localhost\r\n"
                 b"Connection: close\r\n\r\n"]:
        st, _, body, _, _ = exchange(door_default, data)
        assert st == 200 and json.loads(body) == {"status": "ok"}, data


def test_hangup_while_parked_aborts(door_default):
    """A non-streamed request parks its connection until the answer is
    whole; libmicrohttpd does not poll a parked connection, so the watch
    notices the hang-up (at once, through its epoll) and aborts the job."""
    def stats():
        with urllib.request.urlopen(door_default.base + "/admin/api/stats",
                                    timeout=10) as r:
            return json.load(r)
    before = stats()["tokens"]["generated"]
    # greedy, this prompt counts on to max_tokens (sampled, it may stop)
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 480,
                       "temperature": 0,
                       "prompt": "Count from 1 to 1000: 1, 2, 3,"}).encode()
    s = socket.create_connection(("127.0.0.1", door_default.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    t0 = time.time()
    while stats()["engine"]["running"] == 0:
        assert time.time() - t0 < 30
        time.sleep(0.05)
    s.close()  # hang up while the answer is being generated
    t0 = time.time()
    while True:
        e = stats()["engine"]
        if e["running"] == 0 and e["kv_blocks_used"] == 0:
            break
        assert time.time() - t0 < 2, e
        time.sleep(0.05)
    gen = stats()["tokens"]["generated"] - before
    assert gen < 480, gen


def test_chunked_after_100_continue(door_default):
    """A chunked body behind "Expect: 100-continue" (curl sends it for large
    uploads) is not held at the door waiting for its first chunk line: the
    client gets its 100 Continue, sends the body and is answered."""
    body = json.dumps({"content": "hello world"}).encode()
    s = socket.create_connection(("127.0.0.1", door_default.port), timeout=10)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
              b"Connection: close\r\n\r\n")
    first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 100"), first
    s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert b'"tokens"' in got


def final_answer(raw):
    """(status, headers, body) of the final answer in raw, after any 1xx
    interim answers; a chunked body is decoded."""
    while raw.startswith(b"HTTP/1.1 1"):
        raw = raw.split(b"\r\n\r\n", 1)[1]
    assert b"\r\n\r\n" in raw, raw[:300]
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, v = ln.split(":", 1)
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        out = b""
        while True:
            size, body = body.split(b"\r\n", 1)
            n = int(size, 16)
            if n == 0:
                break
            out += body[:n]
            body = body[n + 2:]
        body = out
    return status, hdrs, body


def stream_text(body, anthropic):
    """The text of an SSE answer, and whether it ended as it should."""
    text, ended = "", False
    for ln in body.decode().split("\n"):
        if not ln.startswith("data: "):
            continue
        if ln == "data: [DONE]":
            ended = True
            continue
        ev = json.loads(ln[6:])
        if anthropic:
            if ev["type"] == "content_block_delta":
                text += ev["delta"].get("text", "")
            ended = ended or ev["type"] == "message_stop"
        elif ev.get("choices"):
            text += ev["choices"][0]["delta"].get("content") or ""
    return text, ended


def plain_text(body, anthropic):
    j = json.loads(body)
    if anthropic:
        return "".join(b.get("text", "") for b in j["content"])
    return j["choices"][0]["message"]["content"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_half_close_gets_its_answer(door_default, api, stream):
    """libmicrohttpd closes a connection when it reads the EOF before an
    answer is queued; the server answers such a client itself (detach.c),
    after a 100 Continue that tells it from one that closed."""
    anthropic = api == "anthropic"
    req = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0,
           "messages": [{"role": "user", "content": "Name three colours."}]}
    path = "/v1/messages" if anthropic else "/v1/chat/completions"
    # the reference: the same request over a connection left open
    r = urllib.request.Request(door_default.base + path,
                               json.dumps(req).encode(),
                               {"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=60) as f:
        want = plain_text(f.read(), anthropic)
    assert want
    before = metric(door_default, "sluice_http_half_closed_answers_total")
    req["stream"] = stream
    body = json.dumps(req).encode()
    s = socket.create_connection(("127.0.0.1", door_default.port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\nX-Request-Id: half-1\r\n"
              b"Content-Length: %d\r\n\r\n" % (path.encode(), len(body)) +
              body)
    s.shutdown(socket.SHUT_WR)
    raw = read_answer(s, 60)
    s.close()
    status, hdrs, got = final_answer(raw)
    assert status == 200, raw[:300]
    assert hdrs.get("x-request-id") == "half-1"
    if stream:
        assert hdrs["content-type"] == "text/event-stream"
        text, ended = stream_text(got, anthropic)
        assert ended, got[-300:]
    else:
        text = plain_text(got, anthropic)
    assert text == want
    # answered by libmicrohttpd when it had queued the answer before it
    # read the EOF, else here: the count says which, both are right
    assert metric(door_default,
                  "sluice_http_half_closed_answers_total") >= before


def test_half_close_is_answered_here(door_default):
    """The non-streamed case always meets the EOF before its answer (the
    connection is parked while it generates): answered by detach.c."""
    before = metric(door_default, "sluice_http_half_closed_answers_total")
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 40,
                       "prompt": "Once upon a time"}).encode()
    s = socket.create_connection(("127.0.0.1", door_default.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n"
              b"\r\n" % len(body) + body)
    s.shutdown(socket.SHUT_WR)
    raw = read_answer(s, 60)
    s.close()
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), raw[:200]
    status, hdrs, got = final_answer(raw)
    assert status == 200 and json.loads(got)["choices"][0]["text"]
    assert hdrs["connection"] == "close"
    assert metric(door_default,
                  "sluice_http_half_closed_answers_total") == before + 1
