"""External comparison arms: upstream's ``llama-speculative-simple`` and llama-cpp-python.

Both are reported as ratios to one of our arms. Upstream's binary loads the model on every run, so each of its
runs is a first-after-load run; the record says so. llama-cpp-python runs in a worker process of its own, so its
copy of llama.cpp never shares an address space or a GPU context with ours, and its model stays loaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from pyllamaspec.bench.backends import RenderedPrompt, RunResult
from pyllamaspec.bench.plan import Arm
from pyllamaspec.errors import PyllamaspecError

SPECULATIVE_SIMPLE_NAME = "llama-speculative-simple"
WORKER_SCRIPT = Path(__file__).with_name("llama_cpp_python_worker.py")


class ExternalArmError(PyllamaspecError):
    """An external comparison arm could not be run or its output could not be read."""


def packaged_speculative_simple() -> Path | None:
    """The binary installed inside this package (built with PYLLAMASPEC_BUILD_UPSTREAM_SPECULATIVE), if any."""
    candidate = Path(__file__).resolve().parent.parent / "bin" / SPECULATIVE_SIMPLE_NAME
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+)\s+t/s")
_COUNTERS = {name: re.compile(rf"\b{name}\s*=\s*(\d+)") for name in ("n_draft", "n_predict", "n_drafted", "n_accept")}


def parse_speculative_simple_output(output: str) -> dict:
    """The figures upstream prints at the end of a run: decoded tokens, seconds, speed and draft counters."""
    decoded = _DECODED.search(output)
    if decoded is None:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise ExternalArmError(f"{SPECULATIVE_SIMPLE_NAME} printed no 'decoded N tokens in X seconds' line; "
                               f"its output ended with:\n{tail}")
    figures = {"n_decoded": int(decoded.group(1)), "seconds": float(decoded.group(2)),
               "tokens_per_second": float(decoded.group(3))}
    for name, pattern in _COUNTERS.items():
        match = pattern.search(output)
        figures[name] = int(match.group(1)) if match else None
    return figures


class SpeculativeSimpleBackend:
    """Runs upstream's ``llama-speculative-simple`` once per generation, with our arm's settings."""

    def __init__(
        self,
        binary: str | Path,
        target_path: str | Path,
        drafter_paths: Mapping[str, str | Path] | None = None,
        *,
        n_gpu_layers: int = -1,
        n_threads: int | None = None,
        seed: int = 0,
        timeout_s: float = 1800.0,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    ):
        self.binary = Path(binary)
        self.target_path = Path(target_path)
        self.drafter_paths = {label: Path(path) for label, path in (drafter_paths or {}).items()}
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads
        self.seed = seed
        self.timeout_s = timeout_s
        self.run = run

    def command(self, arm: Arm, prompt_file: Path, n_predict: int, n_ctx: int) -> list[str]:
        # upstream reads -1 as "auto"; ours means every layer, which upstream spells "all"
        layers = "all" if self.n_gpu_layers < 0 else str(self.n_gpu_layers)
        # -b n_ctx: the example refuses prompts longer than one batch
        command = [str(self.binary), "-m", str(self.target_path), "-f", str(prompt_file), "-n", str(n_predict),
                   "-c", str(n_ctx), "-b", str(n_ctx), "--temp", "0", "--seed", str(self.seed), "-ngl", layers,
                   "--spec-type", ",".join(arm.spec_types)]
        if self.n_threads is not None:
            command += ["-t", str(self.n_threads)]
        if arm.n_max is not None:
            command += ["--spec-draft-n-max", str(arm.n_max)]
        if arm.drafter is not None:
            command += ["-md", str(self.drafter_paths[arm.drafter]), "-ngld", layers]
        return command

    def generate(self, arm: Arm, prompt: RenderedPrompt, n_predict: int, *, n_ctx: int,
                 margins: bool) -> RunResult:
        with tempfile.TemporaryDirectory(prefix="pyllamaspec-bench-") as scratch:
            prompt_file = Path(scratch) / "prompt.txt"
            # upstream strips one trailing newline from a prompt file; rendered prompts often end in one
            prompt_file.write_text(prompt.text + "\n")
            command = self.command(arm, prompt_file, n_predict, n_ctx)
            try:
                completed = self.run(command, capture_output=True, text=True, timeout=self.timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired) as error:
                raise ExternalArmError(f"{self.binary} could not be run: {error}") from error
        output = completed.stdout + "\n" + completed.stderr
        if completed.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-5:])
            raise ExternalArmError(f"{self.binary} exited with status {completed.returncode}:\n{tail}")
        figures = parse_speculative_simple_output(output)
        return RunResult(tokens_per_second=figures["tokens_per_second"], n_generated=figures["n_decoded"],
                         n_prompt=len(prompt.tokens), n_drafted=figures["n_drafted"],
                         n_accepted=figures["n_accept"])

    def close(self) -> None:
        """Nothing stays running between generations."""


class LlamaCppPythonBackend:
    """Plain greedy decoding through llama-cpp-python, in a long-lived worker process."""

    def __init__(
        self,
        target_path: str | Path,
        *,
        n_gpu_layers: int = -1,
        n_threads: int | None = None,
        seed: int = 0,
        python: str = sys.executable,
    ):
        self.target_path = Path(target_path)
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads
        self.seed = seed
        self.python = python
        self._worker: subprocess.Popen | None = None
        self._worker_n_ctx: int | None = None
        self._worker_log = None

    def _start(self, n_ctx: int) -> None:
        """Start the worker (once per context size: the runner uses one for the whole benchmark)."""
        if self._worker is not None and self._worker_n_ctx == n_ctx:
            return
        self.close()
        command = [self.python, str(WORKER_SCRIPT), "--model", str(self.target_path), "--n-ctx", str(n_ctx),
                   "--n-gpu-layers", str(self.n_gpu_layers), "--seed", str(self.seed)]
        if self.n_threads is not None:
            command += ["--threads", str(self.n_threads)]
        # a file, not a pipe, for its log: nobody reads stderr while it runs, and a full pipe would stall it
        self._worker_log = tempfile.TemporaryFile(mode="w+")
        self._worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._worker_log, text=True)
        self._worker_n_ctx = n_ctx
        self._exchange(None)  # the worker says it is ready once the model is loaded

    def _exchange(self, request: dict | None) -> dict:
        worker = self._worker
        if request is not None:
            worker.stdin.write(json.dumps(request) + "\n")
            worker.stdin.flush()
        line = worker.stdout.readline()
        reply = json.loads(line) if line else {"error": "the worker exited"}
        if "error" in reply:
            self._worker_log.seek(0)
            tail = "\n".join(self._worker_log.read().strip().splitlines()[-5:])
            raise ExternalArmError(f"llama-cpp-python worker: {reply['error']}\n{tail}")
        return reply

    def generate(self, arm: Arm, prompt: RenderedPrompt, n_predict: int, *, n_ctx: int,
                 margins: bool) -> RunResult:
        self._start(n_ctx)
        reply = self._exchange({"tokens": list(prompt.tokens), "n_predict": n_predict})
        return RunResult(tokens_per_second=reply["tokens_per_second"], n_generated=len(reply["tokens"]),
                         tokens=tuple(reply["tokens"]), n_prompt=len(prompt.tokens))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stdin.close()  # end of input: the worker leaves its loop and exits
            try:
                self._worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._worker.kill()
                self._worker.wait()
            self._worker = None
        if self._worker_log is not None:
            self._worker_log.close()
            self._worker_log = None
