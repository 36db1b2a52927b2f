#!/usr/bin/env python3
"""Behaviour of two sluice binaries, compared: the same server configurations
and requests against each, and every answer's greedy ids/text, logprobs and
embeddings compared exactly (ids, times and fingerprints left out).

For refactors that must not change behaviour (issue 44): build the previous
head somewhere (git archive HEAD~1 | tar -x -C /tmp/old; cmake ...) and run

    tools/compare_heads.py /tmp/old/build/sluice build/sluice -m MODEL.gguf \
        [--serve-arg=--device --serve-arg=cuda]

It prints one line per configuration and exits 1 on the first difference
(printing both answers). Uses only the standard library.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

CONFIGS = [
    ["-c", "2048"],
    ["-c", "2048", "--max-seqs", "2", "--kv-block-tokens", "16",
     "--prefill-chunk", "32"],
    ["-c", "512", "--max-seqs", "4", "--max-tokens-default", "0"],
    ["-c", "2048", "--kv-block-tokens", "16", "--hot-cache-bytes", "64M"],
]

PROMPTS = ["Write a haiku about rivers.", "What is 17 times 23?",
           "List three colors.", "Say hello in French.",
           "Explain what a compiler does in one sentence."]

VOLATILE = {"id", "created", "system_fingerprint", "timings", "x_sluice"}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def clean(v):
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items() if k not in VOLATILE}
    if isinstance(v, list):
        return [clean(x) for x in v]
    return v


def post(port, path, body, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    if stream:  # the events' data, in order, cleaned
        out = []
        for line in data.splitlines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                out.append(clean(json.loads(line[6:])))
        return [r.status, out]
    try:
        return [r.status, clean(json.loads(data))]
    except ValueError:
        return [r.status, data]


def requests():
    """(path, body, stream) of every request, in order."""
    out = []
    for p in PROMPTS:
        out.append(("/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user", "content": p}],
                     "max_tokens": 24, "temperature": 0, "logprobs": True,
                     "top_logprobs": 3}, False))
    for p in PROMPTS[:3]:
        out.append(("/v1/completions",
                    {"model": "m", "prompt": p, "max_tokens": 16,
                     "temperature": 0, "logprobs": 2}, False))
    for seed in (1, 7, 42):
        out.append(("/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user",
                                                 "content": PROMPTS[0]}],
                     "max_tokens": 20, "temperature": 0.9, "top_p": 0.95,
                     "seed": seed}, False))
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": PROMPTS[2]}],
                 "max_tokens": 12, "temperature": 0.8, "seed": 3, "n": 2},
                False))
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": PROMPTS[1]}],
                 "max_tokens": 20, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}}, True))
    out.append(("/v1/messages",
                {"model": "m", "max_tokens": 20, "temperature": 0,
                 "messages": [{"role": "user", "content": PROMPTS[3]}]},
                False))
    out.append(("/v1/messages",
                {"model": "m", "max_tokens": 16, "temperature": 0,
                 "stream": True,
                 "messages": [{"role": "user", "content": PROMPTS[4]}]},
                True))
    out.append(("/v1/embeddings",
                {"model": "m", "input": PROMPTS}, False))
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": "Give a name."}],
                 "max_tokens": 40, "temperature": 0,
                 "response_format": {"type": "json_schema", "json_schema": {
                     "name": "n", "schema": {
                         "type": "object", "properties": {
                             "name": {"type": "string", "maxLength": 12}},
                         "required": ["name"]}}}}, False))
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": PROMPTS[2]}],
                 "max_tokens": 30, "temperature": 0, "stop": [","]}, False))
    # no max_tokens (the default, or the room left), and one far above it
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": PROMPTS[1] * 20}],
                 "temperature": 0}, False))
    out.append(("/v1/completions",
                {"model": "m", "prompt": PROMPTS[4] * 30, "max_tokens": 100000,
                 "temperature": 0}, False))
    out.append(("/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user",
                                             "content": PROMPTS[0]}],
                 "max_tokens": 0}, False))
    return out


def concurrent(port):
    """Six greedy answers at once (one batch), by prompt, without usage."""
    res = [None] * 6

    def one(i):
        res[i] = post(port, "/v1/chat/completions", {
            "model": "m", "max_tokens": 20 + i, "temperature": 0,
            "logprobs": True,
            "messages": [{"role": "user",
                          "content": PROMPTS[i % len(PROMPTS)] + " " * i}]})
    ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # which prompt's blocks are cached when another arrives depends on
    # timing: usage.prompt_tokens_details.cached_tokens varies run to run
    for r in res:
        if isinstance(r[1], dict):
            r[1].pop("usage", None)
    return res


def first_diff(x, y, path=""):
    """The path of the first place where x and y differ, and both values."""
    if type(x) is not type(y):
        return path, x, y
    if isinstance(x, dict):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                return first_diff(x.get(k), y.get(k), path + "." + str(k))
    elif isinstance(x, list):
        for i, (a, b) in enumerate(zip(x, y)):
            if a != b:
                return first_diff(a, b, "%s[%d]" % (path, i))
        if len(x) != len(y):
            return path + ".length", len(x), len(y)
    return path, x, y


def answers(binary, model, cfg, log):
    port = free_port()
    p = subprocess.Popen([binary, "serve", "-m", model, "--model-name", "m",
                          "--port", str(port)] + cfg,
                         stdout=log, stderr=log)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if p.poll() is not None:
                sys.exit("%s exited %s with %s" % (binary, p.returncode, cfg))
            time.sleep(0.2)
        out = [post(port, path, body, stream)
               for path, body, stream in requests()]
        out.append(concurrent(port))
        return out
    finally:
        p.terminate()
        p.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--log", default="/tmp/compare_heads.log")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for every server (repeat): "
                         "--serve-arg=--device --serve-arg=cuda")
    a = ap.parse_args()
    n = 0
    with open(a.log, "w") as log:
        for cfg in CONFIGS:
            cfg = cfg + a.serve_arg
            old = answers(a.old, a.model, cfg, log)
            new = answers(a.new, a.model, cfg, log)
            reqs = requests()
            for i, (x, y) in enumerate(zip(old, new)):
                if x != y:
                    what = reqs[i][:2] if i < len(reqs) else "concurrent"
                    where, a1, b1 = first_diff(x, y)
                    print("DIFFERENT with %s, request %d %s, first at %s:\n"
                          " old %s\n new %s"
                          % (cfg, i, json.dumps(what)[:300], where,
                             json.dumps(a1)[:2000], json.dumps(b1)[:2000]))
                    return 1
            codes = [x[0] for x in old[:-1]] + [r[0] for r in old[-1]]
            n += len(codes)
            print("same: %s (%d answers, statuses %s)"
                  % (" ".join(cfg), len(codes),
                     ",".join(sorted(set(map(str, codes))))))
    print("identical: %d answers over %d configurations" % (n, len(CONFIGS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
