#!/usr/bin/env python3
"""Writes a Llama-shaped GGUF file with random weights, for benchmarks.

    python3 tools/make_random_model.py --type q4_0 --out /tmp/8b-q4_0.gguf \
        [--like models/SmolLM2-135M-Instruct.Q4_1.gguf] [--vocab 128256] \
        [--layers 32 --embd 4096 --ff 14336 --heads 32 --kv-heads 8]

The defaults are Llama-3-8B's dimensions. The tokenizer is the one of the
--like file (SmolLM2's by default), its vocabulary padded with unused
tokens up to --vocab (0: keep its own size), so that sluice and llama.cpp
both load and serve it. Weights are random: quantized blocks are random
bytes under small random f16 scales (no float data is quantized, so a file
of 8B parameters is written in seconds, streamed tensor by tensor), F16 and
F32 tensors are normal with the given --std. The output is gibberish; only
the shapes and the formats matter.

Types: q4_0, q8_0, f16, f32 (matrices); norms are always F32.
Needs numpy and the gguf package (PyPI) only.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

import gguf

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIKE = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QT = gguf.GGMLQuantizationType
TYPES = {"q4_0": QT.Q4_0, "q8_0": QT.Q8_0, "f16": QT.F16, "f32": QT.F32}


def _field_value(f):
    """A reader field's value (scalar, string or list) as Python data."""
    vt = f.types[0]
    if vt == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "surrogateescape")
                    for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data], sub
    if vt == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def copy_tokenizer(w, like, vocab):
    r = gguf.GGUFReader(str(like))
    n_tok = None
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if name == "tokenizer.ggml.tokens":
            toks = _field_value(f)
            n_tok = len(toks)
            if vocab > n_tok:
                toks += ["<|pad_%d|>" % i for i in range(vocab - n_tok)]
            w.add_array(name, toks)
        elif name == "tokenizer.ggml.token_type":
            vals, _ = _field_value(f)
            if vocab > len(vals):
                vals += [int(gguf.TokenType.USER_DEFINED)] * (vocab - len(vals))
            w.add_array(name, vals)
        elif name == "tokenizer.ggml.scores":
            vals, _ = _field_value(f)
            if vocab > len(vals):
                vals += [0.0] * (vocab - len(vals))
            w.add_array(name, [float(v) for v in vals])
        elif vt == gguf.GGUFValueType.ARRAY:
            v = _field_value(f)
            w.add_array(name, v if isinstance(v, list) and
                        (not v or isinstance(v[0], str)) else v[0])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, _field_value(f))
        elif vt == gguf.GGUFValueType.BOOL:
            w.add_bool(name, bool(_field_value(f)))
        else:
            w.add_uint32(name, int(_field_value(f)))
    return max(vocab, n_tok or 0)


def random_blocks(rng, rows, cols, qt, std):
    """Random quantized rows as bytes, with sane f16 scales."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    nb = cols // bs
    raw = rng.integers(0, 256, size=(rows, nb, ts), dtype=np.uint8)
    # the f16 scale d is the first 2 bytes of Q4_0 and Q8_0 blocks: about
    # std / (typical |q|) so that the weights have roughly the given std
    qmag = 4.6 if qt == QT.Q4_0 else 73.0
    d = (rng.uniform(0.5, 1.5, size=(rows, nb)) * std / qmag).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * ts)


def tensor_bytes(rows, cols, qt):
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    return rows * (cols // bs) * ts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=sorted(TYPES), default="q4_0")
    ap.add_argument("--like", default=str(DEFAULT_LIKE))
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--ff", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    qt = TYPES[a.type]
    rng = np.random.default_rng(a.seed)
    hd = a.embd // a.heads
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("random-%dL-%d-%s" % (a.layers, a.embd, a.type))
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({QT.Q4_0: 2, QT.Q8_0: 7, QT.F16: 1, QT.F32: 0}[qt])
    vocab = copy_tokenizer(w, a.like, a.vocab)
    w.add_vocab_size(vocab)

    # (name, rows, cols, type): rows x cols matrices, GGUF ne = (cols, rows)
    plan = [("token_embd.weight", vocab, a.embd, qt)]
    kvd = a.kv_heads * hd
    for i in range(a.layers):
        p = "blk.%d." % i
        plan += [(p + "attn_norm.weight", 1, a.embd, QT.F32),
                 (p + "attn_q.weight", a.embd, a.embd, qt),
                 (p + "attn_k.weight", kvd, a.embd, qt),
                 (p + "attn_v.weight", kvd, a.embd, qt),
                 (p + "attn_output.weight", a.embd, a.embd, qt),
                 (p + "ffn_norm.weight", 1, a.embd, QT.F32),
                 (p + "ffn_gate.weight", a.ff, a.embd, qt),
                 (p + "ffn_up.weight", a.ff, a.embd, qt),
                 (p + "ffn_down.weight", a.embd, a.ff, qt)]
    plan += [("output_norm.weight", 1, a.embd, QT.F32),
             ("output.weight", vocab, a.embd, qt)]
    for name, rows, cols, t in plan:
        shape = [cols] if rows == 1 else [rows, cols]
        if t in (QT.F32, QT.F16):
            dt = np.float32 if t == QT.F32 else np.float16
            w.add_tensor_info(name, shape, np.dtype(dt),
                              rows * cols * np.dtype(dt).itemsize)
        else:
            nbytes = tensor_bytes(rows, cols, t)
            bshape = [rows, nbytes // rows]
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), nbytes,
                              raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, rows, cols, t in plan:
        if name.endswith("norm.weight"):
            arr = (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
        elif t in (QT.F32, QT.F16):
            dt = np.float32 if t == QT.F32 else np.float16
            arr = (rng.standard_normal((rows, cols), dtype=np.float32) *
                   a.std).astype(dt)
        else:
            arr = random_blocks(rng, rows, cols, t, a.std)
        w.write_tensor_data(arr)
        total += arr.nbytes
    w.close()
    print("wrote %s: %d tensors, %.2f GiB of weights" %
          (a.out, len(plan), total / 2**30), file=sys.stderr)


if __name__ == "__main__":
    main()
