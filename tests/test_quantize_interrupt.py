"""quantize is interruptible: Ctrl-C and SIGTERM end it at once and leave nothing; leftovers of killed runs go."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clirun import CLI

from pyllamaspec.tools import synth
from pyllamaspec.atomicfile import remove_stale_partials
from pyllamaspec.ggufinfo import read_summary
from pyllamaspec.tools.quantize import quantize

SHAPE = synth.TargetShape(arch="qwen3", n_vocab=512, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512)


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory) -> Path:
    return synth.write_target(tmp_path_factory.mktemp("qint") / "t32.gguf", SHAPE, seed=4)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _start_and_freeze_worker(args: list[str]) -> tuple[subprocess.Popen, int]:
    """Start `pyllamaspec quantize`, wait for its quantizer process and stop it (SIGSTOP): whatever the speed
    of the machine, the quantization cannot finish before the signal under test arrives."""
    # Ctrl-C acts as in a terminal even where this test runs with SIGINT ignored (a background job)
    cli = subprocess.Popen([*CLI, "quantize", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while cli.poll() is None:
        for kid in _children(cli.pid):
            try:
                if b"_worker_main" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    os.kill(kid, signal.SIGSTOP)
                    return cli, kid
            except OSError:
                continue
        time.sleep(0.005)
    out, err = cli.communicate()
    raise AssertionError(f"quantize ended before its quantizer process was seen: {cli.returncode} {err}")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.parametrize("sig, status, word", [(signal.SIGTERM, 143, "terminated"),
                                               (signal.SIGINT, 130, "interrupted")])
def test_a_signal_ends_quantize_at_once_and_leaves_nothing(f32_model, tmp_path, sig, status, word):
    out = tmp_path / "q.gguf"
    cli, worker = _start_and_freeze_worker([str(f32_model), str(out), "--type", "Q4_0"])
    try:
        assert any(p.name.endswith(".partial") for p in tmp_path.iterdir())  # it was writing
        cli.send_signal(sig)
        stdout, stderr = cli.communicate(timeout=60)
        assert cli.returncode == status, stderr
        assert word in stderr and "Traceback" not in stderr and stdout == ""
        assert list(tmp_path.iterdir()) == []  # no output, no partial
        assert _gone(worker)
    finally:  # whatever failed above, leave no stopped quantizer behind
        if not _gone(worker) and b"_worker_main" in Path(f"/proc/{worker}/cmdline").read_bytes():
            os.kill(worker, signal.SIGKILL)
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def test_quantize_from_another_thread_reports_progress(f32_model, tmp_path):
    seen, result = [], {}

    def work():
        result["r"] = quantize(f32_model, tmp_path / "q8.gguf", "Q8_0", progress=lambda d, n: seen.append((d, n)))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert result["r"]["bytes_out"] < result["r"]["bytes_in"]
    assert read_summary(tmp_path / "q8.gguf").file_type == "Q8_0"
    n_tensors = len(read_summary(f32_model).tensors)
    assert [d for d, _ in seen] == list(range(n_tensors)) and {n for _, n in seen} == {n_tensors}


def test_an_exception_in_the_caller_ends_the_quantizer_and_removes_the_partial(f32_model, tmp_path):
    class Stop(Exception):
        pass

    def stop_at_third(done, total):
        if done == 2:
            raise Stop()

    with pytest.raises(Stop):
        quantize(f32_model, tmp_path / "q.gguf", "Q4_0", progress=stop_at_third)
    assert list(tmp_path.iterdir()) == []


def _partial(out: Path, hex12: str, age_s: float) -> Path:
    p = out.parent / f".{out.name}.{hex12}.partial"
    p.write_bytes(b"left by a killed run")
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_a_stale_partial_of_the_same_output_is_removed_and_nothing_else(f32_model, tmp_path):
    out = tmp_path / "q.gguf"
    stale = _partial(out, "0123456789ab", age_s=3600)
    fresh = _partial(out, "ba9876543210", age_s=0)  # may belong to a writer that has yet to lock it
    other_output = _partial(tmp_path / "other.gguf", "0123456789ab", age_s=3600)
    users = [tmp_path / f".{out.name}.backup.partial", tmp_path / f".{out.name}.0123456789ab.partial.keep",
             tmp_path / f"{out.name}.0123456789ab.partial"]
    for p in users:
        p.write_bytes(b"mine")
        os.utime(p, (0, 0))
    quantize(f32_model, out, "Q8_0")
    assert out.exists() and not stale.exists()
    assert fresh.exists() and other_output.exists() and all(p.exists() for p in users)


def test_a_partial_a_live_writer_holds_is_never_removed(tmp_path):
    out = tmp_path / "x.gguf"
    held = _partial(out, "00112233aabb", age_s=3600)
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as atomic_output holds its temp file while writing
        assert remove_stale_partials(out) == [] and held.exists()
    finally:
        os.close(fd)
    assert remove_stale_partials(out) == [held] and not held.exists()
