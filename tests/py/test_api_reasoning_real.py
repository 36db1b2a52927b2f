"""Reasoning output (issue 45) on real templates and real token streams,
through the openai SDK against the real `sluice serve` (a file of its own:
the mutants of test_api_reasoning.py do not pay for it):

- a grammar forces the model's own tokens through a think block whose tags
  this vocabulary splits across several tokens: the split is the same
  streamed (token by token) and not, and a later "<think>" is content;
- DeepSeek-R1's chat template in a GGUF file: rendered as jinja2 renders
  it, its family found from its text, answers starting inside the block;
- unknown chat_template_kwargs keys reach the template as variables;
- sampled answers over 10 seeds split the same streamed and not.
"""
import pytest

from conftest import MODEL_NAME
from test_api_reasoning import (STORY, TEMPLATES, hf_render, make_model,
                                oai, raw, reasoning_of, thinking_template)

openai = pytest.importorskip("openai")
pytest.importorskip("jinja2")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def think_model(sluice_server, tmp_path_factory):
    return make_model(tmp_path_factory, thinking_template())


# ---- a real token stream, forced through a grammar -------------------------
#
# The model's own output, token by token as its tokenizer cuts it, forced to
# a known text by a grammar: "<think>" and "</think>" are not tokens of this
# vocabulary, so each tag arrives split across several tokens (and so across
# stream pieces). The template is Qwen3's own (the model opens the block).

FORCED_THINK = "I should add 2 and 2."
FORCED_TEXT = "The answer is 4; I wrote <think> here, as text."
FORCED = "<think>\n" + FORCED_THINK + "\n</think>\n\n" + FORCED_TEXT


def gbnf_literal(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace(
        "\n", "\\n") + '"'


@pytest.fixture(scope="module")
def plain_srv(sluice_server, tmp_path_factory):
    tmpl = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
    s = sluice_server(["-c", "2048"], model=make_model(tmp_path_factory, tmpl))
    return s


def test_forced_tokens_split_the_same_everywhere(plain_srv):
    s = plain_srv
    # the tags really are split across tokens here
    st, tk = raw(s, "/tokenize", {"content": "<think>", "with_pieces": True})
    assert st == 200 and len(tk["tokens"]) > 1, tk
    q = [{"role": "user", "content": "What is 2+2?"}]
    g = {"grammar": "root ::= " + gbnf_literal(FORCED)}
    r = oai(s).chat.completions.create(model=MODEL_NAME, messages=q,
                                       max_tokens=80, temperature=0,
                                       extra_body=g)
    msg = r.choices[0].message
    assert reasoning_of(msg) == FORCED_THINK, msg
    assert msg.content == FORCED_TEXT  # a later "<think>" is content
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < \
        r.usage.completion_tokens
    # streamed, as the SDK accumulates the deltas: the same split
    think, text, pieces = "", "", 0
    for ch in oai(s).chat.completions.create(
            model=MODEL_NAME, messages=q, max_tokens=80, temperature=0,
            stream=True, extra_body=g):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        think += (d.model_extra or {}).get("reasoning_content") or ""
        text += d.content or ""
        pieces += 1
    assert (think, text) == (FORCED_THINK, FORCED_TEXT)
    assert pieces > 10  # token by token
    # (the Anthropic route takes no grammar: its split of the model's own
    # tokens is the tests above)


# ---- DeepSeek-R1's template, in a GGUF file ---------------------------------


@pytest.fixture(scope="module")
def r1_srv(sluice_server, tmp_path_factory):
    tmpl = (TEMPLATES / "deepseek-r1.jinja").read_text(encoding="utf-8")
    s = sluice_server(["-c", "2048"], model=make_model(tmp_path_factory, tmpl))
    s.tmpl = tmpl
    return s


def test_deepseek_r1_template_in_gguf(r1_srv):
    """The R1 distills' template, read from the file: rendered as jinja2
    renders it (with and without enable_thinking, which it ignores; an
    earlier turn's thinking dropped), its family found from its text, so
    an answer starts inside the block the generation prompt opened."""
    s = r1_srv
    turns = [{"role": "user", "content": "Hi."},
             {"role": "assistant",
              "content": "<think>\nA greeting.\n</think>\n\nHello!"},
             {"role": "user", "content": "Write a long story about a dragon."}]
    for kw in ({}, {"chat_template_kwargs": {"enable_thinking": False}}):
        st, p = raw(s, "/apply-template", dict(kw, messages=turns))
        assert st == 200, p
        assert p["prompt"] == hf_render(s.tmpl, turns,
                                        **kw.get("chat_template_kwargs", {}))
        assert p["prompt"].endswith("<｜Assistant｜><think>\n")
        assert "A greeting" not in p["prompt"]
    r = oai(s).chat.completions.create(model=MODEL_NAME, messages=turns,
                                       max_tokens=16, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert len(reasoning_of(ch.message) or "") > 10 and not ch.message.content


def test_unknown_template_kwargs_are_template_variables(
        sluice_server, tmp_path_factory):
    """chat_template_kwargs keys the server does not know reach the
    template as variables, as llama.cpp passes them (any JSON value)."""
    tmpl = ("{{ greeting }}|{{ opts.level }}|{% for m in messages %}"
            "{{ m['content'] }}{% endfor %}")
    s = sluice_server(["-c", "512"], model=make_model(tmp_path_factory, tmpl))
    msgs = [{"role": "user", "content": "Hi"}]
    kw = {"greeting": "hey", "opts": {"level": 3}}
    st, p = raw(s, "/apply-template",
                {"messages": msgs, "chat_template_kwargs": kw})
    assert st == 200, p
    assert p["prompt"] == hf_render(tmpl, msgs, **kw) == "hey|3|Hi"
    # without them the template reads an undefined attribute: an error in
    # jinja2 too, a 400 here
    st, p = raw(s, "/apply-template", {"messages": msgs})
    assert st == 400, p
    with pytest.raises(Exception):
        hf_render(tmpl, msgs)


def test_stream_splits_like_non_stream_over_seeds(sluice_server, think_model):
    """Sampled answers (10 seeds), their thinking closed after 6 tokens so
    that each has both parts: streamed and not, the same two texts, byte
    for byte."""
    s = sluice_server(["-c", "2048", "--reasoning-budget", "6"],
                      model=think_model)
    both = 0
    for seed in range(10):
        kw = dict(model=MODEL_NAME, messages=STORY, max_tokens=24,
                  temperature=1.0, seed=seed)
        whole = oai(s).chat.completions.create(**kw).choices[0]
        rc, content = "", ""
        for ch in oai(s).chat.completions.create(stream=True, **kw):
            if ch.choices:
                d = ch.choices[0].delta
                rc += (d.model_extra or {}).get("reasoning_content") or ""
                content += d.content or ""
        assert (rc, content) == (reasoning_of(whole.message) or "",
                                 whole.message.content or ""), seed
        both += bool(rc) and bool(content)
    assert both >= 5, both
