"""The `pyllamaspec` command: one error format for every command, help with a default on every option, the
flag groups generate and bench share, prompts from -p/-f, and plain decoding said out loud."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import CLI

from pyllamaspec.bench.plan import Arm
from pyllamaspec.cli import bench as bench_cmd
from pyllamaspec.cli import flags
from pyllamaspec.cli import generate as generate_cmd
from pyllamaspec.cli import main
from pyllamaspec.cli import session_flags
from pyllamaspec.cli.app import build_parser
from pyllamaspec.config import DEFAULT_N_MAX, SessionConfig

ROOT = Path(__file__).resolve().parent.parent
SHARED_GROUPS = ("model placement", "context, batch and threads", "speculative decoding")


def subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def options(parser: argparse.ArgumentParser, group: str | None = None) -> dict[str, argparse.Action]:
    groups = [g for g in parser._action_groups if group is None or g.title == group]
    return {a.option_strings[0]: a for g in groups for a in g._group_actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_every_option_says_its_default(command: str) -> None:
    missing = [flag for flag, action in options(subparser(command)).items()
               if "default" not in (action.help or "")]
    assert missing == []


@pytest.mark.parametrize("group", SHARED_GROUPS)
def test_generate_and_bench_spell_the_shared_flags_alike(group: str) -> None:
    generate, bench = options(subparser("generate"), group), options(subparser("bench"), group)
    assert generate and set(generate) == set(bench)
    for flag in generate:
        assert generate[flag].option_strings == bench[flag].option_strings
        assert generate[flag].dest == bench[flag].dest


def test_llama_cpp_flags_reach_the_configuration() -> None:
    args = subparser("generate").parse_args(
        ["-ngl", "0", "-t", "3", "-ctkd", "q8_0", "-ctvd", "q4_0", "--no-mmap", "--spec-ngram-min-hits", "2",
         "-tb", "5", "-fa", "off", "--temp", "0.5", "-ot", "exps=CPU", "-dev", "CUDA0,CUDA1"])
    target, drafter = flags.model_configs(args)
    assert (target.n_gpu_layers, target.use_mmap, tuple(target.tensor_overrides), tuple(target.devices)) == (
        0, False, ("exps=CPU",), ("CUDA0", "CUDA1"))
    assert (drafter.n_gpu_layers, drafter.use_mmap, drafter.tensor_overrides) == (0, False, None)  # -ngld: as -ngl
    cfg = session_flags.session_config(args, None, margins=False)
    assert (cfg.n_threads, cfg.n_threads_batch, cfg.cache_type_k_draft, cfg.cache_type_v_draft) == (
        3, 5, "q8_0", "q4_0")
    assert (cfg.ngram_min_hits, cfg.flash_attn, cfg.temp) == (2, False, 0.5)
    same = session_flags.session_config(subparser("generate").parse_args(["-t", "3"]), None, margins=False)
    assert same.n_threads_batch == 3  # -tb defaults to -t, as in llama.cpp


def test_the_draft_ceiling_defaults_alike_in_the_api_generate_and_bench() -> None:
    generate_args = subparser("generate").parse_args([])
    assert session_flags.session_config(generate_args, ("ngram-mod",), margins=False).n_max == DEFAULT_N_MAX
    assert SessionConfig().n_max == DEFAULT_N_MAX
    bench_args = subparser("bench").parse_args(["-m", "t.gguf", "--spec-type", "ngram-mod"])
    from pyllamaspec.bench.backends import PyllamaspecBackend
    from pyllamaspec.bench.command import build_arms

    arm = next(a for a in build_arms(bench_args) if a.name != "plain")
    config = PyllamaspecBackend("t.gguf", api=type("Api", (), {"SessionConfig": SessionConfig})()).session_config(
        arm, n_ctx=512, margins=False)
    assert config.n_max == DEFAULT_N_MAX
    for parser in (subparser("generate"), subparser("bench")):
        assert f"(default: {DEFAULT_N_MAX})" in options(parser)["--spec-draft-n-max"].help


def test_bench_passes_the_shared_flags_to_its_sessions_and_models() -> None:
    args = subparser("bench").parse_args(["-m", "t.gguf", "-ngl", "0", "-ctk", "q8_0", "-t", "2", "--no-mmap",
                                          "--spec-draft-n-min", "1", "--spec-type", "ngram-mod"])
    options_ = bench_cmd.run_options(args)
    assert (options_.target.n_gpu_layers, options_.drafter.n_gpu_layers, options_.target.use_mmap) == (0, 0, False)
    assert options_.session == {"cache_type_k": "q8_0", "n_threads": 2, "n_threads_batch": 2}
    from pyllamaspec.bench.backends import PyllamaspecBackend

    backend = PyllamaspecBackend("t.gguf", api=type("Api", (), {"SessionConfig": SessionConfig})(),
                                 session_options=options_.session, speculative_options=options_.speculative)
    spec = backend.session_config(Arm("ngram-mod", ("ngram-mod",), 4), n_ctx=512, margins=False)
    plain = backend.session_config(Arm("plain"), n_ctx=512, margins=False)
    assert (spec.cache_type_k, spec.n_min, spec.n_threads) == ("q8_0", 1, 2)
    assert (plain.cache_type_k, plain.n_min) == ("q8_0", 0)  # draft settings only for speculative arms


@pytest.mark.parametrize(("argv", "needle"), [
    (["generate", "-p", "a", "-f", "{tmp}/missing.txt"], "prompt file {tmp}/missing.txt does not exist"),
    (["generate", "-f", "{tmp}"], "prompt file {tmp} is a directory"),
    (["generate", "-m", "{tmp}/none.gguf"], "is not a file here"),
    (["generate", "-m", "{tmp}", "--temp", "nan"], "temp=nan must be a finite number"),
    (["generate", "-n", "many"], "generate: argument -n/--n-predict: invalid int value"),
    (["inspect", "{tmp}/none.gguf"], "no such file"),
    (["convert", "{tmp}", "--target", "{tmp}/t.gguf", "-o", "{tmp}/o.gguf"], "has no config.json"),
    (["quantize", "{tmp}/none.gguf", "{tmp}/o.gguf"], "does not exist"),
    (["download", "--alias", "no-such-alias"], "unknown alias"),
    (["synth", "{tmp}/s.gguf", "--seed", "-1"], "seed=-1 must be an integer within"),
    (["bench", "--spec-type", "ngram-mod"], "give the target model with -m"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_every_command_reports_errors_one_way(tmp_path: Path, argv: list[str], needle: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([*CLI, *argv], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("pyllamaspec: error: ") and needle.replace("{tmp}", str(tmp_path)) in last
    assert "Traceback" not in p.stderr


def test_prompts_from_p_and_f_keep_their_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    args = subparser("generate").parse_args(["-p", "first", "-f", str(tmp_path / "b.txt"), "-p", "third"])
    assert generate_cmd.read_prompts(args.prompts) == ["first", "second\n", "third"]
    assert generate_cmd.read_prompts(None) == [generate_cmd.DEFAULT_PROMPT]
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(Exception, match="is not UTF-8 text"):
        generate_cmd.read_prompts(subparser("generate").parse_args(["-f", str(tmp_path / "latin1.txt")]).prompts)


def test_plain_decoding_is_announced_and_reported_as_such(dense_pair, capsys) -> None:
    target, _ = dense_pair
    assert main(["generate", "-m", str(target), "-p", "hello", "-n", "6", "--raw", "--no-memory-check"]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if line.startswith("pyllamaspec: warning:")]
    assert len(warnings) == 1 and "-md DRAFTER" in warnings[0] and "--spec-type ngram-mod" in warnings[0]
    assert err[-1].startswith("[plain decoding] 6 tokens") and "n_max" not in err[-1]


def test_speculation_is_not_warned_about(dense_pair, capsys) -> None:
    target, drafter = dense_pair
    assert main(["generate", "-m", str(target), "-md", str(drafter), "-p", "hello", "-n", "6", "--raw",
                 "--no-memory-check", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    out = json.loads(captured.out)
    assert out["session"]["spec_types"] == ["draft-simple"] and out["session"]["n_max_requested"] == DEFAULT_N_MAX


def test_adaptive_and_synthetic_acceptance_are_said_in_the_stats_line(dense_pair, capsys) -> None:
    target, drafter = dense_pair
    assert main(["generate", "-m", str(target), "-md", str(drafter), "-p", "hello", "-n", "24", "--raw",
                 "--no-memory-check", "--spec-adaptive", "off", "--spec-draft-n-max", "4",
                 "--spec-synth-rates", "1,1,1,1"]) == 0
    line = capsys.readouterr().err.splitlines()[-1]
    assert "n_max=4 fixed SYNTHETIC ACCEPTANCE" in line
    assert "acceptance 1.00" in line
    assert main(["generate", "-m", str(target), "-md", str(drafter), "-p", "hello", "-n", "6", "--raw",
                 "--no-memory-check", "--json", "--spec-adaptive", "on"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["session"]["adaptive"] is True and out["session"]["synthetic"] is False
