"""HTTP framing through real sockets: ambiguous framing headers (the ground
of request smuggling behind a proxy) get a 400 in the API's JSON shape, and
bytes that make no request line get a 400 and a close within 2 s, not a
connection held until the idle timeout.

Each request is crafted by hand and sent over a raw socket; the answer must
come, and the server must close the connection, within DEADLINE seconds.
"""
import json
import socket
import time

from conftest import MODEL_NAME

DEADLINE = 2.0
BODY = json.dumps({"model": MODEL_NAME, "max_tokens": 1,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
# the start of a TLS ClientHello: what a client speaking https sends here
TLS_HELLO = bytes.fromhex("1603010200010001fc0303") + bytes(range(11, 200))


def exchange(srv, data, sock=None, wait=DEADLINE + 1):
    """Sends data; reads until the server closes or `wait` seconds pass.
    Returns (status, headers, body, seconds, closed): status 0 when no
    answer came."""
    s = sock or socket.create_connection(("127.0.0.1", srv.port))
    s.settimeout(wait)
    t0 = time.time()
    s.sendall(data)
    got, closed = b"", False
    try:
        while time.time() - t0 < wait:
            d = s.recv(65536)
            if not d:
                closed = True
                break
            got += d
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    dt = time.time() - t0
    s.close()
    if b"\r\n\r\n" not in got:
        return 0, {}, b"", dt, closed
    head, body = got.split(b"\r\n\r\n", 1)
    lines = head.decode(errors="replace").split("\r\n")
    hdr = {k.strip().lower(): v.strip() for k, v in
           (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    return int(lines[0].split()[1]), hdr, body, dt, closed


def post(path, headers, body=BODY):
    return (b"POST " + path.encode() + b" HTTP/1.1\r\n" +
            b"".join(h.encode() + b"\r\n" for h in headers) + b"\r\n" + body)


def assert_400_json(res, anthropic=False):
    st, hdr, body, dt, closed = res
    assert st == 400, res
    assert hdr.get("content-type") == "application/json", res
    assert closed and dt < DEADLINE, res
    e = json.loads(body)
    if anthropic:
        assert e["type"] == "error", e
        assert e["error"]["type"] == "invalid_request_error", e
    else:
        assert e["error"]["type"] == "invalid_request_error", e
        assert e["error"]["code"] == "malformed_request", e
    return e


def test_two_content_lengths(server):
    for path, ant in (("/v1/chat/completions", False), ("/v1/messages", True)):
        e = assert_400_json(exchange(server, post(path, [
            "Host: localhost", "Content-Type: application/json",
            "Content-Length: %d" % len(BODY), "Content-Length: 5"])), ant)
        assert "Content-Length" in json.dumps(e)
    # the same value twice is refused too
    assert_400_json(exchange(server, post("/v1/chat/completions", [
        "Host: localhost", "Content-Length: %d" % len(BODY),
        "Content-Length: %d" % len(BODY)])))


def test_content_length_with_transfer_encoding(server):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    assert_400_json(exchange(server, post("/v1/chat/completions", [
        "Host: localhost", "Content-Length: 5", "Transfer-Encoding: chunked"],
        chunked)))
    # a coding other than chunked: the server used to wait for the close
    assert_400_json(exchange(server, post("/v1/messages", [
        "Host: localhost", "Transfer-Encoding: gzip"], b"")), anthropic=True)


def test_host_header(server):
    assert_400_json(exchange(server, b"GET /health HTTP/1.1\r\n\r\n"))
    assert_400_json(exchange(server, post("/v1/chat/completions", [
        "Host: a", "Host: b", "Content-Length: %d" % len(BODY)])))
    # HTTP/1.0 needs none; a well-framed request is served
    st, _, body, _, _ = exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert (st, json.loads(body)) == (200, {"status": "ok"})
    st, _, body, dt, closed = exchange(server, post("/v1/chat/completions", [
        "Host: localhost", "Content-Type: application/json", "Connection: close",
        "Content-Length: %d" % len(BODY)]), wait=120)
    assert st == 200 and json.loads(body)["choices"], body


def test_garbage_gets_400_and_close(server):
    assert_400_json(exchange(server, TLS_HELLO))
    # a request line that never ends
    assert_400_json(exchange(server, b"GET /health HTT"))


def test_garbage_after_a_request_on_a_kept_connection(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    got = b""
    while not got.endswith(b'{"status":"ok"}'):
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    # idle between requests, with no bytes: not cut (the idle timeout rules)
    time.sleep(1.5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    got = b""
    while not got.endswith(b'{"status":"ok"}'):
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    assert_400_json(exchange(server, TLS_HELLO, sock=s))
