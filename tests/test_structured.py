"""Output shaped beyond temperature: grammars and JSON schemas, penalties, logit biases and log-probabilities go
through the verify's sampler, so a speculative run commits what a plain run commits; the server takes OpenAI's and
llama-server's fields for them and refuses what it cannot honour with a 400 naming the field."""

from __future__ import annotations

import json
import math
import re
import subprocess

import pytest
from clirun import CLI

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ConfigError, ParamError

from helpers import MIN_NEAR_TIE, NEAR_TIE, PROMPT, assert_equal_up_to_near_tie

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                         "languages": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                       "maxItems": 3}},
          "required": ["name", "age", "languages"], "additionalProperties": False}
QUESTION = [{"role": "user", "content": "Give a JSON record of a fictional programmer: name, age, languages."}]
N_JSON = 64


def run_submitted(session, prompt, n_predict, **sampling):
    """One sequence through the running batch (the server's path): its tokens and log-probabilities."""
    session.submit(prompt, n_predict, **sampling)
    tokens, logprobs, left = [], [], 1
    while left:
        events, left = session.step_sequences()
        for e in events:
            tokens += e.tokens
            logprobs += e.logprobs or []
    return tokens, logprobs


def check_schema(obj) -> None:
    assert set(obj) == {"name", "age", "languages"}
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int) and isinstance(obj["languages"], list)
    assert all(isinstance(x, str) for x in obj["languages"]) and len(obj["languages"]) <= 3


# -- the small models: bans, penalties, log-probabilities, refusals ------------------------------------------------


def test_a_banned_token_never_comes_and_speculation_still_equals_plain(dense) -> None:
    target, drafter, ref = dense
    banned = ref.tokens[0]
    cfg = dict(adaptive=False, margins=True, n_ctx=512, logit_bias={banned: float("-inf")})
    with SpecSession(target, None, SessionConfig(spec_types=[], **cfg)) as s:
        plain = s.generate(PROMPT, 32)
    assert banned not in plain.tokens and plain.tokens != ref.tokens[:32]
    with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, **cfg)) as s:
        spec = s.generate(PROMPT, 32)
    assert banned not in spec.tokens and spec.stats.n_drafted > 0
    assert_equal_up_to_near_tie(spec.tokens, plain)


def test_a_huge_presence_penalty_never_repeats_a_token_and_speculation_equals_plain(dense) -> None:
    target, drafter, _ref = dense
    cfg = dict(adaptive=False, margins=True, n_ctx=512, presence_penalty=1000.0, repeat_last_n=-1)
    with SpecSession(target, None, SessionConfig(spec_types=[], **cfg)) as s:
        plain = s.generate(PROMPT, 40)
    # the prompt counts: no generated token repeats one of it, nor another generated one
    assert len(set(plain.tokens)) == len(plain.tokens) and not set(plain.tokens) & set(PROMPT)
    with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, **cfg)) as s:
        spec = s.generate(PROMPT, 40)
    assert_equal_up_to_near_tie(spec.tokens, plain)


def test_logprobs_are_the_targets_and_equal_with_and_without_speculation(dense) -> None:
    target, drafter, _ref = dense
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512, margins=True)) as s:
        plain_tokens, plain_lp = run_submitted(s, PROMPT, 24, n_probs=3)
        ref = s.generate(PROMPT, 24)
    with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False,
                                                    n_ctx=512)) as s:
        spec_tokens, spec_lp = run_submitted(s, PROMPT, 24, n_probs=3)
        assert s.stats().n_accepted > 0
        no_lp, none = run_submitted(s, PROMPT, 4)
    assert none == [] and len(no_lp) == 4
    assert plain_tokens == ref.tokens and [r.token for r in plain_lp] == plain_tokens
    for r in plain_lp:
        assert len(r.top) == 3 and r.top[0][0] == r.token  # greedy: the chosen token is the most likely
        assert r.logprob == pytest.approx(r.top[0][1]) and r.top[0][1] >= r.top[1][1] >= r.top[2][1]
        assert sum(math.exp(lp) for _t, lp in r.top) <= 1.0 + 1e-5
    assert_equal_up_to_near_tie(spec_tokens, ref)
    for a, b in zip(spec_lp, plain_lp):
        if a.token != b.token:
            break
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [t for t, _ in a.top] == [t for t, _ in b.top] or a.top[1][1] - a.top[2][1] < NEAR_TIE


def test_sampling_settings_that_cannot_be_honoured_are_refused_naming_the_field(dense) -> None:
    target, _drafter, _ref = dense
    with pytest.raises(ParamError) as e:
        SessionConfig(grammar='root ::= "a"', json_schema={})
    assert e.value.param == "grammar"
    for kw, field in ((dict(repeat_penalty=0.0), "repeat_penalty"), (dict(logit_bias={"a": 1}), "logit_bias"),
                      (dict(logit_bias={1: float("nan")}), "logit_bias"), (dict(json_schema="{nope"), "json_schema"),
                      (dict(n_probs=21), "n_probs"), (dict(grammar=b"x"), "grammar")):
        with pytest.raises(ConfigError) as e:
            from pyllamaspec.config import SequenceParams
            SequenceParams(**kw)
        assert getattr(e.value, "param", None) == field, kw
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=256, n_parallel=2)) as s:
        for kw, field, words in ((dict(grammar='root ::= "a'), "grammar", "does not parse"),
                                 (dict(grammar='start ::= "a"'), "grammar", "'root'"),
                                 (dict(grammar='root ::= x'), "grammar", "undefined rule identifier 'x'"),
                                 (dict(grammar='root ::= root "a"'), "grammar", "left recursion"),
                                 (dict(json_schema={"type": "frobnicate"}), "json_schema", "frobnicate"),
                                 (dict(logit_bias={10 ** 6: 1.0}), "logit_bias", "outside the vocabulary")):
            with pytest.raises(ParamError) as e:
                s.submit(PROMPT, 4, **kw)
            assert e.value.param == field and words in str(e.value), (kw, str(e.value))
        # nothing was queued by the refusals: the session still runs a sequence
        assert len(run_submitted(s, PROMPT, 3)[0]) == 3
    with pytest.raises(ConfigError, match="grammar does not parse"):
        SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=256, grammar="root ::= ("))


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_a_lazy_grammar_holds_from_its_trigger_on_and_speculation_commits_the_same(dense) -> None:
    # a chat template's tool-call grammar is lazy: the reply is free text until the call opens (a trigger), and
    # from there only what the grammar allows. Here: the plain run's own 4th token opens it, and after it only
    # letters a-f may come (the plain run goes on otherwise)
    target, drafter, ref = dense
    pieces = [target.detokenize([t]) for t in ref.tokens]
    # a token whose text is new to the run at its position, followed by one the grammar forbids
    i = next(j for j in range(2, len(pieces) - 1) if re.search("[^a-f]", pieces[j + 1]) and pieces[j].strip()
             and pieces[j] not in "".join(pieces[:j]) + pieces[j][:-1])
    trigger, text = ref.tokens[i], pieces[i]
    grammar = f"root ::= {_gbnf_literal(text)} [a-f]+"
    n = i + 12

    def after_trigger(tokens):
        assert tokens[:i + 1] == ref.tokens[:i + 1]  # free until the trigger, as the plain run
        rest = target.detokenize(tokens[i + 1:])
        assert rest and re.fullmatch("[a-f]+", rest), rest
        return tokens

    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)) as s:
        by_token = after_trigger(run_submitted(s, PROMPT, n, grammar=grammar,
                                               grammar_triggers=[("token", "", trigger)])[0])
        by_word = run_submitted(s, PROMPT, n, grammar=grammar, grammar_triggers=[("word", text, -1)])[0]
        never = run_submitted(s, PROMPT, n, grammar=grammar, grammar_triggers=[("word", "never-in-the-text", -1)])[0]
        eager = run_submitted(s, PROMPT, n, grammar=grammar)[0]
    assert by_word == by_token and never == ref.tokens[:n]
    assert target.detokenize(eager).startswith(text) and eager[:i + 1] != ref.tokens[:i + 1]
    with SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False,
                                                    n_ctx=512)) as s:
        spec = run_submitted(s, PROMPT, n, grammar=grammar, grammar_triggers=[("token", "", trigger)])[0]
        assert s.stats().n_drafted > 0
    assert after_trigger(spec) == by_token


def test_a_draft_model_that_sees_the_grammar_drafts_what_lands_and_commits_the_same(dense) -> None:
    # the drafter agrees with the target on its own, but the grammar (letters a-f) moves the target off its first
    # choice: a drafter's first choice is refused where the grammar forbids it; drafting the best candidate the
    # grammar allows lands more, and the committed text is the plain run's either way
    target, drafter, _ref = dense
    grammar, n = "root ::= [a-f]+", 32
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=512)) as s:
        plain_tokens = run_submitted(s, PROMPT, n, grammar=grammar)[0]
    assert re.fullmatch("[a-f]+", target.detokenize(plain_tokens))
    runs = {}
    for sees in (False, True):
        cfg = SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False, n_ctx=512, draft_grammar=sees)
        with SpecSession(target, drafter, cfg) as s:
            tokens = run_submitted(s, PROMPT, n, grammar=grammar)[0]
            runs[sees] = (tokens, s.stats())
    for tokens, _stats in runs.values():
        assert tokens == plain_tokens
    blind, seeing = runs[False][1], runs[True][1]
    assert blind.n_drafted > 0 and seeing.n_drafted > 0
    assert seeing.n_accepted > blind.n_accepted and seeing.acceptance > blind.acceptance
    with pytest.raises(ConfigError, match="draft_grammar"):
        SessionConfig(draft_grammar=1)


def test_grammar_triggers_that_cannot_be_honoured_are_refused_naming_them(dense) -> None:
    from pyllamaspec.config import SequenceParams
    from pyllamaspec.chat import GrammarTrigger

    target, _drafter, _ref = dense
    g = 'root ::= "a"'
    for kw in (dict(grammar=g, grammar_triggers=[]), dict(grammar=g, grammar_triggers="<tool_call>"),
               dict(grammar=g, grammar_triggers=[("sometimes", "x", -1)]),
               dict(grammar=g, grammar_triggers=[("word", "", -1)]),
               dict(grammar=g, grammar_triggers=[("token", "", -2)]), dict(grammar_triggers=[("word", "x", -1)])):
        with pytest.raises(ParamError) as e:
            SequenceParams(**kw)
        assert e.value.param == "grammar_triggers", kw
    # the template's own trigger objects and mappings are taken as they are
    assert SequenceParams(grammar=g, grammar_triggers=[GrammarTrigger("word", "<x>"), {"type": "token", "token": 3}]
                          ).grammar_triggers == (("word", "<x>", -1), ("token", "", 3))
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=256)) as s:
        for triggers, words in (([("pattern", "(", -1)], "not a regular expression"),
                                ([("token", "", 10 ** 6)], "outside the vocabulary")):
            with pytest.raises(ParamError) as e:
                s.submit(PROMPT, 4, grammar=g, grammar_triggers=triggers)
            assert e.value.param == "grammar_triggers" and words in str(e.value), str(e.value)
        assert len(run_submitted(s, PROMPT, 3)[0]) == 3


# -- the real pair: JSON schemas under every kind of speculation -------------------------------------------------


@pytest.fixture(scope="module")
def real(real_pair):
    t, d = real_pair
    with Model(t) as target, Model(d) as drafter:
        prompt = target.tokenize(target.apply_chat_template(QUESTION))
        with SpecSession(target, None, SessionConfig(spec_types=[], margins=True, n_ctx=1024,
                                                     json_schema=SCHEMA)) as s:
            ref = s.generate(prompt, N_JSON)
        yield target, drafter, prompt, ref


@pytest.mark.realmodel
@pytest.mark.parametrize("arm", ["draft-simple", "ngram-mod", "adaptive"])
def test_schema_output_is_the_plain_runs_under_speculation(real, arm) -> None:
    target, drafter, prompt, ref = real
    check_schema(json.loads(ref.text))
    types = ["ngram-mod"] if arm == "ngram-mod" else ["draft-simple"]
    cfg = SessionConfig(spec_types=types, n_max=6, adaptive=arm == "adaptive", cost_cache=False, n_ctx=1024,
                        json_schema=SCHEMA)
    with SpecSession(target, drafter if types == ["draft-simple"] else None, cfg) as s:
        if arm == "adaptive":   # the running batch, as the server runs it
            tokens, _ = run_submitted(s, prompt, N_JSON)
        else:
            tokens = s.generate(prompt, N_JSON).tokens
        st = s.stats()
    _near(tokens, ref)
    check_schema(json.loads(target.detokenize(tokens)))
    if arm != "ngram-mod":
        assert st.n_accepted > 0


def _near(tokens, ref) -> None:
    for i, (a, b) in enumerate(zip(tokens, ref.tokens)):
        if a != b:
            assert ref.margins[i] < MIN_NEAR_TIE, f"divergence at {i} where the margin is {ref.margins[i]:.3g}"
            return
    assert len(tokens) == len(ref.tokens)


@pytest.mark.realmodel
def test_a_grammar_rejects_the_drafts_it_forbids(real) -> None:
    """Upper-case letters only: what the drafter proposes (lower-case prose) is refused by the verifier."""
    target, drafter, prompt, _ref = real
    grammar = 'root ::= [A-Z ]{4,40} "."'
    outs = []
    for types in ([], ["draft-simple"]):
        # a drafter blind to the grammar, whose drafts the verifier must refuse
        cfg = SessionConfig(spec_types=types, n_max=4, adaptive=False, n_ctx=1024, grammar=grammar, margins=True,
                            draft_grammar=False)
        with SpecSession(target, drafter if types else None, cfg) as s:
            outs.append(s.generate(prompt, 48))
    for r in outs:
        assert re.fullmatch(r"[A-Z ]{4,40}\.", r.text), r.text
    _near(outs[1].tokens, outs[0])
    assert outs[1].stats.n_drafted > outs[1].stats.n_accepted


# -- the server, with the official client ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(real_pair):
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from pyllamaspec.server.app import Loaded, create_app

    from serving import InProcessServer

    def load():
        target, drafter = Model(real_pair[0]), Model(real_pair[1])
        session = SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=6, n_ctx=2048,
                                                             n_parallel=2))
        return Loaded(target, drafter, session)

    with InProcessServer(create_app(load, alias="qwen")) as s:
        yield s.wait_ready(120)


@pytest.mark.realmodel
@pytest.mark.parametrize("fmt", ["json_object", "json_schema", "llama-server json_schema", "llama-server grammar"])
def test_served_output_follows_every_response_format(served, fmt) -> None:
    import openai

    c = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=300)
    body = {"json_object": {"response_format": {"type": "json_object"}},
            "json_schema": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "programmer", "schema": SCHEMA,
                                                                "strict": True}}},
            "llama-server json_schema": {"extra_body": {"json_schema": SCHEMA}},
            "llama-server grammar": {"extra_body": {"grammar": 'root ::= "{\\"ok\\": " ("true" | "false") "}"'}}}[fmt]
    r = c.chat.completions.create(model="qwen", messages=QUESTION, max_tokens=N_JSON, temperature=0, **body)
    obj = json.loads(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    if fmt == "json_object":
        assert isinstance(obj, dict)
    elif fmt == "llama-server grammar":
        assert set(obj) == {"ok"}
    else:
        check_schema(obj)


@pytest.mark.realmodel
def test_served_logprobs_and_a_ban_in_openais_shapes(served) -> None:
    import openai

    c = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    r = c.chat.completions.create(model="qwen", messages=ask, max_tokens=4, temperature=0, logprobs=True,
                                  top_logprobs=2, extra_body={"return_tokens": True})
    content = r.choices[0].logprobs.content
    assert "".join(x.token for x in content) == r.choices[0].message.content
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob and
               bytes(x.bytes) == x.token.encode() for x in content)
    assert "Paris" in r.choices[0].message.content
    paris = r.choices[0].model_dump()["tokens"][0]
    # -100 bans the token: the answer takes another (the word may still come, spelt with other tokens)
    banned = c.chat.completions.create(model="qwen", messages=ask, max_tokens=4, temperature=0,
                                       logit_bias={str(paris): -100}, extra_body={"return_tokens": True})
    assert paris not in banned.choices[0].model_dump()["tokens"]
    # streamed: the same tokens and log-probabilities, chunk by chunk
    chunks = c.chat.completions.create(model="qwen", messages=ask, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2, stream=True)
    streamed = [x for ch in chunks if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    assert [x.token for x in streamed] == [x.token for x in content]
    assert [x.logprob for x in streamed] == pytest.approx([x.logprob for x in content], abs=1e-3)
    text = c.completions.create(model="qwen", prompt="The capital of France is", max_tokens=3, temperature=0,
                                logprobs=2)
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens) == text.choices[0].text and len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)


@pytest.mark.realmodel
@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"grammar": 'root ::= "a'}, "grammar"),
    ({"json_schema": {"$ref": "#/missing"}}, "json_schema"),
    ({"grammar": 'root ::= "a"', "json_schema": {}}, "json_schema"),
    ({"logit_bias": {"Paris": -100}}, "logit_bias"),
    ({"logit_bias": {"5": 1000}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    # llama-server's samplers this server does not run, set on; its n_probs and ignore_eos
    ({"mirostat": 2}, "mirostat"), ({"typical_p": 0.5}, "typical_p"), ({"dynatemp_range": 0.5}, "dynatemp_range"),
    ({"xtc_probability": 0.5}, "xtc_probability"), ({"top_n_sigma": 1.0}, "top_n_sigma"),
    ({"dry_multiplier": 0.8}, "dry_multiplier"), ({"n_probs": 3}, "n_probs"), ({"ignore_eos": True}, "ignore_eos"),
    # a sampler order other than this server's, one it does not run, penalties left out of the order but set
    ({"samplers": "tkpm"}, "samplers"), ({"samplers": "ekpmta"}, "samplers"),
    ({"samplers": "kpmt", "repeat_penalty": 1.1}, "samplers"),
    # a lazy grammar without its triggers or its grammar, triggers without grammar_lazy, a trigger of no known type
    ({"grammar": 'root ::= "a"', "grammar_lazy": True}, "grammar_triggers"),
    ({"grammar_lazy": True, "grammar_triggers": [{"type": 1, "value": "x"}]}, "grammar_lazy"),
    ({"grammar": 'root ::= "a"', "grammar_triggers": [{"type": 1, "value": "x"}]}, "grammar_triggers"),
    ({"grammar": 'root ::= "a"', "grammar_lazy": True, "grammar_triggers": [{"type": 9, "value": "x"}]},
     "grammar_triggers[0]"),
    ({"grammar": 'root ::= "a"', "grammar_lazy": True, "grammar_triggers": [{"type": 2, "value": "("}]},
     "grammar_triggers"),
])
def test_served_fields_that_cannot_be_honoured_are_a_400_naming_them(served, body, param) -> None:
    import httpx

    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2, **body},
                   timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == param, r.text  # a bias out of range: logit_bias.<token>


@pytest.mark.realmodel
def test_served_lazy_grammar_and_samplers_left_off_as_llama_server_takes_them(served) -> None:
    # llama-server's grammar_lazy / grammar_triggers: the reply is the plain one up to the trigger (its third token)
    # and digits from there; llama-server's samplers sent at the values that keep them off, and its default sampler
    # order, change nothing
    import httpx

    body = {"messages": QUESTION, "max_tokens": 12, "temperature": 0, "return_tokens": True}
    plain = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    off = {"mirostat": 0, "typical_p": 1.0, "dynatemp_range": 0, "xtc_probability": 0.0, "top_n_sigma": -1.0,
           "dry_multiplier": 0.0, "n_probs": 0, "ignore_eos": False, "samplers": "edkypmxt"}  # llama.cpp's web UI's
    same = httpx.post(served.url + "/v1/chat/completions", json={**body, **off}, timeout=300).json()["choices"][0]
    assert same["tokens"] == plain["tokens"]
    tokens = plain["tokens"]
    detok = httpx.post(served.url + "/detokenize", json={"tokens": tokens[:3]}, timeout=60).json()["content"]
    head = httpx.post(served.url + "/detokenize", json={"tokens": tokens[:2]}, timeout=60).json()["content"]
    piece = detok[len(head):]
    assert piece and piece not in head
    lazy = {**body, "grammar": f"root ::= {_gbnf_literal(piece)} [0-9]+", "grammar_lazy": True,
            "grammar_triggers": [{"type": 0, "value": piece, "token": tokens[2]}]}
    got = httpx.post(served.url + "/v1/chat/completions", json=lazy, timeout=300).json()["choices"][0]
    assert got["tokens"][:3] == tokens[:3] and got["tokens"] != tokens
    assert got["message"]["content"].startswith(detok) and re.fullmatch("[0-9]+", got["message"]["content"][len(detok):])


# -- generate ---------------------------------------------------------------------------------------------------


@pytest.mark.realmodel
def test_generate_follows_a_json_schema_and_refuses_a_bad_grammar(real_pair, tmp_path) -> None:
    t, d = real_pair
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    p = subprocess.run([*CLI, "generate", "-m", str(t), "-md", str(d), "-c", "1024", "-n", str(N_JSON), "--temp", "0",
                        "-jf", str(schema), "-p", "A JSON record of a fictional programmer:"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    check_schema(json.loads(p.stdout))
    p = subprocess.run([*CLI, "generate", "-m", str(t), "-c", "256", "-n", "4", "--grammar", 'root ::= "a',
                        "-p", "x"], capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "grammar does not parse" in p.stderr and "Traceback" not in p.stderr
