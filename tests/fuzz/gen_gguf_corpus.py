#!/usr/bin/env python3
"""Writes the GGUF seed corpus for tests/fuzz/fuzz_gguf.c with gguf-py.

The files are tiny and deterministic. tests/test_gguf.c also opens them (an
independent writer for the reader) and checks facts fixed here, so keep the
two in step. Run from anywhere:  python3 tests/fuzz/gen_gguf_corpus.py
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def tiny(path, alignment=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<unk>", "a", "b", "ab"])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0])
    w.add_token_types([2, 1, 1, 1])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("tokenizer.ggml.merges", ["a b"])
    # token_embd: ne = [8, 4], values arange(32) / 2
    w.add_tensor("token_embd.weight",
                 (np.arange(32, dtype=np.float32) / 2).reshape(4, 8))
    # blk.0.attn_q: Q8_0, ne = [32, 2]
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(x, Q.Q8_0),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kquants(path):
    """K-quant and legacy-quant tensors with raw (random) blocks."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, "llama")
    for name, qt in [("q2k", Q.Q2_K), ("q3k", Q.Q3_K), ("q4k", Q.Q4_K),
                     ("q5k", Q.Q5_K), ("q6k", Q.Q6_K), ("q8k", Q.Q8_K),
                     ("q4_0", Q.Q4_0), ("q4_1", Q.Q4_1), ("q5_0", Q.Q5_0),
                     ("q5_1", Q.Q5_1)]:
        blk, nbytes = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(2, (256 // blk) * nbytes),
                           dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)
    w.add_tensor("bf16", np.zeros((3, 2), dtype=np.uint16), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kv_only(path):
    """Every metadata type, arrays of every element type, no tensors."""
    w = gguf.GGUFWriter(path, "test")
    w.add_uint8("u8", 200)
    w.add_int8("i8", -5)
    w.add_uint16("u16", 60000)
    w.add_int16("i16", -300)
    w.add_uint32("u32", 7)
    w.add_int32("i32", -7)
    w.add_float32("f32", 0.25)
    w.add_uint64("u64", 2**40)
    w.add_int64("i64", -(2**40))
    w.add_float64("f64", 1.5)
    w.add_bool("b", False)
    w.add_string("s", "text")
    w.add_array("as", ["x", "yy", ""])
    w.add_array("ai", [1, 2, 3])
    w.add_array("af", [0.5, 1.5])
    w.add_array("ab", [True, False])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def set_version(path, version):
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(int(version).to_bytes(4, "little"))


def main():
    os.makedirs(OUT, exist_ok=True)
    tiny(os.path.join(OUT, "tiny_v3.gguf"))
    p = os.path.join(OUT, "tiny_v2_align64.gguf")
    tiny(p, alignment=64)
    set_version(p, 2)
    kquants(os.path.join(OUT, "kquants.gguf"))
    kv_only(os.path.join(OUT, "kv_only.gguf"))
    for name in sorted(os.listdir(OUT)):
        print(os.path.join(OUT, name), os.path.getsize(os.path.join(OUT, name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
