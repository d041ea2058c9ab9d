"""The server's bounds: a request-body limit (413), lone surrogates (400 naming the field), the right `param`
for an out-of-range sampling value, and prompt tokenization that a shutdown does not wait for (503)."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed (pip install .[server])")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_server import TIMEOUT, InProcessServer, _loader, assert_openai_error  # noqa: E402

from pyllamaspec.server.limits import lone_surrogate_field, parse_size  # noqa: E402


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while httpx.get(url + "/health", timeout=TIMEOUT).status_code != 200:
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.02)


def _post(url: str, content, **kw) -> "httpx.Response":
    body = content if isinstance(content, (bytes, str)) or callable(getattr(content, "__iter__", None)) \
        and not isinstance(content, dict) else json.dumps(content)
    return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=TIMEOUT, **kw)


@pytest.fixture(scope="module")
def small_limit_server(dense_pair):
    from pyllamaspec.server.app import create_app

    app = create_app(_loader(dense_pair, 2), max_body_bytes=1024)
    with InProcessServer(app) as s:
        _wait_ready(s.url)
        s.app = app
        yield s


def test_a_body_over_the_limit_is_413_in_openai_shape(small_limit_server):
    url = small_limit_server.url + "/v1/completions"
    r = _post(url, {"prompt": "x" * 2000, "max_tokens": 2})
    err = assert_openai_error(r, 413, None, "request_too_large")
    assert "1024 bytes" in err["message"] and "--max-body-size" in err["message"]

    def chunks():  # no Content-Length: counted while it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"y" * 200
        yield b'"}'

    err = assert_openai_error(_post(url, chunks()), 413, None, "request_too_large")
    # the server is still usable
    r = _post(url, {"prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_lone_surrogate_is_400_naming_the_field(small_limit_server):
    url = small_limit_server.url
    assert_openai_error(_post(url + "/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}'), 400, "prompt")
    err = assert_openai_error(_post(url + "/v1/chat/completions",
                                    b'{"messages": [{"role": "user", "content": "\\udc00"}]}'), 400,
                              "messages[0].content")
    assert "surrogate" in err["message"]
    assert_openai_error(_post(url + "/tokenize", b'{"content": "\\uD83D"}'), 400, "content")
    # an escaped pair is one character (an emoji), and fine
    r = _post(url + "/v1/completions", b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


def test_an_out_of_range_temperature_is_blamed_on_temperature(small_limit_server):
    url = small_limit_server.url + "/v1/completions"
    err = assert_openai_error(_post(url, {"prompt": "hi", "max_tokens": 2, "temperature": 1e308}), 400,
                              "temperature")
    assert "out of range" in err["message"]
    assert _post(url, {"prompt": "hi", "max_tokens": 2, "temperature": 0.5}).status_code == 200


def test_a_shutdown_does_not_wait_for_a_long_tokenization(dense_pair):
    from pyllamaspec.server.app import create_app

    app = create_app(_loader(dense_pair, 1))
    release = threading.Event()
    with InProcessServer(app) as s:
        _wait_ready(s.url)
        state = app.state.server
        real = state.completion_tokens

        def slow(req):  # stands in for tokenizing a very long prompt
            release.wait(TIMEOUT)
            return real(req)

        state.completion_tokens = slow
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _post(s.url + "/v1/completions",
                                                                         {"prompt": "hi", "max_tokens": 2})))
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        state.begin_shutdown()
        t.join(TIMEOUT)
        release.set()
        assert time.monotonic() - t0 < 5.0
        err = assert_openai_error(result["r"], 503)
        assert "shutting down" in err["message"]


def test_parse_size_and_the_serve_flag(tmp_path):
    import subprocess

    from clirun import CLI

    assert parse_size("8M") == 8 * 2**20 and parse_size("512k") == 512 * 1024 and parse_size("0") == 0
    assert parse_size("1GiB") == 2**30
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    r = subprocess.run([*CLI, "serve", "--max-body-size", "lots"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a size" in r.stderr and "Traceback" not in r.stderr


def test_lone_surrogate_field_names_nested_fields():
    assert lone_surrogate_field(b'{"a": [{"b": "ok"}, {"c": "\\ud800"}]}') == "a[1].c"
    assert lone_surrogate_field(b'{"a": "\\\\ud800"}') is None  # an escaped backslash, then text
    assert lone_surrogate_field(b'{"a": "\\ud83d\\ude00"}') is None
    assert lone_surrogate_field(b"not json \\ud800") is None


def test_a_request_the_shutdown_cancels_is_answered_503_not_a_bare_500():
    import asyncio

    from pyllamaspec.server.limits import RequestLimits

    started = None
    sent = []

    async def stuck_app(scope, receive, send):  # a handler still tokenizing when the server cancels its task
        await receive()
        await asyncio.sleep(3600)

    async def main():
        nonlocal started
        started = asyncio.Event()
        messages = [{"type": "http.request", "body": b'{"prompt": "x"}', "more_body": False}]

        async def receive():
            if messages:
                started.set()
                return messages.pop()
            await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        task = asyncio.ensure_future(RequestLimits(stuck_app)(scope, receive, send))
        await started.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        await task  # answered, not raised

    asyncio.run(main())
    assert sent[0]["status"] == 503
    body = json.loads(sent[1]["body"])
    assert body["error"]["type"] == "unavailable_error" and "shutting down" in body["error"]["message"]
