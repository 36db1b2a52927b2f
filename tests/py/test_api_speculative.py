"""Speculative decoding through the server (issue 47): `sluice serve
--speculative ngram` drafts by prompt lookup for greedy requests and
verifies the drafts in the engine's steps. Through the official openai and
anthropic SDKs, unmodified:

- a greedy answer (text and logprobs) with drafts equals the same request
  with `"speculative": false` (no drafts), bit for bit, one at a time and
  eight at once (their drafts verified together in shared steps);
- the Anthropic route takes the same opt-out;
- a `speculative` that is not a boolean is a 400 in the API's shape;
- /admin/api/stats counts the drafted and the kept tokens.

Skipped without the model, the binary or the SDKs (see conftest.py).
"""
import concurrent.futures
import json
import os
import urllib.request

import pytest

from conftest import MODEL_NAME

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
