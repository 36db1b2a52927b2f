#!/usr/bin/env python3
"""The agent-facing APIs against `sluice serve --device cuda`, with the
standard library only (the GPU machine has no SDKs): a forced tool call,
a JSON-schema answer, n choices, and the embeddings refusal. Exits non-zero
on the first failure. Usage: api_smoke.py SLUICE MODEL
"""
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def main():
    sluice, model = sys.argv[1], sys.argv[2]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open("/tmp/api_smoke_serve.log", "w")
    p = subprocess.Popen([sluice, "serve", "-m", model, "--device", "cuda",
                          "--port", str(port), "--model-name", "m"],
                         stdout=log, stderr=log)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if json.load(r)["status"] == "ok":
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        tools = [{"type": "function", "function": {
            "name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}}]
        ok = True
        for temp in (0, 0.8):
            st, r = post(base, "/v1/chat/completions", {
                "model": "m", "messages": ask, "tools": tools,
                "tool_choice": "required", "temperature": temp, "seed": 3,
                "max_tokens": 200})
            calls = r["choices"][0]["message"].get("tool_calls") or []
            good = st == 200 and calls and all(
                c["function"]["name"] == "get_weather" and
                isinstance(json.loads(c["function"]["arguments"])["city"], str)
                for c in calls)
            print(f"tool_choice required, temperature {temp}: "
                  f"{'ok' if good else 'FAIL'} {calls[:1]}")
            ok &= bool(good)
        schema = {"type": "object", "properties": {
            "title": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["title", "year"], "additionalProperties": False}
        for temp in (0, 0.8):
            st, r = post(base, "/v1/chat/completions", {
                "model": "m", "temperature": temp, "seed": 5,
                "max_tokens": 120,
                "messages": [{"role": "user", "content": "A book, as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "b", "schema": schema}}})
            text = r["choices"][0]["message"]["content"] if st == 200 else ""
            try:
                v = json.loads(text)
                good = set(v) == {"title", "year"} and \
                    isinstance(v["year"], int)
            except ValueError:
                good = r["choices"][0]["finish_reason"] == "length"
            print(f"json_schema, temperature {temp}: "
                  f"{'ok' if good else 'FAIL'} {text[:80]!r}")
            ok &= good
        st, r = post(base, "/v1/chat/completions", {
            "model": "m", "messages": ask, "n": 3, "seed": 9,
            "max_tokens": 16})
        good = st == 200 and [c["index"] for c in r["choices"]] == [0, 1, 2]
        print(f"n=3: {'ok' if good else 'FAIL'} "
              f"{[c['message']['content'][:30] for c in r.get('choices', [])]}")
        ok &= good
        st, r = post(base, "/v1/embeddings", {"model": "m", "input": "hi"})
        good = st == 400 and "device" in r["error"]["message"]
        print(f"embeddings on a GPU engine: 400 {'ok' if good else 'FAIL'}: "
              f"{r['error']['message'] if st == 400 else st}")
        ok &= good
        with urllib.request.urlopen(base + "/admin/api/stats") as resp:
            print("sampling:", json.load(resp).get("sampling"))
        return 0 if ok else 1
    finally:
        p.terminate()
        p.wait(60)


if __name__ == "__main__":
    sys.exit(main())
