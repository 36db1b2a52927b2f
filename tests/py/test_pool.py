"""The engine pool (issue 13): several models in one server, loaded on
first use, kept under --max-memory by unloading the least recently used
idle model, --pin, --idle-ttl, one load shared by concurrent first
requests, unknown models, a load that cannot fit, and the admin actions.

The models are three names for the default GGUF file (symlinks), so each
is a real model with its own engine; greedy text must be the same from
each."""
import concurrent.futures as cf
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import model_path, sluice_bin

NAMES = ("alpha", "beta", "gamma")
# one sequence of 2048 tokens: the KV pool does not depend on the budget
BASE = ["--max-seqs", "1", "-c", "2048"]
PROMPT = "Once upon a time, in a small village by the sea,"


def raw(srv, path, body=None, method=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        srv.base + path, data=data, method=method or
        ("POST" if data is not None else "GET"),
        headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def models(srv):
    st, body = raw(srv, "/v1/models")
    assert st == 200, body
    return {m["id"]: m for m in body["data"]}


def states(srv):
    return {k: m["state"] for k, m in models(srv).items()}


def complete(srv, model, n=6):
    return raw(srv, "/v1/completions", {
        "model": model, "prompt": PROMPT, "max_tokens": n,
        "temperature": 0})


def metric(srv, name, model):
    with urllib.request.urlopen(srv.base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    key = '%s{model="%s"} ' % (name, model)
    for line in text.splitlines():
        if line.startswith(key):
            return float(line[len(key):])
    raise AssertionError("no %s in /metrics" % key)


@pytest.fixture(scope="module")
def mdir(tmp_path_factory):
    if not model_path():
        pytest.skip("no model")
    d = tmp_path_factory.mktemp("models")
    for n in NAMES:
        os.symlink(model_path(), d / ("%s.gguf" % n))
    return d


@pytest.fixture(scope="module")
def pool_srv(sluice_server, mdir):
    return sluice_server(["--models", str(mdir)] + BASE, bare=True)


@pytest.fixture(scope="module")
def plan(pool_srv):
    """Bytes one model plans to hold (weights, KV pool, activations)."""
    st, body = raw(pool_srv, "/admin/api/models/alpha/load", {})
    assert st == 200, body
    p = models(pool_srv)["alpha"]["memory_bytes"]
    assert p > os.path.getsize(model_path()), p
    return p


def test_models_are_listed_before_they_load(sluice_server, mdir):
    srv = sluice_server(["--models", str(mdir)] + BASE, bare=True)
    ms = models(srv)
    assert sorted(ms) == sorted(NAMES), ms
    # no engine: the clear drains every stream of the devices instead
    st, body = raw(srv, "/admin/api/clear-cache", {})
    assert st == 200 and body["cleared"] == "drain_all", body
    assert all(m["state"] == "unloaded" for m in ms.values()), ms
    import openai
    c = openai.OpenAI(base_url=srv.base + "/v1", api_key="x")
    assert sorted(m.id for m in c.models.list()) == sorted(NAMES)
    # nothing loaded, the other routes still answer
    st, s = raw(srv, "/admin/api/stats")
    assert st == 200 and [m["state"] for m in s["models"]] == \
        ["unloaded"] * 3, s


def test_load_on_first_use(sluice_server, mdir):
    srv = sluice_server(["--models", str(mdir)] + BASE, bare=True)
    st, a = complete(srv, "alpha")
    assert st == 200, a
    assert states(srv) == {"alpha": "loaded", "beta": "unloaded",
                           "gamma": "unloaded"}
    st, b = complete(srv, "beta.gguf")  # the file's name is an alias
    assert st == 200, b
    # the same weights under two names: the same greedy text
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert states(srv)["beta"] == "loaded"
    assert metric(srv, "sluice_model_loads_total", "alpha") == 1
    assert metric(srv, "sluice_model_requests_total", "alpha") == 1


def test_concurrent_first_requests_share_one_load(pool_srv):
    assert states(pool_srv)["gamma"] == "unloaded"
    with cf.ThreadPoolExecutor(6) as ex:
        res = list(ex.map(lambda _: complete(pool_srv, "gamma"), range(6)))
    for st, body in res:
        assert st == 200, body
    assert len({b["choices"][0]["text"] for _, b in res}) == 1
    m = models(pool_srv)["gamma"]
    assert m["state"] == "loaded"
    assert metric(pool_srv, "sluice_model_loads_total", "gamma") == 1
    assert metric(pool_srv, "sluice_model_requests_total", "gamma") == 6


def test_unknown_model_is_404_in_each_api(pool_srv):
    import anthropic
    import openai
    o = openai.OpenAI(base_url=pool_srv.base + "/v1", api_key="x",
                      max_retries=0)
    with pytest.raises(openai.NotFoundError) as ei:
        o.chat.completions.create(model="nope", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}])
    assert ei.value.body["code"] == "model_not_found", ei.value.body
    a = anthropic.Anthropic(base_url=pool_srv.base, api_key="x",
                            max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as ei:
        a.messages.create(model="nope", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "not_found_error", ei.value.body
    st, body = raw(pool_srv, "/v1/models/nope")
    assert st == 404, body
    st, body = raw(pool_srv, "/v1/embeddings", {"model": "nope",
                                                 "input": "x"})
    assert st == 404, body
    # nothing was loaded for it
    assert metric(pool_srv, "sluice_model_load_failures_total", "beta") == 0


def test_lru_unloads_the_least_recently_used_idle_model(sluice_server, mdir,
                                                        plan):
    budget = int(2.5 * plan)  # room for two models, not three
    srv = sluice_server(["--models", str(mdir), "--max-memory", str(budget)]
                        + BASE, bare=True)
    for n in ("alpha", "beta"):
        st, body = complete(srv, n)
        assert st == 200, body
    assert states(srv) == {"alpha": "loaded", "beta": "loaded",
                           "gamma": "unloaded"}
    st, body = complete(srv, "gamma")
    assert st == 200, body
    assert states(srv) == {"alpha": "unloaded", "beta": "loaded",
                           "gamma": "loaded"}
    assert metric(srv, "sluice_model_evictions_total", "alpha") == 1
    # beta used after gamma: gamma is now the least recently used
    assert complete(srv, "beta")[0] == 200
    assert complete(srv, "alpha")[0] == 200
    assert states(srv) == {"alpha": "loaded", "beta": "loaded",
                           "gamma": "unloaded"}
    st, s = raw(srv, "/admin/api/stats")
    planned = sum(m["memory_bytes"] for m in s["models"])
    assert planned <= budget, (planned, budget)
    # one log line per stage of each load and unload
    log = srv.log_text()
    for line in ("gamma: loading", "gamma: making room: unloading alpha",
                 "alpha: unloading (evicted to make room)",
                 "alpha: unloaded in", "gamma: reading the weights",
                 "gamma: loaded in"):
        assert "sluice: " + line in log, (line, log)


def test_a_pinned_model_is_never_unloaded(sluice_server, mdir, plan):
    budget = int(2.5 * plan)
    srv = sluice_server(["--models", str(mdir), "--max-memory", str(budget),
                         "--pin", "alpha"] + BASE, bare=True)
    assert states(srv)["alpha"] == "loaded"  # pinned: loaded at start
    for n in ("beta", "gamma", "beta"):
        st, body = complete(srv, n)
        assert st == 200, body
        assert states(srv)["alpha"] == "loaded"
    assert metric(srv, "sluice_model_pinned", "alpha") == 1
    st, body = raw(srv, "/admin/api/models/alpha/unload", {})
    assert st == 409 and "pinned" in body["error"]["message"], body
    st, body = raw(srv, "/admin/api/models/alpha/unpin", {})
    assert st == 200 and body["pinned"] is False, body
    st, body = raw(srv, "/admin/api/models/alpha/unload", {})
    assert st == 200 and body["state"] == "unloaded", body


def test_a_model_serving_a_request_is_never_unloaded(sluice_server, mdir,
                                                     plan):
    budget = int(2.5 * plan)
    srv = sluice_server(["--models", str(mdir), "--max-memory", str(budget)]
                        + BASE, bare=True)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": "alpha", "prompt": PROMPT, "max_tokens": 1500,
        "temperature": 0, "stream": True}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data: "), first
    # alpha is the least recently used, but busy: beta goes instead
    assert complete(srv, "beta")[0] == 200
    st, body = complete(srv, "gamma")
    assert st == 200, body
    got = states(srv)
    assert got["alpha"] == "loaded" and got["beta"] == "unloaded", got
    st, body = raw(srv, "/admin/api/models/alpha/unload", {})
    assert st == 409 and "serving" in body["error"]["message"], body
    # the stream is still going
    line = resp.readline()
    while line in (b"\n", b"\r\n"):
        line = resp.readline()
    assert line.startswith(b"data: {"), line
    conn.close()


def test_a_load_that_cannot_fit_fails_that_request_alone(sluice_server,
                                                         mdir, plan):
    budget = int(2.5 * plan)
    srv = sluice_server(["--models", str(mdir), "--max-memory", str(budget),
                         "--pin", "alpha", "--pin", "beta"] + BASE,
                        bare=True)
    st, body = complete(srv, "gamma")
    assert st == 503, body
    assert body["error"]["code"] == "insufficient_memory", body
    assert "pinned" in body["error"]["message"], body
    assert states(srv)["gamma"] == "unloaded"
    assert complete(srv, "alpha")[0] == 200
    assert complete(srv, "beta")[0] == 200
    assert metric(srv, "sluice_model_load_failures_total", "gamma") == 1
    # a budget below one model's weights: every load fails, clearly, and
    # the server keeps answering
    small = sluice_server(["--models", str(mdir), "--max-memory", "50M"] +
                          BASE, bare=True)
    st, body = complete(small, "alpha")
    assert st == 503 and "memory budget" in body["error"]["message"], body
    st, body = raw(small, "/health")
    assert st == 200, body


def test_idle_ttl_unloads_and_the_next_request_loads_again(sluice_server,
                                                           mdir):
    srv = sluice_server(["--models", str(mdir), "--idle-ttl", "2",
                         "--pin", "gamma"] + BASE, bare=True)
    st, first = complete(srv, "alpha")
    assert st == 200, first
    assert states(srv)["alpha"] == "loaded"
    t0 = time.time()
    while states(srv)["alpha"] != "unloaded":
        assert time.time() - t0 < 30, models(srv)
        time.sleep(0.25)
    assert time.time() - t0 >= 1.0  # not before the TTL
    assert metric(srv, "sluice_model_reclaims_total", "alpha") == 1
    assert states(srv)["gamma"] == "loaded"  # pinned: no TTL
    st, again = complete(srv, "alpha")
    assert st == 200, again
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert metric(srv, "sluice_model_loads_total", "alpha") == 2


def test_admin_actions(pool_srv, plan):
    st, body = raw(pool_srv, "/admin/api/models/beta/load", {})
    assert st == 200 and body["state"] == "loaded", body
    st, body = raw(pool_srv, "/admin/api/models/beta/pin", {})
    assert st == 200 and body["pinned"] is True, body
    st, body = raw(pool_srv, "/admin/api/models/beta/unpin", {})
    assert st == 200 and body["pinned"] is False, body
    st, body = raw(pool_srv, "/admin/api/models/beta/clear", {})
    assert st == 200 and body["state"] == "loaded", body
    st, body = raw(pool_srv, "/admin/api/clear-cache", {})
    assert st == 200 and body["cleared"] == "engines", body
    assert body["engines"] >= 1, body
    st, body = raw(pool_srv, "/admin/api/models/beta/unload", {})
    assert st == 200 and body["state"] == "unloaded", body
    st, body = raw(pool_srv, "/admin/api/models/beta/clear", {})
    assert st == 409, body  # not loaded
    st, body = raw(pool_srv, "/admin/api/models/beta/explode", {})
    assert st == 404, body
    st, body = raw(pool_srv, "/admin/api/models/nope/load", {})
    assert st == 404, body
    st, body = raw(pool_srv, "/admin/api/models/beta/load")  # GET
    assert st == 405, body


def test_admin_actions_need_the_api_key(sluice_server, mdir):
    srv = sluice_server(["--models", str(mdir), "--api-key", "k"] + BASE,
                        bare=True)
    st, body = raw(srv, "/admin/api/models/alpha/load", {})
    assert st == 401, body
    st, body = raw(srv, "/admin/api/models/alpha/load", {},
                   headers={"Authorization": "Bearer k"})
    assert st == 200 and body["state"] == "loaded", body


def test_two_engines_decode_while_a_third_loads(sluice_server, mdir):
    """Two engines decode while a third loads: both answers are the ones
    each gives alone (tests/test_pool.c checks the clears' evidence)."""
    srv = sluice_server(["--models", str(mdir)] + BASE, bare=True)
    alone = {n: complete(srv, n, 40)[1]["choices"][0]["text"]
             for n in ("alpha", "beta")}
    out = {}

    def run(n):
        out[n] = complete(srv, n, 40)

    ts = [threading.Thread(target=run, args=(n,)) for n in ("alpha", "beta")]
    for t in ts:
        t.start()
    st, body = raw(srv, "/admin/api/models/gamma/load", {})
    assert st == 200, body
    for t in ts:
        t.join(300)
    for n in ("alpha", "beta"):
        st, body = out[n]
        assert st == 200, body
        assert body["choices"][0]["text"] == alone[n]
    assert set(states(srv).values()) == {"loaded"}


def test_sluice_models_lists_a_folder(mdir, tmp_path):
    """`sluice models DIR --json` against the gguf package's reading of the
    same file."""
    if not sluice_bin():
        pytest.skip("no sluice binary")
    import gguf
    r = gguf.GGUFReader(model_path())

    def field(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING \
            else int(v[0])
    out = subprocess.run([sluice_bin(), "models", str(mdir), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [os.path.basename(x["path"]) for x in rows] == \
        ["%s.gguf" % n for n in NAMES]
    arch = field("general.architecture")
    for x in rows:
        assert x["architecture"] == arch
        assert x["context_length"] == field("%s.context_length" % arch)
        assert x["parameters"] == sum(int(t.n_elements) for t in r.tensors)
        assert x["file_bytes"] == os.path.getsize(model_path())
        assert x["quantization"] == "Q4_1" and x["supported"] is True
    # a file that is not GGUF: a clear line, exit 1, the others still shown
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file at all")
    os.symlink(model_path(), tmp_path / "good.gguf")
    out = subprocess.run([sluice_bin(), "models", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "broken.gguf" in out.stdout and "error" in out.stdout, out.stdout
    assert "good.gguf" in out.stdout and "Q4_1" in out.stdout, out.stdout


def test_help_shows_every_flag_with_its_default():
    """Every option `sluice serve` parses is in --help, with its default."""
    if not sluice_bin():
        pytest.skip("no sluice binary")
    import pathlib
    import re
    src = (pathlib.Path(__file__).resolve().parents[2] / "src" / "cli" /
           "cmd_serve.c").read_text()
    # every spelling in the flag table (sluice/flags.h: one line a flag)
    flags = set()
    for names in re.findall(r'\{SL_FLAG_(?!GROUP)\w+, "(-[^"]+)"', src):
        flags.update(n.strip() for n in names.split(","))
    assert "--idle-ttl" in flags and len(flags) > 30, flags
    out = subprocess.run([sluice_bin(), "serve", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for f in sorted(flags - {"-h", "--help"}):
        hit = [ln for ln in lines
               if re.match(r"\s+(-\S+, )?%s\b" % re.escape(f), ln)]
        assert hit, "--help does not list %s" % f
        assert "(default: " in hit[0], hit[0]


def test_default_context_is_the_models_training_context(sluice_server,
                                                        mdir):
    """Without -c, a model's context is its training context (as
    llama-server's), bounded by what its KV cache can hold under
    --max-memory."""
    import gguf
    r = gguf.GGUFReader(model_path())
    f = r.fields["llama.context_length"]
    train = int(f.parts[f.data[0]][0])
    srv = sluice_server(["--models", str(mdir), "--max-seqs", "2"],
                        bare=True)
    assert complete(srv, "alpha")[0] == 200
    assert models(srv)["alpha"]["context_length"] == train
    # a prompt past the old fixed 2048
    long_prompt = "word " * 2500
    st, body = raw(srv, "/v1/completions", {
        "model": "alpha", "prompt": long_prompt, "max_tokens": 2,
        "temperature": 0})
    assert st == 200, body
    assert body["usage"]["prompt_tokens"] > 2048, body["usage"]
    # under a budget, the context is what the KV cache holds
    small = sluice_server(["--models", str(mdir), "--max-memory", "300M"],
                          bare=True)
    assert complete(small, "alpha")[0] == 200
    ctx = models(small)["alpha"]["context_length"]
    assert 256 <= ctx < train, ctx
    st, body = raw(small, "/v1/completions", {
        "model": "alpha", "prompt": "word " * (ctx + 10), "max_tokens": 2})
    assert st == 400, body
    assert body["error"]["code"] == "context_length_exceeded", body


def test_embeddings_are_served_by_the_model_the_request_names(pool_srv):
    """/v1/embeddings goes through the pool: the model named is loaded if
    needed, and two names of the same weights give the same vectors."""
    texts = ["the river runs to the sea", "a cat sat on the mat"]
    got = {}
    for n in ("alpha", "beta"):
        st, body = raw(pool_srv, "/v1/embeddings", {"model": n,
                                                    "input": texts})
        assert st == 200, body
        assert body["model"] == n
        got[n] = [d["embedding"] for d in body["data"]]
        assert states(pool_srv)[n] == "loaded"
    assert len(got["alpha"]) == 2 and len(got["alpha"][0]) > 100
    for a, b in zip(got["alpha"], got["beta"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6


def test_a_load_holds_no_http_thread(sluice_server, mdir):
    """With one HTTP thread, requests for a loaded model and /health are
    answered while another model loads (the waiting requests' connections
    are parked, not the thread), and every request for the loading model
    gets its answer when the load ends."""
    env = dict(os.environ, SLUICE_POOL_LOAD_DELAY_MS="5000")
    srv = sluice_server(["--models", str(mdir), "--pin", "alpha",
                         "--http-threads", "1"] + BASE, bare=True, env=env)
    got = []
    ts = [threading.Thread(target=lambda: got.append(complete(srv, "beta")))
          for _ in range(3)]
    t0 = time.time()
    for t in ts:
        t.start()
    t_wait = time.time()
    while states(srv)["beta"] != "loading":
        assert time.time() - t_wait < 30
        time.sleep(0.05)
    t1 = time.time()
    st, body = complete(srv, "alpha", 2)
    assert st == 200, body
    st, _ = raw(srv, "/health")
    assert st == 200
    took = time.time() - t1
    assert states(srv)["beta"] == "loading", "the load ended first"
    assert took < 4.0, took
    for t in ts:
        t.join(120)
    assert len(got) == 3 and all(st == 200 for st, _ in got), got
    assert time.time() - t0 >= 4.5  # they did wait for the load
    assert metric(srv, "sluice_model_loads_total", "beta") == 1


def test_shutdown_while_requests_wait_for_a_load(sluice_server, mdir):
    """SIGTERM while requests wait for a model's load: the load ends, they
    are answered 503 shutting_down, and the server exits 0."""
    import signal
    env = dict(os.environ, SLUICE_POOL_LOAD_DELAY_MS="3000")
    srv = sluice_server(["--models", str(mdir), "--pin", "alpha"] + BASE,
                        bare=True, env=env)
    got = []
    t = threading.Thread(target=lambda: got.append(complete(srv, "gamma")))
    t.start()
    t_wait = time.time()
    while states(srv)["gamma"] != "loading":
        assert time.time() - t_wait < 30
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) == 0, srv.log_text()
    t.join(60)
    assert got and got[0][0] == 503, got
    assert got[0][1]["error"]["code"] == "shutting_down", got
