"""Compare sluice's forward pass with llama.cpp on an all-F32 model copy.

test_model_vs_llamacpp.py compares the two on the Q4_1 file, where every
Q4_1 matmul first quantizes its activations per block to Q8_1: a last-bit
difference upstream (ggml's approximate exp in SiLU and softmax) can move a
value across a rounding boundary of that quantization, and the difference
grows from layer to layer. With F32 weights the activations stay F32 in both
programs, so the two should agree far more closely; this test shows it.

The F32 copy is built once from the default model with the `gguf` package:
every metadata key/value copied verbatim (tokenizer arrays and chat template
included; general.file_type therefore still says Q4_1, which neither
program uses for computing), every tensor dequantized to F32. It is cached
next to the model as <stem>.F32.gguf (models/ is git-ignored), written under
a temporary name and renamed; it is rebuilt when older than the source.

The teacher-forced comparison on the F32 copy (same sequences from
corpus_tokenize.json, same metrics: sluice and llama.cpp each against the
float64 reference, sluice no worse than llama.cpp by the margins below, at
each ISA level of SLUICE_TEST_ISAS) runs in test_model_vs_llamacpp
(test_teacher_forced_logits_f32), in the same pass as the Q4_1 file's: the
copy's weights are that file's dequantized weights, so one float64 forward
pass per sequence serves both. This file builds the copy and checks it
(test_f32_copy): metadata, shapes, types, values.

Environment: SLUICE_MODEL_TOOL (set by ctest), SLUICE_MODEL or
SLUICE_SOURCE_DIR/models/. Skips when llama_cpp, gguf, the model or the tool
is missing.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_model_vs_llamacpp import _model_path, gguf_reader  # noqa: E402

# With F32 weights nothing is re-quantized: what separates either engine from
# float64 is F16 K/V (both round K and V to F16 the same way), float32
# summation order (llama.cpp with LLAMAFILE runs F32 matmuls through
# llamafile's sgemm, sluice through its own dots) and, in llama.cpp, ggml's
# approximate exp. The F16 K/V rounding is common to both and dominates, so
# sluice's distance from float64 follows llama.cpp's closely; top-1 misses
# against float64 are a few tenths of a percent (near-ties), hence the small
# absolute top-1 margin; the relative margins are those of the Q4_1 test.
# A sluice bug that matters (a wrong scale, a wrong row) moves these by
# multiples, as the Q4_1 test's planted breaks show.
F32_TOP1_MARGIN = 0.005
F32_REL_MEAN_MARGIN = 0.10
F32_REL_P99_MARGIN = 0.15
F32_KL_MEAN_MARGIN = 0.15


def _f32_path(src):
    name = re.sub(r"\.(Q[0-9A-Za-z_]+|IQ[0-9A-Za-z_]+|F16|BF16)\.gguf$",
                  ".F32.gguf", src.name)
    if name == src.name:
        name = src.stem + ".F32.gguf"
    return src.with_name(name)


def _fresh(dst, src):
    return dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime


def _convert(gguf, src, dst):
    """Writes an F32 copy of src to dst: metadata verbatim, every tensor
    dequantized. Atomic: a temporary file in dst's folder, checked, then
    renamed."""
    r = gguf_reader(src)
    arch = r.fields["general.architecture"].contents()
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp",
                               dir=str(dst.parent))
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)  # writes general.architecture itself
        for f in r.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue  # virtual fields (version, counts) and the above
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            if f.name == "general.alignment":
                w.data_alignment = int(f.contents())
            w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
        for t in r.tensors:
            # numpy shape (ne[n-1] .. ne[0]); the writer reverses it
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            w.add_tensor_info(t.name, shape, np.dtype(np.float32),
                              int(np.prod(shape)) * 4,
                              raw_dtype=gguf.GGMLQuantizationType.F32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in r.tensors:
            if t.tensor_type == gguf.GGMLQuantizationType.F32:
                a = np.asarray(t.data, dtype=np.float32)
            else:
                a = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            a = np.ascontiguousarray(a, dtype=np.float32).reshape(shape)
            w.write_tensor_data(a)
        w.close()
        _check_copy(gguf, r, tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it 0600
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _check_copy(gguf, a, dst):
    """The copy holds the metadata and tensor shapes of the source (reader
    a), all tensors in F32."""
    b = gguf_reader(dst)
    ka = {k for k in a.fields if not k.startswith("GGUF.")}
    kb = {k for k in b.fields if not k.startswith("GGUF.")}
    assert ka == kb, f"metadata keys differ: {sorted(ka ^ kb)}"
    for k in ka:
        fa, fb = a.fields[k], b.fields[k]
        assert fa.types == fb.types, k
        assert fa.contents() == fb.contents(), k
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert tb.tensor_type == gguf.GGMLQuantizationType.F32, tb.name
        assert ta.shape.tolist() == tb.shape.tolist(), tb.name
    # each quantized type's first tensor, value for value
    seen = set()
    for ta in a.tensors:
        if ta.tensor_type == gguf.GGMLQuantizationType.F32 or \
                ta.tensor_type in seen:
            continue
        seen.add(ta.tensor_type)
        tb = next(t for t in b.tensors if t.name == ta.name)
        assert np.array_equal(gguf.quants.dequantize(ta.data, ta.tensor_type),
                              np.asarray(tb.data)), ta.name


def f32_model():
    """The cached F32 copy of the default model, built (and checked against
    the source) when missing or older than the source."""
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("gguf.quants")
    src = _model_path()
    if not src.exists():
        pytest.skip(f"model missing: {src}")
    dst = _f32_path(src)
    if not _fresh(dst, src):
        try:
            _convert(gguf, src, dst)
        except OSError:
            # the models folder is read-only: cache in the temp folder
            dst = Path(tempfile.gettempdir()) / dst.name
            if not _fresh(dst, src):
                _convert(gguf, src, dst)
    return dst


def test_f32_copy():
    """The copy holds the source's metadata, and every tensor is the
    source's tensor dequantized, value for value: what lets
    test_model_vs_llamacpp score both files against one float64 pass."""
    gguf = pytest.importorskip("gguf")
    dst = f32_model()
    a = gguf_reader(_model_path())
    _check_copy(gguf, a, dst)
    b = {t.name: t for t in gguf_reader(dst).tensors}
    for ta in a.tensors:
        want = np.asarray(ta.data, dtype=np.float32) \
            if ta.tensor_type == gguf.GGMLQuantizationType.F32 else \
            gguf.quants.dequantize(ta.data, ta.tensor_type)
        assert np.array_equal(want.reshape(-1),
                              np.asarray(b[ta.name].data).reshape(-1)), \
            ta.name
