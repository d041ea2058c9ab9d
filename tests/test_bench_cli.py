"""``pyllamaspec bench`` argument parsing, arm construction, errors, --from-json, and one fake end-to-end run."""

import argparse
import json
import os

import pytest

from pyllamaspec.bench import command
from pyllamaspec.cli import bench as cli
from pyllamaspec.cli.app import run_command
from pyllamaspec.bench.backends import RenderedPrompt, RunResult
from pyllamaspec.bench.lock import lock_path_for, read_holder
from pyllamaspec.config import SessionConfig
from pyllamaspec.errors import ConfigError


def parse(*argv):
    parser = argparse.ArgumentParser(prog="pyllamaspec")
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


@pytest.fixture
def models(tmp_path):
    paths = {}
    for name in ("target", "draft-q4", "draft-q8"):
        paths[name] = tmp_path / f"{name}.gguf"
        paths[name].write_bytes(b"GGUF" + name.encode())
    return paths


def test_full_command_line_parses():
    args = parse("-m", "t.gguf", "-md", "d4.gguf", "-md", "d8.gguf", "--drafter-label", "q4", "--drafter-label", "q8",
                 "--spec-type", "draft-simple,ngram-mod", "--spec-draft-n-max", "4,8", "--classes", "code,prose",
                 "--depth", "0,4096,16384", "--repeat", "10", "--n-predict", "256", "--json", "o.json", "--md",
                 "o.md", "--plots", "plots", "--cotenant", "refuse", "--lock", "refuse", "--cooling-gate", "70",
                 "--external-speculative-simple", "/opt/llama-speculative-simple", "--threads", "8", "-ngl", "99",
                 "--chat-template", "on", "--reasoning", "on,off", "--force-mixed-modes")
    assert args.func is cli.run
    assert (args.model, args.drafters, args.drafter_labels) == ("t.gguf", ["d4.gguf", "d8.gguf"], ["q4", "q8"])
    assert args.spec_type == ["draft-simple", "ngram-mod"] and args.spec_draft_n_max == [4, 8]
    assert args.classes == ["code", "prose"] and args.depth == [0, 4096, 16384]
    assert (args.repeat, args.n_predict, args.n_threads, args.n_gpu_layers) == (10, 256, 8, 99)
    assert (args.cotenant, args.lock, args.cooling_gate) == ("refuse", "refuse", 70.0)
    assert args.external_speculative_simple == "/opt/llama-speculative-simple"
    assert (args.chat_template, args.reasoning, args.force_mixed_modes) == ([True], [True, False], True)


def test_defaults_are_the_trustworthy_ones():
    args = parse("-m", "t.gguf")
    assert args.repeat >= 8 and args.lock == "wait" and args.depth == [0]
    assert args.classes == ["code", "prose", "reasoning", "edit", "mixed"]
    assert args.chat_template == [True] and args.reasoning == [None]
    assert parse("-m", "t", "--external-speculative-simple").external_speculative_simple == "auto"


def test_invalid_values_are_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        parse("-m", "t", "--depth", "zero")
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        parse("-m", "t", "--chat-template", "maybe")


def names(*argv):
    return [arm.name for arm in command.build_arms(parse(*argv))]


def test_every_spec_type_and_n_max_is_an_arm_after_the_plain_arm():
    assert names("-m", "t", "--spec-type", "ngram-mod,ngram-simple", "--spec-draft-n-max", "4,8") == \
        ["plain", "ngram-mod/n4", "ngram-mod/n8", "ngram-simple/n4", "ngram-simple/n8"]
    assert names("-m", "t") == ["plain"]


def test_drafter_types_get_one_arm_per_drafter_and_ngram_types_do_not():
    assert names("-m", "t", "-md", "a/d-q4.gguf", "-md", "d-q8.gguf", "--spec-type", "draft-simple,ngram-mod") == \
        ["plain", "draft-simple@d-q4", "draft-simple@d-q8", "ngram-mod"]
    assert names("-m", "t", "-md", "x.gguf", "--drafter-label", "fast", "--spec-type", "ngram-mod+draft-simple") == \
        ["plain", "ngram-mod+draft-simple@fast"]


def test_breakeven_twins_and_external_arms_point_at_their_base_arm():
    arms = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--breakeven", "--external-speculative-simple",
                                "--external-llama-cpp-python"))
    by_name = {arm.name: arm for arm in arms}
    twin = by_name["ngram-mod/forced-reject"]
    assert twin.force_reject and twin.compare_to == "ngram-mod"
    assert by_name["upstream:ngram-mod"].kind == "speculative-simple"
    assert by_name["llama-cpp-python"].compare_to == "plain"


def test_adaptive_on_and_off_are_arms_and_a_single_value_applies_to_every_arm():
    arms = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--spec-draft-n-max", "4",
                                    "--spec-adaptive", "on,off", "--breakeven"))
    by_name = {arm.name: arm for arm in arms}
    assert list(by_name)[:3] == ["plain", "ngram-mod/n4/adaptive", "ngram-mod/n4/fixed"]
    assert by_name["ngram-mod/n4/adaptive"].adaptive is True and by_name["ngram-mod/n4/fixed"].adaptive is False
    # a forced zero-acceptance twin measures the cost of drafting n_max every step, so it never adapts
    assert by_name["ngram-mod/n4/adaptive/forced-reject"].adaptive is False
    fixed = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--spec-adaptive", "off"))
    assert [(arm.name, arm.adaptive) for arm in fixed[1:]] == [("ngram-mod", False)]
    default = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod"))
    assert default[1].adaptive is SessionConfig.adaptive


def test_synthetic_acceptance_marks_speculative_arms_and_refuses_upstream_arms():
    arms = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--spec-synth-rates", "0.9,0.8"))
    assert [arm.synthetic for arm in arms] == [False, True]
    for extra in ("--external-speculative-simple", "--breakeven"):
        with pytest.raises(ConfigError, match="synthetic acceptance"):
            command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--spec-synth-len", "3", extra))


def test_modes_can_be_set_per_arm():
    arms = command.build_arms(parse("-m", "t", "--spec-type", "ngram-mod", "--reasoning", "off,on"))
    assert [arm.mode.reasoning for arm in arms] == [False, True]


@pytest.mark.parametrize("argv, message", [
    (["--spec-type", "draft-simple"], "needs a drafter"),
    (["--spec-type", "draft-magic"], "unknown spec type"),
    (["--spec-type", "none"], "plain arm is always included"),
    (["-md", "a.gguf", "-md", "b.gguf", "--drafter-label", "x"], "--drafter-label"),
    (["-md", "a/d.gguf", "-md", "b/d.gguf", "--spec-type", "draft-simple"], "distinct"),
    (["--spec-type", "ngram-mod", "--reasoning", "on,off,on"], "one per arm"),
    (["--spec-type", "ngram-mod,ngram-mod"], "listed twice"),
])
def test_bad_arm_specifications_are_refused(argv, message):
    with pytest.raises(ConfigError, match=message):
        command.build_arms(parse("-m", "t", *argv))


def test_errors_exit_2_with_one_line_on_stderr(models, capsys):
    assert run_command(parse("-m", str(models["target"]), "--spec-type", "draft-simple")) == 2
    error = capsys.readouterr().err
    assert error.startswith("pyllamaspec: error:") and "needs a drafter" in error
    assert error.count("\n") == 1


def test_missing_target_and_mixed_modes_exit_2(models, capsys):
    assert run_command(parse("--spec-type", "ngram-mod")) == 2
    assert "-m GGUF" in capsys.readouterr().err
    assert run_command(parse("-m", str(models["target"]) + ".missing")) == 2
    assert "does not exist" in capsys.readouterr().err
    assert run_command(parse("-m", str(models["target"]), "--spec-type", "ngram-mod", "--chat-template", "on,off")) == 2
    assert "--force-mixed-modes" in capsys.readouterr().err


def test_from_json_renders_markdown_and_plots_without_a_model(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    recorded = tmp_path / "bench.json"
    record = {"arm": "plain", "class": "code", "depth": 0, "runs": [10.0, 11.0], "median_tps": 10.5,
              "min_tps": 10.0, "max_tps": 11.0, "spread_pct": 9.5, "contaminated": False}
    recorded.write_text(json.dumps({"records": [record]}))
    markdown, plots = tmp_path / "out.md", tmp_path / "plots"
    assert run_command(parse("--from-json", str(recorded), "--md", str(markdown), "--plots", str(plots))) == 0
    assert "| code | 0 | plain |" in markdown.read_text()
    assert (plots / "throughput.png").stat().st_size > 0
    assert run_command(parse("--from-json", str(recorded))) == 0
    assert "| code | 0 | plain |" in capsys.readouterr().out
    assert run_command(parse("--from-json", str(tmp_path / "nothing.json"))) == 2


def test_lock_devices_follow_the_build_and_the_offload():
    info = {"devices": [{"name": "CUDA0", "type": "gpu"}, {"name": "CUDA1", "type": "gpu"},
                        {"name": "BLAS", "type": "accel"}, {"name": "CPU", "type": "cpu"}]}
    assert command.lock_devices(info, -1) == ["CUDA0", "CUDA1"]
    assert command.lock_devices(info, 0) == ["cpu"]
    assert command.lock_devices({"devices": [{"name": "Vulkan0", "type": "igpu"}]}, 99) == ["Vulkan0"]
    assert command.lock_devices({"devices": [{"name": "CPU", "type": "cpu"}]}, -1) == ["cpu"]


class FakeSessionBackend:
    """Stands in for the session adapter: the CLI's whole path runs without native code."""

    instances = []

    def __init__(self, target_path, drafter_paths=None, **options):
        self.drafter_paths = drafter_paths
        self.lock_holders = set()
        self.closed = False
        FakeSessionBackend.instances.append(self)

    def describe(self):
        return {"upstream": {"commit": "0c1e570"}, "backends": ["CPU"], "devices": []}

    def count_tokens(self, text):
        return len(text.split()) + 1

    def render(self, user_message, mode):
        return RenderedPrompt(user_message, tuple(range(len(user_message.split()) + 1)))

    def generate(self, arm, prompt, n_predict, *, n_ctx, margins):
        holder = read_holder(lock_path_for("cpu"))
        self.lock_holders.add(holder["pid"] if holder else None)
        speculative = arm.spec_types != ("none",)
        return RunResult(tokens_per_second=80.0 if speculative else 40.0, n_generated=n_predict,
                         tokens=tuple(range(n_predict)), margins=(1.0,) * n_predict if margins else None,
                         n_prompt=len(prompt.tokens), n_steps=n_predict // 2 if speculative else n_predict,
                         n_drafted=n_predict * 2 if speculative else 0, n_accepted=n_predict // 2 if speculative else 0)

    def close(self):
        self.closed = True


class QuietDetector:
    uninspectable = set()

    def __init__(self, **options):
        self.options = options

    def preflight(self):
        return []

    def begin_window(self):
        pass

    def end_window(self):
        return []


class NoGpu:
    def sample(self):
        return []


def test_measurement_end_to_end_with_a_fake_session(models, tmp_path, monkeypatch):
    monkeypatch.setenv("PYLLAMASPEC_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(command, "PyllamaspecBackend", FakeSessionBackend)
    monkeypatch.setattr(command, "CotenantDetector", QuietDetector)
    monkeypatch.setattr(command, "GpuTelemetry", NoGpu)
    output = tmp_path / "bench.json"
    status = run_command(parse("-m", str(models["target"]), "-md", str(models["draft-q4"]), "--spec-type",
                           "draft-simple", "--classes", "code", "--depth", "0,32", "--repeat", "2", "--n-predict",
                           "8", "-ngl", "0", "--json", str(output), "--md", str(tmp_path / "bench.md")))
    assert status == 0
    backend = FakeSessionBackend.instances[-1]
    assert backend.lock_holders == {os.getpid()}  # every generation ran under our device lock
    assert backend.closed and read_holder(lock_path_for("cpu")) is None  # and it was released afterwards
    document = json.loads(output.read_text())
    environment = document["environment"]
    assert environment["models"]["target"]["sha256"] and "drafter draft-q4" in environment["models"]
    assert environment["locks"][0]["device"] == "cpu" and environment["locks"][0]["held"] is True
    assert environment["cotenant"]["policy"] == "flag"
    assert environment["params"]["arms"] == ["plain", "draft-simple@draft-q4"]
    assert {(r["arm"], r["depth"]) for r in document["records"]} == \
        {("plain", 0), ("plain", 32), ("draft-simple@draft-q4", 0), ("draft-simple@draft-q4", 32)}
    draft = next(r for r in document["records"] if r["arm"] == "draft-simple@draft-q4")
    assert draft["speedup_vs_plain"]["median"] == 2.0 and draft["equal_to_plain"]["kind"] == "identical"
    assert "draft-simple@draft-q4" in (tmp_path / "bench.md").read_text()
