"""Compare sluice's forward pass with llama.cpp on copies of the default
model quantized to Q5_0 and Q5_1: with IQ4_NL, the 32-element types
llama.cpp falls back to for rows that are not a multiple of 256 (SmolLM2's
576), so that Q4_K_M / Q5_K_M files of such models hold them. IQ4_NL's
forward pass is compared in test_model_lowbit_vs_llamacpp: llama.cpp's
IQ4_XS file of this model holds 180 IQ4_NL matrices of 210 (that test
requires at least MIN_TENSORS), so a copy of its own would repeat it.

Each copy is made by llama.cpp itself (llama_cpp.llama_model_quantize, the
library behind llama-quantize) from the F32 copy that
test_model_f32_vs_llamacpp builds, in a child process (its log is long and
goes to stderr there). llama.cpp's own choices apply: token_embd falls back
to Q8_0 (Q6_K needs rows of 256). Copies are cached next to the F32 copy as
<stem>.F32-<TYPE>.gguf (the temp folder when that is read-only), written
under a temporary name and renamed, rebuilt when older than the F32 copy.

Then the teacher-forced comparison of test_model_vs_llamacpp runs on each
copy: VARIANT_SEQS of its sequences (that file says why that many),
sluice and llama.cpp each against the float64
reference (tools/ref_forward.py on the same quantized weights), sluice no
worse than llama.cpp by the margins of the Q4_1 test. The situation is the
Q4_1 one: both engines quantize each matmul's activations per block (Q8_0
for Q5_0, Q8_1 for Q5_1) and differ in which values land on the
other side of a rounding boundary, so the same boundary-noise reasoning sets
the margins; none is a value measured on one machine.

Environment: SLUICE_MODEL_TOOL (set by ctest), SLUICE_MODEL or
SLUICE_SOURCE_DIR/models/, SLUICE_TEST_ISAS. Skips when llama_cpp, gguf, the
model or the tool is missing.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_model_f32_vs_llamacpp import f32_model  # noqa: E402
from test_model_vs_llamacpp import (KL_MEAN_MARGIN, REL_MEAN_MARGIN,  # noqa: E402
                                    REL_P99_MARGIN, TOP1_MARGIN,
                                    VARIANT_SEQS, _level, gguf_reader,
                                    isa_levels, teacher_forced, top1_margin)

# type name -> llama_ftype (llama.h: LLAMA_FTYPE_MOSTLY_*)
FTYPES = {"Q5_0": 8, "Q5_1": 9}
# most matrices must really be of the type (30 layers x 7 matrices = 210)
MIN_TENSORS = 150

_QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3])
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(),
                                        sys.argv[2].encode(), p))
"""


def _quantize(src, dst, qtype):
    """llama.cpp quantizes src (F32) to dst, atomically; the copy is checked
    to hold mostly tensors of qtype."""
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp",
                               dir=str(dst.parent))
    os.close(fd)
    try:
        r = subprocess.run([sys.executable, "-c", _QUANTIZE, str(src), tmp,
                            str(FTYPES[qtype])], capture_output=True,
                           timeout=900)
        assert r.returncode == 0, \
            f"llama_model_quantize failed: {r.stderr.decode()[-2000:]}"
        n = sum(t.tensor_type.name == qtype
                for t in gguf_reader(tmp).tensors)
        assert n >= MIN_TENSORS, f"{qtype} copy has only {n} {qtype} tensors"
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def quant_model(qtype):
    """The cached qtype copy, built when missing or older than the F32 copy."""
    pytest.importorskip("llama_cpp")
    src = f32_model()
    name = src.name[:-len(".gguf")] + f"-{qtype}.gguf"
    for folder in (src.parent, Path(tempfile.gettempdir())):
        dst = folder / name
        if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
            return dst
        try:
            _quantize(src, dst, qtype)
            return dst
        except OSError:
            continue  # read-only: the temp folder
    pytest.skip(f"cannot write the {qtype} copy")


@pytest.fixture(scope="module", params=list(FTYPES))
def measured(request):
    qtype = request.param
    llama_cpp = pytest.importorskip("llama_cpp")
    tool = os.environ.get("SLUICE_MODEL_TOOL")
    if not tool or not Path(tool).exists():
        pytest.skip("SLUICE_MODEL_TOOL not set")
    model = quant_model(qtype)
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=2048, n_batch=512,
                          logits_all=True, n_threads=2, verbose=False)
    r = subprocess.run([tool, "logits", str(model)], input=b"1 2 3\n",
                       capture_output=True, timeout=300)
    assert r.returncode == 0, \
        f"sluice cannot run the {qtype} copy: {r.stderr.decode()}"
    out = teacher_forced(llm, str(model), tool, f"{qtype} copy", isa_levels(),
                         VARIANT_SEQS)
    return qtype, tool, out


@pytest.mark.parametrize("isa", isa_levels())
def test_teacher_forced_logits_quant(measured, isa):
    qtype, tool, m = measured
    _level(tool, isa)
    ours, theirs = m["sluice-" + isa], m["llama.cpp"]
    margin = top1_margin(m, isa, TOP1_MARGIN)
    assert ours["top1"] >= theirs["top1"] - margin, \
        f"{qtype}: top-1 vs fp64: sluice {ours['top1']:.4f}, llama.cpp " \
        f"{theirs['top1']:.4f}"
    for key, margin in (("rel_mean", REL_MEAN_MARGIN),
                        ("rel_p99", REL_P99_MARGIN),
                        ("kl_mean", KL_MEAN_MARGIN)):
        assert ours[key] <= theirs[key] * (1 + margin), \
            f"{qtype}: {key}: sluice {ours[key]:.6g}, llama.cpp " \
            f"{theirs[key]:.6g}"
