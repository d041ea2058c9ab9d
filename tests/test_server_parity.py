"""What a llama-server user expects of `pyllamaspec serve`: its common flags (accepted where they map, refused with
a message where they do not), /props and /slots in its shapes, -n as the default reply length, and the stop-string
limit named plainly."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed (pip install .[server])")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from pyllamaspec import Model, SessionConfig, SpecSession  # noqa: E402
from pyllamaspec.cli.app import build_parser, main  # noqa: E402

from serving import InProcessServer  # noqa: E402


def serve_args(*flags):
    return build_parser().parse_args(["serve", "-m", "t.gguf", *flags])


def test_llama_servers_common_flags_parse():
    a = serve_args("-cb", "--jinja", "-n", "64", "--slots", "--cache-reuse", "0")
    assert a.cont_batching and a.jinja and a.n_predict == 64 and a.slots and a.cache_reuse == 0
    assert a.n_ctx is None                    # -cb is not -c b
    assert serve_args("--n-predict", "7").n_predict == 7 and serve_args().n_predict == -1
    assert not serve_args("--no-slots").slots and not serve_args("-nocb").cont_batching


@pytest.mark.parametrize("flags, words", [
    (["-nocb"], "continuous batching cannot be switched off"),
    (["--cache-reuse", "256"], "--cache-reuse 256"),
    (["--embeddings"], "/v1/embeddings"),
    (["-n", "0"], "-n/--n-predict 0"),
])
def test_flags_that_do_not_map_are_refused_with_a_message(dense_pair, capsys, flags, words):
    assert main(["serve", "-m", str(dense_pair[0]), "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.fixture(scope="module")
def server(dense_pair):
    from pyllamaspec.server.app import Loaded, create_app

    def load():
        target, drafter = Model(dense_pair[0]), Model(dense_pair[1])
        session = SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False,
                                                             n_ctx=2048, n_parallel=2))
        return Loaded(target, drafter, session)

    with InProcessServer(create_app(load, n_predict=5, chat_template="chatml")) as s:
        deadline = time.monotonic() + 60
        while httpx.get(s.url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield s.url


def test_props_and_slots_answer_in_llama_servers_shape(server):
    props = httpx.get(server + "/props", timeout=30).json()
    assert props["total_slots"] == 2 and props["model_path"].endswith(".gguf")
    d = props["default_generation_settings"]
    assert d["n_ctx"] == 1024 and d["params"]["n_predict"] == 5 and d["is_processing"] is False
    assert props["modalities"] == {"vision": False, "audio": False}
    assert isinstance(props["chat_template_caps"], dict)
    slots = httpx.get(server + "/slots", timeout=30).json()
    assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)


def test_n_predict_is_the_default_reply_length_and_timings_count_the_reply(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": [1, 5, 9, 2], "temperature": 0}, timeout=60).json()
    assert r["usage"]["completion_tokens"] <= 5 and r["choices"][0]["finish_reason"] in ("length", "stop")
    assert r["timings"]["predicted_n"] == r["usage"]["completion_tokens"]
    if r["usage"]["completion_tokens"]:
        assert r["timings"]["predicted_ms"] > 0
    r = httpx.post(server + "/v1/completions", json={"prompt": [1, 5, 9, 2], "max_tokens": 9, "temperature": 0},
                   timeout=60).json()
    assert r["usage"]["completion_tokens"] == 9 or r["choices"][0]["finish_reason"] == "stop"


def test_too_many_stop_strings_are_named_as_such(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": [1, 2], "stop": [str(i) for i in range(17)]},
                   timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "stop" and "at most 16 stop strings, not 17" in err["message"]
    assert httpx.post(server + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1,
                                                         "stop": [str(i) for i in range(16)]},
                      timeout=30).status_code == 200


def test_slots_can_be_switched_off(dense_pair):
    from pyllamaspec.server.app import Loaded, create_app

    def load():
        target = Model(dense_pair[0])
        return Loaded(target, None, SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)))

    with InProcessServer(create_app(load, slots_endpoint=False, chat_template="chatml")) as s:
        deadline = time.monotonic() + 60
        while httpx.get(s.url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = httpx.get(s.url + "/slots", timeout=30)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
