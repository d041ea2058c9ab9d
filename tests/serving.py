"""Servers for the tests that drive one: `pyllamaspec serve` in a subprocess, or an app under uvicorn in a
thread (where a test holds the model load or the batch)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from clirun import CLI

TIMEOUT = 60.0


class ServerProcess:
    """`pyllamaspec serve --port 0` in a subprocess; output goes to files (a full pipe would block it)."""

    def __init__(self, args: list[str], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = workdir / "server.out", workdir / "server.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        # cwd elsewhere than the repository: `-m` must import the installed package, not the source tree
        self.proc = subprocess.Popen([*CLI, "serve", *args, "--host", "127.0.0.1",
                                      "--port", "0"], stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                     cwd=workdir)
        self.url = None

    def wait_listening(self, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out_path.read_text().splitlines():
                if "listening on http://" in line:
                    self.url = line.split("listening on ")[1].strip()
                    return self.url
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}: {self.err_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError("the server did not open its port")

    def wait_ready(self, timeout: float = TIMEOUT) -> None:
        self.wait_listening()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}: {self.err_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError("the server did not become ready")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                    raise AssertionError(f"the server did not stop within {timeout} s after {sig!r}")
            return self.proc.returncode
        finally:
            self._out.close()
            self._err.close()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()




class InProcessServer:
    def __init__(self, app) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def wait_ready(self, timeout: float = TIMEOUT) -> "InProcessServer":
        """Until /health says the model is loaded (it loads in a thread after the server starts)."""
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/health", timeout=TIMEOUT).status_code != 200:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the model did not load"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the server did not stop"
