"""sl_kern_dequant_row against gguf.quants.dequantize (the gguf package is
the layout authority): on real tensors of the default model, one per type
present, and on random blocks (quantized by gguf.quants where it can quantize
the type, else random bytes with well-formed scales). Every ISA level this CPU
can run is run through SLUICE_ISA; which ones it can run, and that SLUICE_ISA
really selects them, is asked of SLUICE_MODEL_TOOL (`sl_model_tool isa`, same
kernels). The tolerance is one float32 rounding: the dequantization of one
element is a product (and a sum for the types with a minimum) of exact values.

Needs SL_DEQUANT_TOOL and SLUICE_MODEL_TOOL (set by ctest), or builds at
build-kern/.
"""
import os
import subprocess
import tempfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

SRC = os.environ.get("SLUICE_SOURCE_DIR",
                     os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.environ.get("SL_DEQUANT_TOOL",
                      os.path.join(SRC, "build-kern", "sl_dequant_tool"))
MODEL_TOOL = os.environ.get("SLUICE_MODEL_TOOL",
                            os.path.join(SRC, "build-kern", "sl_model_tool"))


def _isas():
    """The levels this CPU runs: `sl_model_tool isa` exits 77 for the others
    and prints the level it runs."""
    out = []
    for isa in ["scalar", "avx2", "avx512", "avxvnni", "avx512vnni"]:
        env = dict(os.environ, SLUICE_ISA=isa)
        env.pop("SLUICE_CPU_ISA", None)
        r = subprocess.run([MODEL_TOOL, "isa"], env=env, capture_output=True)
        if r.returncode == 77:
            continue
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout.decode().strip() == isa
        out.append(isa)
    return out


# without the model tool, only the level the kernels pick by default (None)
ISAS = _isas() if os.path.exists(MODEL_TOOL) else [None]
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K,
         T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.IQ4_XS]
# gguf.quants cannot quantize these: random blocks with sane scales
RANDOM_ONLY = (T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.Q2_K, T.Q3_K, T.IQ4_XS)


def model_path():
    p = os.environ.get("SLUICE_MODEL")
    if p:
        return p
    return os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_tool(qtype, raw, n, isa):
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        with open(fin, "wb") as f:
            f.write(raw)
        env = dict(os.environ)
        env.pop("SLUICE_CPU_ISA", None)
        env.pop("SLUICE_ISA", None)
        if isa:
            env["SLUICE_ISA"] = isa
        subprocess.run([TOOL, str(int(qtype)), str(n), fin, fout], check=True,
                       env=env)
        return np.fromfile(fout, dtype=np.float32)


def check(qtype, raw, n):
    want = quants.dequantize(np.frombuffer(raw, dtype=np.uint8),
                             qtype).astype(np.float32).reshape(-1)
    assert want.size == n
    scale = float(np.max(np.abs(want))) if n else 0.0
    for isa in ISAS:
        got = run_tool(qtype, raw, n, isa)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7 * scale,
                                   err_msg=f"{qtype.name} isa={isa}")


def f16_bytes(vals):
    return np.asarray(vals, dtype=np.float16).view(np.uint8)


def random_blocks(qtype, nblocks, rng):
    """Random bytes per block with the scale fields set to sane f16."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first
        raw[:, 0:2] = f16_bytes(rng.uniform(1e-4, 2e-3, nblocks)).reshape(-1, 2)
        raw[:, 2:4] = f16_bytes(rng.uniform(1e-4, 2e-3, nblocks)).reshape(-1, 2)
    elif qtype in (T.Q6_K, T.Q3_K):  # d last
        raw[:, ts - 2:ts] = f16_bytes(rng.uniform(1e-4, 1e-3, nblocks)).reshape(-1, 2)
    elif qtype == T.IQ4_NL:  # d first
        raw[:, 0:2] = f16_bytes(rng.uniform(1e-4, 2e-2, nblocks)).reshape(-1, 2)
    elif qtype == T.Q2_K:  # d, dmin last
        raw[:, ts - 4:ts - 2] = f16_bytes(rng.uniform(1e-4, 2e-3, nblocks)).reshape(-1, 2)
        raw[:, ts - 2:ts] = f16_bytes(rng.uniform(1e-4, 2e-3, nblocks)).reshape(-1, 2)
    elif qtype == T.IQ4_XS:  # d first
        raw[:, 0:2] = f16_bytes(rng.uniform(1e-4, 1e-3, nblocks)).reshape(-1, 2)
    else:
        raise AssertionError(qtype)
    return raw.tobytes(), nblocks * bs


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_random(qtype):
    rng = np.random.default_rng(1234 + int(qtype))
    if qtype in RANDOM_ONLY:
        nb = 37 if qtype != T.IQ4_NL else 37 * 8
        raw, n = random_blocks(qtype, nb, rng)
    else:
        x = (rng.standard_normal((7, 512)) *
             rng.uniform(0.01, 3, (7, 1))).astype(np.float32)
        x[2, :64] = 0.0  # all-zero blocks
        if qtype == T.F32:
            raw = x.tobytes()
        else:
            raw = quants.quantize(x, qtype).tobytes()
        n = x.size
    check(qtype, raw, n)


def test_model_tensors():
    path = model_path()
    if not os.path.exists(path):
        pytest.skip(f"model not found: {path}")
    r = gguf.GGUFReader(path)
    seen = set()
    for t in r.tensors:
        if t.tensor_type in seen or t.tensor_type not in TYPES:
            continue
        seen.add(t.tensor_type)
        bs, ts = gguf.GGML_QUANT_SIZES[t.tensor_type]
        cols = int(t.shape[0])
        rows = min(int(t.n_elements) // cols, 256)
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        nbytes = rows * cols // bs * ts
        check(t.tensor_type, raw[:nbytes].tobytes(), rows * cols)
    assert seen, "no tensor of a supported type"
    print("checked types:", sorted(x.name for x in seen))
