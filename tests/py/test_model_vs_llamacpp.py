"""Compare sluice's forward pass with llama.cpp on the same GGUF file.

1. Teacher-forced logits: sequences built from the tokenizer corpus (code,
   Unicode, whitespace, numbers, prose), tokenized once by llama.cpp, are run
   through both; at every position we compare the argmax (top-1 agreement)
   and the relative error ||sluice - llama.cpp||_2 / ||llama.cpp||_2 of the
   full logit vector.
2. Greedy continuation: 64 tokens for a set of prompts must be identical;
   a divergence is allowed only where, in llama.cpp's own logits at that
   point, the token sluice chose is within NEAR_TIE of the one llama.cpp
   chose; every such case is reported.

Environment: SLUICE_MODEL_TOOL (set by ctest), SLUICE_MODEL or
SLUICE_SOURCE_DIR/models/. Skips when llama_cpp, the model or the tool is
missing.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Issue 3 asks for 99% top-1 agreement. sluice reaches 95.7%: everything but
# the exp() inside SiLU and softmax now matches ggml's arithmetic bit for bit
# (checked by swapping in ggml's own exp at run time: 100.0%), and ggml's exp
# is an approximation that sluice does not copy. Against a float64 reference
# llama.cpp itself agrees on top-1 only 94.7% of the time, and sluice's error
# against float64 equals llama.cpp's (docs/ARCHITECTURE.md, "Accuracy").
# On an all-F32 copy of the model, where no activation is re-quantized, the
# two agree at 100% (test_model_f32_vs_llamacpp.py). These floors guard what
# is reached on Q4_1; the 99% goal there stays open.
TOP1_MIN = 0.95
REL_ERR_MEAN_MAX = 0.025  # mean relative L2 error of a position's logits (0.0167 measured)
REL_ERR_P99_MAX = 0.12   # (0.090 measured)
NEAR_TIE = 0.5   # logit gap under which a greedy divergence is a tie: the
                 # noise of llama.cpp's own logits against float64 is ~0.3
MIN_POSITIONS = 2000
SEQ_TOKENS = 256

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n",
    "The three laws of thermodynamics are",
    "#include <stdio.h>\n\nint main(void) {\n",
    "Translate to French: 'The weather is nice today.'\n",
    "1, 1, 2, 3, 5, 8, 13,",
]


def _model_path():
    p = os.environ.get("SLUICE_MODEL")
    if p:
        return Path(p)
    src = Path(os.environ.get("SLUICE_SOURCE_DIR", HERE.parent.parent))
    return src / "models" / DEFAULT_MODEL


@pytest.fixture(scope="module")
def env():
    llama_cpp = pytest.importorskip("llama_cpp")
    model = _model_path()
    tool = os.environ.get("SLUICE_MODEL_TOOL")
    if not model.exists():
        pytest.skip(f"model missing: {model}")
    if not tool or not Path(tool).exists():
        pytest.skip("SLUICE_MODEL_TOOL not set")
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=2048, n_batch=512,
                          logits_all=True, n_threads=2, verbose=False)
    return llm, str(model), tool


def _sequences(llm):
    items = json.loads((HERE / "corpus_tokenize.json").read_text())
    texts = [it["text"] for it in items if "text" in it and it["text"].strip()]
    seqs, cur = [], []
    for t in texts:
        ids = llm.tokenize(t.encode("utf-8", "replace"), add_bos=False,
                           special=False)
        cur.extend(ids)
        while len(cur) >= SEQ_TOKENS:
            seqs.append(cur[:SEQ_TOKENS])
            cur = cur[SEQ_TOKENS:]
    return seqs


def _llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def _sluice(tool, model, mode, lines, extra=()):
    inp = "".join(" ".join(map(str, ids)) + "\n" for ids in lines)
    r = subprocess.run([tool, mode, model, *extra], input=inp.encode(),
                       capture_output=True, timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def teacher_forced(llm, model, tool, label):
    """Runs the corpus sequences through both programs; returns (top-1
    agreement, per-position relative L2 errors) and prints them."""
    seqs = _sequences(llm)
    npos = sum(len(s) for s in seqs)
    assert npos >= MIN_POSITIONS, f"only {npos} positions"
    raw = _sluice(tool, model, "logits", seqs)
    n_vocab = llm.n_vocab()
    ours_all = np.frombuffer(raw, dtype=np.float32)
    assert ours_all.size == npos * n_vocab
    ours_all = ours_all.reshape(npos, n_vocab)
    agree, errs, off = 0, [], 0
    for ids in seqs:
        ref = _llama_logits(llm, ids)
        ours = ours_all[off: off + len(ids)]
        off += len(ids)
        assert np.isfinite(ours).all()
        agree += int((ours.argmax(1) == ref.argmax(1)).sum())
        errs.extend(np.linalg.norm(ours - ref, axis=1) /
                    np.linalg.norm(ref, axis=1))
    errs = np.array(errs)
    top1 = agree / npos
    print(f"\nteacher-forced ({label}): {npos} positions in {len(seqs)} "
          f"sequences; top-1 agreement {top1:.4%}; relative L2 error mean "
          f"{errs.mean():.6f}, p99 {np.percentile(errs, 99):.6f}, "
          f"max {errs.max():.6f}")
    return top1, errs


def test_teacher_forced_logits(env):
    llm, model, tool = env
    top1, errs = teacher_forced(llm, model, tool, "Q4_1 file")
    assert top1 >= TOP1_MIN
    assert errs.mean() <= REL_ERR_MEAN_MAX
    assert np.percentile(errs, 99) <= REL_ERR_P99_MAX


def test_greedy_continuation(env):
    llm, model, tool = env
    n_gen = 64
    prompts = [llm.tokenize(p.encode(), add_bos=True, special=True)
               for p in PROMPTS]
    ours = [list(map(int, line.split()))
            for line in _sluice(tool, model, "greedy", prompts,
                                (str(n_gen),)).decode().splitlines()]
    assert len(ours) == len(prompts)
    identical, ties = 0, []
    for p, ids, mine in zip(PROMPTS, prompts, ours):
        # incremental: the prompt once, then one token per step (as sluice)
        llm.reset()
        llm.eval(list(ids))
        ref = []
        logits_at = []
        for _ in range(n_gen):
            lg = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(lg.argmax())
            ref.append(tok)
            logits_at.append(lg)
            llm.eval([tok])
        if mine == ref:
            identical += 1
            continue
        i = next(k for k in range(n_gen) if mine[k] != ref[k])
        lg = logits_at[i]
        top2 = np.sort(lg)[-2:]
        gap = float(top2[1] - top2[0])
        ties.append((p, i, gap))
        print(f"\ndivergence at token {i} for {p!r}: llama.cpp top-2 gap "
              f"{gap:.4f}; sluice chose {mine[i]} (llama.cpp logit "
              f"{lg[mine[i]]:.4f}), llama.cpp chose {ref[i]} "
              f"({lg[ref[i]]:.4f})")
        # a near-tie: in llama.cpp's own logits, the token sluice chose is
        # within NEAR_TIE of the token llama.cpp chose
        assert lg[ref[i]] - lg[mine[i]] < NEAR_TIE, \
            f"divergence without a near-tie for {p!r}"
    print(f"\ngreedy: {identical}/{len(prompts)} continuations identical "
          f"over {n_gen} tokens; {len(ties)} divergence(s) after near-ties")
