"""Embeddings: an Embedder's pooled, unit-norm vectors (one per input, texts or token ids, the same from any thread),
bad input refused naming the input, and `serve --embeddings`' /v1/embeddings in OpenAI's shape (floats or base64)
beside the completions; without the flag the endpoint says how to get it."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest

from pyllamaspec import Embedder, Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError, ConfigTypeError, ContextOverflowError

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "the quick brown fox"]


def errors_in_threads(work, n: int) -> list[Exception]:
    """work(i) in n threads at once, each to its end: what they raised."""
    errors: list[Exception] = []

    def run(i):
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture(scope="module")
def target(dense_pair):
    with Model(dense_pair[0]) as m:
        yield m


@pytest.fixture(scope="module")
def embedder(target):
    with Embedder(target, 64) as e:
        yield e


def test_one_unit_vector_per_input_equal_for_equal_inputs(target, embedder):
    v = embedder.embed(TEXTS)
    assert v.shape == (3, target.info.n_embd) == (3, embedder.n_embd) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert np.allclose(v[0], v[2], atol=1e-6)            # the same text, the same vector
    assert not np.allclose(v[0], v[1], atol=1e-3)        # another text, another vector
    assert embedder.pooling == "mean" and embedder.n_ctx == 64   # a causal LM names no pooling: the mean
    # token ids are the text's tokens: the same vector; a single text is one row
    assert np.allclose(embedder.embed(target.tokenize(TEXTS[1]))[0], v[1], atol=1e-6)
    assert np.allclose(embedder.embed([target.tokenize(TEXTS[0]), target.tokenize(TEXTS[1])]), v[:2], atol=1e-6)
    assert np.allclose(embedder.embed(TEXTS[0]), v[:1], atol=1e-6)
    assert embedder.embed([]).shape == (0, embedder.n_embd)


def test_pooling_and_normalization_are_honoured(target, embedder):
    tokens = target.tokenize(TEXTS[1])
    with Embedder(target, 64, normalize=False) as raw, Embedder(target, 64, pooling="last") as last:
        r = raw.embed_tokens([tokens])[0]
        assert not np.isclose(np.linalg.norm(r), 1.0, atol=1e-3)
        assert np.allclose(r / np.linalg.norm(r), embedder.embed_tokens([tokens])[0], atol=1e-5)
        lv = last.embed_tokens([tokens])[0]
        assert last.pooling == "last" and np.isclose(np.linalg.norm(lv), 1.0, atol=1e-5)
        assert not np.allclose(lv, embedder.embed_tokens([tokens])[0], atol=1e-3)


def test_bad_input_is_refused_naming_the_input(target, embedder):
    good = target.tokenize(TEXTS[0])
    with pytest.raises(ConfigError, match="input 1 is empty"):
        embedder.embed_tokens([good, []])
    with pytest.raises(ContextOverflowError, match="input 0 has 65 tokens"):
        embedder.embed_tokens([[1] * 65])
    with pytest.raises(ConfigError, match="input 1: token id .* outside the vocabulary"):
        embedder.embed_tokens([good, [target.info.n_vocab]])
    with pytest.raises(ConfigTypeError):
        embedder.embed(b"bytes")
    with pytest.raises(ConfigTypeError):
        embedder.embed_tokens(["text"])
    for bad in (dict(n_ctx=0), dict(n_ctx=target.info.n_ctx_train + 1), dict(pooling="max"), dict(n_threads=-1)):
        with pytest.raises(ConfigError):
            Embedder(target, **{"n_ctx": 64, **bad})
    # and it still embeds
    assert embedder.embed_tokens([good]).shape == (1, embedder.n_embd)


def test_threads_share_an_embedder_and_each_gets_its_own_vectors(embedder):
    expected = {t: embedder.embed(t)[0] for t in TEXTS[:2]}
    got = []

    def work(i):
        for _ in range(3):
            text = TEXTS[i % 2]
            got.append((text, embedder.embed(text)[0]))

    assert errors_in_threads(work, 4) == [] and len(got) == 12
    assert all(np.allclose(v, expected[text], atol=1e-6) for text, v in got)


def test_an_embedder_outlives_its_models_close_and_refuses_after_its_own(dense_pair):
    m = Model(dense_pair[0])
    e = Embedder(m, 32)
    tokens = m.tokenize(TEXTS[0])
    m.close()
    assert e.embed_tokens([tokens]).shape == (1, e.n_embd)
    e.close()
    with pytest.raises(ConfigError, match="closed"):
        e.embed_tokens([tokens])


# -- the server --------------------------------------------------------------------------------------


pytest.importorskip("fastapi", reason="the server extra is not installed (pip install .[server])")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")


def _serve(dense_pair, embeddings: bool):
    from pyllamaspec.server.app import Loaded, create_app

    from serving import InProcessServer

    def load():
        target = Model(dense_pair[0])
        session = SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512, n_parallel=2))
        return Loaded(target, None, session, Embedder(target, 64) if embeddings else None)

    return InProcessServer(create_app(load, chat_template="chatml", alias="m"))


@pytest.fixture(scope="module")
def server(dense_pair):
    with _serve(dense_pair, True) as s:
        s.wait_ready()
        yield s.url


def test_v1_embeddings_in_openais_shape(server, target, embedder):
    c = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=60)
    r = c.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and all(d.object == "embedding" for d in r.data)
    v = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert np.allclose(v, embedder.embed(TEXTS), atol=1e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(target.tokenize(t)) for t in TEXTS)
    # token ids: one input, or several
    ids = [target.tokenize(t) for t in TEXTS[:2]]
    one = httpx.post(server + "/v1/embeddings", json={"input": ids[0]}, timeout=60).json()
    assert len(one["data"]) == 1 and np.allclose(one["data"][0]["embedding"], v[0], atol=1e-5)
    two = httpx.post(server + "/v1/embeddings", json={"input": ids}, timeout=60).json()
    assert np.allclose([d["embedding"] for d in two["data"]], v[:2], atol=1e-5)
    assert two["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1]) and two["object"] == "list"
    # base64: the little-endian float32 bytes
    b = httpx.post(server + "/v1/embeddings", json={"input": TEXTS[1], "encoding_format": "base64"},
                   timeout=60).json()
    assert np.allclose(np.frombuffer(base64.b64decode(b["data"][0]["embedding"]), dtype="<f4"), v[1], atol=1e-5)
    # completions are served beside them
    done = c.completions.create(model="m", prompt=[1, 5, 9], max_tokens=3, temperature=0)
    assert done.usage.completion_tokens == 3


@pytest.mark.parametrize("body, param", [
    ({"input": [[1, 2], []]}, "input[1]"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [1, 10**6]}, "input"),
    ({"input": [[1] * 65]}, "input[0]"),
    ({"input": 5}, "input"),
    ({}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 3}, "dimensions"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(server, body, param):
    r = httpx.post(server + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model_and_concurrent_requests(server, embedder):
    r = httpx.post(server + "/v1/embeddings", json={"input": "x", "model": "other"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    expected = embedder.embed(TEXTS[:2])
    results = []

    def one(i):
        r = httpx.post(server + "/v1/embeddings", json={"input": TEXTS[i % 2]}, timeout=120)
        results.append((i % 2, r.status_code, r.json()["data"][0]["embedding"]))

    assert errors_in_threads(one, 6) == [] and len(results) == 6
    assert all(status == 200 and np.allclose(v, expected[k], atol=1e-5) for k, status, v in results)


def test_without_embeddings_the_endpoint_says_how_to_get_them(dense_pair):
    with _serve(dense_pair, False) as s:
        s.wait_ready()
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "x"}, timeout=60)
        assert r.status_code == 501
        err = r.json()["error"]
        assert err["type"] == "not_supported_error" and "--embeddings" in err["message"]


def test_serve_embeddings_takes_inputs_of_up_to_ub_tokens(dense_pair, tmp_path, target, embedder):
    from serving import ServerProcess

    s = ServerProcess(["-m", str(dense_pair[0]), "--spec-type", "none", "--embeddings", "-ub", "32", "-np", "1",
                       "-c", "512"], tmp_path)
    try:
        s.wait_ready()
        tokens = target.tokenize(TEXTS[0])
        r = httpx.post(s.url + "/v1/embeddings", json={"input": [tokens]}, timeout=60).json()
        assert np.allclose(r["data"][0]["embedding"], embedder.embed_tokens([tokens])[0], atol=1e-5)
        r = httpx.post(s.url + "/v1/embeddings", json={"input": [[1] * 33]}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert "at most 32" in r.json()["error"]["message"]
        assert s.stop() == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(10)
