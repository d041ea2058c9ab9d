"""`pyllamaspec serve`: a real server on 127.0.0.1 (a subprocess, or uvicorn in a thread where a test needs to
hold the model load or the batch), driven by the official openai client (sync and async) and raw HTTP.

Greedy output through the server must be each prompt's own plain output (the near-tie rule of the session
tests); errors are OpenAI-shaped 4xx, never 500; cancelled streams free their slots; /metrics adds up to what
the responses report; shutdown stops admitting, ends what runs and closes the session.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed (pip install .[server])")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pyllamaspec import Model, SessionConfig, SpecSession  # noqa: E402

from helpers import MIN_NEAR_TIE, NEAR_TIE  # noqa: E402
from serving import InProcessServer, ServerProcess  # noqa: E402

PROMPTS = [[1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7], [4, 4, 8, 15, 16, 23, 42], [7, 3, 3, 7, 1, 2], [9, 8, 7, 6, 5, 4, 3, 2, 1],
           [2, 4, 6, 8, 10, 12, 14], [11, 13, 17, 19, 23], [30, 31, 32, 33], [100, 200, 300, 400, 500]]
N_PREDICT = 40
MODEL = "target-qwen3"       # the served name: the target file's name without .gguf
TIMEOUT = 60.0
SERVE = ["--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-adaptive", "off", "-np", "4", "-c", "8192",
         "--queue-size", "16"]


@pytest.fixture(scope="module")
def models(dense_pair):
    return dense_pair


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    target, drafter = models
    s = ServerProcess(["-m", str(target), "-md", str(drafter), *SERVE], tmp_path_factory.mktemp("server"))
    try:
        s.wait_ready()
        yield s
        rc = s.stop()
        assert rc == 0, s.stderr
        assert "session closed" in s.stderr and "Traceback" not in s.stderr, s.stderr
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(10)


@pytest.fixture(scope="module")
def refs(models):
    """Each prompt's own plain greedy output (no drafter, one stream) with the target's margins."""
    target_path, _ = models
    out = {}
    with Model(target_path) as target:
        with SpecSession(target, None, SessionConfig(adaptive=False, spec_types=[], margins=True, n_ctx=1024)) as s:
            def ref(tokens, n=N_PREDICT):
                key = (tuple(tokens), n)
                if key not in out:
                    out[key] = s.generate(list(tokens), n)
                return out[key]

            def chat_tokens(messages):
                return target.tokenize(target.apply_chat_template(messages, template="chatml"))

            yield ref, chat_tokens


def client(server, timeout: float = TIMEOUT) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=timeout)


def aclient(server) -> "openai.AsyncOpenAI":
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)


def assert_near(tokens, ref, near_tie=NEAR_TIE):
    for i, (a, b) in enumerate(zip(tokens, ref.tokens)):
        if a != b:
            assert ref.margins[i] < near_tie, f"divergence at {i} where the margin is {ref.margins[i]:.4g}"
            return
    assert len(tokens) == len(ref.tokens)


def extra(obj, name):
    return obj.model_dump()[name]


def scrape(url: str) -> dict[str, float]:
    """/metrics as {'name{label="v"}': value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def wait_idle(url: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if m["pyllamaspec:requests_processing"] == 0 and m["pyllamaspec:requests_deferred"] == 0:
            return m
        assert time.monotonic() < deadline, f"slots still busy: {m['pyllamaspec:requests_processing']}"
        time.sleep(0.05)


# -- exactness ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_completions_greedy_equal_generate(server, refs, stream):
    ref, _ = refs
    c = client(server)
    for prompt in PROMPTS[:3]:
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, temperature=0, stream=stream,
                                 extra_body={"return_tokens": True})
        if stream:
            chunks = list(r)
            tokens = [t for ch in chunks for t in extra(ch.choices[0], "tokens")]
            text = "".join(ch.choices[0].text for ch in chunks)
            finish = [ch.choices[0].finish_reason for ch in chunks]
            assert finish[-1] == "length" and not any(finish[:-1])
        else:
            tokens, text = extra(r.choices[0], "tokens"), r.choices[0].text
            assert r.choices[0].finish_reason == "length"
            assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == N_PREDICT
            t = extra(r, "timings")
            assert t["predicted_n"] == N_PREDICT and t["prompt_n"] + t["cache_n"] == len(prompt) and t["prompt_n"] >= 1
            assert 0 <= t["draft_n_accepted"] <= t["draft_n"] and t["draft_n"] > 0
        expected = ref(prompt)
        assert_near(tokens, expected)
        if tokens == expected.tokens:
            assert text == expected.text


def test_timings_count_what_a_slots_memory_already_held(server, refs):
    """As llama-server: a prompt that starts with one a slot finished is processed only from where it differs;
    timings.prompt_n counts what was processed, cache_n (and usage's cached_tokens) what the slot held."""
    ref, _ = refs
    c = client(server)
    first = PROMPTS[4]
    r1 = c.completions.create(model=MODEL, prompt=first, max_tokens=8, temperature=0,
                              extra_body={"return_tokens": True})
    follow = first + extra(r1.choices[0], "tokens") + [5, 6]
    r2 = c.completions.create(model=MODEL, prompt=follow, max_tokens=8, temperature=0,
                              extra_body={"return_tokens": True})
    t = extra(r2, "timings")
    assert t["prompt_n"] + t["cache_n"] == len(follow) == r2.usage.prompt_tokens
    assert t["cache_n"] >= len(first) and t["prompt_n"] >= 1
    assert r2.usage.prompt_tokens_details.cached_tokens == t["cache_n"]
    assert_near(extra(r2.choices[0], "tokens"), ref(follow, 8))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_equal_generate(server, refs, stream):
    ref, chat_tokens = refs
    c = client(server)
    for content in ["hello world", "write a haiku about numbers"]:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
        r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=N_PREDICT, temperature=0,
                                      stream=stream, stream_options={"include_usage": True} if stream else None,
                                      # llama-server's extensions
                                      extra_body={"return_tokens": True,
                                                  "chat_template_kwargs": {"enable_thinking": False}})
        if stream:
            chunks = list(r)
            assert chunks[0].choices[0].delta.role == "assistant"
            assert len({ch.id for ch in chunks}) == 1
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == N_PREDICT
            body = [ch for ch in chunks if ch.choices]
            assert body[-1].choices[0].finish_reason == "length"
            assert not any(ch.choices[0].finish_reason for ch in body[:-1])
            text = "".join(ch.choices[0].delta.content or "" for ch in body)
            tokens = [t for ch in body for t in extra(ch.choices[0], "tokens")]
        else:
            text, tokens = r.choices[0].message.content, extra(r.choices[0], "tokens")
            assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
        expected = ref(chat_tokens(messages))
        assert_near(tokens, expected)
        if tokens == expected.tokens:
            assert text == expected.text


def test_sse_wire_format(server):
    """Every event is one `data:` line of JSON, then `data: [DONE]`; usage only when asked for."""
    for include_usage in (False, True):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = r.text.split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
        assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        if include_usage:
            assert all("usage" in c for c in chunks)
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
            assert all(c["usage"] is None for c in chunks[:-1])
            chunks = chunks[:-1]
        else:
            assert all("usage" not in c for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        t = chunks[-1]["timings"]
        assert t["predicted_n"] == 12 and t["draft_n"] >= t["draft_n_accepted"] >= 0


def test_concurrent_clients_each_get_their_solo_output(server, refs):
    ref, _ = refs

    async def one(c, prompt, stream):
        if stream:
            tokens = []
            async for ch in await c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, stream=True,
                                                       temperature=0, extra_body={"return_tokens": True}):
                tokens += extra(ch.choices[0], "tokens")
            return tokens
        r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, temperature=0,
                                       extra_body={"return_tokens": True})
        return extra(r.choices[0], "tokens")

    async def main():
        async with aclient(server) as c:
            return await asyncio.gather(*(one(c, p, i % 2 == 0) for i, p in enumerate(PROMPTS)))

    outputs = asyncio.run(main())
    assert len(PROMPTS) == 8
    for prompt, tokens in zip(PROMPTS, outputs):
        assert_near(tokens, ref(prompt))


def test_per_request_draft_settings_keep_greedy_output(server, refs):
    """speculative.n_max / n_min (nested or dotted, as llama-server takes them) change the drafting, not the
    output; n_max 0 drafts nothing."""
    ref, _ = refs
    c = client(server)
    prompt = PROMPTS[1]
    seen = []
    for body in ({"speculative": {"n_max": 0}}, {"speculative.n_max": 1}, {"speculative": {"n_max": 4, "n_min": 2}},
                 {"speculative.n_max": 2, "speculative.p_min": 0.0}, {"speculative": {"n_max": 16}}):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, temperature=0,
                                 extra_body={"return_tokens": True, **body})
        t = extra(r, "timings")
        seen.append(t["draft_n"])
        assert_near(extra(r.choices[0], "tokens"), ref(prompt))
    assert seen[0] == 0 and all(n > 0 for n in seen[1:])


def test_sampling_fields_and_seed(server):
    c = client(server)
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=1.0, top_p=1.0,
              extra_body={"top_k": 16, "min_p": 0.0})
    a = c.completions.create(seed=7, **kw).choices[0].text
    b = c.completions.create(seed=7, **kw).choices[0].text
    others = {c.completions.create(seed=s, **kw).choices[0].text for s in (8, 9, 10)}
    assert a == b                      # same seed, same sample
    assert others - {a}                # another seed, another sample


# -- n choices ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_each_the_greedy_output_with_and_without_drafting(server, refs, stream):
    """n=3: three sequences of their own, named by index; greedy, each is the prompt's plain output (drafting on or
    off), and usage counts the prompt once and every choice's tokens."""
    ref, _ = refs
    c = client(server)
    prompt = PROMPTS[2]
    for draft in ({}, {"speculative.n_max": 0}):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, temperature=0, n=3, stream=stream,
                                 stream_options={"include_usage": True} if stream else None,
                                 extra_body={"return_tokens": True, **draft})
        tokens = {0: [], 1: [], 2: []}
        if stream:
            chunks = list(r)
            usage = chunks[-1].usage
            assert chunks[-1].choices == []
            finishes = [(ch.choices[0].index, ch.choices[0].finish_reason) for ch in chunks[:-1]
                        if ch.choices[0].finish_reason]
            assert sorted(finishes) == [(0, "length"), (1, "length"), (2, "length")]
            for ch in chunks[:-1]:
                assert len(ch.choices) == 1
                tokens[ch.choices[0].index] += extra(ch.choices[0], "tokens")
        else:
            assert [ch.index for ch in r.choices] == [0, 1, 2]
            assert all(ch.finish_reason == "length" for ch in r.choices)
            usage = r.usage
            tokens = {ch.index: extra(ch, "tokens") for ch in r.choices}
            assert extra(r, "timings")["predicted_n"] == 3 * N_PREDICT
        assert usage.prompt_tokens == len(prompt) and usage.completion_tokens == 3 * N_PREDICT
        assert usage.total_tokens == len(prompt) + 3 * N_PREDICT
        for i in range(3):
            assert_near(tokens[i], ref(prompt))


def test_n_choices_process_their_prompt_once(server, refs):
    """The first choice processes the prompt; the others copy its memory (timings count their prompt as cached),
    and each is still the prompt's plain output."""
    ref, _ = refs
    prompt = list(range(60, 90))  # no slot holds any of it
    r = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, n=3,
                                          extra_body={"return_tokens": True})
    t = extra(r, "timings")
    assert t["prompt_n"] == len(prompt) + 2  # the whole prompt once, and each other choice's last token
    assert t["cache_n"] == 2 * (len(prompt) - 1)
    for ch in r.choices:
        assert_near(extra(ch, "tokens"), ref(prompt, 8))


def test_n_chat_choices_stream_with_their_index(server, refs):
    ref, chat_tokens = refs
    messages = [{"role": "user", "content": "count to five"}]
    chunks = list(client(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                         n=2, stream=True, extra_body={"return_tokens": True}))
    roles = [ch.choices[0].index for ch in chunks if ch.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]
    for i in range(2):
        mine = [ch.choices[0] for ch in chunks if ch.choices[0].index == i]
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]
        assert_near([t for c in mine for t in extra(c, "tokens")], ref(chat_tokens(messages), 12))
        text = "".join(c.delta.content or "" for c in mine)
        if [t for c in mine for t in extra(c, "tokens")] == ref(chat_tokens(messages), 12).tokens:
            assert text == ref(chat_tokens(messages), 12).text


def test_seeded_choices_sample_with_seed_plus_index(server):
    c = client(server)
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=1.0, top_p=1.0)
    r = c.completions.create(seed=7, n=3, **kw)
    texts = [ch.text for ch in r.choices]
    assert texts == [c.completions.create(seed=7 + i, **kw).choices[0].text for i in range(3)]
    assert len(set(texts)) > 1


def test_n_choices_carry_their_own_logprobs(server):
    r = client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=6, temperature=0, n=2, logprobs=True, top_logprobs=2,
                                               extra_body={"return_tokens": True})
    for ch in r.choices:
        assert len(ch.logprobs.content) == len(extra(ch, "tokens")) == 6
        assert all(len(e.top_logprobs) == 2 for e in ch.logprobs.content)


# -- stop strings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_token_boundaries(server, refs, models, stream):
    ref, _ = refs
    prompt = PROMPTS[0]
    expected = ref(prompt)
    with Model(models[0]) as target:
        pieces = [target.token_bytes(t).decode() for t in expected.tokens]
    # a stop string made of the end of one token and the start of the next
    i = next(i for i in range(5, len(pieces) - 1) if pieces[i] and pieces[i + 1])
    stop = pieces[i][-1] + pieces[i + 1][0]
    full = "".join(pieces)
    cut = full[:full.find(stop)]
    c = client(server)
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=N_PREDICT, temperature=0, stream=stream,
                             stop=["never-there", stop])
    if stream:
        chunks = list(r)
        text = "".join(ch.choices[0].text for ch in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage.completion_tokens < N_PREDICT
    assert text == cut and finish == "stop"
    assert stop not in text


# -- errors ------------------------------------------------------------------------------------------


def assert_openai_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["code"] == code
    return err


def test_bad_requests_get_openai_shaped_4xx(server):
    url = server.url
    chat = url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]

    def post(path, content):
        return httpx.post(path, content=content if isinstance(content, (str, bytes)) else json.dumps(content),
                          headers={"content-type": "application/json"}, timeout=TIMEOUT)

    assert_openai_error(post(chat, {"model": "gpt-4o", "messages": msgs}), 404, "model", "model_not_found")
    assert_openai_error(post(chat, {"messages": msgs, "max_tokens": -1}), 400, "max_tokens")
    assert_openai_error(post(chat, '{"messages": [{"role": "user", "content": "hi"}'), 400)
    assert_openai_error(post(chat, b"\xff\xfe"), 400)
    assert_openai_error(post(chat, "[1, 2]"), 400)
    assert_openai_error(post(chat, {"messages": "hi"}), 400, "messages")
    assert_openai_error(post(chat, {"messages": []}), 400, "messages")
    assert_openai_error(post(chat, {"messages": [{"role": "robot", "content": "x"}]}), 400, "messages[0].role")
    assert_openai_error(post(chat, {"messages": msgs, "temperature": "hot"}), 400, "temperature")
    assert_openai_error(post(chat, {"messages": msgs, "max_tokens": "10"}), 400, "max_tokens")
    assert_openai_error(post(chat, {"messages": msgs, "stream": "yes"}), 400, "stream")
    assert_openai_error(post(chat, {"messages": msgs, "top_p": 1.5}), 400, "top_p")
    err = assert_openai_error(post(chat, {"messages": msgs, "n": 5}), 400, "n")
    assert "n=5" in err["message"] and "4" in err["message"]      # more choices than the 4 slots
    assert_openai_error(post(chat, {"messages": msgs, "n": 0}), 400, "n")
    assert_openai_error(post(chat, {"messages": msgs, "speculative": {"n_max": 1000}}), 400, "speculative.n_max")
    assert_openai_error(post(chat, {"messages": msgs, "speculative.n_min": -1}), 400, "speculative.n_min")
    assert_openai_error(post(chat, {"messages": msgs, "stop": 3}), 400, "stop")
    comp = url + "/v1/completions"
    assert_openai_error(post(comp, {"prompt": [1, 2, 100_000]}), 400, "prompt")
    assert_openai_error(post(comp, {"prompt": ["a", "b"]}), 400, "prompt")
    assert_openai_error(post(comp, {"prompt": ""}), 400, "prompt")
    assert_openai_error(post(comp, {}), 400, "prompt")
    # over the context (8192 shared by 4 slots: 2048 each)
    err = assert_openai_error(post(comp, {"prompt": [1 + i % 400 for i in range(2100)], "max_tokens": 4}), 400,
                              "prompt", "context_length_exceeded")
    assert "2100" in err["message"]
    long_chat = [{"role": "user", "content": " ".join(str(i) for i in range(3000))}]
    assert_openai_error(post(chat, {"messages": long_chat}), 400, "messages", "context_length_exceeded")
    assert_openai_error(post(url + "/detokenize", {"tokens": [1, 99999]}), 400, "tokens")
    assert_openai_error(post(url + "/tokenize", {"content": 5}), 400, "content")
    r = httpx.get(url + "/v1/nothing-here", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.get(chat, timeout=TIMEOUT).status_code == 405

    # the openai client maps them to its exceptions
    c = client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=[1] * 2100)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=-5)
    # and the server still serves
    assert c.completions.create(model=MODEL, prompt="ok", max_tokens=3).usage.completion_tokens == 3
    wait_idle(url)


def test_models_tokenize_detokenize(server, models):
    c = client(server)
    listed = c.models.list().data
    assert [m.id for m in listed] == [MODEL]
    with Model(models[0]) as target:
        expected = target.tokenize("hello world", add_special=False)
        with_bos = target.tokenize("hello world", add_special=True)
        text = target.detokenize(expected)   # the synthetic vocabulary does not spell "hello world" back
    r = httpx.post(server.url + "/tokenize", json={"content": "hello world"}, timeout=TIMEOUT).json()
    assert r["tokens"] == expected
    r = httpx.post(server.url + "/tokenize", json={"content": "hello world", "add_special": True}, timeout=TIMEOUT)
    assert r.json()["tokens"] == with_bos
    r = httpx.post(server.url + "/tokenize", json={"content": "hello world", "with_pieces": True}, timeout=TIMEOUT)
    assert [p["id"] for p in r.json()["tokens"]] == expected
    assert "".join(p["piece"] for p in r.json()["tokens"]) == text
    r = httpx.post(server.url + "/detokenize", json={"tokens": expected}, timeout=TIMEOUT).json()
    assert r["content"] == text


# -- cancellation, metrics, load ---------------------------------------------------------------------


def test_cancelled_streams_free_their_slots(server):
    before = scrape(server.url)
    c = client(server)
    streams = []
    for p in PROMPTS[:4]:   # every slot, each asked for far more than the test waits for
        s = c.completions.create(model=MODEL, prompt=p, max_tokens=100_000, stream=True)
        next(iter(s))
        streams.append(s)
    assert scrape(server.url)["pyllamaspec:requests_processing"] == 4
    for s in streams:
        s.close()   # the client goes away mid-stream
    after = wait_idle(server.url)
    assert delta(after, before, 'pyllamaspec:requests_finished_total{finish_reason="cancelled"}') == 4
    # the slots are free for the next requests
    r = c.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=8)
    assert r.choices[0].finish_reason == "length"
    # a request whose client disconnects before its response (not streamed) is cancelled too
    with pytest.raises(openai.APITimeoutError):
        client(server, timeout=0.3).completions.create(model=MODEL, prompt=PROMPTS[6], max_tokens=100_000)
    after2 = wait_idle(server.url)
    assert delta(after2, after, 'pyllamaspec:requests_finished_total{finish_reason="cancelled"}') == 1


def test_metrics_add_up_to_the_responses(server):
    c = client(server)
    before = scrape(server.url)
    usage, timings, reasons = [], [], []
    for i, p in enumerate(PROMPTS):
        kw = dict(model=MODEL, max_tokens=10 + 3 * i, temperature=0)
        if i % 3 == 2:
            kw["stop"] = ["1", "2"]
        if i % 2:
            r = c.completions.create(prompt=p, **kw)
            usage.append(r.usage.model_dump())
            timings.append(extra(r, "timings"))
            reasons.append(r.choices[0].finish_reason)
        else:
            chunks = list(c.completions.create(prompt=p, stream=True, stream_options={"include_usage": True}, **kw))
            usage.append(chunks[-1].usage.model_dump())
            timings.append(extra(chunks[-1], "timings"))
            reasons.append(chunks[-2].choices[0].finish_reason)
    after = wait_idle(server.url)
    d = lambda k: delta(after, before, "pyllamaspec:" + k)  # noqa: E731
    assert d("tokens_predicted_total") == sum(u["completion_tokens"] for u in usage)
    assert d("prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
    assert d("spec_decode_num_draft_tokens_total") == sum(t["draft_n"] for t in timings) > 0
    assert d("spec_decode_num_accepted_tokens_total") == sum(t["draft_n_accepted"] for t in timings)
    per_pos = sum(delta(after, before, k) for k in after
                  if k.startswith("pyllamaspec:spec_decode_num_accepted_tokens_per_pos_total"))
    assert per_pos == d("spec_decode_num_accepted_tokens_total")
    assert 0 < d("spec_decode_num_drafts_total") <= d("spec_decode_num_draft_tokens_total")
    assert d("time_to_first_token_seconds_count") == len(PROMPTS)
    assert d("n_decode_total") > 0 and d("prompt_seconds_total") > 0
    for reason in set(reasons):
        assert d(f'requests_finished_total{{finish_reason="{reason}"}}') == reasons.count(reason)
    assert "stop" in reasons and "length" in reasons


def test_bounded_load_ends_clean(server):
    """200 requests, 16 at a time (chat and text, streamed or not, some with stop strings, some abandoned by
    their clients): no errors, every slot free afterwards, and memory back within a margin."""
    rng = random.Random(1)

    def plan(n):
        out = []
        for _ in range(n):
            abandon = rng.random() < 0.1
            out.append(dict(chat=rng.random() < 0.5, stream=rng.random() < 0.5, n=rng.randint(4, 20),
                            prompt=rng.choice(PROMPTS), stop=["7"] if rng.random() < 0.2 and not abandon else None,
                            abandon=abandon))
        return out

    async def one(c, job):
        kw = dict(model=MODEL, max_tokens=job["n"], stop=job["stop"], stream=job["stream"])
        if job["chat"]:
            create = c.chat.completions.create
            kw["messages"] = [{"role": "user", "content": " ".join(map(str, job["prompt"]))}]
        else:
            create = c.completions.create
            kw["prompt"] = job["prompt"]
        if job["abandon"]:
            kw.update(stream=True, max_tokens=100_000)
        r = await create(**kw)
        if not kw["stream"]:
            return r.choices[0].finish_reason
        finish = None
        async for ch in r:
            if job["abandon"]:
                await r.close()
                return "abandoned"
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        return finish

    async def run(jobs):
        sem = asyncio.Semaphore(16)
        async with aclient(server) as c:
            async def guarded(job):
                async with sem:
                    return await one(c, job)
            return await asyncio.gather(*(guarded(j) for j in jobs), return_exceptions=True)

    asyncio.run(run(plan(40)))        # warm-up: buffers, caches, the allocator's pools
    wait_idle(server.url)
    base = server.rss_mib()
    before = scrape(server.url)
    jobs = plan(200)
    results = asyncio.run(run(jobs))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert all(r in ("stop", "length", "abandoned") for r in results)
    after = wait_idle(server.url)
    finished = sum(delta(after, before, k) for k in after if k.startswith("pyllamaspec:requests_finished_total"))
    assert finished == 200
    assert delta(after, before, 'pyllamaspec:requests_finished_total{finish_reason="cancelled"}') == \
        sum(j["abandon"] for j in jobs)
    assert delta(after, before, 'pyllamaspec:requests_finished_total{finish_reason="error"}') == 0
    rss = server.rss_mib()
    assert rss < base + max(16.0, 0.1 * base), f"RSS {base:.0f} MiB -> {rss:.0f} MiB"


# -- loading, overflow, shutdown (uvicorn in a thread, where the test holds the load or the batch) ------


class GatedSession:
    """A session whose steps wait for the test to open the gate."""

    def __init__(self, session, gate: threading.Event) -> None:
        self._session = session
        self._gate = gate

    def step_sequences(self):
        assert self._gate.wait(TIMEOUT)
        return self._session.step_sequences()

    def __getattr__(self, name):
        return getattr(self._session, name)


def _loader(models, n_parallel, gate=None, load_gate=None):
    from pyllamaspec.server.app import Loaded

    def load():
        if load_gate is not None:
            assert load_gate.wait(TIMEOUT)
        target, drafter = Model(models[0]), Model(models[1])
        session = SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False,
                                                             n_ctx=4096, n_parallel=n_parallel))
        return Loaded(target, drafter, GatedSession(session, gate) if gate is not None else session)
    return load


def test_health_is_503_while_loading_then_200(models):
    from pyllamaspec.server.app import create_app

    load_gate = threading.Event()
    app = create_app(_loader(models, 1, load_gate=load_gate))
    with InProcessServer(app) as s:
        try:
            r = httpx.get(s.url + "/health", timeout=TIMEOUT)
            assert r.status_code == 503
            assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi"}, timeout=TIMEOUT)
            assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
            assert httpx.get(s.url + "/metrics", timeout=TIMEOUT).status_code == 200
        finally:
            load_gate.set()
        deadline = time.monotonic() + TIMEOUT
        while (r := httpx.get(s.url + "/health", timeout=TIMEOUT)).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert app.state.server.status == "closed"


def test_api_key(models):
    from pyllamaspec.server.app import create_app

    with InProcessServer(create_app(_loader(models, 1), api_key="sekret")) as s:
        s.wait_ready()   # /health needs no key
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=TIMEOUT)
        assert_openai_error(r, 401, None, "invalid_api_key")
        assert httpx.get(s.url + "/metrics", timeout=TIMEOUT).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).completions.create(
                model=MODEL, prompt="hi", max_tokens=2)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0, timeout=TIMEOUT)
        assert [m.id for m in c.models.list().data] == [MODEL]
        assert c.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_full_queue_answers_429_with_retry_after(models):
    from pyllamaspec.server.app import create_app

    gate = threading.Event()
    app = create_app(_loader(models, 1, gate=gate), queue_size=1)
    with InProcessServer(app) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
        try:
            s.wait_ready()
            first = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, stream=True)  # holds the slot
            waiting = {}
            t = threading.Thread(target=lambda: waiting.setdefault(
                "r", httpx.post(s.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 8},
                                timeout=TIMEOUT)))
            t.start()
            deadline = time.monotonic() + TIMEOUT
            while scrape(s.url)["pyllamaspec:requests_deferred"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPTS[2]}, timeout=TIMEOUT)
            err = assert_openai_error(r, 429, None, "rate_limit_exceeded")
            assert err["type"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
            with pytest.raises(openai.RateLimitError):
                c.completions.create(model=MODEL, prompt=PROMPTS[2])
            assert scrape(s.url)['pyllamaspec:requests_rejected_total{reason="queue_full"}'] == 2
        finally:
            gate.set()
        assert sum(len(ch.choices[0].text) >= 0 for ch in first) > 0
        t.join(TIMEOUT)
        assert waiting["r"].status_code == 200 and waiting["r"].json()["usage"]["completion_tokens"] == 8


def test_shutdown_while_generating_ends_streams_and_closes_the_session(models):
    from pyllamaspec.server.app import create_app

    gate = threading.Event()
    app = create_app(_loader(models, 2, gate=gate))
    state = app.state.server
    with InProcessServer(app) as s:
        s.wait_ready()
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
        stream = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=100_000, stream=True)
        it = iter(stream)
        gate.set()
        next(it)
        state.loop.call_soon_threadsafe(state.begin_shutdown)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in it:
                pass
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi"}, timeout=TIMEOUT)
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        session = state.loaded.session
    assert state.status == "closed" and session.closed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_server_cleanly(models, tmp_path, sig):
    target, drafter = models
    s = ServerProcess(["-m", str(target), "-md", str(drafter), *SERVE], tmp_path)
    try:
        s.wait_ready()
        stream = client(s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                                   max_tokens=100_000, stream=True)
        it = iter(stream)
        next(it)
        s.proc.send_signal(sig)
        with pytest.raises(openai.APIError):   # the stream ends with the server's 503 error event
            for _ in it:
                pass
        s.proc.wait(30)
        assert s.proc.returncode == 0, s.stderr
        assert "session closed" in s.stderr and "Traceback" not in s.stderr, s.stderr
    finally:
        s.stop(signal.SIGKILL)


def test_a_model_that_cannot_load_exits_with_a_message(tmp_path):
    s = ServerProcess(["-m", str(tmp_path / "missing.gguf"), "--spec-type", "none"], tmp_path)
    try:
        s.proc.wait(TIMEOUT)
        assert s.proc.returncode == 2
        assert "missing.gguf" in s.stderr and "Traceback" not in s.stderr, s.stderr
    finally:
        s.stop(signal.SIGKILL)


def test_stop_matcher_holds_back_only_what_could_become_a_stop():
    from pyllamaspec.server.engine import StopMatcher

    m = StopMatcher(("</s>", "STOP"))
    assert m.feed("hello <") == ("hello ", False)
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)
    assert m.feed(" ST") == (" ", False)
    assert m.feed("OP and more") == ("", True)
    m = StopMatcher(("ab", "b"))
    assert m.feed("xab") == ("x", True)        # the earliest stop wins
    m = StopMatcher(())
    assert m.feed("anything") == ("anything", False)
    m = StopMatcher(("aab",))
    assert m.feed("aaa") == ("a", False)       # "aa" may still become "aab"
    assert m.feed("b") == ("", True)         # "aaab": the stop began after the "a" already sent
    m = StopMatcher(("xyz",))
    assert m.feed("x") == ("", False) and m.flush() == "x"


# -- the real pair -----------------------------------------------------------------------------------


@pytest.mark.realmodel
def test_real_pair_served_greedy_equals_generate(real_pair, tmp_path):
    target_path, drafter_path = real_pair
    s = ServerProcess(["-m", str(target_path), "-md", str(drafter_path), "--spec-type", "draft-simple",
                       "--spec-draft-n-max", "8", "-np", "2", "-c", "2048"], tmp_path)
    try:
        s.wait_ready(timeout=300)
        messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        c = client(s)
        r = c.chat.completions.create(model=Path(target_path).stem, messages=messages, max_tokens=48, temperature=0,
                                      extra_body={"return_tokens": True})
        tokens = extra(r.choices[0], "tokens")

        async def streamed():
            async with aclient(s) as ac:
                out = []
                async for ch in await ac.chat.completions.create(model=Path(target_path).stem, messages=messages,
                                                                 max_tokens=48, temperature=0, stream=True,
                                                                 extra_body={"return_tokens": True}):
                    if ch.choices:
                        out += extra(ch.choices[0], "tokens") or []
                return out

        streamed_tokens = asyncio.run(streamed())
        assert s.stop() == 0, s.stderr
    finally:
        s.stop(signal.SIGKILL)
    with Model(target_path) as target:
        prompt = target.tokenize(target.apply_chat_template(messages))
        with SpecSession(target, None, SessionConfig(spec_types=[], margins=True, n_ctx=1024)) as ref_session:
            ref = ref_session.generate(prompt, 48)
    assert r.usage.prompt_tokens == len(prompt)
    # the real pair's near-tie: its batch-shape noise on x86 CPU kernels (see test_real_models)
    assert_near(tokens, ref, MIN_NEAR_TIE)
    assert_near(streamed_tokens, ref, MIN_NEAR_TIE)
    assert extra(r, "timings")["draft_n"] > 0


def test_chat_template_kwargs_switch_reasoning_per_request(models):
    from pyllamaspec.server.app import create_app

    from helpers import QWEN3_STYLE

    app = create_app(_loader(models, 1), chat_template=QWEN3_STYLE, enable_thinking=None)
    with InProcessServer(app) as s:
        s.wait_ready()

        def prompt_tokens(extra: dict) -> int:
            r = httpx.post(s.url + "/v1/chat/completions", timeout=TIMEOUT, json={
                "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1, **extra})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        default = prompt_tokens({})
        off = prompt_tokens({"chat_template_kwargs": {"enable_thinking": False}})
        assert off > default == prompt_tokens({"chat_template_kwargs": {"enable_thinking": True}})
        r = httpx.post(s.url + "/v1/chat/completions", timeout=TIMEOUT, json={
            "messages": [{"role": "user", "content": "hello"}], "chat_template_kwargs": {"tools_mode": 1}})
        err = assert_openai_error(r, 400, "chat_template_kwargs.tools_mode", None)
        assert "tools_mode" in err["message"]


# -- fields beyond the declared ones ------------------------------------------------------------------------------

WEB_UI_FIELDS = {  # what llama.cpp's web UI and other llama-server clients send, at the values that change nothing
    "cache_prompt": True, "timings_per_token": False, "dynatemp_exponent": 1.0, "xtc_threshold": 0.1,
    "typ_p": 1.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n"],
    "mirostat_tau": 5.0, "mirostat_eta": 0.1, "min_keep": 0, "n_keep": 0, "n_discard": 0, "id_slot": -1,
    "t_max_predict_ms": -1, "post_sampling_probs": False, "reasoning_budget": -1, "lora": [],
    "user": "u-1", "metadata": {"run": "a"}, "store": False, "best_of": 1, "add_generation_prompt": True,
    "reasoning_format": "none",
}


def test_other_llama_server_and_openai_fields_at_neutral_values_change_nothing(server):
    body = {"messages": [{"role": "user", "content": "count to five"}], "max_tokens": 8, "temperature": 0,
            "return_tokens": True}
    plain = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    same = httpx.post(server.url + "/v1/chat/completions", json={**body, **WEB_UI_FIELDS}, timeout=TIMEOUT)
    assert plain.status_code == 200 and same.status_code == 200, same.text
    assert same.json()["choices"][0]["tokens"] == plain.json()["choices"][0]["tokens"]


@pytest.mark.parametrize("field, value", [
    ("cache_prompt", False), ("id_slot", 2), ("t_max_predict_ms", 100), ("n_indent", 4), ("typ_p", 0.5),
    ("reasoning_format", "auto"), ("reasoning_budget", 0), ("lora", [{"id": 0, "scale": 1.0}]),
    ("functions", [{"name": "f", "parameters": {}}]), ("best_of", 2), ("post_sampling_probs", True),
    ("return_progress", True), ("response_fields", ["content"]), ("modalities", ["text", "audio"]),
    ("add_generation_prompt", False), ("prediction", {"type": "content", "content": "x"}), ("min_keep", 5),
])
def test_fields_this_server_cannot_honour_are_a_400_naming_them(server, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_a_field_no_request_has_is_a_400_naming_it_with_the_close_one(server):
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})]:
        r = httpx.post(server.url + path, json={**body, "max_tokens": 2, "temprature": 0}, timeout=TIMEOUT)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "temprature" and "'temperature'" in err["message"], err
    # the chat's own fields are not a text completion's
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "tools": []}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_n_predict_is_llama_servers_max_tokens(server):
    for body in [{"prompt": "one two", "n_predict": 3}, {"prompt": "one two", "n_predict": 3, "max_tokens": 9}]:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "one two", "n_predict": 0}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict", r.text


def _stream_chunks(url, body):
    chunks = []
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def test_timings_per_token_puts_the_timings_so_far_in_every_chunk(server):
    body = {"prompt": "one two three", "max_tokens": 12, "temperature": 0, "stream": True}
    with_timings = _stream_chunks(server.url + "/v1/completions", {**body, "timings_per_token": True})
    texts = [c for c in with_timings if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) >= 2 and all("timings" in c for c in texts)
    counts = [c["timings"]["predicted_n"] for c in texts]
    assert counts == sorted(counts) and counts[-1] <= 12 and counts[0] >= 1
    assert with_timings[-1]["timings"]["predicted_n"] == 12
    without = _stream_chunks(server.url + "/v1/completions", body)
    assert [("timings" in c) for c in without] == [False] * (len(without) - 1) + [True]


def test_ignore_unknown_fields_takes_them_and_logs_them(models, caplog):
    from pyllamaspec.server.app import create_app

    with InProcessServer(create_app(_loader(models, 1), ignore_unknown_fields=True)) as s:
        s.wait_ready()
        with caplog.at_level("WARNING", logger="pyllamaspec.server"):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "mfq_session_id": "x"},
                           timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert any("mfq_session_id" in m for m in caplog.messages)
        # llama-server's own fields are still judged by their values
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "cache_prompt": False},
                       timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_prompt"
