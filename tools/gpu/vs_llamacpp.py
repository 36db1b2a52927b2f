#!/usr/bin/env python3
"""sluice on a GPU against llama.cpp and a float64 reference, in two places.

The GPU machine has no llama.cpp Python bindings (and nothing to build them
from), so the comparison of tests/py/test_model_vs_llamacpp.py is split:

  prepare (here, where llama_cpp is installed):
      python3 tools/gpu/vs_llamacpp.py prepare MODEL OUT.json
    tokenizes the test corpus into the test's sequences with llama.cpp, runs
    llama.cpp (CPU) and the float64 reference (tools/ref_forward.py), and
    writes the sequences, llama.cpp's argmax at every position and its
    scores against float64.

  f32 SRC DST: writes the test's F32 copy of SRC (needs only gguf, numpy).

  check (on the GPU machine):
      SLUICE_DEVICE=cuda python3 tools/gpu/vs_llamacpp.py check MODEL \
          IN.json SL_MODEL_TOOL
    runs sl_model_tool on the device and the float64 reference on the same
    sequences, scores sluice against float64 exactly as the test does, and
    checks it with the test's margins against llama.cpp's scores; prints the
    top-1 agreement with llama.cpp's argmax. Exit 1 on a failed check.

The scores and margins are the test's own (imported from it).
"""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "py"))
sys.path.insert(0, str(ROOT / "tools"))
if "pytest" not in sys.modules:  # the test module imports it; not needed
    try:
        import pytest  # noqa: F401
    except ImportError:
        sys.modules["pytest"] = types.ModuleType("pytest")
import test_model_vs_llamacpp as T  # noqa: E402
from ref_forward import Ref  # noqa: E402


def prepare(model, out):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, n_ctx=2048, n_batch=512,
                          logits_all=True, n_threads=os.cpu_count(),
                          verbose=False)
    seqs = T._sequences(llm)
    ref = Ref(model)
    sc = T.Scores()
    argmax = []
    for ids in seqs:
        R = ref.forward(ids)
        L = T._llama_logits(llm, ids)
        sc.add(L, R)
        argmax.append(L.argmax(1).tolist())
    s = sc.summary()
    print("llama.cpp:", T._fmt(s))
    Path(out).write_text(json.dumps({"model": Path(model).name,
                                     "seqs": seqs, "llama_argmax": argmax,
                                     "llama": s}))


def check(model, inp, tool, min_agree):
    d = json.loads(Path(inp).read_text())
    seqs, largmax, theirs = d["seqs"], d["llama_argmax"], d["llama"]
    ref = Ref(model)
    n_vocab = None
    p = subprocess.Popen([tool, "logits", model], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    sc = T.Scores()
    agree = npos = 0
    for ids, la in zip(seqs, largmax):
        p.stdin.write((" ".join(map(str, ids)) + "\n").encode())
        p.stdin.flush()
        R = ref.forward(ids)
        n_vocab = R.shape[1]
        nb = len(ids) * n_vocab * 4
        raw = p.stdout.read(nb)
        assert len(raw) == nb, "sl_model_tool stopped"
        S = np.frombuffer(raw, np.float32).reshape(len(ids), n_vocab)
        sc.add(S, R)
        agree += int((S.argmax(1) == np.array(la)).sum())
        npos += len(ids)
    p.stdin.close()
    assert p.wait(60) == 0
    ours = sc.summary()
    dev = os.environ.get("SLUICE_DEVICE", "cpu")
    print(f"{d['model']}: {npos} positions, {len(seqs)} sequences")
    print(f"  llama.cpp (CPU, measured at prepare) {T._fmt(theirs)}")
    print(f"  sluice ({dev})  {T._fmt(ours)}; top-1 agreement with "
          f"llama.cpp {agree / npos:.4%}")
    ok = True
    try:
        T.check_no_worse(ours, theirs, T.TOP1_MARGIN, T.REL_MEAN_MARGIN,
                         T.REL_P99_MARGIN, T.KL_MEAN_MARGIN)
        print("  no worse than llama.cpp against float64: ok")
    except AssertionError as e:
        print("  FAILED:", e)
        ok = False
    if min_agree is not None:
        if agree / npos >= min_agree:
            print(f"  top-1 agreement >= {min_agree:.2%}: ok")
        else:
            print(f"  FAILED: top-1 agreement {agree / npos:.4%} < "
                  f"{min_agree:.2%}")
            ok = False
    return ok


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "f32":
        # the test's own F32 copy (metadata verbatim, tensors dequantized)
        import gguf
        import test_model_f32_vs_llamacpp as F
        F._convert(gguf, Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) >= 5 and sys.argv[1] == "check":
        mn = float(sys.argv[5]) if len(sys.argv) > 5 else None
        return 0 if check(sys.argv[2], sys.argv[3], sys.argv[4], mn) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
