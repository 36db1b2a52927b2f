#!/usr/bin/env python3
"""Speculative decoding's pay-off through the server (issue 47 stage 3):
aggregate tokens/s of three workloads at 1, 4 and 16 concurrent clients,
for `sluice serve` without speculation and with it (the adaptive rule, and
--draft-fixed), each server started here in turn on the same model and
threads. Prints JSON on stdout (progress on stderr).

  python3 tools/bench_spec.py [--bin build/sluice] [-m MODEL] [-t 2]
      [--clients 1,4,16] [--workloads edit,summarise,chat]
      [--configs off,ngram,ngram-fixed,ngram16,ngram32,ngram64]
      [--max-tokens 192]

Workloads (chat completions, greedy):
- edit: a ~1.5k-token C source file (src/engine/spec.c) and "rename one
  identifier and print the whole file again": the answer repeats the prompt;
- summarise: the same file's comments as prose, "summarise it";
- chat: an open question with nothing to copy.
Each client sends one request with its own small variation (so that no
prefix cache serves one from another), streamed: tokens/s end to end (the
prompt's prefill included) and of the decode alone. All servers run at
once and the phases alternate between them.
"""
import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=900):
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/chat/completions" % port,
        json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream(port, body, timeout=900):
    """A streamed answer: its text, usage, and the times of its first and
    last text chunks (seconds, monotonic)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/chat/completions" % port,
        json.dumps(body).encode(), {"Content-Type": "application/json"})
    text, usage, t_first, t_last = [], None, None, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    now = time.monotonic()
                    t_first = t_first or now
                    t_last = now
                    text.append(piece)
    return "".join(text), usage, t_first, t_last


def prompts(kind, n):
    code = open(os.path.join(SRC, "src", "engine", "spec.c")).read()[:6000]
    names = ["sl_drafter_propose", "ngram_seq", "sl_spec_accept", "residual",
             "ngram_ref_lookup", "model_drafter", "sl_draft_lookup", "hist"]
    out = []
    for i in range(n):
        if kind == "edit":
            a = names[i % len(names)]
            t = ("Rename `%s` to `%s_%d` in this C file and print the whole "
                 "file again, changed, with nothing else:\n\n%s" %
                 (a, a, i, code))
        elif kind == "summarise":
            prose = " ".join(re.findall(r"/\*(.*?)\*/", code, re.S))
            prose = re.sub(r"\s*\*\s*", " ", prose)
            t = ("(%d) Summarise what this text says in a few sentences:\n\n"
                 "%s" % (i, prose))
        else:
            topics = ["rivers", "mountains", "cities", "the sea", "forests",
                      "deserts", "islands", "the night sky"]
            t = ("(%d) Tell me a story about %s, in your own words." %
                 (i, topics[i % len(topics)]))
        out.append(t)
    return out


def run_phase(port, kind, n, max_tokens):
    """n clients at once, one request each: tokens/s end to end (prompt
    included) and of the decode alone (from the last first token to the
    last token: every client decoding)."""
    ps = prompts(kind, n)

    def one(p):
        return stream(port, {"model": "default", "temperature": 0,
                             "max_tokens": max_tokens,
                             "messages": [{"role": "user", "content": p}]})
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        res = list(ex.map(one, ps))
    wall = time.monotonic() - t0
    toks = sum(u["completion_tokens"] for _, u, _, _ in res)
    # decode: each request's tokens after its first, over the time from
    # its first to its last chunk; summed over the clients
    dec = sum((u["completion_tokens"] - 1) / (tl - tf)
              for _, u, tf, tl in res if tl and tf and tl > tf)
    det = [u.get("completion_tokens_details") or {} for _, u, _, _ in res]
    return {"clients": n, "tokens": toks, "wall_s": round(wall, 3),
            "tokens_per_s": round(toks / wall, 2),
            "decode_tokens_per_s": round(dec, 2),
            "accepted": sum(d.get("accepted_prediction_tokens", 0)
                            for d in det),
            "rejected": sum(d.get("rejected_prediction_tokens", 0)
                            for d in det)}, [t for t, _, _, _ in res]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(SRC, "build", "sluice"))
    ap.add_argument("-m", "--model", default=os.path.join(
        SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--workloads", default="edit,summarise,chat")
    ap.add_argument("--configs", default="off,ngram,ngram-fixed")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--llama-server", default=None,
                    help="llama.cpp's llama-server binary: configs llama "
                    "(no speculation) and llama-TYPE (--spec-type TYPE: "
                    "ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
                    "ngram-cache) run it beside sluice")
    a = ap.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    args_of = {"off": [], "ngram": ["--speculative", "ngram"],
               "ngram-fixed": ["--speculative", "ngram", "--draft-fixed"]}
    for k in (16, 32, 64):  # ngram16: --draft-max 16, ...
        args_of["ngram%d" % k] = ["--speculative", "ngram", "--draft-max",
                                  str(k)]
    results = {}
    texts = {}
    servers = {}
    # every server up at once; the phases alternate between them (off N,
    # ngram N, ...) so that the machine's drift touches all alike
    try:
        for cfg in a.configs.split(","):
            port = free_port()
            if cfg.startswith("llama"):
                if not a.llama_server:
                    sys.exit("bench_spec: %s needs --llama-server" % cfg)
                np_ = max(clients)
                cmd = [a.llama_server, "-m", a.model, "--port", str(port),
                       "-t", str(a.threads), "-np", str(np_), "-c",
                       str(4096 * np_), "--cont-batching"]
                if cfg != "llama":
                    cmd += ["--spec-type", cfg[len("llama-"):]]
            else:
                cmd = [a.bin, "serve", "-m", a.model, "--port", str(port),
                       "-t", str(a.threads), "-c", "4096", "--max-seqs",
                       str(max(clients)), "--max-batched-tokens", "512"] + \
                    args_of[cfg]
            servers[cfg] = (port, subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for cfg, (port, _) in servers.items():
            for _ in range(600):
                try:
                    urllib.request.urlopen(
                        "http://127.0.0.1:%d/health" % port, timeout=1)
                    break
                except Exception:
                    time.sleep(0.1)
            post(port, {"model": "default", "max_tokens": 8,
                        "messages": [{"role": "user", "content": "hi"}]})
        for kind in a.workloads.split(","):
            for n in clients:
                for cfg, (port, _) in servers.items():
                    r, out = run_phase(port, kind, n, a.max_tokens)
                    results.setdefault(kind, {}).setdefault(cfg, []).append(r)
                    if cfg != "off" and texts.get((kind, n)) is not None:
                        r["same_text_as_off"] = out == texts[(kind, n)]
                    if cfg == "off":
                        texts[(kind, n)] = out
                    print("%s %s N=%d: %.1f tok/s, decode %.1f (%d kept, "
                          "%d rejected)" %
                          (cfg, kind, n, r["tokens_per_s"],
                           r["decode_tokens_per_s"], r["accepted"],
                           r["rejected"]), file=sys.stderr)
        for cfg, (port, _) in servers.items():
            if cfg.startswith("llama"):
                continue
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/admin/api/stats" % port,
                    timeout=30) as r:
                sp = json.loads(r.read()).get("speculative", {})
            results.setdefault("speculative_stats", {})[cfg] = sp
    finally:
        for _, p in servers.values():
            p.terminate()
            p.wait(30)
    ratios = {}
    for kind, by in results.items():
        if kind == "speculative_stats" or "off" not in by:
            continue
        for cfg, runs in by.items():
            if cfg == "off":
                continue
            ratios.setdefault(kind, {})[cfg] = {
                str(r["clients"]): {
                    "tokens_per_s": round(
                        r["tokens_per_s"] / o["tokens_per_s"], 3),
                    "decode": round(r["decode_tokens_per_s"] /
                                    o["decode_tokens_per_s"], 3)}
                for r, o in zip(runs, by["off"])}
    print(json.dumps({"bench": "spec", "model": a.model,
                      "threads": a.threads, "max_tokens": a.max_tokens,
                      "runs": results, "ratio_to_off": ratios}, indent=1))


if __name__ == "__main__":
    main()
