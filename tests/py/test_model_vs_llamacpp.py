"""Compare sluice's forward pass with llama.cpp on the same GGUF file, both
measured against a float64 reference on the same (dequantized) weights.

1. Teacher-forced logits: sequences built from the tokenizer corpus (code,
   Unicode, whitespace, numbers, prose), tokenized once by llama.cpp, are run
   through sluice, llama.cpp and tools/ref_forward.py (float64, exact
   arithmetic on the quantized weights, no activation quantization). At every
   position each engine's logits are scored against the reference: top-1
   agreement with the reference's argmax, relative L2 error
   ||x - ref||_2 / ||ref||_2, and KL(softmax(ref) || softmax(x)). sluice must
   be no worse than llama.cpp on the same machine by more than the stated
   margins. No floor here is a value measured on one machine: llama.cpp
   takes other kernels on another CPU, and its own distance from float64 is
   the yardstick.
2. Greedy continuation: 64 tokens for a set of prompts, compared with
   llama.cpp's; a divergence is allowed only at a near-tie in the float64
   reference: there, sluice's token must be within llama.cpp's own logit
   noise (measured in 1 on this machine) of the reference's best token.

Both run once per ISA level in SLUICE_TEST_ISAS (default: the level sluice
picks here, plus avx2 when that is avx512); sl_model_tool runs under
SLUICE_ISA=<level> and a level this CPU cannot run is skipped.

Environment: SLUICE_MODEL_TOOL (set by ctest), SLUICE_MODEL or
SLUICE_SOURCE_DIR/models/. Skips when llama_cpp, gguf, the model or the tool
is missing.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"

# sluice's error against float64 next to llama.cpp's. Both quantize the
# activations of every Q4_1 matmul to Q8_1 as ggml does, and on AVX2 sluice
# follows ggml's arithmetic bit for bit except the exp() in SiLU and
# softmax, so the two sit at the same distance from float64 (about 1.7%
# relative L2, 5% top-1 disagreement). What differs between them is which
# activations land on the other side of a Q8 rounding boundary: positions
# where the two engines' argmaxes differ number ~4% of ~3300, and each
# moves the top-1 count by at most one, so the difference of the two top-1
# rates has a standard deviation of about sqrt(0.04 * 3300) / 3300 = 0.35
# points. TOP1_MARGIN is three of those. The mean-based metrics average
# ~3300 positions, so the same boundary noise moves them by a few percent;
# the relative margins allow ~3 times that. Planted breaks fail them: the
# AVX-512 rmsnorm's scale times 1.01 gives a mean relative error 0.0268
# against llama.cpp's 0.0182 (+47%); the AVX2 Q4 gemm's weight scale d
# times 1.01 gives top-1 84.5% against 95.1%.
TOP1_MARGIN = 0.010        # absolute, on the top-1 rate against float64
# (the floor: top1_margin() widens it to three standard deviations of the
# boundary noise measured in the run, for a comparison on fewer positions)
REL_MEAN_MARGIN = 0.10     # relative, on the mean relative L2 error
REL_P99_MARGIN = 0.15      # relative, on its 99th percentile
KL_MEAN_MARGIN = 0.15      # relative, on the mean KL divergence
# greedy: a divergence is a near-tie when, in the float64 logits, sluice's
# token is within NEAR_TIE_SCALE times llama.cpp's p99 top-token error
# (|llama - ref| at the reference's best token, teacher-forced positions)
# of the best token: noise of llama.cpp's own size could have flipped it.
NEAR_TIE_SCALE = 1.0
MIN_POSITIONS = 2000
SEQ_TOKENS = 256
# How many positions each comparison needs. The Q4_1 and F32 files, the
# default model and its exact copy, take every corpus sequence (13 of 256
# tokens, 3,328 positions): there TOP1_MARGIN is 3 standard deviations of
# the boundary noise, as above. The seven other quantizations
# (test_model_quant_* and test_model_lowbit_*) take VARIANT_SEQS of them,
# spread evenly over the corpus so that every kind of text is in (code,
# Unicode, whitespace, numbers, prose): 2,048 positions, 62% of the cost. Their noise
# grows by sqrt(3328 / 2048) = 1.27, so:
#   - the top-1 margin is taken from the run: three standard deviations,
#     3 * sqrt(d / n) for a discordance d between the engines' argmaxes
#     over n positions (top1_margin): at d = 4%, 1.3 points instead of
#     1.0; at the lowbit files' d of up to 8%, 1.9. A break that costs 3
#     points of top-1 or more is caught with a power of 0.95 or more
#     (the planted Q4 gemm break costs 10.6);
#   - the relative margins (10% and 15%) stay: the mean metrics' noise of a
#     few percent becomes 1.27 times that, and the margins still allow
#     over twice it, while the planted breaks move them by 47% or more.
# The kernels of every type are also checked one by one without a model
# (test_kern_cpu, test_dequant_vs_gguf), so these files check the whole
# forward pass of each type, not each rounding of each kernel.
VARIANT_SEQS = 8

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 17 times 23?<|im_end|>\n<|im_start|>assistant\n",
    "The three laws of thermodynamics are",
    "#include <stdio.h>\n\nint main(void) {\n",
    "Translate to French: 'The weather is nice today.'\n",
    "1, 1, 2, 3, 5, 8, 13,",
]


def _model_path():
    p = os.environ.get("SLUICE_MODEL")
    if p:
        return Path(p)
    src = Path(os.environ.get("SLUICE_SOURCE_DIR", ROOT))
    return src / "models" / DEFAULT_MODEL


def _tool_isa(tool, isa=None):
    """The level sl_model_tool runs under SLUICE_ISA=isa (None: unset);
    None when this CPU cannot run it."""
    env = dict(os.environ)
    env.pop("SLUICE_CPU_ISA", None)
    if isa:
        env["SLUICE_ISA"] = isa
    else:
        env.pop("SLUICE_ISA", None)
    r = subprocess.run([tool, "isa"], env=env, capture_output=True)
    if r.returncode == 77:
        return None
    assert r.returncode == 0, r.stderr.decode()
    got = r.stdout.decode().strip()
    assert isa is None or got == isa, f"asked for {isa}, got {got}"
    return got


def isa_levels():
    """Levels to test: SLUICE_TEST_ISAS, else 'default' and 'avx2' (the
    avx2 one is skipped where it is the default)."""
    v = os.environ.get("SLUICE_TEST_ISAS")
    return v.split() if v else ["default", "avx2"]


@pytest.fixture(scope="module")
def env():
    llama_cpp = pytest.importorskip("llama_cpp")
    model = _model_path()
    tool = os.environ.get("SLUICE_MODEL_TOOL")
    if not model.exists():
        pytest.skip(f"model missing: {model}")
    if not tool or not Path(tool).exists():
        pytest.skip("SLUICE_MODEL_TOOL not set")
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=2048, n_batch=512,
                          logits_all=True, n_threads=2, verbose=False)
    return llm, str(model), tool


_readers = {}


def gguf_reader(path):
    """The gguf package's reader of `path`, one per file and process: a read
    parses every metadata array element by element in Python (3 to 5 s for
    this vocabulary), and a comparison reads one file several times (its
    tensor types, then the reference). Keyed by the file's identity, so a
    file renamed into place (a quantized copy) is not read twice and a
    rewritten one is read again."""
    import gguf
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _readers:
        _readers[key] = gguf.GGUFReader(str(path))
    return _readers[key]


def reference(model):
    """tools/ref_forward.py's float64 forward pass on `model`."""
    pytest.importorskip("gguf")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from ref_forward import Ref
    finally:
        sys.path.pop(0)
    return Ref(str(model), gguf_reader(model))


def _sequences(llm):
    items = json.loads((HERE / "corpus_tokenize.json").read_text())
    texts = [it["text"] for it in items if "text" in it and it["text"].strip()]
    seqs, cur = [], []
    for t in texts:
        ids = llm.tokenize(t.encode("utf-8", "replace"), add_bos=False,
                           special=False)
        cur.extend(ids)
        while len(cur) >= SEQ_TOKENS:
            seqs.append(cur[:SEQ_TOKENS])
            cur = cur[SEQ_TOKENS:]
    return seqs


def _llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float64)


def _isa_env(isa):
    env = dict(os.environ)
    env.pop("SLUICE_CPU_ISA", None)
    env.pop("SLUICE_ISA", None)
    if isa != "default":
        env["SLUICE_ISA"] = isa
    return env


def _sluice(tool, model, mode, lines, extra=(), isa="default"):
    inp = "".join(" ".join(map(str, ids)) + "\n" for ids in lines)
    r = subprocess.run([tool, mode, model, *extra], input=inp.encode(),
                       capture_output=True, timeout=900, env=_isa_env(isa))
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def _rowdot(a, b):
    """Each row's dot product of a and b (no temporary array)."""
    return np.einsum("ij,ij->i", a, b)


class RefStats:
    """What scoring against one block of float64 logits needs, computed
    once: the argmax, the row norms, the softmax p and sum(p log p) (KL(p||q)
    = sum(p log p) - sum(p log q)). The blocks are 256 x 49,152 (100 MB in
    float64), and scoring reads them more often than the forward passes
    make them: each sum is a row dot product, with one temporary array."""

    def __init__(self, ref):
        self.ref = ref
        self.best = ref.argmax(1)
        self.norm = np.sqrt(_rowdot(ref, ref))
        lse = _logsumexp(ref)
        self.p = np.subtract(ref, lse)
        np.exp(self.p, out=self.p)
        self.psum = self.p.sum(1)
        # sum p log p = sum p (ref - lse) = p.ref - lse sum p
        self.plogp = _rowdot(self.p, ref) - lse[:, 0] * self.psum


class Scores:
    """Per-position scores of one engine's logits against float64."""

    def __init__(self):
        self.top1, self.rel, self.kl, self.top_err = [], [], [], []

    def add(self, x, ref):
        """x: an engine's logits; ref: the float64 logits, or their
        RefStats (computed once for every engine scored on them)."""
        r = ref if isinstance(ref, RefStats) else RefStats(ref)
        x = np.asarray(x, dtype=np.float64)
        assert np.isfinite(x).all()
        self.top1.extend(x.argmax(1) == r.best)
        d = np.subtract(x, r.ref)
        self.rel.extend(np.sqrt(_rowdot(d, d)) / r.norm)
        # sum p log q = sum p (x - lse(x)) = p.x - lse(x) sum p
        self.kl.extend(r.plogp -
                       (_rowdot(r.p, x) - _logsumexp(x)[:, 0] * r.psum))
        rows = np.arange(len(r.best))
        self.top_err.extend(np.abs(x[rows, r.best] - r.ref[rows, r.best]))

    def summary(self):
        rel, kl = np.array(self.rel), np.array(self.kl)
        return {"top1": float(np.mean(self.top1)),
                "rel_mean": float(rel.mean()),
                # the medians: robust to the few sequences where an MoE
                # router's near-tie tips one engine another way
                # (test_model_moe)
                "rel_p50": float(np.percentile(rel, 50)),
                "rel_p99": float(np.percentile(rel, 99)),
                "rel_max": float(rel.max()),
                "kl_mean": float(kl.mean()),
                "kl_p50": float(np.percentile(kl, 50)),
                "top_err_p99": float(np.percentile(self.top_err, 99))}


def _logsumexp(a):
    """Each row's log(sum(exp(a))), as a column (one temporary array)."""
    m = a.max(1, keepdims=True)
    t = np.subtract(a, m)
    np.exp(t, out=t)
    return m + np.log(t.sum(1, keepdims=True))


def _fmt(s):
    return (f"top-1 vs fp64 {s['top1']:.4%}, rel L2 mean {s['rel_mean']:.6f} "
            f"p99 {s['rel_p99']:.6f} max {s['rel_max']:.6f}, KL mean "
            f"{s['kl_mean']:.3e}, |err| at the top token p99 "
            f"{s['top_err_p99']:.4f}")


def teacher_forced(llm, model, tool, label, isas, n_seqs=None):
    """Runs the corpus sequences (n_seqs of them spread evenly over the
    corpus, all when None) through the float64 reference, llama.cpp and
    sluice at each level of `isas` (those this CPU runs); returns the
    summaries by engine ("llama.cpp", "sluice-<isa>") plus, per ISA, the
    top-1 agreement of sluice with llama.cpp under "agree-<isa>", and the
    positions under "positions"."""
    return teacher_forced_shared([(label, llm, model)], tool, isas,
                                 n_seqs)[0]


def teacher_forced_shared(targets, tool, isas, n_seqs=None):
    """teacher_forced() for several (label, llm, model) files whose
    dequantized weights are the same (the Q4_1 file and its F32 copy): the
    float64 reference forward pass of each sequence, and its softmax,
    argmax and norms, are computed once, from the first file, and every
    engine on every file is scored against it. One result per target."""
    seqs = _sequences(targets[0][1])
    if n_seqs is not None and n_seqs < len(seqs):
        pick = np.linspace(0, len(seqs) - 1, n_seqs).round().astype(int)
        seqs = [seqs[i] for i in sorted(set(pick))]
    npos = sum(len(s) for s in seqs)
    assert npos >= MIN_POSITIONS, f"only {npos} positions"
    ref = reference(targets[0][2])
    here = _tool_isa(tool)
    levels = []
    for isa in isas:
        if isa != "default" and _tool_isa(tool, isa) is None:
            continue
        # a named level that is this CPU's default runs the same code as
        # "default": scored once (its test skips, see _level)
        if isa != "default" and isa == here and "default" in isas:
            continue
        levels.append(isa)
    runs = []  # per target: llm, n_vocab, procs, scores, agree
    try:
        for _, llm, model in targets:
            procs = {isa: subprocess.Popen([tool, "logits", model],
                                           stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE,
                                           env=_isa_env(isa))
                     for isa in levels}
            runs.append((llm, llm.n_vocab(), procs,
                         {"llama.cpp": Scores(),
                          **{i: Scores() for i in procs}},
                         {i: 0 for i in procs}))
        for ids in seqs:
            line = (" ".join(map(str, ids)) + "\n").encode()
            for run in runs:  # sluice works while the others do
                for p in run[2].values():
                    p.stdin.write(line)
                    p.stdin.flush()
            R = RefStats(ref.forward(ids))
            for llm, n_vocab, procs, scores, agree in runs:
                L = _llama_logits(llm, ids)
                scores["llama.cpp"].add(L, R)
                for isa, p in procs.items():
                    nb = len(ids) * n_vocab * 4
                    raw = p.stdout.read(nb)
                    assert len(raw) == nb, f"sluice ({isa}) stopped"
                    S = np.frombuffer(raw, np.float32).reshape(len(ids),
                                                               n_vocab)
                    scores[isa].add(S, R)
                    agree[isa] += int((S.argmax(1) == L.argmax(1)).sum())
    finally:
        for run in runs:
            for p in run[2].values():
                p.stdin.close()
                p.wait(timeout=60)
    outs = []
    for (label, _, _), (_, _, procs, scores, agree) in zip(targets, runs):
        for p in procs.values():
            assert p.returncode == 0
        out = {"positions": npos}
        print(f"\nteacher-forced ({label}): {npos} positions in "
              f"{len(seqs)} sequences, each engine against float64")
        for name, sc in scores.items():
            key = name if name == "llama.cpp" else "sluice-" + name
            out[key] = sc.summary()
            extra = "" if name == "llama.cpp" else \
                f"; top-1 agreement with llama.cpp {agree[name] / npos:.4%}"
            print(f"  {key:15s} {_fmt(out[key])}{extra}")
            if name != "llama.cpp":
                out["agree-" + name] = agree[name] / npos
        outs.append(out)
    return outs


def top1_margin(measured, isa, floor):
    """The top-1 margin for sluice at `isa` in a teacher_forced() result:
    three standard deviations of the boundary noise between the two
    engines' top-1 rates (each position where their argmaxes differ moves
    the difference by at most one: sd <= sqrt(d / n) for a discordance d
    over n positions), and no less than `floor`."""
    n = measured["positions"]
    d = 1.0 - measured["agree-" + isa]
    return max(floor, 3.0 * (d / n) ** 0.5)


def check_no_worse(ours, theirs, top1_margin, rel_mean_margin,
                   rel_p99_margin, kl_mean_margin):
    """sluice's distance from float64 against llama.cpp's, with margins."""
    assert ours["top1"] >= theirs["top1"] - top1_margin, \
        f"top-1 vs fp64: sluice {ours['top1']:.4f}, llama.cpp " \
        f"{theirs['top1']:.4f}"
    assert ours["rel_mean"] <= theirs["rel_mean"] * (1 + rel_mean_margin), \
        f"mean rel L2: sluice {ours['rel_mean']:.6f}, llama.cpp " \
        f"{theirs['rel_mean']:.6f}"
    assert ours["rel_p99"] <= theirs["rel_p99"] * (1 + rel_p99_margin), \
        f"p99 rel L2: sluice {ours['rel_p99']:.6f}, llama.cpp " \
        f"{theirs['rel_p99']:.6f}"
    assert ours["kl_mean"] <= theirs["kl_mean"] * (1 + kl_mean_margin), \
        f"mean KL: sluice {ours['kl_mean']:.3e}, llama.cpp " \
        f"{theirs['kl_mean']:.3e}"


@pytest.fixture(scope="module")
def f32_env(env):
    """The F32 copy of the default model (test_model_f32_vs_llamacpp builds
    and checks it) loaded in llama.cpp, once sluice has loaded it too."""
    from test_model_f32_vs_llamacpp import f32_model
    tool = env[2]
    model = f32_model()
    llm = llama_cpp_module().Llama(model_path=str(model), n_ctx=2048,
                                   n_batch=512, logits_all=True, n_threads=2,
                                   verbose=False)
    r = subprocess.run([tool, "logits", str(model)], input=b"1 2 3\n",
                       capture_output=True, timeout=300)
    assert r.returncode == 0, \
        f"sluice cannot run the F32 copy: {r.stderr.decode()}"
    assert len(r.stdout) == 3 * llm.n_vocab() * 4
    return llm, str(model), tool


def llama_cpp_module():
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def measured_both(env, f32_env):
    """The Q4_1 file and its F32 copy, scored in one pass: the copy's
    weights are the file's dequantized weights (gguf.quants.dequantize, the
    function the reference uses too), so one float64 forward pass per
    sequence is the reference of both."""
    llm, model, tool = env
    return teacher_forced_shared([("Q4_1 file", llm, model),
                                  ("F32 weights", f32_env[0], f32_env[1])],
                                 tool, isa_levels())


@pytest.fixture(scope="module")
def measured(measured_both):
    return measured_both[0]


def _level(tool, isa):
    """Skips a level this CPU cannot run, or avx2 where it is the default."""
    if isa == "default":
        return
    if _tool_isa(tool, isa) is None:
        pytest.skip(f"this CPU cannot run {isa}")
    if isa == _tool_isa(tool) and "default" in isa_levels():
        pytest.skip(f"{isa} is the default level here")


@pytest.mark.parametrize("isa", isa_levels())
def test_teacher_forced_logits(env, measured, isa):
    _level(env[2], isa)
    check_no_worse(measured["sluice-" + isa], measured["llama.cpp"],
                   TOP1_MARGIN, REL_MEAN_MARGIN, REL_P99_MARGIN,
                   KL_MEAN_MARGIN)


@pytest.mark.parametrize("isa", isa_levels())
def test_teacher_forced_logits_f32(env, measured_both, isa):
    """The F32 copy: see test_model_f32_vs_llamacpp for the margins."""
    from test_model_f32_vs_llamacpp import (F32_KL_MEAN_MARGIN,
                                            F32_REL_MEAN_MARGIN,
                                            F32_REL_P99_MARGIN,
                                            F32_TOP1_MARGIN)
    _level(env[2], isa)
    m = measured_both[1]
    check_no_worse(m["sluice-" + isa], m["llama.cpp"], F32_TOP1_MARGIN,
                   F32_REL_MEAN_MARGIN, F32_REL_P99_MARGIN,
                   F32_KL_MEAN_MARGIN)


GREEDY_TOKENS = 64


@pytest.fixture(scope="module")
def llama_greedy(env):
    """llama.cpp's greedy continuations of PROMPTS (computed once)."""
    llm = env[0]
    prompts = [llm.tokenize(p.encode(), add_bos=True, special=True)
               for p in PROMPTS]
    out = []
    for ids in prompts:
        # incremental: the prompt once, then one token per step (as sluice)
        llm.reset()
        llm.eval(list(ids))
        theirs = []
        for _ in range(GREEDY_TOKENS):
            lg = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(lg.argmax())
            theirs.append(tok)
            llm.eval([tok])
        out.append(theirs)
    return prompts, out


@pytest.mark.parametrize("isa", isa_levels())
def test_greedy_continuation(env, measured, llama_greedy, isa):
    llm, model, tool = env
    _level(tool, isa)
    near_tie = NEAR_TIE_SCALE * measured["llama.cpp"]["top_err_p99"]
    n_gen = GREEDY_TOKENS
    prompts, theirs_all = llama_greedy
    ours = [list(map(int, line.split()))
            for line in _sluice(tool, model, "greedy", prompts,
                                (str(n_gen),), isa).decode().splitlines()]
    assert len(ours) == len(prompts)
    ref = None
    identical, ties = 0, []
    for p, ids, mine, theirs in zip(PROMPTS, prompts, ours, theirs_all):
        if mine == theirs:
            identical += 1
            continue
        i = next(k for k in range(n_gen) if mine[k] != theirs[k])
        # the float64 logits after the common prefix
        ref = ref or reference(model)
        R = ref.forward(list(ids) + mine[:i])[-1]
        best = int(R.argmax())
        miss = float(R[best] - R[mine[i]])
        ties.append((p, i, miss))
        print(f"\ndivergence at token {i} for {p!r}: float64 logits: sluice's "
              f"{mine[i]} {R[mine[i]]:.4f}, llama.cpp's {theirs[i]} "
              f"{R[theirs[i]]:.4f}, best {best} {R[best]:.4f}; near-tie "
              f"bound {near_tie:.4f}")
        assert miss <= near_tie, f"divergence without a near-tie for {p!r}"
    print(f"\ngreedy ({isa}): {identical}/{len(prompts)} continuations "
          f"identical over {n_gen} tokens; {len(ties)} divergence(s) at "
          "near-ties")
