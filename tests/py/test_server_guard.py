"""`sluice serve` at its limits, end to end through real sockets and the
official SDKs (issue 10, items 2 and 3):

- a shutdown (SIGTERM) never reports a cut-off answer as complete: a
  request cut by the end of the grace period gets a 503 with retry-after
  (non-streamed) or an error event that the SDKs raise on (streamed); a
  request still queued gets a 503 at once;
- the memory guard queues: a request that fits the memory limit alone is
  served (a missing max_tokens no longer reserves the whole context; six
  at once take turns), one that cannot fit even alone gets a 4xx saying
  so, and one that waits past --queue-timeout-ms gets a 503 with
  retry-after.

Skipped without the model, the binary or the SDKs (see conftest.py).
"""
import concurrent.futures as cf
import http.client
import json
import signal
import threading
import time

import pytest

from conftest import MODEL_NAME

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

# a prompt the default model continues for as long as it is allowed to
COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"
COUNT_CHAT = "Count from 1 to 1000, separated by commas."
BLOCK_TOKENS = 16  # the server's default --kv-block-tokens


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def ant(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key="none",
                               max_retries=0, timeout=300)


def raw(srv, path, body, timeout=300):
    """(status, headers with lower-case names, parsed JSON body)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, \
        json.loads(data)


def stats(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("GET", "/admin/api/stats")
    body = json.loads(c.getresponse().read())
    c.close()
    return body


def wait_engine(srv, running, waiting, timeout=60):
    t0 = time.time()
    while True:
        e = stats(srv)["engine"]
        if e["running"] >= running and e["waiting"] >= waiting:
            return
        assert time.time() - t0 < timeout, e
        time.sleep(0.02)


def in_thread(fn):
    """Runs fn in a thread; returns (thread, result dict: "r" or "e")."""
    out = {}

    def run():
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def assert_retry_after(headers):
    assert "retry-after" in headers, headers
    assert int(headers["retry-after"]) >= 1


# ---- shutdown: cut-off answers end as errors ------------------------------------

def test_sigterm_cut_and_queued_requests_get_503(sluice_server):
    """Non-streamed: the running request, cut by the end of the grace
    period, and the queued one (--max-seqs 1) both get a 503 in their API's
    shape with retry-after, never a 200 with a truncated or empty text."""
    srv = sluice_server(["-c", "2048", "--grace-ms", "1000",
                         "--max-seqs", "1"])
    t1, running = in_thread(lambda: raw(srv, "/v1/completions", {
        "model": MODEL_NAME, "prompt": COUNT, "max_tokens": 1500,
        "temperature": 0}))
    wait_engine(srv, running=1, waiting=0)
    t2, queued = in_thread(lambda: raw(srv, "/v1/messages", {
        "model": MODEL_NAME, "max_tokens": 200,
        "messages": [{"role": "user", "content": "Say hi."}]}))
    wait_engine(srv, running=1, waiting=1)
    t_sig = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    t1.join(120)
    t2.join(120)
    assert srv.proc.wait(60) == 0, srv.log_text()

    st, hdr, body = queued["r"]
    assert st == 503, body  # the old code: 200, empty text, "end_turn"
    assert body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error", body
    assert "not started" in body["error"]["message"]
    assert_retry_after(hdr)

    st, hdr, body = running["r"]
    assert st == 503, body  # the old code: 200, finish_reason "stop"
    assert body["error"]["code"] == "shutting_down", body
    assert body["error"]["type"] == "server_error"
    assert "cut off" in body["error"]["message"]
    assert_retry_after(hdr)
    assert time.time() - t_sig < 30


def test_sigterm_streams_end_with_an_error_the_sdks_raise(sluice_server):
    """Streamed: the OpenAI stream ends with an error chunk and no [DONE],
    the Anthropic stream with an overloaded_error event; both SDKs raise,
    after the text so far. A queued streamed request gets a 503 at once."""
    srv = sluice_server(["-c", "2048", "--grace-ms", "300",
                         "--max-seqs", "2"])
    first = threading.Event()
    got = {"oai": "", "ant": ""}

    def oai_stream():
        s = oai(srv).chat.completions.create(
            model=MODEL_NAME, max_tokens=1500, temperature=0, stream=True,
            messages=[{"role": "user", "content": COUNT_CHAT}])
        finish = None
        for ch in s:
            if ch.choices:
                got["oai"] += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
                if got["oai"]:
                    first.set()
        return finish

    def ant_stream():
        reason = None
        for ev in ant(srv).messages.create(
                model=MODEL_NAME, max_tokens=1500, stream=True,
                extra_body={"temperature": 0},  # not a keyword in this SDK
                messages=[{"role": "user", "content": COUNT_CHAT}]):
            if ev.type == "content_block_delta":
                got["ant"] += ev.delta.text
            if ev.type == "message_delta":
                reason = ev.delta.stop_reason
        return reason

    def queued_stream():
        return list(ant(srv).messages.create(
            model=MODEL_NAME, max_tokens=50, stream=True,
            messages=[{"role": "user", "content": "Say hi."}]))

    t1, r_oai = in_thread(oai_stream)
    t2, r_ant = in_thread(ant_stream)
    assert first.wait(120)
    wait_engine(srv, running=2, waiting=0)
    t3, r_q = in_thread(queued_stream)
    wait_engine(srv, running=2, waiting=1)
    srv.proc.send_signal(signal.SIGTERM)
    for t in (t1, t2, t3):
        t.join(120)
    assert srv.proc.wait(60) == 0, srv.log_text()

    # the old code: finish_reason "stop" / stop_reason "end_turn", no error
    e = r_oai.get("e")
    assert isinstance(e, openai.APIError), r_oai
    assert e.body["code"] == "shutting_down", e.body
    assert "cut off" in e.body["message"]
    assert got["oai"]
    e = r_ant.get("e")
    assert isinstance(e, anthropic.APIStatusError), r_ant
    assert e.body["error"]["type"] == "overloaded_error", e.body
    assert got["ant"]
    e = r_q.get("e")
    assert isinstance(e, anthropic.APIStatusError), r_q
    assert e.status_code == 503
    assert_retry_after({k.lower(): v for k, v in e.response.headers.items()})


def test_sigterm_openai_stream_wire_has_no_done(sluice_server):
    srv = sluice_server(["-c", "2048", "--grace-ms", "0"])
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({
        "model": MODEL_NAME, "prompt": COUNT, "max_tokens": 1500,
        "temperature": 0, "stream": True}),
        headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    data = r.readline()  # the first event is on its way
    srv.proc.send_signal(signal.SIGTERM)
    data += r.read()
    c.close()
    assert srv.proc.wait(60) == 0
    events = [e for e in data.decode().split("\n\n") if e]
    assert "data: [DONE]" not in events, events[-3:]
    last = json.loads(events[-1][len("data: "):])
    assert last["error"]["code"] == "shutting_down", last
    finals = [json.loads(e[6:])["choices"][0]["finish_reason"]
              for e in events[:-1]]
    assert finals and not any(finals), "a cut stream reported a finish"


# ---- the memory guard queues ------------------------------------------------------


@pytest.fixture(scope="module")
def sizes(server):
    """The default model's resident weight bytes (as the guard counts them,
    from /admin/api/stats) and the bytes of one KV block and of a full
    prefill chunk's activations (SmolLM2-135M: 30 layers, kv_dim 192; 5760
    floats a token; the default --prefill-chunk 256)."""
    w = stats(server)["memory"]["weights"]
    block = 2 * 30 * BLOCK_TOKENS * 192 * 2
    chunk = 256 * 5760 * 4
    return w, block, chunk


def test_default_chat_without_max_tokens_fits(sluice_server, sizes):
    """A chat request with no max_tokens used to reserve KV for the whole
    context (2048 tokens: 128 blocks) and, with the limit leaving room for
    far fewer, fail (issue 10: 500 context_length_exceeded there, 400
    prefill_memory_exceeded here). Now it is served, its generation
    bounded by what fits alone."""
    w, block, chunk = sizes
    limit = w + chunk + 40 * block
    srv = sluice_server(["-c", "2048", "--max-memory", str(limit)])
    st, _, body = raw(srv, "/v1/chat/completions", {
        "model": MODEL_NAME, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hi."}]})
    assert st == 200, body
    assert body["choices"][0]["message"]["content"]
    u = body["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] <= 40 * BLOCK_TOKENS
    # a long answer stops with "length" where the memory ends
    st, _, body = raw(srv, "/v1/chat/completions", {
        "model": MODEL_NAME, "temperature": 0,
        "messages": [{"role": "user", "content": COUNT_CHAT}],
        "max_tokens": 2000})
    assert st == 200, body
    u = body["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] <= 40 * BLOCK_TOKENS


def test_six_concurrent_requests_that_fit_alone_all_succeed(sluice_server,
                                                            sizes):
    """Room for about one and a half of these requests: each fits alone,
    six at once used to get 400 prefill_memory_exceeded (all but the
    first); now the others wait (or are preempted and recomputed) and all
    six are served in full."""
    w, block, chunk = sizes
    limit = w + chunk + 12 * block
    srv = sluice_server(["-c", "2048", "--max-memory", str(limit)])

    def one(_):
        return raw(srv, "/v1/completions", {
            "model": MODEL_NAME, "prompt": COUNT, "max_tokens": 100,
            "temperature": 0})

    with cf.ThreadPoolExecutor(6) as ex:
        res = list(ex.map(one, range(6)))
    for st, _, body in res:
        assert st == 200, body
        assert body["usage"]["completion_tokens"] == 100
        assert body["choices"][0]["finish_reason"] == "length"
    texts = {body["choices"][0]["text"] for _, _, body in res}
    assert all(texts)
    e = stats(srv)["engine"]
    assert e["requests_failed"] == 0 and e["kv_blocks_used"] == 0, e


def test_request_that_cannot_fit_alone_gets_4xx(sluice_server, sizes):
    w, block, chunk = sizes
    limit = w + chunk + 12 * block
    srv = sluice_server(["-c", "2048", "--max-memory", str(limit)])
    long_prompt = "word " * 400  # > 12 blocks of prompt
    with pytest.raises(openai.BadRequestError) as ei:
        oai(srv).chat.completions.create(
            model=MODEL_NAME, max_tokens=8,
            messages=[{"role": "user", "content": long_prompt}])
    err = ei.value.body
    assert ei.value.status_code == 400
    assert err["code"] == "prefill_memory_exceeded", err
    assert "even with no other request running" in err["message"], err
    assert err["estimated_bytes"] > err["limit_bytes"] == limit
    with pytest.raises(anthropic.BadRequestError) as ei:
        ant(srv).messages.create(
            model=MODEL_NAME, max_tokens=8,
            messages=[{"role": "user", "content": long_prompt}])
    assert ei.value.body["error"]["type"] == "invalid_request_error"
    # and it goes on serving what fits
    st, _, body = raw(srv, "/v1/completions", {
        "model": MODEL_NAME, "prompt": COUNT, "max_tokens": 4})
    assert st == 200, body


def test_queue_timeout_gives_503_with_retry_after(sluice_server):
    srv = sluice_server(["-c", "2048", "--max-seqs", "1",
                         "--queue-timeout-ms", "1000"])
    t1, running = in_thread(lambda: raw(srv, "/v1/completions", {
        "model": MODEL_NAME, "prompt": COUNT, "max_tokens": 1500,
        "temperature": 0}))
    wait_engine(srv, running=1, waiting=0)
    t0 = time.time()
    st, hdr, body = raw(srv, "/v1/chat/completions", {
        "model": MODEL_NAME, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hi."}]})
    waited = time.time() - t0
    assert st == 503, body
    assert body["error"]["code"] == "queue_timeout", body
    assert_retry_after(hdr)
    assert 0.9 < waited < 30, waited
    with pytest.raises(anthropic.APIStatusError) as ei:
        ant(srv).messages.create(
            model=MODEL_NAME, max_tokens=8,
            messages=[{"role": "user", "content": "Say hi."}])
    assert ei.value.status_code == 503
    assert ei.value.body["error"]["type"] == "overloaded_error"
    assert stats(srv)["engine"]["queue_timeouts"] == 2
    srv.stop()
    t1.join(120)
