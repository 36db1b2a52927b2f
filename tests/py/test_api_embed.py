"""/v1/embeddings (issue 12) through the official openai SDK and raw HTTP,
against llama.cpp (llama-cpp-python's Llama(embedding=True) on the same
GGUF file, the same pooling, normalized) as the reference:

- mean and last-token pooling agree with llama.cpp's vectors (cosine);
- token counts in usage equal llama.cpp's tokenization;
- the same text twice gives the same vector (the prefix cache must not
  shorten what is pooled), and a chunked prefill gives the vector of an
  unchunked one;
- embeddings and generation share the engine: a greedy answer is the same
  while 32 inputs are embedded beside it;
- float and base64 encodings, token-id inputs, and the 400s: empty input,
  a wrong `dimensions`, an input longer than the context.

Skipped without the model, the binary, the SDK or llama-cpp-python.
"""
import base64
import concurrent.futures
import http.client
import json

import numpy as np
import pytest

from conftest import MODEL_NAME, model_path

openai = pytest.importorskip("openai")

TEXTS = ["Hello world", "The cat sat on the mat.", "Bonjour le monde",
         "Embeddings turn text into vectors. " * 12]
# cosine against llama.cpp: both run the same Q4_1 weights with their own
# kernels; the vectors agree to about 1e-4 in cosine on the machines seen,
# and unrelated texts sit below 0.8
MIN_COS = 0.998


def oai(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none",
                         max_retries=0, timeout=300)


def raw(srv, body):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/embeddings", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    return r.status, data


def vectors(srv, inputs, **kw):
    r = oai(srv).embeddings.create(model=MODEL_NAME, input=inputs, **kw)
    return np.array([d.embedding for d in r.data]), r


@pytest.fixture(scope="module")
def llama_ref():
    llama_cpp = pytest.importorskip("llama_cpp")
    refs = {}

    def get(pool):
        if pool not in refs:
            pt = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                  "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}[pool]
            refs[pool] = llama_cpp.Llama(model_path(), embedding=True,
                                         pooling_type=pt, n_ctx=2048,
                                         n_threads=2, verbose=False)
        return refs[pool]
    return get


@pytest.fixture(scope="module")
def last_server(sluice_server):
    return sluice_server(["-c", "2048", "--pooling", "last"])


@pytest.mark.parametrize("pool", ["mean", "last"])
def test_matches_llama_cpp(server, last_server, llama_ref, pool):
    srv = server if pool == "mean" else last_server
    ref = llama_ref(pool)
    want = np.array([ref.embed(t, normalize=True) for t in TEXTS])
    got, r = vectors(srv, TEXTS)
    assert got.shape == want.shape
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = np.sum(got * want, axis=1)
    assert cos.min() >= MIN_COS, cos
    # and not by accident: each text is nearest its own reference
    assert (np.argmax(got @ want.T, axis=1) == np.arange(len(TEXTS))).all()
    assert r.usage.prompt_tokens == sum(len(ref.tokenize(t.encode()))
                                        for t in TEXTS)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))


def test_same_text_same_vector(server):
    """The second time, the prompt's blocks are in the prefix cache; the
    mean must still be over every token. The text is this test's own, so
    its first time is cold whatever ran before (mutant 52 pools only the
    uncached tokens of the second)."""
    text = "Only this test embeds these words. " * 12
    a, _ = vectors(server, [text])
    b, _ = vectors(server, [text])
    assert np.abs(a - b).max() < 1e-6


def test_chunked_prefill_same_vector(server, sluice_server):
    small = sluice_server(["-c", "2048", "--prefill-chunk", "16",
                           "--max-batched-tokens", "16"])
    a, _ = vectors(server, TEXTS)
    b, _ = vectors(small, TEXTS)
    assert np.sum(a * b, axis=1).min() > 0.99999


def test_encodings_and_ids(server):
    st, body = raw(server, {"model": MODEL_NAME, "input": TEXTS[:2],
                            "encoding_format": "float"})
    assert st == 200 and body["object"] == "list"
    f = np.array([d["embedding"] for d in body["data"]])
    st, body = raw(server, {"model": MODEL_NAME, "input": TEXTS[:2],
                            "encoding_format": "base64"})
    assert st == 200
    b = np.array([np.frombuffer(base64.b64decode(d["embedding"]),
                                dtype="<f4") for d in body["data"]])
    assert np.abs(f - b).max() < 1e-6
    # token ids: the text's own tokens give the text's vector
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/tokenize", body=json.dumps(
        {"content": TEXTS[0], "add_special": True}).encode(),
        headers={"Content-Type": "application/json"})
    ids = json.loads(c.getresponse().read())["tokens"]
    c.close()
    st, body = raw(server, {"model": MODEL_NAME, "input": [ids, TEXTS[0]]})
    assert st == 200
    v = np.array([d["embedding"] for d in body["data"]])
    assert np.abs(v[0] - v[1]).max() < 1e-6


def test_beside_generation(server):
    """32 inputs embedded while a greedy answer is generated: the answer is
    the one it gives alone, and the vectors are the ones they are alone."""
    c = oai(server)
    ask = dict(model=MODEL_NAME, temperature=0, max_tokens=40,
               messages=[{"role": "user", "content": "Name three colors."}])
    alone = c.chat.completions.create(**ask).choices[0].message.content
    inputs = [f"sentence number {i} about the sea" for i in range(32)]
    want, _ = vectors(server, inputs)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        gen = ex.submit(lambda: c.chat.completions.create(**ask))
        embs = [ex.submit(vectors, server, inputs[k:k + 8])
                for k in range(0, 32, 8)]
        got = np.concatenate([f.result()[0] for f in embs])
        assert gen.result().choices[0].message.content == alone
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": "x", "dimensions": 7}, "dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "word " * 3000}, "input"),
    ({"input": [[10 ** 9]]}, "input"),
])
def test_bad_requests(server, body, param):
    st, err = raw(server, dict(body, model=MODEL_NAME))
    assert st == 400, err
    assert err["error"]["param"] == param
