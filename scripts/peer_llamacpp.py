#!/usr/bin/env python3
"""The llama.cpp peer for `sluice bench model --peer llama-cpp`.

Runs llama.cpp (through llama-cpp-python) on the same GGUF file with the same
thread count and prints one JSON object: pp512_tps (one 512-token batch),
tg128_tps (128 tokens one at a time from an empty context), each the median
of --reps runs, and this process's peak resident memory."""
import argparse
import json
import resource
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    try:
        import llama_cpp
    except ImportError as e:
        print(f"peer_llamacpp: llama_cpp is not installed: {e}", file=sys.stderr)
        return 1
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.ctx, n_batch=a.pp,
                          n_ubatch=a.pp, n_threads=a.threads,
                          n_threads_batch=a.threads, verbose=False)
    nv = llm.n_vocab()
    toks = [(i * 7919 + 13) % nv for i in range(a.pp)]
    llm.reset()
    llm.eval(toks[:16])  # warm-up
    pp, tg = [], []
    for _ in range(a.reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        pp.append(a.pp / (time.perf_counter() - t0))
        llm.reset()
        t0 = time.perf_counter()
        for i in range(a.tg):
            llm.eval([toks[i]])
        tg.append(a.tg / (time.perf_counter() - t0))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"engine": "llama.cpp (llama-cpp-python "
                      f"{llama_cpp.__version__})",
                      "pp512_tps": statistics.median(pp),
                      "tg128_tps": statistics.median(tg),
                      "threads": a.threads, "peak_rss_bytes": rss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
