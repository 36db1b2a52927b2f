"""Reasoning output (issue 45) through the official openai and anthropic
SDKs against the real `sluice serve`:

The default model never writes <think> by itself, so a copy of it gets a
Qwen3-style thinking template (tests/fixtures/templates/qwen3.jinja with
the generation prompt opening "<think>\\n" unless enable_thinking is false,
as Qwen3-thinking and DeepSeek-R1 do, plus a line that shows
reasoning_effort): its answers then start inside the think block.

- a block cut by max_tokens is all reasoning (openai reasoning_content via
  model_extra, anthropic thinking blocks), finish_reason length;
- streamed and non-streamed answers split the same way (greedy), in each
  SDK's own accumulation of the deltas (reasoning_content deltas;
  thinking_delta and signature_delta events);
- Anthropic's thinking.budget_tokens: the server closes the block after N
  tokens (the thinking is the first N tokens' text of the same prompt) and
  the model's continuation is the text block;
- chat_template_kwargs / thinking disabled / reasoning_effort reach the
  template: the rendered prompt equals jinja2's, and the answer has no
  reasoning;
- bad thinking / reasoning_effort / chat_template_kwargs values get a 400
  in each API's shape while other requests keep being served;
- --reasoning-format none leaves the thinking in the content;
- a forced tool call on the thinking template still parses.
"""
import http.client
import json
import pathlib
import subprocess
import sys

import pytest

from conftest import MODEL_NAME, metric, model_path

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
jinja2 = pytest.importorskip("jinja2")
pytest.importorskip("gguf")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "fixtures" / "templates"
T0 = {"temperature": 0}  # (this anthropic SDK takes it through extra_body)
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


def thinking_template():
    t = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
    old = ("    {%- if enable_thinking is defined and enable_thinking is false"
           " %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
           "    {%- endif %}")
    assert old in t
    t = t.replace(old, old.replace(
        "    {%- endif %}",
        "    {%- else %}\n        {{- '<think>\\n' }}\n    {%- endif %}"))
    return ("{%- if reasoning_effort is defined %}{{- '<|im_start|>system\\n"
            "Reasoning: ' + reasoning_effort + '<|im_end|>\\n' }}"
            "{%- endif %}\n" + t)


def make_model(tmp_path_factory, tmpl):
    out = tmp_path_factory.mktemp("think") / "think.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                    model_path(), str(out), "--chat-template", tmpl,
                    "--force"], check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def think_model(sluice_server, tmp_path_factory):
    tmpl = thinking_template()
    return make_model(tmp_path_factory, tmpl), tmpl


@pytest.fixture(scope="module")
def srv(sluice_server, think_model):
    s = sluice_server(["-c", "2048"], model=think_model[0])
    s.tmpl = think_model[1]
    return s


def oai(s):
    return openai.OpenAI(base_url=s.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def ant(s):
    return anthropic.Anthropic(base_url=s.base, api_key="none",
                               max_retries=0, timeout=300)


def raw(s, path, body):
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def reasoning_of(msg):
    return (msg.model_extra or {}).get("reasoning_content")


def hf_render(template, messages, **extra):
    """The reference: jinja2 set up as transformers sets it up."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, \
        separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent,
            separators=separators, sort_keys=sort_keys)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True,
        bos_token="<|im_start|>", eos_token="<|im_end|>", **extra)


# ---- a think block cut by max_tokens ---------------------------------------


def test_openai_cut_mid_think_is_reasoning(srv):
    before = metric(srv, "sluice_reasoning_tokens_total")
    r = oai(srv).chat.completions.create(
        model=MODEL_NAME, messages=STORY, max_tokens=24, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    rc = reasoning_of(ch.message)
    assert isinstance(rc, str) and len(rc) > 20, ch.message
    assert not ch.message.content
    assert "<think>" not in rc and "</think>" not in rc
    assert r.usage.completion_tokens == 24
    # every token was thinking (OpenAI's usage field)
    assert r.usage.completion_tokens_details.reasoning_tokens == 24
    # streamed with include_usage: the same count in the last chunk
    last = None
    for ch in oai(srv).chat.completions.create(
            model=MODEL_NAME, messages=STORY, max_tokens=24, temperature=0,
            stream=True, stream_options={"include_usage": True}):
        last = ch.usage or last
    assert last.completion_tokens_details.reasoning_tokens == 24
    # /metrics counts both
    assert metric(srv, "sluice_reasoning_tokens_total") - before == 48


def test_anthropic_cut_mid_think_is_thinking(srv):
    m = ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                 max_tokens=24, extra_body=T0)
    assert m.stop_reason == "max_tokens"
    assert [b.type for b in m.content] == ["thinking"]
    assert len(m.content[0].thinking) > 20 and m.content[0].signature
    oa = oai(srv).chat.completions.create(
        model=MODEL_NAME, messages=STORY, max_tokens=24, temperature=0)
    assert m.content[0].thinking == reasoning_of(oa.choices[0].message)


# ---- streamed = non-streamed -----------------------------------------------


@pytest.mark.parametrize("max_tokens", [10, 40])
def test_openai_stream_splits_like_non_stream(srv, max_tokens):
    kw = dict(model=MODEL_NAME, messages=STORY, max_tokens=max_tokens,
              temperature=0)
    whole = oai(srv).chat.completions.create(**kw).choices[0]
    rc, content, fin = "", "", None
    for ch in oai(srv).chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rc += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        fin = ch.choices[0].finish_reason or fin
    assert rc == (reasoning_of(whole.message) or "")
    assert content == (whole.message.content or "")
    assert fin == whole.finish_reason == "length"
    assert rc


def test_openai_stream_logprobs_follow_the_split(srv):
    kw = dict(model=MODEL_NAME, messages=STORY, max_tokens=8, temperature=0,
              logprobs=True)
    n = 0
    for ch in oai(srv).chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs:
            n += len(ch.choices[0].logprobs.content or [])
    assert n == 8  # each token's logprobs once, on its reasoning delta


def budget_request(**kw):
    return dict(model=MODEL_NAME, messages=STORY, max_tokens=60,
                extra_body=T0,
                thinking={"type": "enabled", "budget_tokens": 16}, **kw)


def test_anthropic_stream_splits_like_non_stream(srv):
    whole = ant(srv).messages.create(**budget_request())
    kinds = []
    with ant(srv).messages.stream(**budget_request()) as st:
        for ev in st:
            if ev.type == "content_block_delta":
                kinds.append(ev.delta.type)
            elif ev.type == "content_block_start":
                kinds.append("start:" + ev.content_block.type)
        final = st.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    assert final.content[0].thinking == whole.content[0].thinking
    assert final.content[1].text == whole.content[1].text
    assert final.content[0].signature
    # thinking block first, its deltas, its signature, then the text block
    assert kinds[0] == "start:thinking" and kinds[1] == "thinking_delta"
    sig = kinds.index("signature_delta")
    assert set(kinds[1:sig]) == {"thinking_delta"}
    assert kinds[sig + 1] == "start:text"
    assert final.stop_reason == whole.stop_reason


# ---- the thinking budget ---------------------------------------------------


def test_anthropic_budget_closes_the_thinking(srv):
    m = ant(srv).messages.create(**budget_request())
    assert [b.type for b in m.content] == ["thinking", "text"], m.content
    # the thinking is what the model wrote in its first 16 tokens
    first16 = ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                       max_tokens=16, extra_body=T0)
    assert first16.stop_reason == "max_tokens"
    assert m.content[0].thinking == first16.content[0].thinking
    # the rest is the model's own continuation after the closed block
    assert len(m.content[1].text.strip()) > 10
    assert m.usage.output_tokens <= 60
    # without a budget the same prompt thinks on past 16 tokens
    free = ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                    max_tokens=60, extra_body=T0)
    assert len(free.content[0].thinking) > len(m.content[0].thinking)


def test_anthropic_thinking_disabled(srv):
    m = ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                 max_tokens=20, extra_body=T0,
                                 thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text.strip()


# ---- the template's variables ----------------------------------------------


def test_chat_template_kwargs_reach_the_template(srv):
    st, on = raw(srv, "/apply-template", {"messages": STORY})
    assert st == 200
    st, off = raw(srv, "/apply-template", {
        "messages": STORY, "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200
    assert on["prompt"] == hf_render(srv.tmpl, STORY)
    assert off["prompt"] == hf_render(srv.tmpl, STORY, enable_thinking=False)
    assert on["prompt"].endswith("<think>\n")
    assert off["prompt"].endswith("</think>\n\n")
    st, eff = raw(srv, "/apply-template", {"messages": STORY,
                                           "reasoning_effort": "low"})
    assert st == 200
    assert eff["prompt"] == hf_render(srv.tmpl, STORY, reasoning_effort="low")
    assert "Reasoning: low" in eff["prompt"]
    r = oai(srv).chat.completions.create(
        model=MODEL_NAME, messages=STORY, max_tokens=20, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    assert not reasoning_of(msg) and msg.content.strip()
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_bad_values_are_400_in_each_shape(srv):
    bad_thinking = [{"type": "on"}, {"type": "enabled"},
                    {"type": "enabled", "budget_tokens": 0},
                    {"type": "enabled", "budget_tokens": "16"},
                    {"type": "enabled", "budget_tokens": 60}, "yes"]
    for th in bad_thinking:
        with pytest.raises(anthropic.BadRequestError) as e:
            ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                     max_tokens=60, thinking=th)
        body = e.value.body
        assert body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error"
        assert "thinking" in body["error"]["message"]
    for extra in [{"reasoning_effort": "max"},
                  {"chat_template_kwargs": [1]},
                  {"chat_template_kwargs": {"messages": []}}]:
        with pytest.raises(openai.BadRequestError) as e:
            oai(srv).chat.completions.create(
                model=MODEL_NAME, messages=STORY, max_tokens=5,
                extra_body=extra)
        assert e.value.code == "invalid_value" or e.value.code == \
            "invalid_type", e.value.body
    # and the server goes on serving
    r = oai(srv).chat.completions.create(model=MODEL_NAME, messages=STORY,
                                         max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length"


def test_forced_tool_call_on_thinking_template(srv):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string",
                                               "maxLength": 20}},
                       "required": ["city"]}}}]
    r = oai(srv).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content":
                                     "Weather in Paris?"}],
        tools=tools, tool_choice="required", max_tokens=200, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.tool_calls[0].function.name == "get_weather"
    json.loads(ch.message.tool_calls[0].function.arguments)


# ---- --reasoning-format none -----------------------------------------------


def test_reasoning_format_none_keeps_thinking_in_content(
        srv, sluice_server, think_model):
    plain = sluice_server(["-c", "2048", "--reasoning-format", "none"],
                          model=think_model[0])
    kw = dict(model=MODEL_NAME, messages=STORY, max_tokens=24, temperature=0)
    split = oai(srv).chat.completions.create(**kw).choices[0].message
    whole = oai(plain).chat.completions.create(**kw).choices[0].message
    assert reasoning_of(whole) is None
    assert whole.content.strip() == reasoning_of(split)


# ---- --reasoning-budget ----------------------------------------------------


def test_server_reasoning_budget(srv, sluice_server, think_model):
    """--reasoning-budget N caps the thinking of every request that sets no
    budget of its own (OpenAI routes included): the thinking is the first
    N tokens' and the answer goes on as content; 0 turns thinking off (the
    template's enable_thinking false); a request's own Anthropic budget
    wins."""
    capped = sluice_server(["-c", "2048", "--reasoning-budget", "16"],
                           model=think_model[0])
    kw = dict(model=MODEL_NAME, messages=STORY, temperature=0)
    first16 = oai(srv).chat.completions.create(max_tokens=16, **kw)
    r = oai(capped).chat.completions.create(max_tokens=60, **kw)
    msg = r.choices[0].message
    assert reasoning_of(msg) == reasoning_of(first16.choices[0].message)
    assert msg.content and len(msg.content.strip()) > 10, msg
    assert r.usage.completion_tokens <= 60
    # its own budget wins over the server's
    m = ant(capped).messages.create(
        model=MODEL_NAME, messages=STORY, max_tokens=60, extra_body=T0,
        thinking={"type": "enabled", "budget_tokens": 8})
    first8 = ant(srv).messages.create(model=MODEL_NAME, messages=STORY,
                                      max_tokens=8, extra_body=T0)
    assert m.content[0].thinking == first8.content[0].thinking
    off = sluice_server(["-c", "2048", "--reasoning-budget", "0"],
                        model=think_model[0])
    st, p = raw(off, "/apply-template", {"messages": STORY})
    assert st == 200 and p["prompt"].endswith("</think>\n\n"), p
    r = oai(off).chat.completions.create(max_tokens=16, **kw)
    assert not reasoning_of(r.choices[0].message)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


# ---- earlier turns' thinking -----------------------------------------------

TOOL_TURN = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "",
     "reasoning_content": "The user wants the weather; I call the tool.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}]


def test_earlier_thinking_reaches_the_template(srv):
    """An assistant message's reasoning_content (OpenAI, as llama.cpp and
    vLLM take it) and an Anthropic assistant's thinking blocks are given to
    the template as message.reasoning_content: Qwen3's shows it for the
    turns after the last user message (a tool loop) and drops it before.
    sluice's prompt equals jinja2's; Anthropic clients that send their
    thinking blocks back (as Claude clients do) are no longer refused."""
    st, p = raw(srv, "/apply-template", {"messages": TOOL_TURN,
                                         "tools": TOOLS})
    assert st == 200, p
    ref = [dict(m) for m in TOOL_TURN]
    ref[1]["tool_calls"] = [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": {"city": "Paris"}}}]
    want = hf_render(srv.tmpl, ref, tools=TOOLS)
    assert "I call the tool." in p["prompt"]
    assert p["prompt"] == want, (p["prompt"], want)
    # before a later user message, the template drops it
    later = TOOL_TURN + [{"role": "assistant", "content": "It is sunny."},
                         {"role": "user", "content": "Thanks!"}]
    st, p2 = raw(srv, "/apply-template", {"messages": later, "tools": TOOLS})
    assert st == 200 and "I call the tool." not in p2["prompt"], p2
    bad = [dict(TOOL_TURN[1], reasoning_content=5)]
    st, e = raw(srv, "/apply-template", {"messages": [TOOL_TURN[0]] + bad})
    assert st == 400 and "reasoning_content" in e["error"]["message"], e
    # Anthropic: thinking blocks (and redacted ones) in the history
    ant_msgs = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "signature": "s",
             "thinking": "The user wants the weather; I call the tool."},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": "18 C, sunny"}]}]
    ant_tools = [{"name": "get_weather", "description": "The weather in a "
                  "city.", "input_schema": TOOLS[0]["function"]["parameters"]}]
    with_t = ant(srv).messages.count_tokens(model=MODEL_NAME,
                                            messages=ant_msgs,
                                            tools=ant_tools).input_tokens
    no_t = [dict(m) for m in ant_msgs]
    no_t[1] = {"role": "assistant", "content": [ant_msgs[1]["content"][2]]}
    without = ant(srv).messages.count_tokens(model=MODEL_NAME, messages=no_t,
                                             tools=ant_tools).input_tokens
    assert with_t > without  # the thinking is in the prompt
    m = ant(srv).messages.create(model=MODEL_NAME, messages=ant_msgs,
                                 tools=ant_tools, max_tokens=8,
                                 extra_body=T0)
    assert m.stop_reason in ("max_tokens", "end_turn", "tool_use"), m
    # a plain thinking + text turn before a new user message
    m = ant(srv).messages.create(model=MODEL_NAME, max_tokens=4,
                                 extra_body=T0, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "greet", "signature": "s"},
            {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "again"}])
    assert m.content, m
