#!/usr/bin/env python3
"""A short, mixed load on a running `sluice serve` (for compute-sanitizer
runs): N concurrent streamed chats (even ones greedy, odd ones sampled at
temperature 1 with a seed and top logprobs: the device sampler), a repeat of
one prompt (a prefix-cache hit), and one client that hangs up mid-stream (an
abort). Prints the server's clears (their share of the steps' time) and
where tokens were sampled. Exit 1 when a request that should have succeeded
did not.

    python3 tools/gpu/load.py PORT [N [MAX_TOKENS]]
"""
import http.client
import json
import sys
import threading
import time

PORT = int(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
MAX_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 24
STORY = ("The lighthouse keeper wrote every evening in his log about the "
         "ships that passed and the weather over the rocks. ") * 6
failures = []
MODEL = None


def model_id():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]


def chat(i, text, max_tokens=None, hang_up_after=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens or MAX_TOKENS, "temperature": 0,
            "stream": True}
    if i % 2:
        body.update(temperature=1.0, seed=i, logprobs=True, top_logprobs=3)
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        failures.append((i, r.status, r.read()[:200]))
        return
    chunks = 0
    for line in r:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                c.sock.close()  # the client goes away: an abort
                return
    if chunks == 0:
        failures.append((i, "no chunks"))


def main():
    global MODEL
    MODEL = model_id()
    ts = [threading.Thread(target=chat, args=(i, f"Client {i}: {STORY}"))
          for i in range(N)]
    ts.append(threading.Thread(target=chat, args=(N, STORY, 200, 3)))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    chat(N + 1, "Client 0: " + STORY)  # the same prompt again: cached
    time.sleep(0.5)
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("GET", "/admin/api/stats")
    st = json.loads(c.getresponse().read())
    print("stats:", json.dumps({k: st.get(k) for k in
                                ("device", "requests", "tokens", "clears",
                                 "sampling")}))
    cl = st.get("clears", {})
    if cl.get("step_ms_total"):
        print("clears: %d sites, %.3f ms of %.1f ms of steps (%.3f%%)" % (
            cl.get("engine_sites", 0), cl.get("ms_total", 0),
            cl["step_ms_total"], 100.0 * cl.get("ms_total", 0) /
            cl["step_ms_total"]))
    if st.get("tokens", {}).get("cached", 0) <= 0:
        failures.append(("no prefix-cache hit",))
    if failures:
        print("FAILED:", failures)
        return 1
    print("load ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
