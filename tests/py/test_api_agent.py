"""What agents and SDK clients send beyond plain chat (issue 12), through the
official openai and anthropic SDKs, unmodified, and raw HTTP where the SDKs
hide what is checked:

- max_tokens above the context is clamped, not refused (Claude Code sends
  32000); --max-tokens-default caps a chat request that gives none;
- /v1/messages/count_tokens equals the prompt /v1/messages really runs;
- Anthropic usage: input_tokens leaves out the cache reads;
- an Anthropic prefill (a last assistant message) is continued;
- top_k, min_p, repetition_penalty / repeat_penalty and logit_bias act;
- /v1/models/{id}, and the model list as each SDK reads it;
- /tokenize and /detokenize as llama.cpp's server has them;
- x-request-id (and Anthropic's request-id) on every answer, the client's
  own echoed;
- CORS: off by default, --cors-origin for a list or '*', preflights.

Skipped without the model, the binary or the SDKs (see conftest.py).
"""
import http.client
import json

import pytest

from conftest import MODEL_NAME

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def ant(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key="none",
                               max_retries=0, timeout=300)


def raw(srv, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    hd = {k.lower(): v for k, v in r.getheaders()}
    try:
        return r.status, hd, json.loads(data)
    except ValueError:
        return r.status, hd, data.decode(errors="replace")


COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]


def test_max_tokens_above_context_is_clamped(server):
    m = ant(server).messages.create(model=MODEL_NAME, max_tokens=32000,
                                    messages=COUNT,
                                    extra_body={"temperature": 0,
                                                "stop_sequences": ["7"]})
    assert m.stop_reason == "stop_sequence" and m.content[0].text
    c = oai(server).chat.completions.create(
        model=MODEL_NAME, messages=COUNT, max_tokens=10 ** 6, temperature=0,
        stop=["7"])
    assert c.choices[0].finish_reason == "stop"


def test_max_tokens_fills_the_room_left(sluice_server):
    """The engine owns the clamp (sl_engine_max_new): an answer asked for
    far past the context, whose end-of-text tokens are banned, runs to the
    context's last slot exactly, and says "length"."""
    srv = sluice_server(["-c", "96"])
    ban = {"0": -100, "1": -100, "2": -100}
    for body in ({"prompt": "Count: 1, 2, 3,", "max_tokens": 10 ** 6},
                 {"prompt": "Count: 1, 2, 3, 4,"}):  # (the default, 16)
        st, _, c = raw(srv, "POST", "/v1/completions",
                       dict(body, model=MODEL_NAME, temperature=0,
                            logit_bias=ban))
        assert st == 200, c
        u = c["usage"]
        want = 96 - u["prompt_tokens"] if "max_tokens" in body else 16
        assert u["completion_tokens"] == want, u
        assert c["choices"][0]["finish_reason"] == "length"
    # a chat request without max_tokens (--max-tokens-default 0 would be
    # the room left): the default of 4096, clamped to the room
    st, _, c = raw(srv, "POST", "/v1/chat/completions",
                   {"model": MODEL_NAME, "temperature": 0, "logit_bias": ban,
                    "messages": [{"role": "user", "content": "Count."}]})
    assert st == 200, c
    u = c["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] == 96, u


def test_max_tokens_default(sluice_server):
    srv = sluice_server(["-c", "2048", "--max-tokens-default", "5"])
    # a sampled answer that would run long: capped at 5 tokens
    c = oai(srv).chat.completions.create(
        model=MODEL_NAME, seed=3,
        messages=[{"role": "user", "content": "Write a long story."}])
    assert c.usage.completion_tokens <= 5
    assert c.choices[0].finish_reason in ("length", "stop")
    c = oai(srv).chat.completions.create(
        model=MODEL_NAME, seed=3, max_tokens=9,
        messages=[{"role": "user", "content": "Write a long story."}])
    assert c.usage.completion_tokens > 5  # the client's own wins


def test_count_tokens_and_cached_usage(server):
    msgs = [{"role": "user",
             "content": "count_tokens check: describe a lighthouse at dusk "
                        "in two sentences, with " + "detail " * 40}]
    n = ant(server).messages.count_tokens(model=MODEL_NAME, messages=msgs)
    assert n.input_tokens > 40
    m1 = ant(server).messages.create(model=MODEL_NAME, max_tokens=4,
                                     messages=msgs)
    u1 = m1.usage
    assert u1.input_tokens + u1.cache_read_input_tokens == n.input_tokens
    m2 = ant(server).messages.create(model=MODEL_NAME, max_tokens=4,
                                     messages=msgs)
    u2 = m2.usage
    # the second time the prefix cache serves most of it; input_tokens
    # counts only the rest (Anthropic's meaning), not the cached tokens too
    assert u2.cache_read_input_tokens > 0
    assert u2.input_tokens + u2.cache_read_input_tokens == n.input_tokens
    assert u2.input_tokens < n.input_tokens
    # streamed: message_start's usage the same way
    with ant(server).messages.stream(model=MODEL_NAME, max_tokens=4,
                                     messages=msgs) as st:
        for _ in st:
            pass
        f = st.get_final_message()
    assert f.usage.input_tokens + f.usage.cache_read_input_tokens == \
        n.input_tokens
    # with a system prompt and a prefill too
    n2 = ant(server).messages.count_tokens(
        model=MODEL_NAME, system="Be brief.",
        messages=COUNT + [{"role": "assistant", "content": "1, 2,"}])
    m3 = ant(server).messages.create(
        model=MODEL_NAME, max_tokens=2, system="Be brief.",
        messages=COUNT + [{"role": "assistant", "content": "1, 2,"}])
    assert m3.usage.input_tokens + m3.usage.cache_read_input_tokens == \
        n2.input_tokens
    # count_tokens refuses what messages refuses
    with pytest.raises(anthropic.BadRequestError):
        ant(server).messages.count_tokens(
            model=MODEL_NAME, messages=[{"role": "system", "content": "x"}])


def test_anthropic_prefill_is_continued(server):
    plain = ant(server).messages.create(model=MODEL_NAME, max_tokens=12,
                                        messages=COUNT,
                                        extra_body={"temperature": 0})
    pre = ant(server).messages.create(
        model=MODEL_NAME, max_tokens=12,
        messages=COUNT + [{"role": "assistant", "content": "1, 2,"}],
        extra_body={"temperature": 0})
    t, p = plain.content[0].text, pre.content[0].text
    assert t.startswith("1, 2, 3"), t  # what the model says on its own
    # continued: the answer goes on after "1, 2," instead of starting over
    assert not p.lstrip().startswith("1"), p
    assert p.lstrip().startswith("3"), p
    # OpenAI chat: vLLM's continue_final_message does the same
    c = oai(server).chat.completions.create(
        model=MODEL_NAME, max_tokens=12, temperature=0,
        messages=COUNT + [{"role": "assistant", "content": "1, 2,"}],
        extra_body={"continue_final_message": True})
    assert c.choices[0].message.content.lstrip().startswith("3")
    # trailing whitespace in a prefill: refused, as Anthropic does
    with pytest.raises(anthropic.BadRequestError):
        ant(server).messages.create(
            model=MODEL_NAME, max_tokens=4,
            messages=COUNT + [{"role": "assistant", "content": "1, 2, "}])


POEM = [{"role": "user", "content": "Write a poem about the sea."}]


def test_sampling_fields(server):
    o = oai(server)

    def run(**kw):
        return o.chat.completions.create(model=MODEL_NAME, messages=POEM,
                                         max_tokens=16, **kw) \
            .choices[0].message.content

    greedy = run(temperature=0)
    sampled = run(seed=7)
    assert sampled != greedy  # seed 7 at temperature 1 strays
    # top_k 1 leaves only the best token: greedy, whatever the seed
    assert run(seed=7, extra_body={"top_k": 1}) == greedy
    # min_p 1 keeps only tokens as likely as the best: greedy too
    assert run(seed=7, extra_body={"min_p": 1.0}) == greedy
    # repetition_penalty 1 is no penalty; a strong one changes the text
    assert run(temperature=0, extra_body={"repetition_penalty": 1.0}) == greedy
    assert run(temperature=0, extra_body={"repeat_penalty": 1.0}) == greedy
    assert run(temperature=0, extra_body={"repetition_penalty": 3.0}) != greedy
    # logit_bias +100 forces a token; -100 bans one
    st, _, tk = raw(server, "POST", "/tokenize",
                    {"content": " banana", "add_special": False})
    assert st == 200 and len(tk["tokens"]) == 1, tk
    banana = tk["tokens"][0]
    forced = o.chat.completions.create(
        model=MODEL_NAME, messages=POEM, max_tokens=3, temperature=0,
        logit_bias={str(banana): 100})
    assert forced.choices[0].message.content == " banana" * 3
    st, _, first = raw(server, "POST", "/tokenize",
                       {"content": greedy, "add_special": False})
    banned = run(temperature=0, logit_bias={str(first["tokens"][0]): -100})
    assert banned != greedy
    # the same on /v1/completions
    cp = o.completions.create(model=MODEL_NAME, prompt="The sea is",
                              max_tokens=2, temperature=0,
                              logit_bias={str(banana): 100})
    assert cp.choices[0].text == " banana" * 2
    # refused with a 400 in OpenAI's shape
    for bad in ({"logit_bias": {"abc": 1}}, {"logit_bias": {"5": 500}},
                {"logit_bias": {"999999999": 1}}, {"top_k": -7},
                {"min_p": 2}, {"repetition_penalty": 0}):
        with pytest.raises(openai.BadRequestError) as ei:
            o.chat.completions.create(model=MODEL_NAME, messages=POEM,
                                      max_tokens=2, extra_body=bad)
        assert ei.value.body["param"] in bad, (bad, ei.value.body)


def stats(srv):
    import urllib.request
    with urllib.request.urlopen(srv.base + "/admin/api/stats") as r:
        d = json.load(r)
    return d.get("engine", d)


def test_n_choices(server):
    """n choices: each its own seed (seed + index), so sampled choices
    differ and repeat; streamed choices (by index) equal the non-streamed
    ones; the prompt is computed once: the other choices wait for its
    blocks (in-flight sharing) and take them from the prefix cache."""
    c = oai(server)
    # a prompt nobody sent before: its blocks are not cached yet
    msgs = [{"role": "user", "content": "n-test: write one line about "
                                        "lighthouses, foghorns and gulls."}]
    before = stats(server)["cached_tokens_total"]
    r = c.chat.completions.create(model=MODEL_NAME, messages=msgs, n=4,
                                  seed=11, max_tokens=24)
    shared = stats(server)["cached_tokens_total"] - before
    full = (r.usage.prompt_tokens - 1) // 16 * 16  # full blocks but the last
    assert shared >= 3 * full > 0, (shared, full)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    texts = [ch.message.content for ch in r.choices]
    assert len(set(texts)) >= 2, texts
    assert 4 <= r.usage.completion_tokens <= 4 * 24
    s = c.chat.completions.create(model=MODEL_NAME, messages=msgs, n=4,
                                  seed=11, max_tokens=24, stream=True)
    acc = {}
    for chunk in s:
        for ch in chunk.choices:
            acc[ch.index] = acc.get(ch.index, "") + (ch.delta.content or "")
    assert [acc[i] for i in range(4)] == texts
    # greedy choices are all the same answer
    g = c.chat.completions.create(model=MODEL_NAME, messages=msgs, n=2,
                                  temperature=0, max_tokens=16)
    assert g.choices[0].message.content == g.choices[1].message.content
    # completions too
    p = c.completions.create(model=MODEL_NAME, prompt="The lighthouse", n=3,
                             seed=4, max_tokens=8)
    assert [ch.index for ch in p.choices] == [0, 1, 2]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL_NAME, messages=msgs, n=17,
                                  max_tokens=4)


def test_models_routes(server):
    o = oai(server)
    m = o.models.retrieve(MODEL_NAME)
    assert m.id == MODEL_NAME and m.object == "model"
    with pytest.raises(openai.NotFoundError) as ei:
        o.models.retrieve("no-such-model")
    assert ei.value.body["code"] == "model_not_found"
    ids = [x.id for x in o.models.list()]
    assert len(ids) == 1
    page = ant(server).models.list()
    assert page.data and page.data[0].type == "model"
    assert page.data[0].display_name and page.data[0].created_at
    a = ant(server).models.retrieve(MODEL_NAME)
    assert a.id == MODEL_NAME and a.type == "model"


def test_tokenize_detokenize(server):
    text = "Hello world, <|im_end|> and caf\u00e9."
    st, _, t = raw(server, "POST", "/tokenize", {"content": text})
    assert st == 200
    ids = t["tokens"]
    assert all(isinstance(i, int) for i in ids)
    st, _, d = raw(server, "POST", "/detokenize", {"tokens": ids})
    assert st == 200 and d["content"] == text
    # special tokens parsed by default (llama.cpp's parse_special), not
    # when told so
    st, _, plain = raw(server, "POST", "/tokenize",
                       {"content": text, "parse_special": False})
    assert len(plain["tokens"]) > len(ids)
    st, _, one = raw(server, "POST", "/tokenize", {"content": "<|im_end|>"})
    assert len(one["tokens"]) == 1
    # pieces, whose concatenation is the text
    st, _, p = raw(server, "POST", "/tokenize",
                   {"content": text, "with_pieces": True})
    assert [x["id"] for x in p["tokens"]] == ids
    joined = b"".join(x["piece"].encode() if isinstance(x["piece"], str)
                      else bytes(x["piece"]) for x in p["tokens"])
    assert joined.decode() == text
    # the same count as the chat route's prompt would have for raw text
    st, _, e = raw(server, "POST", "/detokenize", {"tokens": []})
    assert st == 200 and e["content"] == ""
    for path, body, param in (("/tokenize", {}, "content"),
                              ("/tokenize", {"content": 5}, "content"),
                              ("/tokenize", {"content": "x",
                                             "with_pieces": 1}, "with_pieces"),
                              ("/detokenize", {"tokens": [-1]}, "tokens"),
                              ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
                              ("/detokenize", {"tokens": "1"}, "tokens")):
        st, _, err = raw(server, "POST", path, body)
        assert st == 400 and err["error"]["param"] == param, (path, err)
    st, _, err = raw(server, "POST", "/tokenize", b"{nope")
    assert st == 400 and err["error"]["code"] == "invalid_json"
    st, h, err = raw(server, "GET", "/tokenize")
    assert st == 405 and h["allow"] == "POST, OPTIONS"  # from the route table
    st, h, err = raw(server, "POST", "/v1/models", {})
    assert st == 405 and h["allow"] == "GET, HEAD, OPTIONS"
    st, h, err = raw(server, "GET", "/v1/models")
    assert st == 200 and "allow" not in h


def test_request_ids(server):
    c = oai(server).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=POEM, max_tokens=2)
    assert c.request_id and c.request_id.startswith("req_")
    a = ant(server).messages.with_raw_response.create(
        model=MODEL_NAME, max_tokens=2, messages=POEM)
    assert a.request_id and a.request_id.startswith("req_")
    ids = set()
    for path, body in (("/v1/models", None), ("/health", None),
                       ("/v1/nope", None),
                       ("/v1/chat/completions", {"model": "x"}),
                       ("/v1/messages", {"model": MODEL_NAME})):
        st, h, _ = raw(server, "POST" if body else "GET", path, body)
        assert h.get("x-request-id", "").startswith("req_"), (path, h)
        ids.add(h["x-request-id"])
        if path.startswith("/v1/messages"):
            assert h.get("request-id") == h["x-request-id"]
    assert len(ids) == 5
    # the client's own id comes back; a bad one is replaced
    st, h, _ = raw(server, "GET", "/v1/models",
                   headers={"x-request-id": "trace-42.a:b"})
    assert h["x-request-id"] == "trace-42.a:b"
    st, h, _ = raw(server, "GET", "/v1/models",
                   headers={"x-request-id": "x" * 200})
    assert h["x-request-id"].startswith("req_")
    # streamed answers too
    with oai(server).chat.completions.with_streaming_response.create(
            model=MODEL_NAME, messages=POEM, max_tokens=2,
            stream=True) as r:
        assert r.headers["x-request-id"].startswith("req_")
        for _ in r.iter_lines():
            pass


def test_cors(server, sluice_server):
    pre = {"Origin": "http://app.test",
           "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    # off by default: a foreign origin is refused (403, no allowed origin),
    # preflight or not (issue 43; test_http_origin has the rest)
    st, h, _ = raw(server, "OPTIONS", "/v1/chat/completions", headers=pre)
    assert st == 403 and "access-control-allow-origin" not in h
    st, h, _ = raw(server, "GET", "/v1/models", headers={"Origin": "x"})
    assert st == 403 and "access-control-allow-origin" not in h
    srv = sluice_server(["-c", "2048", "--api-key", "k", "--cors-origin",
                         "http://app.test,http://other.test"])
    # a preflight needs no key; the listed origin is allowed, with the
    # headers asked for
    st, h, _ = raw(srv, "OPTIONS", "/v1/chat/completions", headers=pre)
    assert st == 204
    assert h["access-control-allow-origin"] == "http://app.test"
    assert h["access-control-allow-methods"] == "POST, OPTIONS"
    st, h, _ = raw(srv, "OPTIONS", "/v1/models",
                   headers=dict(pre, **{"Access-Control-Request-Method":
                                        "GET"}))
    assert st == 204 and h["access-control-allow-methods"] == \
        "GET, HEAD, OPTIONS"
    assert h["access-control-allow-headers"] == "authorization, content-type"
    assert h.get("vary") == "Origin"
    st, h, _ = raw(srv, "OPTIONS", "/v1/messages",
                   headers=dict(pre, Origin="http://evil.test"))
    assert st == 403 and "access-control-allow-origin" not in h
    # the answers themselves carry the header, errors too
    st, h, _ = raw(srv, "GET", "/v1/models",
                   headers={"Origin": "http://other.test",
                            "Authorization": "Bearer k"})
    assert st == 200
    assert h["access-control-allow-origin"] == "http://other.test"
    assert "x-request-id" in h["access-control-expose-headers"]
    st, h, _ = raw(srv, "GET", "/v1/models",
                   headers={"Origin": "http://other.test"})
    assert st == 401
    assert h["access-control-allow-origin"] == "http://other.test"
    # unknown routes are not preflighted
    st, h, _ = raw(srv, "OPTIONS", "/v1/nope", headers=pre)
    assert st != 204
    star = sluice_server(["-c", "2048", "--cors-origin", "*"])
    st, h, _ = raw(star, "GET", "/v1/models", headers={"Origin": "http://a"})
    assert h["access-control-allow-origin"] == "*" and "vary" not in h


# ---- structured output (constrained decoding) ------------------------------

jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int
    coastal: bool
    kind: str = pydantic.Field(json_schema_extra={"enum": ["capital", "town"]})


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer"},
                         "tags": {"type": "array", "maxItems": 3,
                                  "items": {"enum": ["a", "b", "c"]}},
                         "nick": {"type": ["string", "null"]}},
          "required": ["name", "age"], "additionalProperties": False}


def test_structured_output_openai(server):
    o = oai(server)
    # the SDK's own parse(), with a Pydantic model: greedy and sampled
    for kw in ({"temperature": 0}, {"seed": 11}, {"seed": 12}):
        r = o.chat.completions.parse(
            model=MODEL_NAME, response_format=City, max_tokens=200,
            messages=[{"role": "user", "content": "Describe Paris."}], **kw)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", ch
        assert isinstance(ch.message.parsed, City)
        jsonschema.validate(json.loads(ch.message.content),
                            City.model_json_schema())
    # a json_schema given by hand, streamed: the deltas make valid JSON
    for seed in (1, 2, 3):
        st = o.chat.completions.create(
            model=MODEL_NAME, max_tokens=200, seed=seed, stream=True,
            messages=[{"role": "user", "content": "A person, please."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person",
                                             "schema": PERSON,
                                             "strict": True}})
        text = "".join(c.choices[0].delta.content or "" for c in st
                       if c.choices)
        jsonschema.validate(json.loads(text), PERSON)
    # json_object: some JSON object
    r = o.chat.completions.create(
        model=MODEL_NAME, max_tokens=300, seed=5,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Facts about cats as JSON."}])
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut at max_tokens: still a prefix of a JSON object
        assert r.choices[0].message.content.lstrip().startswith("{")
    # llama.cpp's grammar (GBNF) and json_schema fields, on completions too
    r = o.chat.completions.create(
        model=MODEL_NAME, max_tokens=8, seed=3,
        messages=[{"role": "user", "content": "Yes or no?"}],
        extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no")
    assert r.choices[0].finish_reason == "stop"
    c = o.completions.create(model=MODEL_NAME, prompt="Numbers:",
                             max_tokens=40, seed=4,
                             extra_body={"json_schema": {
                                 "type": "array", "minItems": 2,
                                 "maxItems": 4,
                                 "items": {"type": "integer"}}})
    v = json.loads(c.choices[0].text)
    assert isinstance(v, list) and 2 <= len(v) <= 4
    assert all(isinstance(x, int) for x in v)


def test_structured_output_anthropic(server):
    a = ant(server)
    for seed_text in ("A person, please.", "Invent someone."):
        # greedy: the Anthropic API has no seed, and a sampled answer may
        # run past max_tokens inside a string (it failed that way once)
        m = a.messages.create(
            model=MODEL_NAME, max_tokens=200,
            messages=[{"role": "user", "content": seed_text}],
            extra_body={"temperature": 0, "output_config": {"format": {
                "type": "json_schema", "schema": PERSON}}})
        assert m.stop_reason == "end_turn", m
        jsonschema.validate(json.loads(m.content[0].text), PERSON)


def test_structured_output_refusals(server):
    o = oai(server)
    bad = [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "pattern": "^a"}}}},
         "response_format", "pattern"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#/nowhere"}}}},
         "response_format", "$ref"),
        ({"grammar": "root ::= missing"}, "grammar", "missing"),
        ({"grammar": "root ::= root \"a\" | \"b\""}, "grammar", "left"),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ]
    for body, param, word in bad:
        with pytest.raises(openai.BadRequestError) as ei:
            o.chat.completions.create(model=MODEL_NAME, messages=POEM,
                                      max_tokens=4, extra_body=body)
        e = ei.value.body
        assert e["param"] == param and word in e["message"], e
    with pytest.raises(anthropic.BadRequestError) as ei:
        ant(server).messages.create(
            model=MODEL_NAME, max_tokens=4, messages=POEM,
            extra_body={"output_config": {"format": {
                "type": "json_schema",
                "schema": {"type": "number", "minimum": 2}}}})
    assert "minimum" in str(ei.value)
