#!/usr/bin/env python3
"""The per-format CPU table of issue 9: `sluice bench model` and llama.cpp's
own `llama-bench` on the same files, in the same run, one format after the
other; prints one JSON line per format and a Markdown table of the ratios.

The files are the default model's F32 copy quantized by llama.cpp itself
(llama_cpp.llama_model_quantize, as tests/py/test_model_quant_vs_llamacpp.py
does, or llama.cpp's llama-quantize where --llama-quantize names it), cached
in --cache.

    python3 tools/bench_formats.py --llama-bench PATH [--threads N]
        [--formats Q4_0,Q5_0,...] [--f32 models/...F32.gguf]
        [--cache ~/.cache/sluice] [--sluice build/sluice] [--reps 3]
        [--llama-quantize PATH] [--llama-reps 5]
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# llama.h: LLAMA_FTYPE_MOSTLY_*
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
          "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18,
          "IQ4_NL": 25, "IQ4_XS": 30}
_QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3])
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(),
                                        sys.argv[2].encode(), p))
"""


def quantized(f32, fmt, cache, quantize_exe=None):
    out = Path(cache) / f"{Path(f32).stem.replace('.F32', '')}.{fmt}.gguf"
    if not out.exists() or out.stat().st_mtime < Path(f32).stat().st_mtime:
        tmp = str(out) + ".tmp"
        if quantize_exe:
            cmd = [quantize_exe, f32, tmp, fmt]
        else:
            cmd = [sys.executable, "-c", _QUANTIZE, f32, tmp,
                   str(FTYPES[fmt])]
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(tmp, out)
    return str(out)


def sluice(exe, model, threads, reps):
    r = subprocess.run([exe, "bench", "model", "-m", model, "--device", "cpu",
                        "-t", str(threads), "--reps", str(reps)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def llama(exe, model, threads, reps):
    r = subprocess.run([exe, "-m", model, "-t", str(threads), "-p", "512",
                        "-n", "128", "-r", str(reps), "-o", "json"],
                       capture_output=True,
                       text=True, check=True)
    out = {}
    for row in json.loads(r.stdout):
        key = "pp512" if row["n_prompt"] else "tg128"
        out[key] = row["avg_ts"]
        out[key + "_sd"] = row["stddev_ts"]
    return out


def main():
    ap = argparse.ArgumentParser()
    src = Path(__file__).resolve().parent.parent
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--sluice", default=str(src / "build" / "sluice"))
    ap.add_argument("--f32", default=str(src / "models" /
                                         "SmolLM2-135M-Instruct.F32.gguf"))
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/sluice"))
    ap.add_argument("--formats", default=",".join(FTYPES))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-quantize", default=None)
    ap.add_argument("--llama-reps", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.cache, exist_ok=True)
    rows = []
    for fmt in a.formats.split(","):
        m = quantized(a.f32, fmt, a.cache, a.llama_quantize)
        try:
            s = sluice(a.sluice, m, a.threads, a.reps)
        except subprocess.CalledProcessError as e:
            print(json.dumps({"format": fmt, "sluice_error":
                              e.stderr.strip()[-300:]}), flush=True)
            continue
        p = llama(a.llama_bench, m, a.threads, a.llama_reps)
        row = {"format": fmt, "file": m, "threads": a.threads,
               "isa": s.get("isa"),
               "sluice_pp512": s["pp512_tps"], "sluice_tg128": s["tg128_tps"],
               "llama_pp512": p["pp512"], "llama_pp512_sd": p["pp512_sd"],
               "llama_tg128": p["tg128"], "llama_tg128_sd": p["tg128_sd"],
               "pp512_ratio": s["pp512_tps"] / p["pp512"],
               "tg128_ratio": s["tg128_tps"] / p["tg128"],
               "decode_bw_fraction": s.get("decode_bw_fraction")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| format | sluice pp512 | llama.cpp pp512 | ratio | sluice tg128 "
          "| llama.cpp tg128 | ratio | decode of read bw |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['format']} | {r['sluice_pp512']:.1f} | "
              f"{r['llama_pp512']:.1f} ± {r['llama_pp512_sd']:.1f} | "
              f"{r['pp512_ratio']:.2f}× | {r['sluice_tg128']:.1f} | "
              f"{r['llama_tg128']:.1f} ± {r['llama_tg128_sd']:.1f} | "
              f"{r['tg128_ratio']:.2f}× | {r['decode_bw_fraction']} |")


if __name__ == "__main__":
    main()
