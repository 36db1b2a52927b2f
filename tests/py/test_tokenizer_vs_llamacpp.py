"""Compare sluice's tokenizer with llama.cpp (through llama-cpp-python).

For every text of corpus_tokenize.json, with parse_special both on and off
and add_bos (add_special) both on and off, the ids from sl_tokenize_tool
(sluice) must equal llama_cpp.Llama(model, vocab_only=True).tokenize(...),
and the detokenized bytes must equal llama.cpp's llama_detokenize of the
same ids. The whole corpus goes through one sl_tokenize_tool process per
vocabulary.

Vocabularies: the default model (SmolLM2, pre-tokenizer "smollm"), and
vocabulary-only GGUFs derived from it that differ in tokenizer.ggml.pre
(llama-bpe, qwen2, gpt-2, default, starcoder, deepseek-llm), plus an SPM
("llama") vocabulary built from its tokens with scores and <0xXX> byte
tokens, so every tokenizer path is compared with llama.cpp itself.

Environment: SLUICE_TOKENIZE_TOOL (path of sl_tokenize_tool, set by ctest),
SLUICE_MODEL or SLUICE_SOURCE_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf.
Skips (never fails) when llama_cpp, the model or the tool is missing.
"""
import ctypes
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus_tokenize.json"
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _model_path():
    p = os.environ.get("SLUICE_MODEL")
    if p:
        return Path(p)
    src = Path(os.environ.get("SLUICE_SOURCE_DIR", HERE.parent.parent))
    return src / "models" / DEFAULT_MODEL


def _tool_path():
    p = os.environ.get("SLUICE_TOKENIZE_TOOL")
    return Path(p) if p else None


def _corpus():
    items = json.loads(CORPUS.read_text())
    out = []
    for it in items:
        if "hex" in it:
            out.append(bytes.fromhex(it["hex"]))
        else:
            out.append(it["text"].encode("utf-8", "surrogatepass"))
    return items, out


@pytest.fixture(scope="module")
def env():
    llama_cpp = pytest.importorskip("llama_cpp")
    model = _model_path()
    if not model.is_file():
        pytest.skip(f"model not found: {model}")
    tool = _tool_path()
    if tool is None or not tool.is_file():
        pytest.skip("SLUICE_TOKENIZE_TOOL not set or missing")
    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    return llama_cpp, llm, model, tool


def _llama_detok(llama_cpp, llm, ids, special):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 16 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False,
                                       special)
        if n >= 0:
            return buf.raw[:n]
        cap = -n + 1


def _run_tool(tool, model, requests):
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    res = subprocess.run([str(tool), str(model)], input=lines.encode(),
                         capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    outs = [json.loads(l) for l in res.stdout.decode().splitlines() if l]
    assert len(outs) == len(requests)
    return outs


def _requests(items, add_bos):
    reqs = []
    for it in items:
        for special in (False, True):
            r = dict(it)
            r["special"] = special
            r["add_bos"] = add_bos
            r["decode_special"] = special
            reqs.append(r)
    return reqs


# ---- variant vocabularies, derived from the default model ------------------

def _kv_str(key, val):
    kb, vb = key.encode(), val if isinstance(val, bytes) else val.encode()
    return struct.pack("<Q", len(kb)) + kb + struct.pack("<IQ", 8, len(vb)) + vb


def _kv_arr(key, elem_type, payload, n):
    kb = key.encode()
    return (struct.pack("<Q", len(kb)) + kb +
            struct.pack("<IIQ", 9, elem_type, n) + payload)


def _strs(vals):
    return b"".join(struct.pack("<Q", len(v)) + v for v in vals)


def _byte_decoder():
    bs = (list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) +
          list(range(0xAE, 0x100)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _write_gguf(path, kv_blobs):
    with open(path, "wb") as fp:
        fp.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv_blobs)))
        for blob in kv_blobs:
            fp.write(blob)


BPE_VARIANTS = ["llama-bpe", "qwen2", "gpt-2", "default", "starcoder",
                "deepseek-llm"]


@pytest.fixture(scope="module")
def variants(env, tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    _, _, model, _ = env
    r = gguf.GGUFReader(str(model))
    raw = r.data
    fields = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        size = sum(p.nbytes for p in f.parts)
        fields[k] = bytes(raw[f.offset:f.offset + size])
    d = tmp_path_factory.mktemp("vocab_variants")
    out = {}
    for pre in BPE_VARIANTS:
        # without add_bos_token, so the pre-tokenizer's own BOS default shows
        blobs = [v for k, v in fields.items()
                 if k not in ("tokenizer.ggml.pre",
                              "tokenizer.ggml.add_bos_token")]
        blobs.append(_kv_str("tokenizer.ggml.pre", pre))
        path = d / f"bpe-{pre}.gguf"
        _write_gguf(path, blobs)
        out[pre] = path
    # SPM: the same pieces with spaces as U+2581, scores by id, byte tokens
    tf = r.fields["tokenizer.ggml.tokens"]
    yf = r.fields["tokenizer.ggml.token_type"]
    toks = [bytes(tf.parts[i]) for i in tf.data]
    types = [int(yf.parts[i][0]) for i in yf.data]
    dec = _byte_decoder()
    ntoks, ntypes, nscores = [], [], []
    for i, (t, ty) in enumerate(zip(toks, types)):
        if ty == 1:
            try:
                b = bytes(dec[c] for c in t.decode("utf-8"))
                b.decode("utf-8")
                t = b.replace(b" ", "\u2581".encode())
            except (KeyError, UnicodeDecodeError):
                t, ty = f"[inv{i}]".encode(), 5
        ntoks.append(t)
        ntypes.append(ty)
        nscores.append(-float(i))
    for c in range(256):
        ntoks.append(f"<0x{c:02X}>".encode())
        ntypes.append(6)
        nscores.append(0.0)
    keep = ("general.architecture", "general.name", "llama.context_length",
            "llama.embedding_length", "llama.block_count",
            "llama.feed_forward_length", "llama.rope.dimension_count",
            "llama.attention.head_count", "llama.attention.head_count_kv",
            "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base",
            "llama.vocab_size", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id")
    blobs = [v for k, v in fields.items() if k in keep]
    blobs.append(_kv_str("tokenizer.ggml.model", "llama"))
    blobs.append(_kv_arr("tokenizer.ggml.tokens", 8, _strs(ntoks), len(ntoks)))
    blobs.append(_kv_arr("tokenizer.ggml.scores", 6,
                         struct.pack(f"<{len(nscores)}f", *nscores),
                         len(nscores)))
    blobs.append(_kv_arr("tokenizer.ggml.token_type", 5,
                         struct.pack(f"<{len(ntypes)}i", *ntypes),
                         len(ntypes)))
    path = d / "spm.gguf"
    _write_gguf(path, blobs)
    out["spm"] = path
    return out


def _compare(llama_cpp, llm, model, tool, add_bos, label):
    items, texts = _corpus()
    assert len(texts) >= 200
    outs = _run_tool(tool, model, _requests(items, add_bos))
    ids_ok = detok_ok = 0
    failures = []
    k = 0
    for text in texts:
        for special in (False, True):
            out = outs[k]
            k += 1
            assert "error" not in out, out
            want = llm.tokenize(text, add_bos=add_bos, special=special)
            if out["ids"] == want:
                ids_ok += 1
            else:
                failures.append((text, special, out["ids"], want))
            got_detok = bytes.fromhex(out["detok_hex"])
            want_detok = _llama_detok(llama_cpp, llm, want, special)
            if got_detok == want_detok:
                detok_ok += 1
            else:
                failures.append((text, special, "detok", got_detok,
                                 want_detok))
    total = 2 * len(texts)
    print(f"\n{label} add_bos={add_bos}: ids match {ids_ok}/{total}, "
          f"detok match {detok_ok}/{total}")
    for f in failures[:20]:
        print("MISMATCH", f)
    assert ids_ok == total and detok_ok == total


@pytest.mark.parametrize("add_bos", [False, True])
def test_ids_and_detok_match_llamacpp(env, add_bos):
    llama_cpp, llm, model, tool = env
    _compare(llama_cpp, llm, model, tool, add_bos, "smollm (model)")


@pytest.mark.parametrize("name", BPE_VARIANTS + ["spm"])
def test_variant_vocab_matches_llamacpp(env, variants, name):
    llama_cpp, _, _, tool = env
    path = variants[name]
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for add_bos in (False, True):
        _compare(llama_cpp, llm, path, tool, add_bos, name)


def test_round_trip(env):
    """Valid UTF-8 without special tokens decodes back to itself."""
    llama_cpp, llm, model, tool = env
    items, texts = _corpus()
    reqs = [dict(it, special=False, add_bos=False) for it in items]
    outs = _run_tool(tool, model, reqs)
    checked = 0
    for text, out in zip(texts, outs):
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert bytes.fromhex(out["detok_hex"]) == text, text
        checked += 1
    assert checked >= 200


def test_vocab_info_matches_llamacpp(env):
    llama_cpp, llm, model, tool = env
    res = subprocess.run([str(tool), "--info", str(model)],
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    info = json.loads(res.stdout)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    assert info["n_vocab"] == n
    assert info["bos"] == llama_cpp.llama_vocab_bos(vocab)
    assert info["eos"] == llama_cpp.llama_vocab_eos(vocab)
    assert info["eot"] == llama_cpp.llama_vocab_eot(vocab)
    assert info["add_bos"] == bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    assert info["add_eos"] == bool(llama_cpp.llama_vocab_get_add_eos(vocab))
    eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    assert info["eog"] == eog
    # control / user-defined / unknown attributes agree
    attr_ctl, attr_user, attr_unk = 8, 16, 1
    for i in range(n):
        a = llama_cpp.llama_vocab_get_attr(vocab, i)
        t = info["types"][i]
        assert (t == 3) == bool(a & attr_ctl) or t == 5, (i, t, a)
        assert (t == 4) == bool(a & attr_user), (i, t, a)
        assert (t == 2) == bool(a & attr_unk and not a & attr_ctl), (i, t, a)
