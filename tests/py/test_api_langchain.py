"""LangChain's ChatOpenAI and ChatAnthropic against the real `sluice serve`
(issue 45: reasoning output must not break the client libraries people
build on): plain answers, streamed and not (the same greedy text), tool
calls through bind_tools, and a thinking model (the default model with a
Qwen3-style template whose generation prompt opens "<think>"): ChatOpenAI
keeps the thinking out of the content, ChatAnthropic with thinking enabled
gets a thinking block, then the text, with a budget.
"""
import subprocess
import sys

import pytest

from conftest import MODEL_NAME, model_path

lc_openai = pytest.importorskip("langchain_openai")
lc_anthropic = pytest.importorskip("langchain_anthropic")
from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from test_api_reasoning import thinking_template  # noqa: E402

Q = "Write one sentence about rivers."


def chat_openai(s, **kw):
    return lc_openai.ChatOpenAI(base_url=s.base + "/v1", api_key="none",
                                model=MODEL_NAME, temperature=0,
                                max_retries=0, timeout=300, **kw)


def chat_anthropic(s, **kw):
    kw.setdefault("temperature", 0)
    return lc_anthropic.ChatAnthropic(base_url=s.base, api_key="none",
                                      model=MODEL_NAME, max_retries=0,
                                      timeout=300, **kw)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_chat_openai(server):
    llm = chat_openai(server, max_tokens=16)
    m = llm.invoke([HumanMessage(Q)])
    assert isinstance(m.content, str) and m.content.strip()
    assert m.usage_metadata["output_tokens"] <= 16
    streamed = "".join(c.content for c in llm.stream([HumanMessage(Q)]))
    assert streamed == m.content
    # a forced tool call comes back as LangChain's tool_calls
    t = chat_openai(server, max_tokens=80).bind_tools(
        [get_weather], tool_choice="get_weather")
    m = t.invoke("What is the weather in Paris?")
    assert m.tool_calls and m.tool_calls[0]["name"] == "get_weather"
    assert isinstance(m.tool_calls[0]["args"].get("city"), str)


def test_chat_anthropic(server):
    llm = chat_anthropic(server, max_tokens=16)
    m = llm.invoke([HumanMessage(Q)])
    assert isinstance(m.content, str) and m.content.strip()
    streamed = "".join(c.content if isinstance(c.content, str) else
                       "".join(b.get("text", "") for b in c.content)
                       for c in llm.stream([HumanMessage(Q)]))
    assert streamed == m.content
    t = chat_anthropic(server, max_tokens=80).bind_tools(
        [get_weather], tool_choice="get_weather")
    m = t.invoke("What is the weather in Paris?")
    assert m.tool_calls and m.tool_calls[0]["name"] == "get_weather"


@pytest.fixture(scope="module")
def think_srv(sluice_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("lc") / "think.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                    model_path(), str(out), "--chat-template",
                    thinking_template(), "--force"], check=True,
                   capture_output=True)
    return sluice_server(["-c", "2048"], model=str(out))


def test_thinking_model(think_srv):
    story = [HumanMessage("Write a long story about a dragon.")]
    # ChatOpenAI: the answer's content is the text after the thinking (here
    # none: max_tokens ends it inside the block), never the thinking itself
    m = chat_openai(think_srv, max_tokens=24).invoke(story)
    assert m.content == "", m.content
    assert m.response_metadata["finish_reason"] == "length"
    # ChatAnthropic with thinking on and a budget: a thinking block first
    # (with its signature), then the text the model goes on with
    llm = chat_anthropic(think_srv, max_tokens=60, temperature=1,
                         thinking={"type": "enabled", "budget_tokens": 16})
    m = llm.invoke(story)
    kinds = [b["type"] for b in m.content]
    assert kinds[0] == "thinking" and m.content[0]["thinking"].strip()
    assert m.content[0].get("signature")
    assert "text" in kinds[1:], kinds
    chunks = list(llm.stream(story))
    assert chunks and any(
        isinstance(c.content, list) and any(
            b.get("type") == "thinking" for b in c.content) for c in chunks)
