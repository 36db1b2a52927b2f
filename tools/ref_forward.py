"""Float64 reference forward pass of a llama-family GGUF model (weights
dequantized with the gguf package), to see how far sluice and llama.cpp each
are from exact arithmetic on the same quantized weights.

    python3 tools/ref_forward.py [--model M] [--tool build/sl_model_tool]
                                 [--seqs 4] [--len 128]

Runs --seqs sequences of --len tokens (from the tokenizer corpus) through the
reference, llama.cpp (llama-cpp-python) and sl_model_tool (once per CPU ISA in
SLUICE_ISAS, default "scalar avx2"; a level this CPU lacks is skipped), and prints, per engine, the mean / p99 /
max relative L2 error of the logits against float64 and top-1 agreement with
float64, plus each engine against llama.cpp.
"""
import argparse
import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent


class Ref:
    """llama, qwen2, qwen3 and qwen3moe (and Mixtral-class llama files:
    expert_count > 0): float64 throughout."""

    def __init__(self, path, reader=None):
        # reader: the caller's gguf.GGUFReader of path, when it has one
        self.r = reader if reader is not None else gguf.GGUFReader(path)
        self.T = {t.name: t for t in self.r.tensors}
        self._w = {}
        self.arch = self.field("general.architecture")
        if isinstance(self.arch, (bytes, np.ndarray)):
            self.arch = bytes(self.arch).decode()
        f = self.key
        self.nl = int(f("block_count"))
        self.eps = float(f("attention.layer_norm_rms_epsilon"))
        self.nh = int(f("attention.head_count"))
        self.nkv = int(f("attention.head_count_kv"))
        self.base = float(f("rope.freq_base", 10000.0))
        self.d = int(f("embedding_length"))
        self.hd = int(f("attention.key_length", self.d // self.nh))
        self.neox = self.arch != "llama"
        self.ne = int(f("expert_count", 0))
        self.nk = int(f("expert_used_count", 0))
        self.enorm = bool(f("expert_weights_norm", True))
        self.escale = float(f("expert_weights_scale", 1.0))
        self.E = self.W("token_embd.weight")

    def field(self, key):
        v = self.r.fields[key]
        if v.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v.parts[v.data[0]]).decode()
        return v.parts[v.data[0]][0]

    def key(self, name, default=None):
        k = f"{self.arch}.{name}"
        if k not in self.r.fields:
            assert default is not None, f"missing {k}"
            return default
        return self.field(k)

    def W(self, name):
        # dequantized once: a forward pass reads every tensor
        if name not in self._w:
            self._w[name] = self._load(name)
        return self._w[name]

    def _load(self, name):
        t = self.T[name]
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(x) for x in reversed(t.shape)]
        return a.reshape(shape) if len(shape) > 1 else a.reshape(-1)

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, nheads):
        # x: (n, nheads*hd); llama NORM mode: pairs (2i, 2i+1); NEOX (qwen):
        # pairs (i, i + hd/2)
        n = x.shape[0]
        hd = self.hd
        i = np.arange(hd // 2)
        theta = np.arange(n)[:, None] * self.base ** (-2.0 * i / hd)[None, :]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if self.neox:
            v = x.reshape(n, nheads, 2, hd // 2)
            x0, x1 = v[:, :, 0], v[:, :, 1]
            out = np.stack([x0 * c - x1 * s, x0 * s + x1 * c], 2)
        else:
            v = x.reshape(n, nheads, hd // 2, 2)
            x0, x1 = v[..., 0], v[..., 1]
            out = np.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1)
        return out.reshape(n, nheads * hd)

    def headnorm(self, x, nheads, w):
        n = x.shape[0]
        return self.rms(x.reshape(n, nheads, self.hd), w).reshape(n, -1)

    def moe(self, p, xn):
        """The routed experts: softmax over all, top-k, renormalised."""
        logits = xn @ self.W(p + "ffn_gate_inp.weight").T
        pr = np.exp(logits - logits.max(1, keepdims=True))
        pr /= pr.sum(1, keepdims=True)
        G, U, D = (self.W(p + f"ffn_{k}_exps.weight")
                   for k in ("gate", "up", "down"))
        out = np.zeros_like(xn)
        for t in range(xn.shape[0]):
            sel = np.argsort(-pr[t], kind="stable")[:self.nk]
            wt = pr[t, sel]
            if self.enorm:
                wt = wt / wt.sum()
            for e, a in zip(sel, wt * self.escale):
                g, u = G[e] @ xn[t], U[e] @ xn[t]
                out[t] += a * (D[e] @ (g / (1 + np.exp(-g)) * u))
        return out

    def forward(self, ids):
        x = self.E[np.array(ids)].copy()
        n, hd, nh, nkv = len(ids), self.hd, self.nh, self.nkv
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.nl):
            p = f"blk.{l}."
            xn = self.rms(x, self.W(p + "attn_norm.weight"))
            q = xn @ self.W(p + "attn_q.weight").T
            k = xn @ self.W(p + "attn_k.weight").T
            v = xn @ self.W(p + "attn_v.weight").T
            if p + "attn_q.bias" in self.T:
                q = q + self.W(p + "attn_q.bias")
                k = k + self.W(p + "attn_k.bias")
                v = v + self.W(p + "attn_v.bias")
            if p + "attn_q_norm.weight" in self.T:
                q = self.headnorm(q, nh, self.W(p + "attn_q_norm.weight"))
                k = self.headnorm(k, nkv, self.W(p + "attn_k_norm.weight"))
            q, k = self.rope(q, nh), self.rope(k, nkv)
            att = np.empty((n, nh * hd))
            for h in range(nh):
                kh = h // (nh // nkv)
                s = q[:, h * hd:(h + 1) * hd] @ k[:, kh * hd:(kh + 1) * hd].T
                s = s / np.sqrt(hd) + mask
                s = np.exp(s - s.max(1, keepdims=True))
                s /= s.sum(1, keepdims=True)
                att[:, h * hd:(h + 1) * hd] = s @ v[:, kh * hd:(kh + 1) * hd]
            x = x + att @ self.W(p + "attn_output.weight").T
            xn = self.rms(x, self.W(p + "ffn_norm.weight"))
            if self.ne > 0:
                x = x + self.moe(p, xn)
                continue
            g = xn @ self.W(p + "ffn_gate.weight").T
            u = xn @ self.W(p + "ffn_up.weight").T
            x = x + (g / (1 + np.exp(-g)) * u) @ self.W(p + "ffn_down.weight").T
        xn = self.rms(x, self.W("output_norm.weight"))
        out = self.T.get("output.weight")
        return xn @ (self.W("output.weight") if out else self.E).T


def rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" /
                                           "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tool", default=str(ROOT / "build" / "sl_model_tool"))
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--len", type=int, default=128)
    a = ap.parse_args()
    import llama_cpp
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=2048, logits_all=True,
                          n_threads=2, verbose=False)
    items = json.loads((ROOT / "tests" / "py" /
                        "corpus_tokenize.json").read_text())
    toks = []
    for it in items:
        if it.get("text", "").strip():
            toks += llm.tokenize(it["text"].encode("utf-8", "replace"),
                                 add_bos=False, special=False)
    seqs = [toks[i * a.len:(i + 1) * a.len] for i in range(a.seqs)]
    ref = Ref(a.model)
    R = np.concatenate([ref.forward(s) for s in seqs])
    L = []
    for s in seqs:
        llm.reset()
        llm.eval(s)
        L.append(np.array(llm.scores[:len(s)], dtype=np.float64))
    L = np.concatenate(L)
    engines = {"llama.cpp": L}
    inp = "".join(" ".join(map(str, s)) + "\n" for s in seqs).encode()
    for isa in os.environ.get("SLUICE_ISAS", "scalar avx2").split():
        env = dict(os.environ, SLUICE_ISA=isa)
        if subprocess.run([a.tool, "isa"], env=env,
                          capture_output=True).returncode != 0:
            print(f"sluice-{isa}: this CPU cannot run it")
            continue
        o = subprocess.run([a.tool, "logits", a.model], input=inp,
                           capture_output=True, check=True, env=env).stdout
        engines["sluice-" + isa] = np.frombuffer(o, np.float32).reshape(
            R.shape).astype(np.float64)
    for name, X in engines.items():
        e = rel(X, R)
        el = rel(X, L)
        print(f"{name:14s} vs fp64: mean {e.mean():.5f} p99 "
              f"{np.percentile(e, 99):.5f} max {e.max():.5f} top1 "
              f"{(X.argmax(1) == R.argmax(1)).mean():.4f} | vs llama.cpp: "
              f"mean {el.mean():.5f} top1 "
              f"{(X.argmax(1) == L.argmax(1)).mean():.4f}")


if __name__ == "__main__":
    main()
