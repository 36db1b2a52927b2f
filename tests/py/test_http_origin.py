"""Whom the server answers (issue 43 stage 1), through real sockets and a
real browser.

With no --api-key (the default), a web page that a local user visits could
drive the server: a form or a no-cors fetch to an admin route, or, after
DNS rebinding, same-origin requests under the attacker's name. So:

- a Host that is not one of the server's names (loopback names and
  addresses, the bound address, --allowed-host) gets 403 in the route's
  error shape, and nothing of the answer it would have had;
- an Origin that is neither the server's own nor one --cors-origin allows
  gets 403 (preflights too);
- every POST whose body is not sent as application/json gets 415;
- refusals are counted in /metrics (sluice_http_refused_total).

In headless Chromium, a page served from another local port fails at each
admin action and at a chat POST (forms, no-cors and CORS fetches), while the
dashboard's own actions succeed; a page under a rebound name (Chromium maps
attacker.example to 127.0.0.1) gets 403 for the dashboard and its stats.
"""
import http.client
import http.server
import json
import os
import threading
import time
import urllib.request

import pytest

from conftest import chromium, metric, model_path

CHAT = {"model": "alpha", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}
JSON = {"Content-Type": "application/json"}


def request(srv, method, path, body=None, headers=None):
    """(status, headers, body bytes); `headers` may set Host itself."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    data = (json.dumps(body).encode() if isinstance(body, (dict, list))
            else body)
    c.request(method, path, body=data, headers=headers or {})
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    c.close()
    return out


def states(srv):
    st, _, b = request(srv, "GET", "/v1/models")
    assert st == 200, b
    return {m["id"]: m["state"] for m in json.loads(b)["data"]}


def refused(srv, reason):
    return metric(srv, 'sluice_http_refused_total{reason="%s"}' % reason)


@pytest.fixture(scope="module")
def srv(sluice_server, tmp_path_factory):
    if not model_path():
        pytest.skip("no model")
    d = tmp_path_factory.mktemp("origin_models")
    for n in ("alpha", "beta"):
        os.symlink(model_path(), d / ("%s.gguf" % n))
    s = sluice_server(["--models", str(d), "-c", "1024", "--max-seqs", "2"],
                      bare=True)
    st, _, b = request(s, "POST", "/admin/api/models/alpha/load", {}, JSON)
    assert st == 200, b
    assert states(s)["alpha"] == "loaded"
    return s


def openai_error(body, code):
    e = json.loads(body)["error"]
    assert e["code"] == code and e["message"], e


def anthropic_error(body, etype):
    e = json.loads(body)
    assert e["type"] == "error" and e["error"]["type"] == etype, e


FOREIGN = ["attacker.example", "attacker.example:%d",
           "localhost.attacker.example:%d", "127.0.0.1.nip.example", "",
           "192.168.1.5:%d"]


def test_foreign_host_is_403_in_each_shape(srv):
    for h in FOREIGN:
        host = h % srv.port if "%d" in h else h
        for method, path, body in [("GET", "/admin/api/stats", None),
                                   ("GET", "/admin", None),
                                   ("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions", CHAT),
                                   ("POST", "/admin/api/clear-cache", {})]:
            st, _, b = request(srv, method, path, body,
                               dict(JSON, Host=host))
            assert st == 403, (host, path, st, b)
            openai_error(b, "host_not_allowed")
            assert model_path().encode() not in b and b"alpha" not in b
        st, _, b = request(srv, "POST", "/v1/messages",
                           dict(CHAT, max_tokens=2), dict(JSON, Host=host))
        assert st == 403, (host, b)
        anthropic_error(b, "permission_error")


def test_own_names_are_served(srv):
    for host in ["localhost:%d" % srv.port, "127.0.0.1:%d" % srv.port,
                 "[::1]:%d" % srv.port, "LOCALHOST", "127.0.0.1",
                 "app.localhost:%d" % srv.port]:
        st, _, b = request(srv, "GET", "/admin/api/stats", None,
                           {"Host": host})
        assert st == 200, (host, b)
    # HTTP/1.0 without Host: no browser sends it; served
    import socket
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(
        b"HTTP/1.1 200"), data[:80]


def test_foreign_origin_is_403(srv):
    before = refused(srv, "origin")
    n = 0
    for origin in ["http://evil.example", "null",
                   "http://127.0.0.1:%d" % (srv.port + 1),
                   "http://localhost:%d" % srv.port]:  # Host says 127.0.0.1
        for method, path, body in [("POST", "/admin/api/clear-cache", {}),
                                   ("POST", "/admin/api/models/alpha/unload",
                                    {}),
                                   ("POST", "/v1/chat/completions", CHAT),
                                   ("GET", "/admin/api/stats", None)]:
            st, h, b = request(srv, method, path, body,
                               dict(JSON, Origin=origin))
            assert st == 403, (origin, path, st, b)
            openai_error(b, "origin_not_allowed")
            assert "access-control-allow-origin" not in h
            n += 1
        # the preflight of a CORS request is refused too
        st, h, _ = request(srv, "OPTIONS", "/v1/chat/completions", None,
                           {"Origin": origin,
                            "Access-Control-Request-Method": "POST",
                            "Access-Control-Request-Headers": "content-type"})
        assert st == 403 and "access-control-allow-origin" not in h, st
        n += 1
    assert refused(srv, "origin") - before == n
    assert states(srv)["alpha"] == "loaded"
    # the server's own origin (the dashboard's POSTs carry it)
    own = "http://127.0.0.1:%d" % srv.port
    st, _, b = request(srv, "POST", "/admin/api/clear-cache", {},
                       dict(JSON, Origin=own))
    assert st == 200, b


BAD_TYPES = [None, "text/plain", "text/plain;charset=UTF-8",
             "application/x-www-form-urlencoded",
             "multipart/form-data; boundary=x", "application/jsonx"]
POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/messages",
         "/v1/messages/count_tokens", "/tokenize", "/detokenize",
         "/apply-template", "/v1/embeddings", "/admin/api/clear-cache",
         "/admin/api/models/alpha/unload", "/admin/api/models/beta/load"]


def test_post_needs_json(srv):
    before = refused(srv, "content_type")
    n = 0
    for path in POSTS:
        for ct in BAD_TYPES:
            hdrs = {"Content-Type": ct} if ct else {}
            st, _, b = request(srv, "POST", path, b"{}" if n % 2 else b"",
                               hdrs)
            assert st == 415, (path, ct, st, b)
            if path.startswith("/v1/messages"):
                anthropic_error(b, "invalid_request_error")
            else:
                openai_error(b, "unsupported_media_type")
            n += 1
    assert refused(srv, "content_type") - before == n
    s = states(srv)
    assert s["alpha"] == "loaded" and s["beta"] != "loaded", s
    # parameters and case are fine
    st, _, b = request(srv, "POST", "/tokenize", {"content": "hi"},
                       {"Content-Type": "Application/JSON; charset=utf-8"})
    assert st == 200, b
    # a GET needs no content type
    st, _, _ = request(srv, "GET", "/v1/models")
    assert st == 200


def test_flags_widen_the_rules(sluice_server):
    s = sluice_server(["-c", "512", "--allowed-host", "box.lan",
                       "--allowed-host", ".corp.example",
                       "--cors-origin", "http://tool.example"])
    for host, ok in [("box.lan:%d" % s.port, True), ("a.corp.example", True),
                     ("corp.example", True), ("a.box.lan", False),
                     ("xcorp.example", False), ("attacker.example", False)]:
        st, _, b = request(s, "GET", "/admin/api/stats", None, {"Host": host})
        assert st == (200 if ok else 403), (host, st, b)
    st, h, b = request(s, "POST", "/tokenize", {"content": "hi"},
                       dict(JSON, Origin="http://tool.example"))
    assert st == 200, b
    assert h["access-control-allow-origin"] == "http://tool.example"
    st, _, _ = request(s, "POST", "/tokenize", {"content": "hi"},
                       dict(JSON, Origin="http://evil.example"))
    assert st == 403


def test_bad_flag_values_exit_2(tmp_path):
    import subprocess
    from conftest import sluice_bin
    if not sluice_bin():
        pytest.skip("no sluice binary")
    for v in ["", "a b", "user@host", "a/b"]:
        p = subprocess.run([sluice_bin(), "serve", "-m", model_path(),
                            "--allowed-host", v], capture_output=True,
                           timeout=60)
        assert p.returncode == 2, (v, p.returncode, p.stderr)
        assert b"--allowed-host" in p.stderr, p.stderr


# ---- in a browser ----------------------------------------------------------

EVIL_PAGE = """<!doctype html><html><body>
<iframe name="sink" id="sink"></iframe>
<form id="f1" method="POST" enctype="text/plain" target="sink"
      action="TARGET/v1/chat/completions">
  <input name='{"model":"alpha","messages":[{"role":"user","content":"x"}],"x":"'
         value='"}'></form>
<form id="f2" method="POST" target="sink"
      action="TARGET/admin/api/models/alpha/unload">
  <input name="a" value="b"></form>
</body></html>"""

ATTACK = """
const done = arguments[arguments.length - 1];
const T = arguments[0];
const out = {};
async function attempt(name, url, opts) {
  try {
    const r = await fetch(url, opts);
    out[name] = r.type === "opaque" ? "opaque" : r.status;
  } catch (e) {
    out[name] = "blocked";
  }
}
(async () => {
  await attempt("clear_nocors", T + "/admin/api/clear-cache",
                {method: "POST", mode: "no-cors",
                 headers: {"Content-Type": "text/plain"}, body: "{}"});
  await attempt("unload_nocors", T + "/admin/api/models/alpha/unload",
                {method: "POST", mode: "no-cors"});
  await attempt("chat_cors", T + "/v1/chat/completions",
                {method: "POST", headers: {"Content-Type": "application/json"},
                 body: JSON.stringify({model: "alpha", max_tokens: 2,
                   messages: [{role: "user", content: "hi"}]})});
  await attempt("stats_cors", T + "/admin/api/stats", {});
  document.getElementById("f1").submit();
  await new Promise(r => setTimeout(r, 1500));
  document.getElementById("f2").submit();
  await new Promise(r => setTimeout(r, 1500));
  done(out);
})();
"""


@pytest.fixture(scope="module")
def evil_site(srv, tmp_path_factory):
    """A page served from another local port (another origin)."""
    d = tmp_path_factory.mktemp("evil")
    (d / "evil.html").write_text(
        EVIL_PAGE.replace("TARGET", "http://127.0.0.1:%d" % srv.port))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(d), **k)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield "http://localhost:%d" % httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    d = chromium(["--host-resolver-rules=MAP attacker.example 127.0.0.1"])
    d.set_script_timeout(60)
    yield d
    d.quit()


def test_page_of_another_origin_cannot_drive_the_server(browser, srv,
                                                        evil_site):
    clears = metric(srv, "sluice_cache_clears_total")
    before = refused(srv, "origin")
    browser.get(evil_site + "/evil.html")
    out = browser.execute_async_script(ATTACK, "http://127.0.0.1:%d" % srv.port)
    # the browser sent each, the server refused each: nothing readable
    assert out == {"clear_nocors": "opaque", "unload_nocors": "opaque",
                   "chat_cors": "blocked", "stats_cors": "blocked"}, out
    # 2 no-cors POSTs, the chat's preflight, the stats GET, 2 form POSTs
    assert refused(srv, "origin") - before >= 6
    assert states(srv)["alpha"] == "loaded"
    assert metric(srv, "sluice_cache_clears_total") == clears
    # nothing was generated for the form's chat POST either
    st, _, b = request(srv, "GET", "/admin/api/stats")
    assert st == 200


def test_dashboard_actions_still_work(browser, srv):
    before = {r: refused(srv, r) for r in ("host", "origin", "content_type")}
    clears = metric(srv, "sluice_cache_clears_total")
    browser.get(srv.base + "/admin")
    t0 = time.time()
    while time.time() - t0 < 30 and not browser.execute_script(
            "return +document.body.dataset.updates||0"):
        time.sleep(0.1)
    browser.find_element("id", "clear-all").click()
    t0 = time.time()
    while (time.time() - t0 < 30 and
           metric(srv, "sluice_cache_clears_total") == clears):
        time.sleep(0.1)
    assert metric(srv, "sluice_cache_clears_total") > clears
    # the page's chat streams an answer through its own origin
    browser.get(srv.base + "/admin#chat")
    t0 = time.time()
    while time.time() - t0 < 30 and browser.execute_script(
            "return document.getElementById('chat-model').options.length"
    ) < 2:
        time.sleep(0.1)
    browser.execute_script(
        "document.getElementById('chat-model').value = 'alpha';"
        "document.getElementById('chat-max').value = '8';"
        "document.getElementById('chat-input').value = 'Hello';")
    browser.find_element("id", "chat-send").click()
    t0 = time.time()
    state = ""
    while time.time() - t0 < 120:
        state = browser.find_element("id", "chat-state").text
        if state == "done" or state.startswith("error"):
            break
        time.sleep(0.2)
    assert state == "done", state
    after = {r: refused(srv, r) for r in before}
    assert after == before, (before, after)


def test_rebound_name_gets_403(browser, srv):
    before = refused(srv, "host")
    browser.get("http://attacker.example:%d/admin" % srv.port)
    assert "host_not_allowed" in browser.page_source
    st = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/admin/api/stats').then(r => r.text().then("
        "t => done([r.status, t]))).catch(e => done(['error', '' + e]));")
    assert st[0] == 403 and "host_not_allowed" in st[1], st
    assert "alpha" not in st[1]
    assert refused(srv, "host") - before >= 2
