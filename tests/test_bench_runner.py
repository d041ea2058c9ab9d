"""The runner driven by a fake backend (no native code), the session adapter against a fake API, external arms."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyllamaspec.bench.backends import PyllamaspecBackend, RenderedPrompt, RunResult
from pyllamaspec.bench.cotenant import CotenantError, Finding, GpuSample
from pyllamaspec.bench.external import (ExternalArmError, LlamaCppPythonBackend, SpeculativeSimpleBackend,
                                        parse_speculative_simple_output)
from pyllamaspec.bench.plan import Arm, MixedModesError, PromptMode
from pyllamaspec.bench.runner import BenchRunner, BenchSettings
from pyllamaspec.bench.workloads import Prompt
from pyllamaspec.errors import ConfigError
from pyllamaspec.errors import ConfigError

PLAIN = Arm("plain")
DRAFT = Arm("draft", ("draft-simple",), 4, "q4")
FORCED = Arm("draft/forced-reject", ("draft-simple",), 4, "q4", force_reject=True, compare_to="draft")
PROMPTS = {"code": [Prompt("c0", "c0", "write code zero", "code"), Prompt("c1", "c1", "write code one", "code")],
           "prose": [Prompt("p0", "p0", "write prose", "prose")]}
WARMUP_TPS = 1.0  # a value no measured run produces, to prove warm-ups are discarded


class FakeBackend:
    """Renders by words and generates deterministic tokens; speed and behaviour per arm are set by the test."""

    def __init__(self, speeds=None, diverge_at=None, margin_at_divergence=2.0):
        self.speeds = speeds or {"plain": 50.0, "draft": 100.0, "draft/forced-reject": 40.0, "ngram": 51.0,
                                 "ngram/forced-reject": 55.0}
        self.diverge_at = diverge_at or {}
        self.margin_at_divergence = margin_at_divergence
        self.calls = []

    def count_tokens(self, text):
        return len(text.split()) + 1

    def render(self, user_message, mode):
        prefix = (1,) if mode.chat_template else ()
        return RenderedPrompt(user_message, prefix + tuple(range(10, 10 + len(user_message.split()))))

    def generate(self, arm, prompt, n_predict, *, n_ctx, margins):
        first_of_arm = all(call["arm"] != arm.name for call in self.calls)
        self.calls.append({"arm": arm.name, "margins": margins, "n_ctx": n_ctx, "prompt_len": len(prompt.tokens)})
        tokens = list(range(1000, 1000 + n_predict))
        if arm.name in self.diverge_at:
            tokens[self.diverge_at[arm.name]] = 7
        margin_list = None
        if margins:
            margin_list = [5.0] * n_predict
            for position in self.diverge_at.values():
                margin_list[position] = self.margin_at_divergence
        speculative = arm.spec_types not in (("none",), ("ngram-mod",))  # the n-gram arm never finds a match
        steps = n_predict if not speculative or arm.force_reject else n_predict // 2
        drafted = steps * 4 if speculative else 0
        accepted = 0 if arm.force_reject or not speculative else n_predict - steps
        return RunResult(
            tokens_per_second=WARMUP_TPS if first_of_arm else self.speeds[arm.name] + len(self.calls) % 3,
            n_generated=n_predict, tokens=tuple(tokens), margins=tuple(margin_list) if margin_list else None,
            n_prompt=len(prompt.tokens), n_steps=steps, n_drafted=drafted, n_accepted=accepted,
            mean_accepted_length=accepted / steps if speculative else None,
            accepted_per_position=(accepted // 2, accepted - accepted // 2, 0, 0) if speculative else (),
            drafted_per_position=(steps, steps, steps, steps) if speculative else (),
        )

    def close(self):
        pass


class FakeDetector:
    def __init__(self, preflight=(), contaminate_windows=()):
        self._preflight = list(preflight)
        self.contaminate_windows = set(contaminate_windows)
        self.windows = 0
        self.open = False
        self.uninspectable = set()

    def preflight(self):
        return self._preflight

    def begin_window(self):
        assert not self.open
        self.open = True

    def end_window(self):
        assert self.open
        self.open = False
        self.windows += 1
        if self.windows in self.contaminate_windows:
            return [Finding("cpu-process", "proc-stat", "compiler", 4242, "180% of one core")]
        return []


class FakeTelemetry:
    def __init__(self):
        self.gate_reads = 0

    def sample(self):
        return [GpuSample(0, 60.0, 1800.0, 1980.0, 250.0)]

    def hottest_c(self):
        self.gate_reads += 1
        return 60.0


def run_bench(arms=(PLAIN, DRAFT), backend=None, detector=None, telemetry=None, **settings):
    backend = backend or FakeBackend()
    options = {"classes": ("code", "prose"), "depths": (0, 64), "repeats": 3, "n_predict": 16}
    runner = BenchRunner(list(arms), {"session": backend}, backend, PROMPTS, BenchSettings(**{**options, **settings}),
                         detector=detector, telemetry=telemetry, sleep=lambda seconds: None)
    return runner.run(), backend


def record(result, arm, content_class="code", depth=0):
    return next(r for r in result["records"] if (r["arm"], r["class"], r["depth"]) == (arm, content_class, depth))


def test_runs_are_interleaved_and_warmups_discarded():
    result, backend = run_bench()
    timed = [call["arm"] for call in backend.calls if not call["margins"]]
    assert timed[:2] == ["plain", "draft"]  # the warm-ups
    # each block's rounds in an order that turns every round: plain first, then draft first, then plain again
    assert timed[2:] == ["plain", "draft", "draft", "plain", "plain", "draft"] * (2 * 2)
    assert len(result["records"]) == 2 * 2 * 2
    first = record(result, "draft")
    assert first["warmup_discarded"] == [WARMUP_TPS]
    assert WARMUP_TPS not in first["runs"] and len(first["runs"]) == 3
    assert record(result, "draft", "prose", 64)["warmup_discarded"] == []
    assert first["run_prompts"] == ["c0", "c1", "c0"]


def test_only_untimed_plain_reference_runs_collect_margins():
    _, backend = run_bench()
    references = [call for call in backend.calls if call["margins"]]
    assert {call["arm"] for call in references} == {"plain"}
    assert len(references) == 2 + 2 + 1 + 1  # code has two prompts, prose one; two depths each


def test_every_run_shares_one_context_size_that_fits_the_deepest_prompt():
    _, backend = run_bench()
    sizes = {call["n_ctx"] for call in backend.calls}
    assert len(sizes) == 1
    assert sizes.pop() >= max(call["prompt_len"] for call in backend.calls) + 16
    _, fixed = run_bench(n_ctx=4096)
    assert {call["n_ctx"] for call in fixed.calls} == {4096}


def test_records_carry_statistics_acceptance_and_paired_speedup():
    result, _ = run_bench()
    draft = record(result, "draft")
    assert draft["median_tps"] == sorted(draft["runs"])[1]
    assert draft["min_tps"] == min(draft["runs"]) and draft["max_tps"] == max(draft["runs"])
    assert draft["acceptance"] == pytest.approx(8 / 32)
    assert draft["tokens_per_step"] == 2.0
    assert draft["accepted_per_position"] == [12, 12, 0, 0] and draft["drafted_per_position"] == [24] * 4
    plain_runs = record(result, "plain")["runs"]
    ratios = sorted(d / p for d, p in zip(draft["runs"], plain_runs, strict=True))
    assert draft["speedup_vs_plain"]["median"] == pytest.approx(ratios[1])
    assert draft["speedup_vs_plain"]["min"] == pytest.approx(ratios[0])
    assert record(result, "plain")["speedup_vs_plain"] is None
    assert draft["telemetry"]["temperature_c"] is None  # no telemetry source in this run


def test_exactness_is_checked_against_the_plain_reference():
    result, _ = run_bench(backend=FakeBackend(diverge_at={"draft": 5}))
    assert record(result, "plain")["equal_to_plain"]["kind"] == "identical"
    diverged = record(result, "draft")["equal_to_plain"]
    assert (diverged["equal"], diverged["kind"], diverged["position"], diverged["margin"]) == \
        (False, "diverged", 5, 2.0)
    assert diverged["counts"] == {"identical": 0, "near-tie": 0, "diverged": 3}
    tie, _ = run_bench(backend=FakeBackend(diverge_at={"draft": 5}, margin_at_divergence=0.01))
    assert record(tie, "draft")["equal_to_plain"]["kind"] == "near-tie"


def test_cotenant_during_one_run_marks_every_figure_and_names_the_run():
    detector = FakeDetector(contaminate_windows={3})  # window 3: round 1 of (code, 0), draft arm (that round's first)
    result, _ = run_bench(detector=detector)
    draft = record(result, "draft")
    assert draft["run_contaminated"] == [False, True, False]
    assert "compiler" in draft["cotenant_findings"][0]
    assert record(result, "plain")["run_contaminated"] == [False, False, False]
    # the plain arm's figures are marked too: every speedup is paired with a run of the same rounds
    assert all(r["contaminated"] for r in result["records"])
    assert result["cotenant"]["contaminated_runs"] == 1
    assert detector.windows == 2 * 2 * 2 * 3  # one window per measured run, none for warm-ups or references
    clean, _ = run_bench(detector=FakeDetector())
    assert not any(r["contaminated"] for r in clean["records"])


def test_cotenant_before_the_run_contaminates_everything_or_refuses():
    finding = Finding("gpu-process", "nvidia-smi", "trainer", 200, "20000 MiB in use")
    result, _ = run_bench(detector=FakeDetector(preflight=[finding]))
    assert all(r["contaminated"] for r in result["records"])
    assert result["cotenant"]["preflight"][0]["name"] == "trainer"
    with pytest.raises(CotenantError):
        run_bench(detector=FakeDetector(preflight=[finding]), cotenant_policy="refuse")
    with pytest.raises(CotenantError, match="during draft"):
        run_bench(detector=FakeDetector(contaminate_windows={2}), cotenant_policy="refuse")


def test_mixed_modes_are_refused_before_anything_runs():
    thinking = Arm("draft", ("draft-simple",), 4, "q4", mode=PromptMode(True, True))
    backend = FakeBackend()
    with pytest.raises(MixedModesError):
        run_bench(arms=(PLAIN, thinking), backend=backend)
    assert backend.calls == []
    result, _ = run_bench(arms=(PLAIN, thinking), force_mixed_modes=True)
    assert result["mixed_modes"] is True
    assert record(result, "draft")["equal_to_plain"] is None  # a different prompt: nothing to compare


def test_breakeven_is_computed_from_the_forced_reject_twin():
    result, _ = run_bench(arms=(PLAIN, DRAFT, FORCED), backend=FakeBackend(
        speeds={"plain": 50.0, "draft": 80.0, "draft/forced-reject": 40.0}))
    forced = record(result, "draft/forced-reject")
    assert forced["ratio_to"]["arm"] == "draft" and forced["acceptance"] == 0.0
    analyses = {(a["arm"], a["content_class"]): a for a in result["breakeven"]}
    assert set(analyses) == {("draft", "code"), ("draft", "prose")}
    point = analyses[("draft", "code")]["points"][0]
    plain, twin = record(result, "plain"), forced
    assert point["cost_ratio"] == pytest.approx(plain["median_tps"] / twin["median_tps"])
    assert point["tokens_per_step"] == 2.0
    assert point["predicted_speedup"] == pytest.approx(2.0 / point["cost_ratio"])


def test_no_breakeven_is_claimed_for_an_arm_that_never_drafted():
    ngram = Arm("ngram", ("ngram-mod",), 4)
    twin = Arm("ngram/forced-reject", ("ngram-mod",), 4, force_reject=True, compare_to="ngram")
    result, _ = run_bench(arms=(PLAIN, ngram, twin), classes=("code",))
    assert record(result, "ngram/forced-reject")["acceptance"] is None
    [analysis] = result["breakeven"]
    assert (analysis["status"], analysis["points"], analysis["breakeven_depth"]) == ("unmeasured", [], None)


def test_cooling_gate_runs_before_every_round():
    telemetry = FakeTelemetry()
    result, _ = run_bench(telemetry=telemetry, cooling_gate_c=80.0)
    assert len(result["cooling"]) == 2 * 2 * 3 and all(gate["reached"] for gate in result["cooling"])
    assert record(result, "draft")["telemetry"]["sm_clock_mhz"] == [1800.0, 1800.0]
    no_gate, _ = run_bench(telemetry=FakeTelemetry())
    assert no_gate["cooling"] == []


def test_runner_needs_exactly_one_plain_arm_and_a_backend_per_kind():
    with pytest.raises(ConfigError):
        run_bench(arms=(DRAFT,))
    with pytest.raises(ConfigError, match="llama-cpp-python"):
        run_bench(arms=(PLAIN, Arm("lcp", kind="llama-cpp-python", compare_to="plain")))


# --- the session adapter, against a fake pyllamaspec API -------------------------------------------------------

class FakeModel:
    def __init__(self, path, n_gpu_layers=-1):
        self.path, self.n_gpu_layers, self.closed = path, n_gpu_layers, False

    def tokenize(self, text):
        return [1] + [len(word) for word in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=None):
        return f"<user>{messages[0]['content']}</user>"  # a template that does not read enable_thinking

    def close(self):
        self.closed = True


class ThinkingModel(FakeModel):
    def apply_chat_template(self, messages, add_generation_prompt=True, enable_thinking=None):
        return f"<user>{messages[0]['content']}</user><think={enable_thinking}>"


class FakeApi:
    """pyllamaspec's public surface as the adapter uses it."""

    def __init__(self, model_class=FakeModel):
        self.model_class = model_class
        self.models, self.sessions = [], []

    def info(self):
        return {"upstream": {"commit": "abc"}, "backends": ["CPU"], "devices": []}

    def Model(self, path, n_gpu_layers=-1):
        model = self.model_class(path, n_gpu_layers)
        self.models.append(model)
        return model

    def SessionConfig(self, **fields):
        return SimpleNamespace(**fields)

    def SpecSession(self, target, drafter, config):
        api = self

        class Session:
            def __enter__(self):
                api.sessions.append((target, drafter, config))
                return self

            def __exit__(self, *exc):
                return False

            def generate(self, tokens, n_predict):
                stats = SimpleNamespace(
                    n_steps=4, n_drafted=12, n_accepted=6, acceptance=0.5, mean_accepted_length=2.5,
                    accepted_per_position=[3, 2, 1], drafted_per_position=[4, 4, 4], tokens_per_second=123.0,
                    n_generated=n_predict, n_prompt=len(tokens), t_prefill_ms=1.0, t_draft_ms=2.0, t_verify_ms=3.0,
                    t_rollback_ms=0.5, t_sample_ms=0.1, t_decode_ms=9.0)
                return SimpleNamespace(text="x", tokens=list(range(n_predict)), margins=[0.5] * n_predict,
                                       finish_reason="length", stats=stats)

        return Session()


def test_adapter_maps_arms_onto_session_configs_and_results():
    api = FakeApi()
    backend = PyllamaspecBackend("/models/t.gguf", {"q4": "/models/d.gguf"}, n_gpu_layers=0, n_threads=6, seed=3,
                                 api=api)
    rendered = backend.render("hello world", PromptMode(chat_template=True))
    assert rendered.text == "<user>hello world</user>"
    assert backend.render("hello world", PromptMode(chat_template=False)).tokens == (1, 5, 5)
    assert backend.count_tokens("a bb") == 3
    assert backend.describe()["upstream"] == {"commit": "abc"}

    result = backend.generate(FORCED, rendered, 8, n_ctx=1024, margins=True)
    target, drafter, config = api.sessions[-1]
    assert target.path == "/models/t.gguf" and drafter.path == "/models/d.gguf" and target.n_gpu_layers == 0
    assert vars(config) == {"spec_types": ["draft-simple"], "n_ctx": 1024, "temp": 0.0, "seed": 3, "margins": True,
                            "force_reject": True, "n_max": 4, "n_threads": 6, "n_threads_batch": 6}
    assert result.tokens_per_second == 123.0 and result.tokens == tuple(range(8))
    assert result.margins == (0.5,) * 8 and result.accepted_per_position == (3, 2, 1)
    assert result.timings_ms["verify"] == 3.0 and result.n_prompt == len(rendered.tokens)

    backend.generate(PLAIN, rendered, 8, n_ctx=1024, margins=False)
    _, drafter, config = api.sessions[-1]
    assert drafter is None and "n_max" not in vars(config) and config.spec_types == ["none"]
    assert len(api.models) == 2  # loaded once, whatever the number of runs
    backend.close()
    assert all(model.closed for model in api.models)


def test_adapter_switches_reasoning_only_where_the_template_can():
    thinking = PyllamaspecBackend("/models/t.gguf", api=FakeApi(ThinkingModel))
    assert thinking.render("hi", PromptMode(True, False)).text == "<user>hi</user><think=False>"
    assert thinking.render("hi", PromptMode(True, None)).text == "<user>hi</user><think=None>"
    plain_templating = PyllamaspecBackend("/models/t.gguf", api=FakeApi())
    with pytest.raises(ConfigError, match="reasoning"):
        plain_templating.render("hi", PromptMode(True, True))
    assert plain_templating.render("hi", PromptMode(True, None)).text == "<user>hi</user>"


# --- upstream's binary ------------------------------------------------------------------------------------------

UPSTREAM_LOG = """
main: encoded   45 tokens in    0.052 seconds, speed:  865.385 t/s
main: decoded  129 tokens in    1.234 seconds, speed:  104.538 t/s

main: n_draft   = 8
main: n_predict = 129
main: n_drafted = 160
main: n_accept  = 109
main: accept    = 68.125%
"""


def test_upstream_output_is_parsed():
    figures = parse_speculative_simple_output(UPSTREAM_LOG)
    assert figures == {"n_decoded": 129, "seconds": 1.234, "tokens_per_second": 104.538, "n_draft": 8,
                       "n_predict": 129, "n_drafted": 160, "n_accept": 109}
    with pytest.raises(ExternalArmError):
        parse_speculative_simple_output("error: failed to load model")


def test_upstream_backend_runs_the_binary_with_the_arms_settings(tmp_path):
    seen = {}

    def fake_run(command, **options):
        seen["command"] = command
        seen["prompt"] = Path(command[command.index("-f") + 1]).read_text()
        return subprocess.CompletedProcess(command, 0, stdout="generated text", stderr=UPSTREAM_LOG)

    backend = SpeculativeSimpleBackend("/bin/llama-speculative-simple", "/m/t.gguf", {"q4": "/m/d.gguf"},
                                       n_gpu_layers=-1, n_threads=4, run=fake_run)
    result = backend.generate(DRAFT, RenderedPrompt("prompt ends in newline\n", (1, 2, 3)), 128, n_ctx=2048,
                              margins=False)
    command = seen["command"]
    assert command[command.index("--spec-type") + 1] == "draft-simple"
    assert command[command.index("--spec-draft-n-max") + 1] == "4"
    assert command[command.index("-md") + 1] == "/m/d.gguf" and command[command.index("-ngl") + 1] == "all"
    assert command[command.index("-t") + 1] == "4" and command[command.index("-c") + 1] == "2048"
    assert seen["prompt"] == "prompt ends in newline\n\n"  # upstream strips exactly one trailing newline
    assert (result.tokens_per_second, result.n_generated, result.n_drafted, result.n_accepted) == \
        (104.538, 129, 160, 109)
    assert result.tokens is None

    failing = SpeculativeSimpleBackend("/bin/x", "/m/t.gguf", run=lambda command, **options:
                                       subprocess.CompletedProcess(command, 1, stdout="", stderr="boom"))
    with pytest.raises(ExternalArmError, match="boom"):
        failing.generate(PLAIN, RenderedPrompt("p", (1,)), 8, n_ctx=512, margins=False)


# --- llama-cpp-python, through its worker process, against a fake llama_cpp module ------------------------------

FAKE_LLAMA_CPP = '''
import os, sys

class Llama:
    def __init__(self, model_path, n_ctx, n_gpu_layers, n_threads, seed, verbose):
        if model_path.endswith("broken.gguf"):
            raise ValueError("not a GGUF")
        os.write(1, b"native chatter on stdout\\n")  # must not corrupt the protocol

    def token_eos(self):
        return 2

    def generate(self, tokens, temp, reset):
        assert temp == 0.0 and reset
        for step in range(1, 100):
            yield 2 if step == 5 else 100 + len(tokens) + step
'''


@pytest.fixture
def fake_llama_cpp(tmp_path, monkeypatch):
    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_llama_cpp_python_worker_serves_greedy_generations(fake_llama_cpp):
    backend = LlamaCppPythonBackend("/m/t.gguf")
    arm = Arm("llama-cpp-python", kind="llama-cpp-python", compare_to="plain")
    try:
        stopped_at_eos = backend.generate(arm, RenderedPrompt("p", (1, 2, 3)), 10, n_ctx=512, margins=False)
        assert stopped_at_eos.tokens == (104, 105, 106, 107, 2) and stopped_at_eos.tokens_per_second > 0
        limited = backend.generate(arm, RenderedPrompt("p", (1,)), 3, n_ctx=512, margins=False)
        assert limited.tokens == (102, 103, 104) and limited.n_prompt == 1
    finally:
        backend.close()


def test_llama_cpp_python_worker_reports_load_failures(fake_llama_cpp):
    backend = LlamaCppPythonBackend("/m/broken.gguf")
    with pytest.raises(ExternalArmError, match="not a GGUF"):
        backend.generate(Arm("lcp", kind="llama-cpp-python"), RenderedPrompt("p", (1,)), 3, n_ctx=512,
                         margins=False)
    backend.close()


class FakeStreamsBackend(FakeBackend):
    """FakeBackend that also runs several prompts as streams, recording which ones."""

    def generate_streams(self, arm, prompts, n_predict, *, n_ctx, margins):
        result = self.generate(arm, prompts[0], n_predict, n_ctx=n_ctx, margins=margins)
        self.calls[-1]["streams"] = [p.text for p in prompts]
        return result


def test_parallel_runs_the_classes_next_prompts_as_streams_in_a_shared_context():
    _, one = run_bench(backend=FakeStreamsBackend(), depths=(0,))
    result, backend = run_bench(backend=FakeStreamsBackend(), depths=(0,), parallel=3)
    assert result["parallel"] == 3
    code = [call["streams"] for call in backend.calls if call.get("streams") and call["prompt_len"] == 4]
    assert ["write code zero", "write code one", "write code zero"] in code  # wraps around the class's prompts
    assert ["write code one", "write code zero", "write code one"] in code
    assert all(len(call["streams"]) == 3 for call in backend.calls)
    # each stream gets the context one run alone would
    assert {call["n_ctx"] for call in backend.calls} == {3 * one.calls[0]["n_ctx"]}


def test_parallel_refuses_backends_that_run_one_stream():
    with pytest.raises(ConfigError, match="run one stream at a time"):
        run_bench(backend=FakeBackend(), parallel=2)


class StreamsApi(FakeApi):
    """FakeApi whose sessions also generate batches and report the streams' joint stats."""

    def SpecSession(self, target, drafter, config):
        inner = super().SpecSession(target, drafter, config)

        class Session:
            def __enter__(self):
                inner.__enter__()
                return self

            def __exit__(self, *exc):
                return False

            def generate_batch(self, prompts, n_predict):
                return [inner.generate(p, n_predict) for p in prompts]

            def stats(self):
                return SimpleNamespace(
                    n_steps=8, n_drafted=24, n_accepted=12, mean_accepted_length=2.5,
                    accepted_per_position=[6, 4, 2], drafted_per_position=[8, 8, 8], tokens_per_second=200.0,
                    n_generated=16, n_prompt=7, t_prefill_ms=1.0, t_draft_ms=2.0, t_verify_ms=3.0,
                    t_rollback_ms=0.5, t_sample_ms=0.1, t_decode_ms=80.0)

        return Session()


def test_adapter_runs_streams_in_one_session():
    api = StreamsApi()
    backend = PyllamaspecBackend("/models/t.gguf", {"q4": "/models/d.gguf"}, api=api)
    rendered = [backend.render(text, PromptMode(chat_template=False)) for text in ("a b", "c d e")]
    result = backend.generate_streams(DRAFT, rendered, 8, n_ctx=2048, margins=False)
    _, _, config = api.sessions[-1]
    assert config.n_parallel == 2 and config.n_ctx == 2048
    assert result.tokens_per_second == 200.0 and result.n_generated == 16 and result.tokens == tuple(range(8))


class FakeNoisyBackend(FakeStreamsBackend):
    """Measures the target's batch-shape noise as a fixed shift of every margin."""

    def __init__(self, shift, **kw):
        super().__init__(**kw)
        self.shift, self.scored = shift, []

    def score_margins(self, prompt, continuation, chunk, *, n_ctx):
        self.scored.append(chunk)
        margins = [5.0] * len(continuation)  # what generate() reports for plain runs, moved by the shift
        for position in self.diverge_at.values():
            margins[position] = self.margin_at_divergence
        return [m + self.shift for m in margins]


def test_divergence_within_measured_batch_shape_noise_is_a_tie():
    # the planted divergence sits at margin 0.2: a tie only once the noise (0.15 -> tolerance 0.225) is measured
    quiet, _ = run_bench(backend=FakeBackend(diverge_at={"draft": 3}, margin_at_divergence=0.2), depths=(0,))
    assert record(quiet, "draft")["equal_to_plain"]["kind"] == "diverged"
    backend = FakeNoisyBackend(0.15, diverge_at={"draft": 3}, margin_at_divergence=0.2)
    noisy, _ = run_bench(backend=backend, depths=(0,))
    equal = record(noisy, "draft")["equal_to_plain"]
    assert equal["kind"] == "near-tie" and equal["tolerance"] == pytest.approx(0.225)
    assert equal["batch_shape_noise"] == pytest.approx(0.15)
    assert set(backend.scored) == {DRAFT.n_max + 1}  # scored in verify-sized batches


def test_noise_never_lowers_the_configured_tolerance():
    backend = FakeNoisyBackend(0.0, diverge_at={"draft": 3}, margin_at_divergence=0.04)
    result, _ = run_bench(backend=backend, depths=(0,))
    assert record(result, "draft")["equal_to_plain"]["tolerance"] == pytest.approx(0.05)
