"""More than one device on any machine: two rpc-servers on 127.0.0.1 and the local CPU.

Every scenario that adds servers runs in a child process (tests/rpcworker.py): servers join a process's device list
for good, and this process's other tests place their models on every device it has. What can fail without adding a
server (a closed port, a silent listener, bad endpoints) runs here, which also shows the interpreter lives on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyllamaspec import ModelConfig
from pyllamaspec.errors import ConfigError, RemoteDeviceError
from pyllamaspec.config import parse_rpc_endpoints as parse_endpoints
from pyllamaspec.rpc import add_servers

from clirun import CLI, PACKAGE_ROOT
from helpers import NEAR_TIE

WORKER = Path(__file__).with_name("rpcworker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    p = subprocess.Popen(CLI + ["rpc-server", "-p", str(port), "-t", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"rpc-server exited with {p.returncode}: {p.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return p  # (the server serves this probe, sees it close, and waits for the next client)
        time.sleep(0.1)
    p.kill()
    raise AssertionError("rpc-server did not listen within 60 s")


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)
    p.stdout.close()


@pytest.fixture()
def two_servers():
    procs = []
    try:
        for _ in range(2):
            port = free_port()
            procs.append((start_server(port), port))
        yield procs, ",".join(f"127.0.0.1:{port}" for _, port in procs)
    finally:
        for p, _ in procs:
            stop(p)


def worker(*args: str, timeout: int = 240) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=timeout,
                       cwd=Path(__file__).parent, env=env)
    assert r.returncode == 0, f"worker exited with {r.returncode}:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def assert_equal_up_to_near_tie(tokens, ref):
    for i, (a, b) in enumerate(zip(tokens, ref["tokens"])):
        if a != b:
            assert ref["margins"][i] < NEAR_TIE, f"divergence at {i}, margin {ref['margins'][i]:.4g}"
            return
    assert len(tokens) == len(ref["tokens"])


def test_split_over_two_hosts_equals_local(two_servers, dense_pair, hybrid_pair):
    _, servers = two_servers
    (dt, dd), (ht, hd) = dense_pair, hybrid_pair
    job = {"n_predict": 32, "cases": {
        "plain": {"target": str(dt), "n_layer": 2},
        "draft": {"target": str(dt), "drafter": str(dd), "n_layer": 2},
        "draft_devd": {"target": str(dt), "drafter": str(dd), "n_layer": 2, "drafter_devices": ["RPC0"]},
        "hybrid": {"target": str(ht), "drafter": str(hd), "n_layer": 4},
    }}
    out = worker("equal", servers, json.dumps(job))
    for name, r in out.items():
        assert_equal_up_to_near_tie(r["remote"]["tokens"], r["local"])
        assert r["remote"]["head"] == "RPC1", name  # the output layer on the last device of the split
    # the drafter goes where the target's head is, unless -devd says otherwise
    assert out["draft"]["remote"]["draft_device"] == "RPC1"
    assert out["hybrid"]["remote"]["draft_device"] == "RPC1"
    assert out["draft_devd"]["remote"]["draft_device"] == "RPC0"
    for name in ("draft", "draft_devd", "hybrid"):
        assert out[name]["remote"]["n_drafted"] > 0
    # the hybrid target rolls rejected drafts back through its snapshot ring, remotely as locally
    assert out["hybrid"]["remote"]["n_rollback_ring"] > 0
    assert out["hybrid"]["remote"]["n_rollback_ring"] == out["hybrid"]["local"]["n_rollback_ring"]


def test_host_killed_mid_generation(two_servers, dense_pair):
    procs, servers = two_servers
    out = worker("kill", servers, str(procs[1][0].pid), str(dense_pair[0]))
    assert out["error"] is not None and "127.0.0.1:" in out["error"] and "unusable" in out["error"]
    assert out["steps_before"] >= 3
    assert out["health"] is not None and "unusable" in out["health"]
    assert out["after"] is not None  # every later call is refused the same way
    assert out["local_tokens"] == 8  # and the process goes on


def test_closed_port_is_a_typed_error():
    port = free_port()  # nothing listens there
    with pytest.raises(RemoteDeviceError, match=f"127.0.0.1:{port}"):
        add_servers(f"127.0.0.1:{port}", timeout=2)


def test_unresolvable_host_is_a_typed_error():
    with pytest.raises(RemoteDeviceError, match="no-such-host.invalid"):
        add_servers("no-such-host.invalid:50052", timeout=2)


def test_listener_that_never_answers_is_bounded():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)  # the kernel accepts connections; nobody reads or answers
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(RemoteDeviceError, match="handshake"):
            add_servers(f"127.0.0.1:{port}", timeout=1)
        assert time.monotonic() - t0 < 30  # bounded by the timeout, not a hang


@pytest.mark.parametrize("bad", ["127.0.0.1", ":50052", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                                 "127.0.0.1:port", "[::1]:50052", "host name:1", "a:1,,b:2"])
def test_bad_endpoints_are_refused(bad):
    with pytest.raises(ConfigError):
        parse_endpoints(bad)
    with pytest.raises(ConfigError):
        ModelConfig(rpc=bad)


def test_endpoints_are_normalised():
    assert parse_endpoints(" 127.0.0.1:0050052 ,localhost:7,127.0.0.1:50052") == ("127.0.0.1:50052", "localhost:7")
    assert parse_endpoints(None) is None


def test_cli_bad_rpc_flag(dense_pair):
    r = subprocess.run(CLI + ["generate", "-m", str(dense_pair[0]), "--rpc", "127.0.0.1", "-n", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "pyllamaspec: error:" in r.stderr and "HOST:PORT" in r.stderr


def test_cli_rpc_server_refusals():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run(CLI + ["rpc-server", "-p", str(port)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"127.0.0.1:{port}" in r.stderr and "-p" in r.stderr
    r = subprocess.run(CLI + ["rpc-server", "-H", "0.0.0.0", "-p", str(free_port())], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--expose" in r.stderr and "no authentication" in r.stderr
    r = subprocess.run(CLI + ["rpc-server", "-H", "my-host", "-p", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "IPv4" in r.stderr
    r = subprocess.run(CLI + ["rpc-server", "-p", str(free_port()), "-d", "GPU7"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "unknown device GPU7" in r.stderr and "CPU" in r.stderr


def test_server_answers_503_for_the_model_when_a_host_dies(two_servers, dense_pair, tmp_path):
    import httpx

    procs, servers = two_servers
    out, err = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")
    serve = subprocess.Popen(CLI + ["serve", "-m", str(dense_pair[0]), "--spec-type", "none", "--rpc", servers,
                                    "-dev", "RPC0,RPC1", "-ngl", "99", "--host", "127.0.0.1", "--port", "0"],
                             stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None or httpx.get(url + "/health", timeout=10).status_code != 200:
            assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            for line in (tmp_path / "out").read_text().splitlines():
                if "listening on http://" in line:
                    url = line.split("listening on ")[1].strip()
            time.sleep(0.1)
        body = {"prompt": [1, 5, 9, 2, 7], "max_tokens": 4}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
        stop(procs[1][0])
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 503 and "unusable" in r.json()["error"]["message"], r.text
        r = httpx.get(url + "/health", timeout=10)
        assert r.status_code == 503 and "unusable" in r.json()["error"]["message"]
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 503
        assert serve.poll() is None  # the server stays up
        serve.terminate()
        assert serve.wait(60) == 0, (tmp_path / "err").read_text()
        assert "Traceback" not in (tmp_path / "err").read_text()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
        out.close()
        err.close()
