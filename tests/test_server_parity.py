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
    assert serve_args("--embeddings").embeddings and not serve_args().embeddings
    assert serve_args("--temp", "0.3").temp == 0.3 and serve_args().temp is None


def test_serves_help_shows_llama_servers_default_temperature(capsys):
    from pyllamaspec.server import defaults

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"greedy (default: {defaults.TEMPERATURE}," in help_text
    assert defaults.TEMPERATURE == 0.8    # llama-server's (upstream's common_params_sampling.temp)


@pytest.mark.parametrize("flags, words", [
    (["-nocb"], "continuous batching cannot be switched off"),
    (["--cache-reuse", "256"], "--cache-reuse 256"),
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


def test_a_request_without_temperature_samples_at_the_servers_default(server):
    """As llama-server: no temperature is the server's default (0.8 unless --temp says otherwise), not greedy."""
    body = {"prompt": [1, 5, 9, 2], "max_tokens": 5, "return_tokens": True, "seed": 11}
    post = lambda extra: httpx.post(server + "/v1/completions", json={**body, **extra}, timeout=60).json()
    unset = post({})["choices"][0]["tokens"]
    assert unset == post({"temperature": 0.8})["choices"][0]["tokens"]
    others = {tuple(post({"temperature": 0.8, "seed": s})["choices"][0]["tokens"]) for s in (12, 13, 14)}
    assert others - {tuple(unset)}     # it samples: other seeds, other tokens
    assert httpx.get(server + "/props", timeout=30).json()["default_generation_settings"]["params"][
        "temperature"] == 0.8


def test_the_servers_temperature_is_what_temp_sets(dense_pair):
    from pyllamaspec.server.app import Loaded, create_app

    def load():
        target = Model(dense_pair[0])
        return Loaded(target, None, SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)))

    with InProcessServer(create_app(load, chat_template="chatml", temperature=0.0)) as s:
        deadline = time.monotonic() + 60
        while httpx.get(s.url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        body = {"prompt": [1, 5, 9, 2], "max_tokens": 6, "return_tokens": True}
        greedy = httpx.post(s.url + "/v1/completions", json={**body, "temperature": 0}, timeout=60).json()
        assert all(httpx.post(s.url + "/v1/completions", json={**body, "seed": seed}, timeout=60).json()[
            "choices"][0]["tokens"] == greedy["choices"][0]["tokens"] for seed in (1, 2))
        assert httpx.get(s.url + "/props", timeout=30).json()["default_generation_settings"]["params"][
            "temperature"] == 0.0


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
