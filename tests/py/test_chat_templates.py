"""Differential test: sluice's Jinja engine against Python jinja2, set up the
way Hugging Face transformers renders chat templates.

Every template in tests/fixtures/templates/*.jinja is rendered with a set of
conversations, with and without add_generation_prompt, by jinja2 and by the
sl_render_template tool (path in $SLUICE_RENDER_TEMPLATE); the outputs must
be byte-identical, and a template error in one must be an error in the other.
A list of small snippets does the same for individual language features.
"""

import json
import os
import pathlib
import subprocess
from datetime import datetime

import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOL = os.environ.get("SLUICE_RENDER_TEMPLATE")
ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "templates"

pytestmark = pytest.mark.skipif(
    not TOOL, reason="SLUICE_RENDER_TEMPLATE is not set (build sl_render_template)"
)


# ---- the reference: HF's environment ------------------------------------------


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = hf_env()


def render_py(template, messages, agp, bos, eos, extra):
    """Returns (ok, text-or-error)."""
    try:
        t = ENV.from_string(template)
        return True, t.render(
            messages=messages,
            add_generation_prompt=agp,
            bos_token=bos,
            eos_token=eos,
            **extra,
        )
    except Exception as e:  # noqa: BLE001 - any jinja2 failure is an error
        return False, f"{type(e).__name__}: {e}"


def render_sluice(template, messages, agp, bos, eos, extra):
    req = {
        "template": template,
        "messages": messages,
        "add_generation_prompt": agp,
        "bos_token": bos,
        "eos_token": eos,
        "extra": extra,
    }
    env = dict(os.environ)
    # a sanitizer report must not pass for a template error (exit code 1)
    env.setdefault("ASAN_OPTIONS", "exitcode=86")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:exitcode=86")
    p = subprocess.run(
        [TOOL],
        input=json.dumps(req).encode(),
        capture_output=True,
        timeout=60,
        env=env,
    )
    if p.returncode == 0:
        return True, p.stdout.decode("utf-8")
    assert p.returncode == 1, f"tool failed badly ({p.returncode}): {p.stderr!r}"
    assert p.stderr, "a template error must come with a message"
    return False, p.stderr.decode("utf-8", "replace")


def check(template, messages=(), agp=False, bos="<s>", eos="</s>", extra=None):
    extra = extra or {}
    ok_py, out_py = render_py(template, list(messages), agp, bos, eos, extra)
    ok_sl, out_sl = render_sluice(template, list(messages), agp, bos, eos, extra)
    if ok_py:
        assert ok_sl, f"sluice failed where jinja2 rendered:\n{out_sl}"
        assert out_sl == out_py
    else:
        assert not ok_sl, f"jinja2 failed ({out_py}) but sluice rendered {out_sl!r}"
    return ok_py, out_py


# ---- conversations --------------------------------------------------------------

SYS = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is 2+2?"}
A1 = {"role": "assistant", "content": "4."}
U2 = {"role": "user", "content": "And 3+3?"}
A2 = {"role": "assistant", "content": "6."}
UNI = {
    "role": "user",
    "content": "  héllo 世界 🚀 \"quoted\" 'single' \\ back\tslash\nnew line  \n",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers — exactly.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
            "return": {"type": "number"},
        },
    },
]
TOOL_CALL_MSG = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "abc123XYZ",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
        }
    ],
}
TOOL_RESULT = {
    "role": "tool",
    "tool_call_id": "abc123XYZ",
    "content": '{"temp": 21.5, "sky": "clear"}',
}
A_FINAL = {"role": "assistant", "content": "It is 21.5°C and clear in Paris."}
THINK = {
    "role": "assistant",
    "content": "<think>\nLet me add.\n</think>\n\nThe answer is 4.",
}
REASONING = {
    "role": "assistant",
    "content": "The answer is 6.",
    "reasoning_content": "\n3+3 is 6.\n",
}

CONVERSATIONS = {
    "user": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [U1, A1, U2],
    "system_multi_turn": [SYS, U1, A1, U2, A2],
    "unicode": [UNI],
    "unicode_multi": [SYS, UNI, {"role": "assistant", "content": " ✓ ok \n"}, U2],
    "ends_with_assistant": [U1, A1],
    "thinking": [U1, THINK, U2, REASONING],
    "tool_use": [SYS, U1, TOOL_CALL_MSG, TOOL_RESULT, A_FINAL],
    "tool_use_open": [U1, TOOL_CALL_MSG, TOOL_RESULT],
    "empty_content": [{"role": "user", "content": ""}],
    "two_users": [U1, U2],
}

TOOL_TEMPLATES = {"qwen2.5", "qwen3", "llama3.1", "mistral-v0.3", "deepseek-r1"}


def fixture_names():
    return sorted(p.stem for p in FIXTURES.glob("*.jinja"))


def test_fixtures_present():
    names = set(fixture_names())
    for want in ["smollm2", "llama3", "llama3.1", "qwen2.5", "qwen3",
                 "mistral-v0.3", "gemma2", "gemma3", "deepseek-r1"]:
        assert want in names


@pytest.mark.parametrize("name", fixture_names())
@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
@pytest.mark.parametrize("agp", [False, True])
def test_template(name, conv, agp):
    template = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    check(template, CONVERSATIONS[conv], agp)


@pytest.mark.parametrize("name", sorted(TOOL_TEMPLATES))
@pytest.mark.parametrize("conv", ["user", "system_user", "tool_use", "tool_use_open"])
def test_template_with_tools(name, conv):
    template = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    ok, _ = check(template, CONVERSATIONS[conv], True, extra={"tools": TOOLS})
    if conv in ("user", "system_user"):
        assert ok


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_enable_thinking(thinking):
    template = (FIXTURES / "qwen3.jinja").read_text(encoding="utf-8")
    ok, out = check(template, [U1], True, extra={"enable_thinking": thinking})
    assert ok
    assert ("<think>" in out) == (not thinking)


@pytest.mark.parametrize("thinking", [None, True, False])
def test_deepseek_r1_thinking(thinking):
    """DeepSeek-R1's template (the distills' chat template): its generation
    prompt opens the think block whatever enable_thinking says, and an
    earlier assistant turn keeps only what follows its </think>; sluice
    renders it as jinja2 does."""
    template = (FIXTURES / "deepseek-r1.jinja").read_text(encoding="utf-8")
    extra = {} if thinking is None else {"enable_thinking": thinking}
    msgs = [{"role": "system", "content": "Be brief."}, U1,
            {"role": "assistant",
             "content": "<think>\nThe user greets me.\n</think>\n\nHello!"},
            {"role": "user", "content": "And now?"}]
    ok, out = check(template, msgs, True, extra=extra)
    assert ok
    assert out.endswith("<｜Assistant｜><think>\n")
    assert "The user greets me" not in out and "<｜Assistant｜>\n\nHello!" in out


def test_llama31_builtin_tools():
    template = (FIXTURES / "llama3.1.jinja").read_text(encoding="utf-8")
    msgs = [
        U1,
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "brave_search", "arguments": {"query": "x"}}}
            ],
        },
        {"role": "ipython", "content": {"result": [1, 2]}},
    ]
    ok, _ = check(
        template, msgs, True,
        extra={"builtin_tools": ["brave_search", "code_interpreter"]},
    )
    assert ok


def test_errors_match():
    # roles that do not alternate: gemma raises, and so must sluice
    template = (FIXTURES / "gemma2.jinja").read_text(encoding="utf-8")
    ok, msg = check(template, [U1, U2], True)
    assert not ok and "alternate" in msg


def test_raise_exception_message():
    ok, _ = render_sluice("{{ raise_exception('boom: ' ~ 42) }}", [], False, "", "", {})
    assert not ok
    ok, err = render_sluice("{{ raise_exception('boom: ' ~ 42) }}", [], False, "", "", {})
    assert "boom: 42" in err


# ---- language features, one snippet at a time ----------------------------------

SNIPPETS = [
    # literals, arithmetic, strings
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}",
    "{{ 10 / 4 }} {{ 1 / 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }}",
    "{{ 1e20 }} {{ 1.5e-7 }} {{ 123456789.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ -0.0 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ 'ab' + 'cd' }} {{ [1] + [2, 3] }}",
    "{{ \"esc: \\n \\t \\\\ \\' \\\" \\x41 \\u00e9 \\101\" }}",
    "{{ 'adjacent' 'strings' }} {{ none }} {{ None }} {{ True }} {{ false }}",
    "{{ [1, 'a', none, true, 1.0, [2], {'k': 'v'}] }} {{ {'a': 1, 'b': [1, 2]} }}",
    "{{ (1, 2) | list }} {{ ['it\\'s', \"q\\\"\"] }}",
    # comparisons, logic
    "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }}",
    "{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ not 0 }} {{ none or [] }}",
    "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}",
    "{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'only' if false }}]",
    # undefined
    "[{{ missing }}] {{ missing is defined }} {{ missing is undefined }} {{ missing | default('d') }}",
    "{{ missing | length }} {{ 'x' if missing else 'y' }} {{ missing == missing2 }}",
    "{% for x in missing %}{{ x }}{% else %}empty{% endfor %}",
    "{{ missing.attr }}",
    "{{ {'a': 1}.b }}|{{ {'a': 1}['b'] }}|{{ [1][5] }}|{{ none.x }}",
    # tests
    "{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 'x' is number }}",
    "{{ none is none }} {{ [] is iterable }} {{ 'x' is iterable }} {{ {} is mapping }} {{ [] is mapping }}",
    "{{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ true is true }} {{ 1 is true }} {{ false is false }}",
    "{{ 6 is divisibleby 3 }} {{ 6 is divisibleby(4) }} {{ 1 is integer }} {{ 1.0 is float }}",
    "{{ 'a' is not string }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} {{ true is boolean }}",
    # filters
    "{{ '  pad  ' | trim }}|{{ 'Hello' | upper }}|{{ 'Hello' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
    "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'a', 'B'] | sort }} {{ ['b', 'A'] | sort(case_sensitive=true) }}",
    "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }}",
    "{{ [1, 2, 3] | join(', ') }} {{ [1, 2] | join }} {{ 'abc' | list }} {{ {'a': 1, 'b': 2} | items | list }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '.') }}",
    "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }}",
    "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ -2.5 | abs }} {{ 3 | round }}",
    "{{ [1, 2, 2, 'a', 'A'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}",
    "{{ 42 | string }} {{ none | string }} {{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | safe }} {{ '<i>' | escape }}",
    "{{ [1, 2, 3] | sum }} {{ [1, 5, 3] | max }} {{ [4, 2, 8] | min }} {{ ['b', 'A', 'c'] | max }}",
    "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(3, true) }}|{{ 'x\\n\\ny' | indent('> ', blank=true) }}",
    "{{ {'b': 1, 'a': 2} | dictsort }} {{ 'one two  three' | wordcount }}",
    "{{ none | default('x') }} {{ none | default('x', true) }} {{ '' | d('empty', boolean=true) }}",
    # tojson
    "{{ {'a': [1, 2.5, none, true], 'b': 'é\"\\n<>&\\'', 'c': {}} | tojson }}",
    "{{ {'a': [1, {'x': []}], 'b': 'c'} | tojson(indent=2) }}",
    "{{ {'b': 1, 'a': [2]} | tojson(indent=4, sort_keys=true) }} {{ [1, 2] | tojson(separators=(',', ':')) }}",
    "{{ 'ünï 🚀' | tojson }} {{ 'ünï 🚀' | tojson(ensure_ascii=true) }} {{ 1e100 | tojson }} {{ 0.5 | tojson }}",
    # select / map
    "{% set xs = [{'n': 'a', 'v': 1}, {'n': 'b', 'v': 0}, {'n': 'c'}] %}{{ xs | selectattr('v') | map(attribute='n') | list }}",
    "{% set xs = [{'n': 'a', 'v': 1}, {'n': 'b', 'v': 0}, {'n': 'c'}] %}{{ xs | rejectattr('v') | map(attribute='n') | join(',') }}",
    "{% set xs = [{'r': 'user'}, {'r': 'bot'}, {'r': 'user'}] %}{{ xs | selectattr('r', 'equalto', 'user') | list | length }}",
    "{% set xs = [{'n': 'b'}, {'n': 'a'}] %}{{ xs | sort(attribute='n') | map(attribute='n') | join }}",
    "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }}",
    "{% set xs = [{'n': 'a'}, {}] %}{{ xs | map(attribute='n', default='?') | list }}",
    # slicing
    "{{ [1, 2, 3, 4, 5][1:3] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3, 4][::2] }} {{ [1, 2, 3][-2:] }} {{ [1, 2, 3][:-1] }}",
    "{{ 'hello'[1:] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ 'abc'[-1] }} {{ [1, 2, 3][5:] }} {{ 'abcdef'[4:1:-1] }}",
    # string methods
    "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }}",
    "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}]",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a<x>b<x>c'.split('<x>')[-1] }}",
    "{{ 'Hi There'.upper() }} {{ 'Hi There'.lower() }} {{ 'hi there-you'.title() }} {{ 'a-b'.replace('-', '_') }}",
    "{{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ 'hELLo'.capitalize() }}",
    # dict methods
    "{% set d = {'a': 1, 'b': 2} %}{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 9) }} {{ d.keys() | list }} {{ d.values() | list }}",
    "{% set d = {'a': 1, 'b': 2} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% set d = {'a': 1} %}{{ d.a }} {{ d['a'] }} {{ d.missing is defined }}",
    # loops
    "{% for x in [10, 20, 30] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }},{% endfor %}",
    "{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ x }}{{ loop.nextitem | default('-') }} {% endfor %}",
    "{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}",
    "{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}{% for x in [] %}no{% else %}else{% endfor %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {{ range(5) | list }}",
    "{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}",
    # scoping and set
    "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% set ns = namespace(n=0, items=[]) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }} {{ ns.items }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (1, 2) %}{{ t | length }}",
    "{% set blk %}inner {{ 1 + 1 }}{% endset %}[{{ blk }}]",
    "{% with q = 5 %}{{ q }}{% endwith %}[{{ q }}]",
    "{% filter upper %}shout {{ 'it' }}{% endfilter %}",
    # macros
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}",
    "{% macro f(x) %}{% if x > 0 %}{{ x }}{{ f(x - 1) }}{% endif %}{% endmacro %}{{ f(4) }}",
    "{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}",
    # whitespace control
    "a\n  {% if true %}\n  b\n  {% endif %}\nc",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "x\n{# comment #}\ny  {#- strip -#}  z",
    "  {{ 'v' }}  \n  {%+ if true %}kept{% endif %}\n{% raw %}{{ not parsed }}{% endraw %}",
    "line1\n\n{% for i in [1, 2] %}\n  item {{ i }}\n{% endfor %}\nend\n",
    "{{- '  a  ' -}}   {{ 'b' }}\r\n{% if 1 %}\r\nc\r\n{% endif %}\r\n",
    "{% if true %}   \n    yes\n{%- endif %}",
    "   {% if true %}x{% endif %}   \n\t{% if true %}y{% endif %}",
    # more corners
    "{%- set x = 1 -%}\n  a  \n{%- set y = 2 %}\n b",
    "  {{ 'v' }}\n  {# c #}\n  x",
    "{{ 'a' ~ [1] }} {{ {1: 'a'} | tojson }} {{ [1,2] == (1,2) }} {{ (1,) }} {{ () }}",
    "{% if true %}  \nx{% endif %}",
    "{{ \"%}\" }} {{ '}}' }} {{ {'a': {'b': 1}} }}",
    "{{ 1e-5 }} {{ 123456789012345678.0 }} {{ 1.0e16 }} {{ 12345.678 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}",
    "{{ -1 | abs }} {{ -(1) }} {{ - 2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not 1 == 2 }} {{ 1 if 0 else 2 if 0 else 3 }}",
    "{% for k, v in {'a': 1} | dictsort %}{{ k }}{{ v }}{% endfor %}",
    "{{ [{'a': 2}, {'a': 1}] | sort(attribute='a') }} {{ [[2, 'b'], [1, 'a']] | sort }}",
    "{{ 3 * 'ab' }} {{ [0] * 3 }} {{ 'a' * 0 }} {{ '{\"a\": 1}' | tojson }}",
    "{{ none | tojson }} {{ true | tojson }} {{ 'x' | tojson(indent=2) }} {{ [] | tojson(indent=2) }} {{ {} | tojson(indent=2) }}",
    "{{ [1, [2, [3]]] | tojson(indent=1) }}",
    "{{ 10 // 3.0 }} {{ -10 // 3.0 }} {{ 10 % -3 }} {{ 10.5 % 3 }} {{ -0.5 // 1 }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 1 }} {{ 1 == 1 == 1 }} {{ 1 < 3 < 2 }}",
    "{{ lst | map('string') | join('|') }} {{ obj.k }} {{ obj['k'] }} {{ num + 1 }}",
    "{{ var.upper() }} {{ var[0] }} {{ var | first | upper }} {{ var is string }}",
    "{{ '\\t\\n x \\n' | trim }}|{{ 'a\\u00a0' | trim }}|",
    "{{ 'A B'.split(' ') }} {{ 'a\\tb\\nc'.split() }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ [1, 2, 3] | select('gt', 1) | list }} {{ ['a', 'B', 'c'] | map('lower') | select('in', ['a', 'b']) | list }}",
    "{% for x in 'abc' %}{{ loop.cycle('odd', 'even') }}{% endfor %}",
    "{{ 'x' ~ none }} {% set x = {'a': [1]} %}{{ x.a.0 }} {{ x['a'][0] }}",
    "{{ 'hello world foo'.title() }} {{ \"they're bill's\".title() }} {{ 'x-y z_a' | title }}",
    "a {%- if true %} b {% endif -%} c",
    "{% for i in range(3) -%}\n  {{ i }}\n{%- endfor %}",
    "{{ x | default }}|{{ 0 | default(5) }}|{{ false | default(5, true) }}",
    "{{ true + 1 }} {{ true * 3 }} {{ 3 / true }}",
    "{{ range(3) | reverse | list }} {{ range(10, 0, -3) | list }} {{ [] | first }}|{{ [] | sum }}",
    "{{ 'abc' | int(-1) }} {{ '  12  ' | int }} {{ '1_000' | int }} {{ '0x10' | int }} {{ '1e3' | int }} {{ ' 2.5 ' | float }}",
    # errors that must be errors in both
    "{{ [1, 'a'] | sort }}",
    "{{ undefined_fn() }}",
    "{% for x in 5 %}{% endfor %}",
    "{{ none | length }}",
    "{{ 1 + 'a' }}",
    "{{ 1 < 'a' }}",
    "{% for %}",
    "{{ raise_exception('custom failure') }}",
    "{% if %}{% endif %}",
    "{{ (1 }}",
    "{% endfor %}",
    "{{ 1 / 0 }}",
    "{% set d = {} %}{{ d.update({'a': 1}) }}",
]


@pytest.mark.parametrize("idx", range(len(SNIPPETS)))
def test_snippet(idx):
    extra = {"var": "value", "num": 3, "lst": [1, 2], "obj": {"k": "v"}}
    check(SNIPPETS[idx], [], False, extra=extra)
