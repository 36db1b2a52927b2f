"""Speculative decoding through the server (issue 47): `sluice serve
--speculative ngram` drafts by prompt lookup for greedy requests and
verifies the drafts in the engine's steps. Through the official openai and
anthropic SDKs, unmodified:

- a greedy answer (text and logprobs) with drafts equals the same request
  with `"speculative": false` (no drafts), bit for bit, one at a time and
  eight at once (their drafts verified together in shared steps);
- the Anthropic route takes the same opt-out;
- a `speculative` that is not a boolean is a 400 in the API's shape;
- /admin/api/stats (all and per model) and /metrics (per model) count the
  drafted and the kept tokens, and the share kept;
- a sampled answer with a seed is the same with drafts as without;
- stop strings, n > 1 and a client that hangs up mid-answer work with
  drafts (the same answers; the server goes on serving);
- a draft model (`--draft-model`: the default model drafting for itself)
  gives the same greedy and seeded sampled answers; a missing one, or
  `--speculative draft` without one, is refused at start;
- OpenAI's `prediction` (predicted outputs) feeds the drafter, and
  usage.completion_tokens_details has accepted_prediction_tokens and
  rejected_prediction_tokens (streamed too); a bad prediction is a 400.

Skipped without the model, the binary or the SDKs (see conftest.py).
"""
import concurrent.futures
import json
import os
import urllib.request

import pytest

from conftest import MODEL_NAME, model_path, sluice_bin

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

SRC = os.environ.get("SLUICE_SOURCE_DIR", os.path.join(
    os.path.dirname(__file__), "..", ".."))

CODE = open(os.path.join(SRC, "src", "engine", "spec.c")).read()[2400:3400]

PROMPTS = [
    "Print this code again exactly:\n" + CODE,
    "Rename total to sum and print the code again:\ndef mean(values):\n"
    "    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)\n",
    "Copy the list exactly: apple, banana, cherry, date, elderberry, fig, "
    "grape.",
    "Write a haiku about rivers.",
]


@pytest.fixture(scope="module")
def spec_server(sluice_server):
    return sluice_server(["-c", "2048", "--speculative", "ngram",
                          "--max-seqs", "8"])


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def ask(srv, prompt, spec):
    extra = {} if spec else {"speculative": False}
    r = oai(srv).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
        max_tokens=96, temperature=0, logprobs=True, top_logprobs=2,
        extra_body=extra)
    c = r.choices[0]
    lp = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
          for t in c.logprobs.content]
    return c.message.content, lp, r.usage.completion_tokens


def test_drafts_change_nothing(spec_server):
    plain = [ask(spec_server, p, False) for p in PROMPTS]
    alone = [ask(spec_server, p, True) for p in PROMPTS]
    assert alone == plain
    # eight at once: each prompt twice, drafts of several requests in one step
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: ask(spec_server, p, True),
                               PROMPTS * 2))
    assert together == plain * 2
    # drafts were made, and some kept, some cut (/admin/api/stats)
    with urllib.request.urlopen(spec_server.base + "/admin/api/stats",
                                timeout=30) as r:
        st = json.loads(r.read())
    sp = st["speculative"]
    assert 0 < sp["accepted"] < sp["drafted"], sp
    assert sp["acceptance_rate"] == pytest.approx(sp["accepted"] /
                                                  sp["drafted"])
    # the model's own counts (one model: the same), and /metrics per model
    (m,) = st["models"]
    assert m["engine"]["speculative"]["drafted"] == sp["drafted"]
    with urllib.request.urlopen(spec_server.base + "/metrics",
                                timeout=30) as r:
        prom = r.read().decode()
    series = {}
    for line in prom.splitlines():
        if line.startswith("sluice_spec_"):
            k, v = line.rsplit(" ", 1)
            series[k] = float(v)
    name = m["name"]
    drafted = series['sluice_spec_drafted_tokens_total{model="%s"}' % name]
    kept = series['sluice_spec_accepted_tokens_total{model="%s"}' % name]
    ratio = series['sluice_spec_acceptance_ratio{model="%s"}' % name]
    assert drafted >= sp["drafted"] and 0 < kept < drafted
    assert ratio == pytest.approx(kept / drafted)


def test_anthropic_opt_out(spec_server):
    cl = anthropic.Anthropic(base_url=spec_server.base, api_key="none",
                             max_retries=0, timeout=300)
    out = []
    for extra in ({}, {"speculative": False}):
        m = cl.messages.create(
            model=MODEL_NAME, max_tokens=64,
            messages=[{"role": "user", "content": PROMPTS[1]}],
            extra_body=dict(extra, temperature=0))
        out.append(m.content[0].text)
    assert out[0] == out[1] and out[0]
    with pytest.raises(anthropic.BadRequestError):  # read there too
        cl.messages.create(model=MODEL_NAME, max_tokens=4,
                           messages=[{"role": "user", "content": "hi"}],
                           extra_body={"speculative": 1})


def test_bad_speculative_is_400(spec_server):
    with pytest.raises(openai.BadRequestError) as ei:
        oai(spec_server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
            max_tokens=4, extra_body={"speculative": "yes"})
    err = ei.value.body
    assert err["param"] == "speculative" and err["code"] == "invalid_type"


def test_sampled_with_seed_is_the_same(spec_server):
    def sampled(prompt, spec):
        extra = {} if spec else {"speculative": False}
        r = oai(spec_server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": prompt}],
            max_tokens=64, temperature=0.7, top_p=0.95, seed=11,
            presence_penalty=0.3, logprobs=True, top_logprobs=1,
            extra_body=extra)
        c = r.choices[0]
        d = r.usage.completion_tokens_details
        return (c.message.content,
                [(t.token, t.logprob) for t in c.logprobs.content],
                d.accepted_prediction_tokens + d.rejected_prediction_tokens)
    kept = 0
    for p in PROMPTS[:3]:
        off = sampled(p, False)
        on = sampled(p, True)
        assert on[:2] == off[:2], p[:40]
        assert off[2] == 0
        kept += on[2]
    assert kept > 0  # the sampled answers were drafted for


def test_prediction_feeds_the_drafter(spec_server):
    cl = oai(spec_server)
    msgs = [{"role": "user", "content": "Write a haiku about rivers."}]
    plain = cl.chat.completions.create(
        model=MODEL_NAME, messages=msgs, max_tokens=48, temperature=0,
        extra_body={"speculative": False})
    text = plain.choices[0].message.content
    d = plain.usage.completion_tokens_details
    assert d.accepted_prediction_tokens == 0
    assert d.rejected_prediction_tokens == 0
    # the answer itself as the prediction (a string, then as text parts)
    for pred in (text, [{"type": "text", "text": text[:20]},
                        {"type": "text", "text": text[20:]}]):
        r = cl.chat.completions.create(
            model=MODEL_NAME, messages=msgs, max_tokens=48, temperature=0,
            prediction={"type": "content", "content": pred})
        assert r.choices[0].message.content == text
        d = r.usage.completion_tokens_details
        assert d.accepted_prediction_tokens >= r.usage.completion_tokens // 2
        assert d.rejected_prediction_tokens <= 4
    # streamed: the usage chunk has them too
    chunks = list(cl.chat.completions.create(
        model=MODEL_NAME, messages=msgs, max_tokens=48, temperature=0,
        prediction={"type": "content", "content": text}, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks
                   if c.choices) == text
    u = chunks[-1].usage
    assert u.completion_tokens_details.accepted_prediction_tokens > 0
    # /v1/completions takes it too
    r = cl.completions.create(model=MODEL_NAME, prompt="1, 2, 3, 4, 5,",
                              max_tokens=24, temperature=0,
                              extra_body={"prediction": {
                                  "type": "content",
                                  "content": " 6, 7, 8, 9, 10, 11, 12"}})
    assert r.usage.completion_tokens_details.accepted_prediction_tokens > 0


@pytest.mark.parametrize("pred", [
    "text", {"type": "other", "content": "x"}, {"type": "content"},
    {"type": "content", "content": 5},
    {"type": "content", "content": [{"type": "image", "text": "x"}]},
    {"type": "content", "content": [{"type": "text"}]},
])
def test_bad_prediction_is_400(spec_server, pred):
    with pytest.raises(openai.BadRequestError) as ei:
        oai(spec_server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
            max_tokens=4, extra_body={"prediction": pred})
    err = ei.value.body
    assert err["param"] == "prediction" and err["code"] == "invalid_value"


def test_stop_strings_and_n_choices(spec_server):
    cl = oai(spec_server)

    def run(spec, **kw):
        extra = {} if spec else {"speculative": False}
        r = cl.chat.completions.create(
            model=MODEL_NAME, max_tokens=64, extra_body=extra,
            messages=[{"role": "user", "content": PROMPTS[2]}], **kw)
        return [(c.message.content, c.finish_reason) for c in r.choices], r
    # a stop string inside a run of kept drafts ends the answer there
    plain, _ = run(False, temperature=0)
    text = plain[0][0]
    assert len(text) > 40, text
    stop = text[24:32]  # its first occurrence ends the answer
    for kw in ({"temperature": 0, "stop": [stop]},
               {"temperature": 0, "n": 3},
               {"temperature": 0.8, "seed": 5, "n": 2, "stop": [stop]}):
        off, _ = run(False, **kw)
        on, r = run(True, **kw)
        assert on == off, kw
        if "stop" in kw and kw["temperature"] == 0:
            assert on[0][1] == "stop" and stop not in on[0][0]
    d = r.usage.completion_tokens_details  # n > 1: the choices' sum
    assert d.accepted_prediction_tokens + d.rejected_prediction_tokens > 0


def test_hang_up_mid_answer(spec_server):
    # a streamed answer with drafts, dropped after a few chunks
    body = json.dumps({
        "model": MODEL_NAME, "max_tokens": 400, "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": PROMPTS[0]}]}).encode()
    req = urllib.request.Request(spec_server.base + "/v1/chat/completions",
                                 body, {"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=60)
    for _ in range(5):
        assert r.readline()
    r.close()
    # the server goes on: the same greedy answer as without drafts
    assert ask(spec_server, PROMPTS[1], True) == \
        ask(spec_server, PROMPTS[1], False)
    with urllib.request.urlopen(spec_server.base + "/admin/api/stats",
                                timeout=30) as r:
        st = json.loads(r.read())
    assert st["models"][0]["engine"]["running"] == 0


@pytest.fixture(scope="module")
def draft_server(sluice_server):
    return sluice_server(["-c", "2048", "--draft-model", model_path(),
                          "--max-seqs", "4", "--draft-max", "4"])


def test_draft_model_changes_nothing(draft_server):
    cl = oai(draft_server)

    def run(prompt, spec, **kw):
        extra = {} if spec else {"speculative": False}
        r = cl.chat.completions.create(
            model=MODEL_NAME, max_tokens=48, extra_body=extra, logprobs=True,
            messages=[{"role": "user", "content": prompt}], **kw)
        c = r.choices[0]
        d = r.usage.completion_tokens_details
        return ((c.message.content, [t.logprob for t in c.logprobs.content]),
                d.accepted_prediction_tokens, d.rejected_prediction_tokens)
    kept = 0
    for p in PROMPTS[1:]:
        for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 3}):
            off, a0, r0 = run(p, False, **kw)
            on, a1, r1 = run(p, True, **kw)
            assert on == off, (p[:30], kw)
            assert a0 == r0 == 0
            kept += a1
    assert kept > 0
    with urllib.request.urlopen(draft_server.base + "/admin/api/stats",
                                timeout=30) as r:
        sp = json.loads(r.read())["speculative"]
    assert 0 < sp["accepted"] <= sp["drafted"], sp


@pytest.mark.parametrize("args,msg", [
    (["--speculative", "draft"], "needs --draft-model"),
    (["--draft-model", "/nonexistent/d.gguf"], "nonexistent"),
    (["--speculative", "ngram", "--draft-model", "x.gguf"], "not ngram"),
])
def test_bad_draft_model_refused(args, msg):
    import subprocess
    if not model_path() or not sluice_bin():
        pytest.skip("no model or binary")
    p = subprocess.run([sluice_bin(), "serve", "-m", model_path(), "--port", "0"]
                       + args, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert msg in p.stderr, p.stderr
