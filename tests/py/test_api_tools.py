"""Tool calling (issue 12) through the official openai and anthropic SDKs,
an agent framework (openai-agents) and raw HTTP:

- tool_choice required / named (OpenAI) and any / tool (Anthropic) give
  well-formed calls whose arguments validate against the tool's schema
  (jsonschema, not our grammar, is the judge), even on the 135M model;
- streamed calls (tool_calls deltas, input_json_delta events) add up, in
  each SDK's own accumulator, to the non-streamed answer;
- a conversation that carries calls and their results is rendered by the
  chat template exactly as Python's jinja2 renders the HF-shaped messages
  (through /apply-template);
- a template that renders no tools gets them in a system message, and
  earlier calls as the JSON the model is asked to write;
- tool_choice none and bad tool definitions;
- openai-agents runs a whole loop: call, tool result, answer.

Skipped without the model, the binary or the SDKs (see conftest.py).
"""
import http.client
import json
import pathlib
import subprocess
import sys

import pytest

from conftest import MODEL_NAME, model_path

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")
jinja2 = pytest.importorskip("jinja2")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "fixtures" / "templates"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"type": "string",
                                                  "maxLength": 20}}}
OAI_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone.",
        "parameters": TIME}},
]
ANT_TOOLS = [{"name": t["function"]["name"],
              "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in OAI_TOOLS]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"]
           for t in OAI_TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def ant(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key="none",
                               max_retries=0, timeout=300)


def raw(srv, path, body):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def check_call(name, args):
    """A call names a tool and its arguments validate against its schema."""
    assert name in SCHEMAS, name
    jsonschema.validate(args, SCHEMAS[name])


# ---- forced calls --------------------------------------------------------


@pytest.mark.parametrize("choice", ["required", "named"])
def test_openai_forced_call(server, choice):
    tc = ("required" if choice == "required" else
          {"type": "function", "function": {"name": "get_time"}})
    r = oai(server).chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS, tool_choice=tc,
        temperature=0, max_tokens=400)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    calls = ch.message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        check_call(c.function.name, json.loads(c.function.arguments))
    if choice == "named":
        assert [c.function.name for c in calls] == ["get_time"]


def test_openai_parallel_off_gives_one_call(server):
    r = oai(server).chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS,
        tool_choice="required", parallel_tool_calls=False, temperature=0,
        max_tokens=400)
    assert len(r.choices[0].message.tool_calls) == 1


def test_openai_stream_adds_up(server):
    kw = dict(model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS,
              tool_choice="required", temperature=0, max_tokens=400)
    whole = oai(server).chat.completions.create(**kw).choices[0].message
    # the SDK's own accumulator
    with oai(server).chat.completions.stream(**kw) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    got = final.choices[0]
    assert got.finish_reason == "tool_calls"
    assert ([(c.function.name, json.loads(c.function.arguments))
             for c in got.message.tool_calls] ==
            [(c.function.name, json.loads(c.function.arguments))
             for c in whole.tool_calls])
    # and the raw deltas: id and name first, then the arguments
    deltas = [c.choices[0].delta for c in
              oai(server).chat.completions.create(stream=True, **kw)
              if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0].tool_calls[0]
    assert first.index == 0 and first.id and first.function.name


@pytest.mark.parametrize("choice", [{"type": "any"},
                                    {"type": "tool", "name": "get_weather"}])
def test_anthropic_forced_call(server, choice):
    kw = dict(model=MODEL_NAME, max_tokens=400, messages=ASK, tools=ANT_TOOLS,
              tool_choice=choice, extra_body={"temperature": 0})
    m = ant(server).messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses
    for b in uses:
        assert b.id.startswith("toolu_")
        check_call(b.name, b.input)
    if choice["type"] == "tool":
        assert [b.name for b in uses] == ["get_weather"]
    with ant(server).messages.stream(**kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in events
    assert final.stop_reason == "tool_use"
    assert ([(b.name, b.input) for b in final.content if b.type == "tool_use"]
            == [(b.name, b.input) for b in uses])


# ---- the conversation around calls ---------------------------------------


def test_results_round_trip(server):
    """A call, its result, and the answer after it, on both APIs."""
    c = oai(server)
    r = c.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0, max_tokens=200)
    msg = r.choices[0].message
    conv = ASK + [msg.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
         "content": "Sunny, 21 degrees."}]
    r2 = c.chat.completions.create(model=MODEL_NAME, messages=conv,
                                   tools=OAI_TOOLS, temperature=0,
                                   max_tokens=40)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the prompt holds the call and its result (no template support for
    # tools in the default model: both are text the model can read)
    st, p = raw(server, "/apply-template", {"messages": conv,
                                            "tools": OAI_TOOLS})
    assert st == 200
    assert '"tool_calls"' in p["prompt"] and "Sunny, 21 degrees." in p["prompt"]
    assert "get_time" in p["prompt"]  # the tools, in the system message

    a = ant(server)
    m = a.messages.create(model=MODEL_NAME, max_tokens=200, messages=ASK,
                          tools=ANT_TOOLS, tool_choice={"type": "any"},
                          extra_body={"temperature": 0})
    use = [b for b in m.content if b.type == "tool_use"][0]
    m2 = a.messages.create(
        model=MODEL_NAME, max_tokens=40, tools=ANT_TOOLS,
        messages=ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in
                                              m.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id,
                 "content": "Sunny, 21 degrees."}]}],
        extra_body={"temperature": 0})
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # count_tokens counts the same conversation, tools included
    n = a.messages.count_tokens(
        model=MODEL_NAME, tools=ANT_TOOLS,
        messages=ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in
                                              m.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id,
                 "content": "Sunny, 21 degrees."}]}])
    u = m2.usage  # Anthropic's input_tokens leaves out the cache reads
    assert n.input_tokens == u.input_tokens + u.cache_read_input_tokens


def test_results_round_trip_streamed(server):
    """The same loop with every answer streamed, each SDK accumulating."""
    c = oai(server)
    with c.chat.completions.stream(
            model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS,
            tool_choice={"type": "function",
                         "function": {"name": "get_weather"}},
            temperature=0, max_tokens=200) as s:
        msg = s.get_final_completion().choices[0].message
    call = msg.tool_calls[0]
    check_call(call.function.name, json.loads(call.function.arguments))
    conv = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": call.function.name,
            "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id,
         "content": "Sunny, 21 degrees."}]
    with c.chat.completions.stream(model=MODEL_NAME, messages=conv,
                                   tools=OAI_TOOLS, tool_choice="none",
                                   temperature=0, max_tokens=30) as s:
        final = s.get_final_completion().choices[0]
    assert final.message.content and final.message.tool_calls is None

    a = ant(server)
    with a.messages.stream(model=MODEL_NAME, max_tokens=200, messages=ASK,
                           tools=ANT_TOOLS, tool_choice={"type": "any"},
                           extra_body={"temperature": 0}) as s:
        m = s.get_final_message()
    use = [b for b in m.content if b.type == "tool_use"][0]
    check_call(use.name, use.input)
    with a.messages.stream(
            model=MODEL_NAME, max_tokens=30, tools=ANT_TOOLS,
            tool_choice={"type": "none"},
            messages=ASK + [
                {"role": "assistant",
                 "content": [b.model_dump(exclude_none=True,
                                          include={"type", "id", "name",
                                                   "input", "text"})
                             for b in m.content]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": use.id,
                     "content": "Sunny, 21 degrees."}]}],
            extra_body={"temperature": 0}) as s:
        m2 = s.get_final_message()
    assert m2.stop_reason in ("end_turn", "max_tokens")
    assert m2.content and m2.content[0].type == "text" and m2.content[0].text


def test_tool_choice_none_is_text(server):
    r = oai(server).chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS, tool_choice="none",
        temperature=0, max_tokens=20)
    ch = r.choices[0]
    assert ch.message.tool_calls is None and ch.finish_reason in ("stop",
                                                                  "length")
    st, p = raw(server, "/apply-template", {"messages": ASK,
                                            "tools": OAI_TOOLS,
                                            "tool_choice": "none"})
    assert st == 200 and "get_weather" not in p["prompt"]


@pytest.mark.parametrize("tools,param", [
    ([{"type": "function", "function": {"name": "bad name"}}], "tools[0]"),
    ([{"type": "function"}], "tools[0]"),
    ([{"type": "function", "function": {"name": "f", "parameters": 3}}],
     "tools[0]"),
])
def test_bad_tools_are_400(server, tools, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).chat.completions.create(model=MODEL_NAME, messages=ASK,
                                            tools=tools, max_tokens=5)
    assert e.value.body["param"] == param


def test_anthropic_server_tool_is_400(server):
    with pytest.raises(anthropic.BadRequestError):
        ant(server).messages.create(
            model=MODEL_NAME, max_tokens=5, messages=ASK,
            tools=[{"type": "web_search_20250305", "name": "web_search"}])


# ---- a template that renders tools (Hermes / Qwen 2.5) -------------------


def hf_render(template, messages, tools):
    """The reference: jinja2 set up as transformers sets it up."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.ext import loopcontrols

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, \
        separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent,
            separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=True,
        bos_token="<|im_start|>", eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def hermes_server(sluice_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("hermes") / "hermes.gguf"
    tmpl = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                    model_path(), str(out), "--chat-template", tmpl,
                    "--force"], check=True, capture_output=True)
    srv = sluice_server(["-c", "2048"], model=str(out))
    srv.tmpl = tmpl
    yield srv


def test_hermes_template_renders_like_jinja2(hermes_server):
    calls = [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather",
        "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]
    conv = [{"role": "system", "content": "Be brief."}] + ASK + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."}]
    st, p = raw(hermes_server, "/apply-template",
                {"messages": conv, "tools": OAI_TOOLS})
    assert st == 200, p
    # HF's shape: arguments as an object, tools as given
    ref_conv = [dict(m) for m in conv]
    ref_conv[2] = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather",
            "arguments": {"city": "Paris", "unit": "celsius"}}}]}
    ref_conv[3] = dict(ref_conv[3])
    assert p["prompt"] == hf_render(hermes_server.tmpl, ref_conv, OAI_TOOLS)
    assert "<tool_call>" in p["prompt"] and "<tools>" in p["prompt"]


def test_hermes_forced_call(hermes_server):
    """The call is written as <tool_call> JSON (the grammar), read back."""
    kw = dict(model=MODEL_NAME, messages=ASK, tools=OAI_TOOLS,
              tool_choice="required", temperature=0, max_tokens=400)
    r = oai(hermes_server).chat.completions.create(**kw)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    for c in calls:
        check_call(c.function.name, json.loads(c.function.arguments))
    # the text the model wrote, through /v1/completions on the same prompt
    st, p = raw(hermes_server, "/apply-template",
                {"messages": ASK, "tools": OAI_TOOLS})
    assert st == 200 and "<tools>" in p["prompt"]


# ---- an agent framework ----------------------------------------------------


def test_openai_agents_loop(server):
    """openai-agents: the model must call the tool (tool_choice required on
    the first turn), the tool runs, its result goes back, and the run ends
    with an answer: after the tool, the agent's hook sets tool_choice to
    "none" (under the framework's reset to auto the 135M model may call the
    tool again at every turn, as it does on some CPUs' rounding: a choice
    of the model's, not the server's), so the second turn is an answer."""
    agents = pytest.importorskip("agents")
    import dataclasses
    from agents import (Agent, AgentHooks, ModelSettings,
                        OpenAIChatCompletionsModel, RunConfig, Runner,
                        function_tool, set_tracing_disabled)
    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny and 21 degrees in {city}."

    client = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="none",
                                max_retries=0, timeout=300)
    class AnswerAfterTool(AgentHooks):
        async def on_tool_end(self, context, agent, tool, result):
            agent.model_settings = dataclasses.replace(agent.model_settings,
                                                       tool_choice="none")

    agent = Agent(
        name="weather", instructions="Answer with the weather tool.",
        tools=[get_weather], hooks=AnswerAfterTool(), reset_tool_choice=False,
        model=OpenAIChatCompletionsModel(model=MODEL_NAME,
                                         openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0,
                                     max_tokens=120))
    res = Runner.run_sync(agent, "What is the weather in Paris?",
                          max_turns=4, run_config=RunConfig(
                              tracing_disabled=True))
    assert seen, "the tool never ran"
    assert isinstance(res.final_output, str)
    kinds = [i.type for i in res.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert kinds[-1] == "message_output_item"
