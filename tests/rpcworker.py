"""Runs one loopback RPC scenario in its own process and prints one JSON line: rpc-servers join the process's device
list for good, so the test process itself never adds them (its other tests place models on every device).

    python rpcworker.py equal SERVERS JOB_JSON       local reference runs, then the same runs split over the servers
    python rpcworker.py kill SERVERS PID TARGET      a server (PID) killed during a generation on it
"""

from __future__ import annotations

import json
import os
import signal
import sys

from pyllamaspec import Model, ModelConfig, SessionConfig, SpecSession
from pyllamaspec.errors import RemoteDeviceError

PROMPT = [1, 5, 9, 2, 7, 3, 8, 1, 5, 9, 2, 7]
LOCAL = ModelConfig(devices=["none"])  # the CPU alone, whatever devices the process has


def session_config(spec: bool, **kw) -> SessionConfig:
    types = ["draft-simple"] if spec else []
    return SessionConfig(spec_types=types, adaptive=False, n_max=4, margins=True, n_ctx=512, ignore_eos=True, **kw)


def run(target: Model, drafter: Model | None, n_predict: int) -> dict:
    with SpecSession(target, drafter, session_config(drafter is not None)) as s:
        r = s.generate(PROMPT, n_predict)
        st = r.stats
        return {"tokens": list(r.tokens), "margins": list(r.margins), "head": s.info.target_head_device,
                "draft_device": s.info.draft_device, "n_drafted": st.n_drafted, "n_accepted": st.n_accepted,
                "n_rollback_ring": st.n_rollback_ring}


def equal(servers: str, job: dict) -> dict:
    out = {}
    n = job["n_predict"]
    for name, case in job["cases"].items():
        with Model(case["target"], LOCAL) as t:
            d = Model(case["drafter"], LOCAL) if case.get("drafter") else None
            out[name] = {"local": run(t, d, n)}
            if d is not None:
                d.close()
    from pyllamaspec.placement import drafter_config

    for name, case in job["cases"].items():
        tcfg = ModelConfig(rpc=servers, devices=["RPC0", "RPC1"], tensor_split=[1, 1],
                           n_gpu_layers=case["n_layer"])  # layer 0 on the CPU, the rest and the head on the servers
        with Model(case["target"], tcfg) as t:
            d = None
            if case.get("drafter"):
                dcfg = ModelConfig(rpc=servers, devices=case.get("drafter_devices"))
                d = Model(case["drafter"], drafter_config(case["target"], tcfg, dcfg))
            r = run(t, d, n)
            r["target_head"] = t.info.head_device
            out[name]["remote"] = r
            if d is not None:
                d.close()
    return out


def kill(servers: str, pid: int, target: str) -> dict:
    tcfg = ModelConfig(rpc=servers, devices=["RPC0", "RPC1"], tensor_split=[1, 1], n_gpu_layers=99)
    result: dict = {}
    with Model(target, tcfg) as t, SpecSession(t, None, session_config(False)) as s:
        n = 0
        try:
            for _piece in s.stream_tokens(PROMPT, 100000):
                n += 1
                if n == 3:
                    os.kill(pid, signal.SIGKILL)
            result["error"] = None
        except RemoteDeviceError as e:
            result["error"] = str(e)
        result["steps_before"] = n
        result["health"] = s.health()
        try:
            s.generate(PROMPT, 4)
            result["after"] = None
        except RemoteDeviceError as e:
            result["after"] = str(e)
    # the process lives on: a session on the local CPU still generates
    with Model(target, LOCAL) as t, SpecSession(t, None, session_config(False)) as s:
        result["local_tokens"] = len(s.generate(PROMPT, 8).tokens)
    return result


def main() -> None:
    mode, servers = sys.argv[1], sys.argv[2]
    if mode == "equal":
        out = equal(servers, json.loads(sys.argv[3]))
    else:
        out = kill(servers, int(sys.argv[3]), sys.argv[4])
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
