"""Behind a proxy (issue 43 stage 4), through real sockets.

Every connection a proxy makes comes from the proxy's address, so without
--trusted-proxy the per-address limit (256 by default) counts every client
as one: 256 idle sockets from anyone lock everyone out. With
`--trusted-proxy 127.0.0.1` the door counts each connection from 127.0.0.1
as the client its PROXY header (v1 or v2) or its first head's
X-Forwarded-For names; from any other address (127.0.0.2 here) both are
ignored: a PROXY line is a bad head, X-Forwarded-For an ordinary field.
"""
import json
import socket
import struct
import time
import urllib.request

import pytest

from conftest import MODEL_NAME
from test_http_door import raise_nofile, read_answer, metric

DEADLINE = 2.0
OTHER = "127.0.0.2"  # not a trusted proxy


def v1(client, dport=8080):
    return b"PROXY TCP4 %s 127.0.0.1 40000 %d\r\n" % (client.encode(), dport)


def v2(client):
    sig = b"\r\n\r\n\x00\r\nQUIT\n"
    addrs = socket.inet_aton(client) + socket.inet_aton("127.0.0.1") + \
        struct.pack(">HH", 40000, 8080)
    tlv = b"\x04\x00\x03abc"  # a NOOP TLV, skipped
    body = addrs + tlv
    return sig + b"\x21\x11" + struct.pack(">H", len(body)) + body


def connect(srv, src="127.0.0.1"):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", srv.port))
    return s


def get_health(extra=b""):
    return (b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + extra +
            b"Connection: close\r\n\r\n")


def chat_request():
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]})
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body.encode()


def status_of(answer):
    if not answer.startswith(b"HTTP/1.1 "):
        return 0
    return int(answer[9:12])


def ask(srv, data, src="127.0.0.1", wait=10):
    s = connect(srv, src)
    t0 = time.time()
    s.sendall(data)
    got = read_answer(s, wait)
    s.close()
    return got, time.time() - t0


def wait_closed(srv):
    """Until the server holds no connection (an answered one lingers up to
    1 s at the door, and counts against its address until it is closed)."""
    end = time.time() + 5
    while metric(srv, "sluice_http_connections_open") > 1:  # this /metrics
        assert time.time() < end
        time.sleep(0.05)


def alive(s):
    """Open and silent: no answer, no EOF, no reset."""
    s.setblocking(False)
    try:
        s.recv(1, socket.MSG_PEEK)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


@pytest.fixture(scope="module")
def proxied(sluice_server):
    return sluice_server(["-c", "512", "--max-conns-per-ip", "4",
                          "--trusted-proxy", "10.0.0.0/8",
                          "--trusted-proxy", "127.0.0.1"])


def test_proxy_headers_name_the_client(proxied):
    srv = proxied
    held = []
    try:
        # the proxy's own idle sockets are not limited per address
        for _ in range(8):
            held.append(connect(srv))
        # four connections of one client, named by PROXY v1, idle after it
        for _ in range(4):
            s = connect(srv)
            s.sendall(v1("192.0.2.1"))
            held.append(s)
        time.sleep(0.5)
        assert all(alive(s) for s in held)
        fwd0 = metric(srv, "sluice_http_connections_forwarded_total")
        assert fwd0 >= 4
        # its fifth: 429 in JSON, at once
        got, dt = ask(srv, v1("192.0.2.1"))
        assert status_of(got) == 429 and dt < DEADLINE, got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == \
            "too_many_connections"
        # and by X-Forwarded-For too (the rightmost untrusted entry)
        got, _ = ask(srv, get_health(
            b"X-Forwarded-For: 198.51.100.9, 192.0.2.1, 10.1.2.3\r\n"))
        assert status_of(got) == 429, got
        # other clients through the same proxy are served: v1, v2, XFF,
        # with the PROXY header consumed before libmicrohttpd reads
        got, dt = ask(srv, v1("192.0.2.2") + chat_request())
        assert status_of(got) == 200 and b'"choices"' in got, got
        got, _ = ask(srv, v2("192.0.2.3") + get_health())
        assert status_of(got) == 200, got
        got, _ = ask(srv, get_health(b"X-Forwarded-For: 192.0.2.1, "
                                     b"198.51.100.4\r\n"))
        assert status_of(got) == 200, got
        # the header and the request in separate pieces
        s = connect(srv)
        hdr = v2("192.0.2.5")
        s.sendall(hdr[:7])
        time.sleep(0.2)
        s.sendall(hdr[7:])
        time.sleep(0.2)
        s.sendall(get_health())
        got = read_answer(s, 10)
        s.close()
        assert status_of(got) == 200, got
        assert metric(srv, "sluice_http_connections_forwarded_total") >= \
            fwd0 + 4
        # a malformed PROXY header from the proxy: 400 in JSON
        got, _ = ask(srv, b"PROXY TCP4 1.2.3.4 nope 1 2\r\n")
        assert status_of(got) == 400 and b'"error"' in got, got
    finally:
        for s in held:
            s.close()


def test_untrusted_addresses_are_not_believed(proxied):
    srv = proxied
    # a PROXY line from an address that is not a trusted proxy: a bad head
    got, _ = ask(srv, v1("192.0.2.7") + get_health(), src=OTHER)
    assert status_of(got) == 400, got
    wait_closed(srv)
    # X-Forwarded-For from it changes nothing: its own address is limited
    held = [connect(srv, OTHER) for _ in range(4)]
    try:
        time.sleep(0.3)
        # refused at once: EOF or reset, and the reset may come back before
        # connect() itself returns (the door closes right at accept)
        s = socket.socket()
        s.bind((OTHER, 0))
        s.settimeout(DEADLINE)
        try:
            s.connect(("127.0.0.1", srv.port))
            s.sendall(get_health(b"X-Forwarded-For: 192.0.2.8\r\n"))
            got = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            got = b""
        s.close()
        assert got == b"", got  # refused at accept, as any 5th socket
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("trusted", [False, True])
def test_idle_sockets_through_a_proxy(sluice_server, trusted):
    """The issue's case: 300 idle connections of one client through a TCP
    proxy (which connects when its client does) under the default limit of
    256. Without --trusted-proxy (the proxy sends no PROXY header: the
    server would refuse it) the first 256 hold every slot of the proxy's
    address and its other clients are refused; with it (and HAProxy's
    send-proxy) they hold only their own client's slots."""
    raise_nofile(1024)
    args = ["-c", "512"] + (["--trusted-proxy", "127.0.0.1"] if trusted
                            else [])
    srv = sluice_server(args)
    held = []
    hdr = (lambda c: v1(c)) if trusted else (lambda c: b"")
    try:
        for _ in range(300):
            try:
                s = connect(srv)
                if trusted:
                    s.sendall(hdr("203.0.113.66"))
                held.append(s)
            except OSError:
                pass
        time.sleep(0.5)
        n_alive = sum(alive(s) for s in held)
        try:
            got, dt = ask(srv, hdr("198.51.100.7") + get_health(), wait=5)
        except (ConnectionResetError, BrokenPipeError):
            got, dt = b"", 0
        if trusted:
            assert n_alive == 256, n_alive  # the rest got 429
            answers = [read_answer(s, 2) for s in held if not alive(s)]
            assert len(answers) == 44
            assert all(status_of(a) == 429 for a in answers), answers[:1]
            assert status_of(got) == 200 and dt < DEADLINE, (got, dt)
        else:
            assert n_alive == 256, n_alive  # the rest were reset
            assert got == b"", got  # the other client is locked out
    finally:
        for s in held:
            s.close()
