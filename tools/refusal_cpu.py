#!/usr/bin/env python3
"""What a refused request costs the server: starts `sluice serve` (BIN, with
-c CTX, the default model unless MODEL is given), sends each kind of prompt
that cannot fit the context three times, and prints the server process's
CPU time (utime + stime from /proc) for the best of the three, with the
status and the start of the answer. Issue 43 stage 2's goal: under 100 ms.
A benchmark, not a test: compare two binaries in the same run.

Usage: tools/refusal_cpu.py BIN [CTX] [MODEL]
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = sys.argv[1]
CTX = sys.argv[2] if len(sys.argv) > 2 else "8192"
MODEL = (sys.argv[3] if len(sys.argv) > 3 else
         os.path.join(HERE, "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
WORDS = "hello world " * 660000  # 7.9 MB
CASES = [
    ("chat 7.9 MB words", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": WORDS}]}),
    ("completions 7.9 MB words", "/v1/completions", {"prompt": WORDS}),
    ("completions 600 KB spaces", "/v1/completions", {"prompt": " " * 600000}),
    ("completions 600 KB letters", "/v1/completions",
     {"prompt": ("abcdefghijklmnopqrstuvwxyz" * 23077)[:600000]}),
    ("completions 50 KB words", "/v1/completions",
     {"prompt": "hello world " * 4200}),
    ("embeddings 7.9 MB", "/v1/embeddings", {"input": WORDS}),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--model-name", "m",
                          "--port", str(port), "-c", CTX,
                          "--max-body", str(9 << 20)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tick = os.sysconf("SC_CLK_TCK")

    def cpu():
        f = open(f"/proc/{p.pid}/stat").read().split(")")[-1].split()
        return (int(f[11]) + int(f[12])) / tick

    def post(path, body):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", path, json.dumps(dict(body, model="m", max_tokens=1)),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()[:100]

    try:
        for _ in range(300):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                c.getresponse().read()
                break
            except OSError:
                time.sleep(0.1)
        post("/v1/completions", {"prompt": "hi"})
        for name, path, body in CASES:
            best = None
            for _ in range(3):
                t0 = cpu()
                st, head = post(path, body)
                t = cpu() - t0
                best = t if best is None else min(best, t)
            print(f"{name:28s} status {st} cpu {best:.3f} s  {head[:70]!r}",
                  flush=True)
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
