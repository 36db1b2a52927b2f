"""The admin dashboard (issue 13) in a real browser: headless Chromium
(Debian's chromium and chromium-driver) driven through Selenium, with the
network limited to this server.

- Each panel shows live numbers while a model loads (a load slowed by
  SLUICE_POOL_LOAD_DELAY_MS, so that it can be watched).
- The chat page streams an answer: the text the page builds from the SSE
  deltas is the API's own greedy answer.
- Pressing a model's unload button unloads it.
- A screenshot of each panel is saved in $SLUICE_SCREENSHOT_DIR (default
  /tmp/sluice-dashboard): models.png, memory.png, kv.png, clears.png,
  recent.png, chat.png, chat-thinking.png.
- A reasoning model's thinking shows folded above the answer (issue 45).
- The models table shows the speculative drafts kept (issue 47; the
  server runs with --speculative ngram).

Skips, saying why, only where Chromium cannot start."""
import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import chromium, model_path

SHOTS = os.environ.get("SLUICE_SCREENSHOT_DIR", "/tmp/sluice-dashboard")
NAMES = ("alpha", "beta")
BASE = ["--max-seqs", "2", "-c", "1024"]


def post(srv, path, body):
    req = urllib.request.Request(srv.base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def states(srv):
    with urllib.request.urlopen(srv.base + "/v1/models", timeout=60) as r:
        return {m["id"]: m["state"] for m in json.loads(r.read())["data"]}


@pytest.fixture(scope="module")
def browser():
    d = chromium()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def srv(sluice_server, tmp_path_factory):
    if not model_path():
        pytest.skip("no model")
    d = tmp_path_factory.mktemp("dash_models")
    for n in NAMES:
        os.symlink(model_path(), d / ("%s.gguf" % n))
    env = dict(os.environ, SLUICE_POOL_LOAD_DELAY_MS="3000")
    return sluice_server(["--models", str(d), "--pin", "alpha",
                          "--speculative", "ngram"] + BASE,
                         bare=True, env=env)


def wait_for(fn, timeout=60, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def updates(b):
    return int(b.execute_script("return +document.body.dataset.updates||0"))


def shot(b, element_id, name):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, name)
    b.find_element("id", element_id).screenshot(path)
    assert os.path.getsize(path) > 1000, path
    return path


def row_state(b, model):
    return b.execute_script(
        "const r = document.querySelector('#models tr[data-model=\"' + "
        "arguments[0] + '\"]'); return r ? r.children[1].textContent : null",
        model)


def test_panels_show_live_numbers_while_a_model_loads(browser, srv):
    b = browser
    b.get(srv.base + "/admin")
    wait_for(lambda: updates(b) >= 2, what="the page's first updates")
    # a request, so that the recent list and the counters have something
    # (a repetitive one: prompt lookup drafts for it)
    post(srv, "/v1/completions", {"model": "alpha", "prompt": "Hello",
                                  "max_tokens": 8, "temperature": 0})
    post(srv, "/v1/completions", {
        "model": "alpha", "max_tokens": 24, "temperature": 0,
        "prompt": "red, green, blue, red, green, blue, red, green, blue, red,"})
    done = threading.Event()
    t = threading.Thread(target=lambda: (post(
        srv, "/admin/api/models/beta/load", {}), done.set()))
    t.start()
    wait_for(lambda: row_state(b, "beta") == "loading", timeout=30,
             what="beta shown loading")
    n0 = updates(b)
    seen = []
    while not done.is_set():
        seen.append((updates(b), row_state(b, "beta")))
        time.sleep(0.2)
    t.join()
    during = [u for u, st in seen if st == "loading"]
    assert during and max(during) - n0 >= 1, seen  # it kept updating
    wait_for(lambda: row_state(b, "beta") == "loaded", what="beta loaded")
    # every panel has numbers in it now
    mem = b.execute_script(
        "return [...document.querySelectorAll('#memchart polyline')]"
        ".map(p => [p.dataset.series, p.getAttribute('points').split(' ')"
        ".length])")
    assert {s for s, _ in mem} >= {"active", "footprint", "limit"}, mem
    assert all(n >= 2 for _, n in mem), mem
    text = b.find_element("id", "memnow").text
    assert "footprint" in text and "MiB" in text, text
    kv = b.find_element("id", "kv").text
    assert "KV blocks" in kv and "total" in kv, kv
    clears = b.find_element("id", "clears").text
    assert "clears" in clears, clears
    recent = b.find_element("id", "recent").text
    assert "alpha" in recent and "200" in recent, recent
    models = b.find_element("id", "models").text
    assert "alpha" in models and "beta" in models, models
    # alpha's drafts: "kept / verified (share%)"
    spec = wait_for(lambda: b.execute_script(
        "const r = document.querySelector('#models tr[data-model=\"alpha\"]');"
        " return r ? r.querySelector('td.spec').textContent : null"),
        what="alpha's drafts shown")
    kept, _, rest = spec.partition(" / ")
    assert int(kept) > 0 and rest.endswith("%)"), spec
    # nothing was fetched from anywhere but this server
    urls = b.execute_script("return performance.getEntriesByType('resource')"
                            ".map(e => e.name)")
    assert urls and all(u.startswith(srv.base + "/") for u in urls), urls
    for el, name in (("panel-models", "models.png"),
                     ("panel-memory", "memory.png"), ("panel-kv", "kv.png"),
                     ("panel-clears", "clears.png"),
                     ("panel-recent", "recent.png")):
        shot(b, el, name)


def test_chat_page_streams_an_answer(browser, srv):
    b = browser
    ref = post(srv, "/v1/chat/completions", {
        "model": "alpha", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Name three rivers."}]})
    want = ref["choices"][0]["message"]["content"]
    b.get(srv.base + "/admin#chat")
    wait_for(lambda: b.execute_script(
        "return document.getElementById('chat-model').options.length") >= 2,
        what="the model list")
    b.execute_script(
        "document.getElementById('chat-model').value = 'alpha';"
        "document.getElementById('chat-max').value = '24';"
        "document.getElementById('chat-input').value = 'Name three rivers.';")
    b.find_element("id", "chat-send").click()
    wait_for(lambda: b.find_element("id", "chat-state").text in
             ("done",) or b.find_element("id", "chat-state").text.startswith(
                 "error"), what="the answer's end")
    assert b.find_element("id", "chat-state").text == "done"
    chunks = int(b.execute_script(
        "return +document.getElementById('answer').dataset.chunks || 0"))
    assert chunks >= 2, chunks  # streamed, not one piece
    got = b.execute_script("return document.getElementById('answer')"
                           ".textContent")
    assert got == want, (got, want)
    shot(b, "chat", "chat.png")


@pytest.fixture(scope="module")
def think_srv(sluice_server, tmp_path_factory):
    """The default model with a Qwen3-style thinking template, its thinking
    closed after 8 tokens (--reasoning-budget) so that an answer follows."""
    import subprocess
    import sys
    from test_api_reasoning import thinking_template
    out = tmp_path_factory.mktemp("dash_think") / "thinker.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                    model_path(), str(out), "--chat-template",
                    thinking_template(), "--force"], check=True,
                   capture_output=True)
    return sluice_server(["-m", str(out), "--model-name", "thinker", "-c",
                          "1024", "--reasoning-budget", "8"], bare=True)


def test_chat_page_folds_the_thinking(browser, think_srv):
    """A reasoning model's thinking (delta.reasoning_content) shows folded
    above the answer: the page's two texts are the API's reasoning_content
    and content for the same request, and a click unfolds the thinking."""
    b, s = browser, think_srv
    q = "Write a long story about a dragon."
    ref = post(s, "/v1/chat/completions", {
        "model": "thinker", "max_tokens": 40, "temperature": 0,
        "messages": [{"role": "user", "content": q}]})["choices"][0]
    assert ref["message"]["reasoning_content"] and ref["message"]["content"]
    b.get(s.base + "/admin#chat")
    wait_for(lambda: b.execute_script(
        "return document.getElementById('chat-model').options.length") >= 1,
        what="the model list")
    b.execute_script(
        "document.getElementById('chat-model').value = 'thinker';"
        "document.getElementById('chat-max').value = '40';"
        "document.getElementById('chat-input').value = arguments[0];", q)
    b.find_element("id", "chat-send").click()
    wait_for(lambda: b.find_element("id", "chat-state").text == "done" or
             b.find_element("id", "chat-state").text.startswith("error"),
             what="the answer's end")
    assert b.find_element("id", "chat-state").text == "done"
    js = "return document.getElementById(arguments[0])"
    assert b.execute_script(js + ".textContent", "thinking-text") == \
        ref["message"]["reasoning_content"]
    assert b.execute_script(js + ".textContent", "answer") == \
        ref["message"]["content"]
    th = b.find_element("id", "thinking")
    assert th.is_displayed() and not b.execute_script(js + ".open",
                                                      "thinking")
    assert int(b.find_element("id", "thinking-n").text) >= 2  # streamed
    assert not b.find_element("id", "thinking-text").is_displayed()  # folded
    b.find_element("css selector", "#thinking summary").click()
    wait_for(lambda: b.find_element("id", "thinking-text").is_displayed(),
             what="the thinking unfolded")
    shot(b, "chat", "chat-thinking.png")
    # the next answer starts a new fold: reset, closed again
    ref2 = post(s, "/v1/chat/completions", {
        "model": "thinker", "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "Hi"}]})["choices"][0]
    b.execute_script("document.getElementById('chat-input').value = 'Hi';"
                     "document.getElementById('chat-max').value = '3';")
    b.find_element("id", "chat-send").click()
    wait_for(lambda: b.execute_script(js + ".textContent", "thinking-text") ==
             ref2["message"]["reasoning_content"] and
             b.find_element("id", "chat-state").text == "done",
             what="the second answer")
    assert not b.execute_script(js + ".open", "thinking")


def test_pressing_unload_unloads_the_model(browser, srv):
    b = browser
    if states(srv)["beta"] != "loaded":
        post(srv, "/admin/api/models/beta/load", {})
    b.get(srv.base + "/admin")
    wait_for(lambda: row_state(b, "beta") == "loaded", what="beta loaded")
    b.find_element("css selector",
                   "#models tr[data-model='beta'] button.act-unload").click()
    wait_for(lambda: states(srv)["beta"] == "unloaded",
             what="beta unloaded on the server")
    wait_for(lambda: row_state(b, "beta") == "unloaded",
             what="the page showing it")
    # the pinned one cannot be unloaded: the page says why
    b.find_element("css selector",
                   "#models tr[data-model='alpha'] button.act-unload").click()
    wait_for(lambda: "pinned" in b.find_element("id", "msg").text,
             what="the refusal shown")
    assert states(srv)["alpha"] == "loaded"


def test_with_an_api_key_the_page_asks_for_it(browser, sluice_server,
                                              tmp_path):
    """The page itself holds no data; every number comes from routes behind
    the key, which the page asks for once."""
    os.symlink(model_path(), tmp_path / "alpha.gguf")
    srv = sluice_server(["--models", str(tmp_path), "--api-key", "s3cret",
                         "--pin", "alpha"] + BASE, bare=True)
    req = urllib.request.Request(srv.base + "/admin/api/stats")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=30)
    assert ei.value.code == 401
    b = browser
    b.get(srv.base + "/admin")
    from selenium.webdriver.support.ui import WebDriverWait
    alert = WebDriverWait(b, 30).until(lambda d: d.switch_to.alert)
    alert.send_keys("s3cret")
    alert.accept()
    wait_for(lambda: row_state(b, "alpha") == "loaded",
             what="the models shown once the key is given")
    assert updates(b) >= 1
