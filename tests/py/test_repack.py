"""Repacked weights on a real model: sluice's CPU forward pass with the
matrices repacked at load (the default) against the same run with
SLUICE_REPACK=0, on copies of the default model that llama.cpp requantizes to
each packed type (Q4_0, Q8_0, Q5_0, IQ4_NL, and Q4_K_M for Q4_K and Q6_K;
llama_cpp.llama_model_quantize with allow_requantize, from the Q4_1 weights:
seconds each). The model is 576 wide, so Q4_K_M keeps the K-quants only
where the rows are multiples of 256 (ffn_down, 1536 wide: Q4_K and Q6_K);
the other matrices fall back to Q5_0 / Q8_0 (packed too).

The packed kernels sum each (row, token) in their own fixed order, not the
unpacked AVX2 dot's, so the logits are not bit-identical: each matmul's
activations are requantized to Q8_0 and a last-bit difference flips a
rounding there, which moves the logits by up to ~0.5 of a range of ~30 on
this model (the same size as the AVX2 level against the scalar one, which
the model tests accept). So the checks are those of one ISA against
another: the same argmax on nearly every position, a small mean difference,
greedy text that follows the unpacked run's as far as the scalar level's
does (or 8 tokens), with the scalar level's distance from the AVX2 one as
the yardstick (measured here: 2-3.5 % mean relative difference for both,
argmax agreeing on 94-100 % of positions); and the two runs must differ
somewhere (else the packed path did not run). On the scalar level (no packed kernels) the two
runs are the same bits.

Environment: SLUICE_MODEL_TOOL (set by ctest), SLUICE_SOURCE_DIR. Skips
without llama_cpp, numpy, the default model or the tool.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

SRC = Path(os.environ.get("SLUICE_SOURCE_DIR",
                          Path(__file__).resolve().parent.parent.parent))
TOOL = os.environ.get("SLUICE_MODEL_TOOL")
DEFAULT = SRC / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "IQ4_NL": 25, "Q4_K_M": 15}

_QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3])
p.nthread = 2
p.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(),
                                        sys.argv[2].encode(), p))
"""

# a fixed prompt of token ids (SmolLM2's vocabulary), and greedy length
IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 30,
       2114, 3600, 314, 260, 1345, 282, 4649, 47, 378, 1345, 282, 4649,
       314, 2, 198, 1, 4093, 198, 504, 314, 2]
N_GEN = 24


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    if not TOOL or not Path(TOOL).exists() or not DEFAULT.exists():
        pytest.skip("needs SLUICE_MODEL_TOOL and the default model")
    d = tmp_path_factory.mktemp("repack")
    out = {}
    for name, ft in FTYPES.items():
        dst = d / f"{name}.gguf"
        r = subprocess.run([sys.executable, "-c", _QUANTIZE, str(DEFAULT),
                            str(dst), str(ft)], capture_output=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        out[name] = dst
    return out


def run(model, mode, repack, isa=None, n=0):
    env = dict(os.environ)
    env.pop("SLUICE_REPACK", None)
    if not repack:
        env["SLUICE_REPACK"] = "0"
    if isa:
        env["SLUICE_ISA"] = isa
    args = [TOOL, mode, str(model)] + ([str(n)] if n else [])
    r = subprocess.run(args, input=(" ".join(map(str, IDS)) + "\n").encode(),
                       capture_output=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


@pytest.mark.parametrize("qtype", list(FTYPES))
def test_repacked_logits_and_greedy(copies, qtype):
    model = copies[qtype]
    on = np.frombuffer(run(model, "logits", True), dtype=np.float32)
    off = np.frombuffer(run(model, "logits", False), dtype=np.float32)
    on = on.reshape(len(IDS), -1)
    off = off.reshape(len(IDS), -1)
    assert not np.array_equal(on, off), \
        f"{qtype}: repacking changed no bit: the packed kernels did not run"
    # the yardstick: the scalar level against the AVX2 one, both unpacked
    sc = np.frombuffer(run(model, "logits", False, isa="scalar"),
                       dtype=np.float32).reshape(len(IDS), -1)

    def top1(a):
        return float(np.mean(a.argmax(1) == off.argmax(1)))

    def rel(a):
        return float(np.mean(np.abs(a - off)) / np.mean(np.abs(off)))

    assert top1(on) >= min(top1(sc), 0.95) - 0.05, \
        f"{qtype}: argmax agrees on {top1(on):.3f} of positions (scalar: " \
        f"{top1(sc):.3f})"
    assert rel(on) <= 2 * rel(sc) + 0.005, \
        f"{qtype}: mean |on - off| / mean |off| = {rel(on):.4g} (scalar: " \
        f"{rel(sc):.4g})"
    # greedy text: near-ties flip under any change of summation order, so
    # the packed run must follow the unpacked one as far as the scalar level
    # does, or 8 tokens
    g_on = run(model, "greedy", True, n=N_GEN).split()
    g_off = run(model, "greedy", False, n=N_GEN).split()
    g_sc = run(model, "greedy", False, isa="scalar", n=N_GEN).split()

    def prefix(a):
        k = 0
        while k < min(len(a), len(g_off)) and a[k] == g_off[k]:
            k += 1
        return k

    assert prefix(g_on) >= min(prefix(g_sc), 8), \
        f"{qtype}: greedy text leaves the unpacked run's after " \
        f"{prefix(g_on)} tokens (scalar: {prefix(g_sc)}): {g_on} vs {g_off}"


def test_scalar_level_ignores_repack(copies):
    model = copies["Q4_0"]
    assert run(model, "logits", True, isa="scalar") == \
        run(model, "logits", False, isa="scalar")
