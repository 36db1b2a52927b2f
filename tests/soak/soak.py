#!/usr/bin/env python3
"""Soak test of `sluice serve` (issue 10): many streaming clients for a long
time, with misbehaving ones mixed in, through real sockets.

    python3 tests/soak/soak.py [--seconds 600] [--clients 64] [--idle 64]
        [--bin build/sluice] [--model models/...Q4_1.gguf] [--out FILE]

Clients (threads, raw HTTP/1.1 over sockets, OpenAI streaming chat):
  - well-behaved (the rest): send a request, read the SSE stream to
    `data: [DONE]`, check status 200, a finish_reason and the chunks;
  - disconnecting (1 in 8): close the socket after a few chunks;
  - slow readers (1 in 8): read the stream in small pieces with pauses;
plus --idle sockets that connect and send nothing, held all along, and
--trickle sockets that send one header line every few seconds.

Records (JSON on stdout and in --out): requests per kind, errors of the
well-behaved clients (each with its cause), latency p50 / p99, RSS at
checkpoints (10%, 50% and 100% of the run: minutes 1, 5 and 10 of the
10-minute run), fds and threads before and after. Exit status 1 when a
well-behaved client saw an error, when RSS after warm-up moved by more than
--rss-tolerance (5% by default), or when fds or threads after the run
exceed those before by more than a few (MHD's pool, stragglers).

The 60-second version runs in CI (ctest test_soak_short); the 10-minute one
by hand, recorded in docs/RELIABILITY.md.
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
PROMPTS = ["Name three colors.", "Count to five.", "What is 2 + 2?",
           "Say hello in French.", "Write a haiku about rain.",
           "What is the capital of Italy?", "List four fruits.",
           "Describe the sea in one sentence."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid):
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss": rss, "threads": threads,
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def request_bytes(port, rng):
    body = json.dumps({
        "model": "default", "stream": True, "temperature": 0.7,
        "seed": rng.randrange(1 << 30),
        "max_tokens": rng.choice([8, 16, 32, 48]),
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]})
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}"
            f"\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(body)}\r\nConnection: close\r\n\r\n{body}").encode()


def one_request(port, kind, rng):
    """(ok, cause, seconds) of one request of the given kind."""
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    try:
        s.sendall(request_bytes(port, rng))
        buf = b""
        chunks = 0
        while True:
            if kind == "slow":
                time.sleep(rng.uniform(0.01, 0.05))
            d = s.recv(64 if kind == "slow" else 65536)
            if not d:
                break
            buf += d
            chunks = buf.count(b"\ndata: ")
            if kind == "disconnect" and chunks >= rng.randrange(1, 4):
                return True, None, time.time() - t0
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return False, head.split(b"\r\n")[0].decode(errors="replace"), 0
        text = rest.decode(errors="replace")
        if "data: [DONE]" not in text:
            return False, "stream ended without [DONE]", 0
        if '"finish_reason":"' not in text.replace(" ", ""):
            return False, "no finish_reason", 0
        if '"error"' in text:
            return False, "error event in the stream", 0
        return True, None, time.time() - t0
    except OSError as e:
        return False, f"{type(e).__name__}: {e}", 0
    finally:
        s.close()


def client(port, kind, seed, stop, out, lock):
    rng = random.Random(seed)
    while not stop.is_set():
        ok, cause, secs = one_request(port, kind, rng)
        with lock:
            out["requests"][kind] += 1
            if kind != "disconnect" and not ok:
                out["errors"].append({"kind": kind, "cause": cause})
            if ok and kind == "good":
                out["latencies"].append(secs)


def held_sockets(port, n, trickle, stop, out, lock):
    """n idle sockets; with trickle, one header line every 5 s on each. The
    server cuts them (idle ones after --http-timeout, trickling ones at the
    head deadline, with a 408): each cut one is opened again at once, as an
    attacker would, and counted in held_cut."""
    def open_one():
        try:
            s = socket.create_connection(("127.0.0.1", port), 10)
        except OSError as e:
            with lock:
                out["held_refused"] += 1
                out["held_refusals"] = str(e)
            return None
        if trickle:
            try:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
            except OSError:
                pass
        return s

    def cut(s):
        s.setblocking(False)
        try:
            s.recv(1, socket.MSG_PEEK)  # EOF, or an answer (a 408)
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            s.setblocking(True)

    socks = [open_one() for _ in range(n)]
    i = 0
    while not stop.wait(5):
        for k, s in enumerate(socks):
            if s is not None and cut(s):
                s.close()
                with lock:
                    out["held_cut"] += 1
                s = socks[k] = open_one()
            if trickle and s is not None:
                try:
                    s.sendall(f"X-Slow-{i}: 1\r\n".encode())
                except OSError:
                    pass
        i += 1
    for s in socks:
        if s is not None:
            s.close()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--idle", type=int, default=64)
    ap.add_argument("--trickle", type=int, default=16)
    ap.add_argument("--bin", default=os.environ.get(
        "SLUICE_BIN", str(SRC / "build" / "sluice")))
    ap.add_argument("--model", default=os.environ.get(
        "SLUICE_MODEL",
        str(SRC / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--out", default=None)
    ap.add_argument("--serve-args", default="")
    a = ap.parse_args()
    if not (os.path.exists(a.bin) and os.path.exists(a.model)):
        print(f"skipped: no binary ({a.bin}) or model ({a.model})")
        return 77
    port = free_port()
    log = open(f"/tmp/sluice_soak_{port}.log", "w+b")
    srv = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port",
                            str(port), "-c", "2048"] + a.serve_args.split(),
                           stdout=log, stderr=log)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if srv.poll() is not None:
                    raise SystemExit("the server exited at start")
                time.sleep(0.2)
        out = {"requests": {"good": 0, "disconnect": 0, "slow": 0},
               "errors": [], "latencies": [], "held_refused": 0,
               "held_cut": 0}
        lock = threading.Lock()
        stop = threading.Event()
        # warm-up: one request of each kind first
        rng = random.Random(1)
        for kind in ("good", "slow"):
            ok, cause, _ = one_request(port, kind, rng)
            if not ok:
                out["errors"].append({"kind": kind, "cause": "warm-up: " +
                                      str(cause)})
        before = proc_stat(srv.pid)
        threads = []
        for i in range(a.clients):
            kind = ("disconnect" if i % 8 == 1 else "slow" if i % 8 == 2
                    else "good")
            threads.append(threading.Thread(
                target=client, args=(port, kind, 1000 + i, stop, out, lock)))
        threads.append(threading.Thread(target=held_sockets, args=(
            port, a.idle, False, stop, out, lock)))
        threads.append(threading.Thread(target=held_sockets, args=(
            port, a.trickle, True, stop, out, lock)))
        t0 = time.time()
        for t in threads:
            t.start()
        checkpoints = [0.1, 0.5, 1.0]
        rss = []
        for c in checkpoints:
            while time.time() - t0 < c * a.seconds:
                time.sleep(0.5)
                if srv.poll() is not None:
                    raise SystemExit("the server died: %s" % srv.returncode)
            st = proc_stat(srv.pid)
            rss.append({"at_s": round(time.time() - t0, 1), **st})
        stop.set()
        for t in threads:
            t.join(180)
        time.sleep(2)  # connections close, MHD threads end
        after = proc_stat(srv.pid)
        lat = out.pop("latencies")
        base = rss[0]["rss"]
        drift = max(abs(r["rss"] - base) / base for r in rss)
        res = {
            "seconds": a.seconds, "clients": a.clients, "idle": a.idle,
            "trickle": a.trickle, **out, "errors": out["errors"][:20],
            "n_errors": len(out["errors"]),
            "latency_p50_s": pct(lat, 0.5), "latency_p99_s": pct(lat, 0.99),
            "rss_checkpoints": rss, "rss_drift_after_warmup": round(drift, 4),
            "before": before, "after": after,
        }
        failed = []
        if res["n_errors"]:
            failed.append("errors for well-behaved clients")
        if drift > a.rss_tolerance:
            failed.append(f"RSS moved {drift:.1%} after warm-up")
        if after["fds"] > before["fds"] + 4:
            failed.append("fds leaked")
        if after["threads"] > before["threads"] + 4:
            failed.append("threads leaked")
        if not res["requests"]["good"]:
            failed.append("no request completed")
        res["failed"] = failed
        text = json.dumps(res, indent=1)
        print(text)
        if a.out:
            Path(a.out).write_text(text + "\n")
        return 1 if failed else 0
    finally:
        srv.terminate()
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    sys.exit(main())
