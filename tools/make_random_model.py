#!/usr/bin/env python3
"""Writes a Llama-shaped GGUF file with random weights, for benchmarks and
for the tests that compare sluice with llama.cpp on architectures no model
file here has (mixture of experts).

    python3 tools/make_random_model.py --type q4_0 --out /tmp/8b-q4_0.gguf \
        [--like models/SmolLM2-135M-Instruct.Q4_1.gguf] [--vocab 128256] \
        [--layers 32 --embd 4096 --ff 14336 --heads 32 --kv-heads 8] \
        [--arch llama|qwen2|qwen3|qwen3moe] [--experts 128 --experts-used 8 \
         --expert-ff 768 --head-dim 128 --router-std 0.05] [--tied]

The defaults are Llama-3-8B's dimensions. --experts N > 0 makes each
layer's FFN N routed experts (3-D ffn_{gate,up,down}_exps tensors and an F32
router ffn_gate_inp, as llama.cpp's converter writes them): a Mixtral-class
file under --arch llama, Qwen3-MoE under --arch qwen3moe (which also has
q/k RMSNorm weights and NEOX RoPE; Qwen3-30B-A3B is --layers 48 --embd 2048
--heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8
--expert-ff 768). --arch qwen2 adds q/k/v biases, qwen3 q/k RMSNorm
weights (both dense). --tied leaves out output.weight. The tokenizer is the one of the
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
    ap.add_argument("--arch", choices=("llama", "qwen2", "qwen3", "qwen3moe"),
                    default="llama")
    ap.add_argument("--experts", type=int, default=0)
    ap.add_argument("--experts-used", type=int, default=2)
    ap.add_argument("--expert-ff", type=int, default=0,
                    help="each expert's width (0: --ff)")
    ap.add_argument("--head-dim", type=int, default=0,
                    help="0: embd / heads")
    ap.add_argument("--router-std", type=float, default=0.0,
                    help="the router's weights (0: 2 / sqrt(embd), so that "
                         "its logits spread over a few units)")
    ap.add_argument("--tied", action="store_true")
    a = ap.parse_args()
    qt = TYPES[a.type]
    rng = np.random.default_rng(a.seed)
    hd = a.head_dim or a.embd // a.heads
    if a.arch == "qwen3moe" and a.experts <= 0:
        ap.error("--arch qwen3moe needs --experts")
    eff = a.expert_ff or a.ff
    rstd = a.router_std or 2.0 / a.embd ** 0.5
    w = gguf.GGUFWriter(a.out, a.arch)
    w.add_name("random-%dL-%d-%s" % (a.layers, a.embd, a.type))
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(hd)
    if a.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if a.experts > 0:
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.experts_used)
        if a.arch == "qwen3moe":
            w.add_expert_feed_forward_length(eff)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({QT.Q4_0: 2, QT.Q8_0: 7, QT.F16: 1, QT.F32: 0}[qt])
    vocab = copy_tokenizer(w, a.like, a.vocab)
    w.add_vocab_size(vocab)

    # (name, rows, cols, type[, experts]): rows x cols matrices (one per
    # expert), GGUF ne = (cols, rows[, experts])
    plan = [("token_embd.weight", vocab, a.embd, qt)]
    kvd, qd = a.kv_heads * hd, a.heads * hd
    for i in range(a.layers):
        p = "blk.%d." % i
        plan += [(p + "attn_norm.weight", 1, a.embd, QT.F32),
                 (p + "attn_q.weight", qd, a.embd, qt),
                 (p + "attn_k.weight", kvd, a.embd, qt),
                 (p + "attn_v.weight", kvd, a.embd, qt),
                 (p + "attn_output.weight", a.embd, qd, qt)]
        if a.arch == "qwen2":
            plan += [(p + "attn_q.bias", 1, qd, QT.F32),
                     (p + "attn_k.bias", 1, kvd, QT.F32),
                     (p + "attn_v.bias", 1, kvd, QT.F32)]
        if a.arch in ("qwen3", "qwen3moe"):
            plan += [(p + "attn_q_norm.weight", 1, hd, QT.F32),
                     (p + "attn_k_norm.weight", 1, hd, QT.F32)]
        plan += [(p + "ffn_norm.weight", 1, a.embd, QT.F32)]
        if a.experts > 0:
            E = a.experts
            plan += [(p + "ffn_gate_inp.weight", E, a.embd, QT.F32),
                     (p + "ffn_gate_exps.weight", eff, a.embd, qt, E),
                     (p + "ffn_up_exps.weight", eff, a.embd, qt, E),
                     (p + "ffn_down_exps.weight", a.embd, eff, qt, E)]
        else:
            plan += [(p + "ffn_gate.weight", a.ff, a.embd, qt),
                     (p + "ffn_up.weight", a.ff, a.embd, qt),
                     (p + "ffn_down.weight", a.embd, a.ff, qt)]
    plan += [("output_norm.weight", 1, a.embd, QT.F32)]
    if not a.tied:
        plan += [("output.weight", vocab, a.embd, qt)]
    plan = [e if len(e) == 5 else e + (1,) for e in plan]
    for name, rows, cols, t, ne in plan:
        shape = [cols] if rows == 1 else [rows, cols]
        if ne > 1:
            shape = [ne] + shape
            rows *= ne  # the tensor's rows, all experts together
        if t in (QT.F32, QT.F16):
            dt = np.float32 if t == QT.F32 else np.float16
            w.add_tensor_info(name, shape, np.dtype(dt),
                              rows * cols * np.dtype(dt).itemsize)
        else:
            nbytes = tensor_bytes(rows, cols, t)
            bshape = shape[:-1] + [tensor_bytes(1, cols, t)]
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), nbytes,
                              raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, rows, cols, t, ne in plan:
        std = rstd if name.endswith("ffn_gate_inp.weight") else a.std
        rows *= ne
        if name.endswith("norm.weight"):
            arr = (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
        elif name.endswith(".bias"):
            arr = (0.5 * rng.standard_normal(cols)).astype(np.float32)
        elif t in (QT.F32, QT.F16):
            dt = np.float32 if t == QT.F32 else np.float16
            arr = (rng.standard_normal((rows, cols), dtype=np.float32) *
                   std).astype(dt)
        else:
            arr = random_blocks(rng, rows, cols, t, std)
        w.write_tensor_data(arr)
        total += arr.nbytes
    w.close()
    print("wrote %s: %d tensors, %.2f GiB of weights" %
          (a.out, len(plan), total / 2**30), file=sys.stderr)


if __name__ == "__main__":
    main()
