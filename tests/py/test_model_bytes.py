"""The bytes one decode token reads (`sl_model_bytes_per_token`, behind
`bench model`'s weight_bytes_per_token and decode_bw_fraction): every weight
once, except an untied embedding table, of which a token reads one row. On a
small untied model written by tools/make_random_model.py and on the default
(tied) model, against the tensor sizes the gguf package reads.
"""
import json
import os
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf")

SRC = os.environ.get("SLUICE_SOURCE_DIR",
                     os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.environ.get("SLUICE_MODEL_TOOL")
DEFAULT = os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def tool_bytes(path):
    r = subprocess.run([TOOL, "bytes", path], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def tensor_bytes(path):
    rd = gguf.GGUFReader(path)
    return {t.name: int(t.n_bytes) for t in rd.tensors}


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    if not TOOL or not os.path.exists(DEFAULT):
        pytest.skip("needs SLUICE_MODEL_TOOL and the default model")
    out = tmp_path_factory.mktemp("bytes") / "untied.gguf"
    subprocess.run([sys.executable, os.path.join(SRC, "tools",
                                                 "make_random_model.py"),
                    "--out", str(out), "--type", "q8_0", "--like", DEFAULT,
                    "--vocab", "49152", "--layers", "2", "--embd", "128",
                    "--ff", "256", "--heads", "4", "--kv-heads", "2",
                    "--ctx", "512"], check=True, capture_output=True)
    return str(out)


def test_untied_reads_one_embedding_row(untied):
    got = tool_bytes(untied)
    sizes = tensor_bytes(untied)
    assert not got["tied"]
    embd = sizes["token_embd.weight"]
    assert got["weight_bytes"] == sum(sizes.values())
    assert got["bytes_per_token"] == (got["weight_bytes"] - embd +
                                      embd // got["n_vocab"])


def test_tied_reads_the_table_as_the_output():
    if not TOOL or not os.path.exists(DEFAULT):
        pytest.skip("needs SLUICE_MODEL_TOOL and the default model")
    got = tool_bytes(DEFAULT)
    assert got["tied"]
    assert got["bytes_per_token"] == got["weight_bytes"]
