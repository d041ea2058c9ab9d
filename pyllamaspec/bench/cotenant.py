"""Co-tenant detection: other work on the device or the CPUs that would make a figure lie.

A co-tenant halving throughput looks exactly like thermal throttling, so the harness looks for one before the
run and during every measured run, and samples GPU temperature and clocks so the two can be told apart.
Everything the detector reads comes through a ``ProcessTable`` and a ``CommandRunner`` so tests can fake the
machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

from pyllamaspec.errors import PyllamaspecError

CotenantPolicy = Literal["refuse", "flag"]

# Per-GPU device nodes only: /dev/nvidiactl and /dev/nvidia-uvm are opened by any CUDA-aware tool and prove nothing.
GPU_DEVICE_NODE = re.compile(r"^/dev/(nvidia\d+|kfd|dri/renderD\d+)$")

# Daemons that keep GPU nodes open without doing work on them.
DEFAULT_IGNORED_NAMES = frozenset({"nvidia-persistenced"})

NVIDIA_APPS_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
NVIDIA_TELEMETRY_QUERY = ["nvidia-smi", "--query-gpu=index,temperature.gpu,clocks.sm,clocks.max.sm,power.draw",
                          "--format=csv,noheader,nounits"]
ROCM_PIDS_QUERY = ["rocm-smi", "--showpids"]
ROCM_TELEMETRY_QUERY = ["rocm-smi", "--showtemp", "--showpower", "--showclocks", "--json"]


class CotenantError(PyllamaspecError):
    """Another process was using the device or the CPUs and the policy is to refuse."""

    def __init__(self, findings: Sequence[Finding], when: str):
        self.findings = list(findings)
        listed = "; ".join(finding.describe() for finding in self.findings)
        super().__init__(f"co-tenant detected {when}: {listed}. Stop it, or use --cotenant flag to run anyway "
                         f"with every figure marked contaminated (--cotenant-ignore NAME for a known-benign process)")


@dataclass(frozen=True)
class Finding:
    """One reason to distrust a figure."""

    kind: Literal["gpu-process", "cpu-process", "load-average"]
    source: str  # the probe that saw it: nvidia-smi, rocm-smi, proc-fd, proc-stat, loadavg
    name: str
    pid: int | None = None
    detail: str = ""

    def describe(self) -> str:
        who = f"{self.name} (pid {self.pid})" if self.pid is not None else self.name
        return f"{self.kind} {who} via {self.source}" + (f": {self.detail}" if self.detail else "")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    ppid: int
    name: str
    cpu_ticks: int  # utime + stime of all threads, in clock ticks


class ProcessTable(Protocol):
    """What the detector needs to know about the machine's processes."""

    ticks_per_second: float

    def processes(self) -> dict[int, ProcessSample]: ...

    def device_paths(self, pid: int) -> list[str] | None:
        """Targets of the process's open descriptors; None when it cannot be inspected (another user's)."""

    def loadavg(self) -> tuple[float, float, float]: ...


CommandRunner = Callable[[Sequence[str]], "str | None"]
"""Runs a tool and returns its stdout, or None when the tool is absent or failed."""


def run_command(argv: Sequence[str], timeout_s: float = 15.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout if completed.returncode == 0 else None


class LinuxProcessTable:
    """The real process table, read from /proc."""

    def __init__(self, proc_root: Path = Path("/proc")):
        self.proc_root = proc_root
        self.ticks_per_second = float(os.sysconf("SC_CLK_TCK"))

    def processes(self) -> dict[int, ProcessSample]:
        table = {}
        for entry in self.proc_root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                # the command name is parenthesised and may itself contain spaces and parentheses
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                # fields[0] is field 3 (state) of proc(5): ppid is field 4, utime 14, stime 15
                sample = ProcessSample(pid=int(entry.name), ppid=int(fields[1]), name=name,
                                       cpu_ticks=int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                continue  # exited (or half-gone) while we were listing
            table[sample.pid] = sample
        return table

    def device_paths(self, pid: int) -> list[str] | None:
        fd_dir = self.proc_root / str(pid) / "fd"
        try:
            entries = list(fd_dir.iterdir())
        except PermissionError:
            return None
        except OSError:
            return []  # exited
        targets = []
        for entry in entries:
            try:
                targets.append(os.readlink(entry))
            except OSError:
                continue
        return targets

    def loadavg(self) -> tuple[float, float, float]:
        return os.getloadavg()


def own_process_tree(processes: dict[int, ProcessSample], root_pid: int) -> set[int]:
    """The root and all its descendants: the harness and whatever it started (servers, external arms)."""
    children: dict[int, list[int]] = {}
    for sample in processes.values():
        children.setdefault(sample.ppid, []).append(sample.pid)
    tree, pending = set(), [root_pid]
    while pending:
        pid = pending.pop()
        if pid not in tree:
            tree.add(pid)
            pending.extend(children.get(pid, ()))
    return tree


def parse_nvidia_apps(output: str) -> list[tuple[int, str, str]]:
    """(pid, process name, used memory) per line of the compute-apps query."""
    apps = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            apps.append((int(parts[0]), ",".join(parts[1:-1]), parts[-1]))
    return apps


def parse_rocm_pids(output: str) -> list[tuple[int, str]]:
    """(pid, process name) per row of ``rocm-smi --showpids`` ("PID  PROCESS NAME  GPU(s)  VRAM USED ...")."""
    apps = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            apps.append((int(parts[0]), parts[1]))
    return apps


class CotenantDetector:
    """Finds other processes on the GPU and busy processes on the CPUs, excluding this harness's process tree.

    Use ``preflight`` before models are loaded and ``begin_window``/``end_window`` around every measured run:
    the CPU figures of a window cover exactly the run between the two calls.
    """

    def __init__(
        self,
        table: ProcessTable | None = None,
        runner: CommandRunner = run_command,
        *,
        own_pid: int | None = None,
        cpu_threshold_pct: float = 10.0,
        load_threshold: float | None = None,
        ignored_names: Iterable[str] = DEFAULT_IGNORED_NAMES,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.table = table or LinuxProcessTable()
        self.runner = runner
        self.own_pid = own_pid if own_pid is not None else os.getpid()
        self.cpu_threshold_pct = cpu_threshold_pct
        # None: the load average is recorded but not judged (a GPU run); a number: judged at preflight (a CPU run)
        self.load_threshold = load_threshold
        self.ignored_names = frozenset(ignored_names)
        self.clock = clock
        self.sleep = sleep
        self.uninspectable: set[int] = set()
        self._window_start: tuple[float, dict[int, ProcessSample]] | None = None

    def gpu_findings(self, processes: dict[int, ProcessSample]) -> list[Finding]:
        own = own_process_tree(processes, self.own_pid)
        reported = [Finding("gpu-process", "nvidia-smi", Path(name).name, pid, f"{memory} in use")
                    for pid, name, memory in parse_nvidia_apps(self.runner(NVIDIA_APPS_QUERY) or "")]
        reported += [Finding("gpu-process", "rocm-smi", name, pid)
                     for pid, name in parse_rocm_pids(self.runner(ROCM_PIDS_QUERY) or "")]
        by_pid: dict[int, Finding] = {}
        # Inside a container the tools report host pids, which match nothing here - our own process included.
        # Such reports count as tenants only beyond the number of GPU users in our own tree.
        invisible: list[Finding] = []
        for finding in reported:
            if finding.pid in own or finding.name in self.ignored_names:
                continue
            if finding.pid in processes:
                by_pid.setdefault(finding.pid, finding)
            else:
                invisible.append(finding)
        own_gpu_users = 0
        for pid, sample in processes.items():
            nodes = self._gpu_nodes(pid)
            if not nodes:
                continue
            if pid in own:
                own_gpu_users += 1
            elif sample.name not in self.ignored_names:
                by_pid.setdefault(pid, Finding("gpu-process", "proc-fd", sample.name, pid, ", ".join(nodes)))
        findings = list(by_pid.values())
        unexplained = len(invisible) - own_gpu_users
        if unexplained > 0:
            pids = ", ".join(str(finding.pid) for finding in invisible)
            findings.append(Finding(
                "gpu-process", invisible[0].source, f"{unexplained} process(es) outside this pid namespace", None,
                f"{len(invisible)} reported (pids {pids}), {own_gpu_users} accounted for by this harness"))
        return findings

    def _gpu_nodes(self, pid: int) -> list[str]:
        paths = self.table.device_paths(pid)
        if paths is None:
            self.uninspectable.add(pid)
            return []
        return sorted({path for path in paths if GPU_DEVICE_NODE.match(path)})

    def cpu_findings(self, before: dict[int, ProcessSample], after: dict[int, ProcessSample],
                     elapsed_s: float) -> list[Finding]:
        """Processes outside our tree that used more than the threshold share of one core between two samples."""
        if elapsed_s <= 0:
            return []
        own = own_process_tree(after, self.own_pid)
        findings = []
        for pid, sample in after.items():
            if pid in own or sample.name in self.ignored_names:
                continue
            # a pid absent from the first sample started inside the window, so all its ticks fall within it
            ticks = sample.cpu_ticks - (before[pid].cpu_ticks if pid in before else 0)
            share_pct = ticks / self.table.ticks_per_second / elapsed_s * 100.0
            if share_pct >= self.cpu_threshold_pct:
                findings.append(Finding("cpu-process", "proc-stat", sample.name, pid,
                                        f"{share_pct:.0f}% of one core over {elapsed_s:.1f} s"))
        return findings

    def load_findings(self) -> list[Finding]:
        load_1min = self.table.loadavg()[0]
        if self.load_threshold is None or load_1min <= self.load_threshold:
            return []
        return [Finding("load-average", "loadavg", "system", None,
                        f"1-minute load {load_1min:.2f} above {self.load_threshold:.2f} before the run")]

    def preflight(self, window_s: float = 2.0) -> list[Finding]:
        """Everything before the run: GPU users, CPU hogs over a short window, and (for CPU runs) the load."""
        before, started = self.table.processes(), self.clock()
        self.sleep(window_s)
        after = self.table.processes()
        return self.gpu_findings(after) + self.cpu_findings(before, after, self.clock() - started) \
            + self.load_findings()

    def begin_window(self) -> None:
        self._window_start = (self.clock(), self.table.processes())

    def end_window(self) -> list[Finding]:
        """Findings for the span since ``begin_window``; the load average is not judged here (we are the load)."""
        if self._window_start is None:
            raise RuntimeError("end_window() without begin_window()")
        started, before = self._window_start
        self._window_start = None
        after = self.table.processes()
        return self.gpu_findings(after) + self.cpu_findings(before, after, self.clock() - started)


def enforce(findings: Sequence[Finding], policy: CotenantPolicy, when: str) -> bool:
    """Apply the policy: raise under "refuse", otherwise report whether the figures are contaminated."""
    if findings and policy == "refuse":
        raise CotenantError(findings, when)
    return bool(findings)


@dataclass(frozen=True)
class GpuSample:
    index: int
    temperature_c: float | None
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_w: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def _number(text: str) -> float | None:
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    return float(match.group()) if match else None


def parse_nvidia_telemetry(output: str) -> list[GpuSample]:
    samples = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit():
            index, temperature, clock, max_clock, power = parts
            samples.append(GpuSample(int(index), _number(temperature), _number(clock), _number(max_clock),
                                     _number(power)))
    return samples


def parse_rocm_telemetry(output: str) -> list[GpuSample]:
    """rocm-smi's JSON names its keys differently across versions, so keys are matched by what they contain."""
    try:
        cards = json.loads(output)
    except ValueError:
        return []
    samples = []
    for card, values in sorted(cards.items()):
        if not card.startswith("card") or not isinstance(values, dict):
            continue
        samples.append(GpuSample(
            int(card[4:]) if card[4:].isdigit() else len(samples),
            _first_number(values, lambda key: "temperature" in key and ("edge" in key or "junction" in key)),
            _first_number(values, lambda key: key.startswith("sclk")),
            None,
            _first_number(values, lambda key: "power" in key and "(w)" in key),
        ))
    return samples


def _first_number(values: dict, key_matches: Callable[[str], bool]) -> float | None:
    return next((_number(str(value)) for key, value in values.items() if key_matches(key.lower())), None)


class GpuTelemetry:
    """Temperature, SM clock and power per GPU, from nvidia-smi or rocm-smi when either is present."""

    def __init__(self, runner: CommandRunner = run_command):
        self.runner = runner

    def sample(self) -> list[GpuSample]:
        nvidia = self.runner(NVIDIA_TELEMETRY_QUERY)
        if nvidia:
            return parse_nvidia_telemetry(nvidia)
        rocm = self.runner(ROCM_TELEMETRY_QUERY)
        return parse_rocm_telemetry(rocm) if rocm else []

    def hottest_c(self) -> float | None:
        temperatures = [sample.temperature_c for sample in self.sample() if sample.temperature_c is not None]
        return max(temperatures) if temperatures else None


@dataclass(frozen=True)
class CoolingResult:
    reached: bool | None  # None: no temperature sensor to judge by
    waited_s: float
    start_c: float | None
    end_c: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def wait_until_cool(
    read_temperature_c: Callable[[], float | None],
    threshold_c: float,
    max_wait_s: float,
    *,
    poll_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CoolingResult:
    """Wait (at most ``max_wait_s``) until the hottest GPU is below ``threshold_c``."""
    started = clock()
    start_c = current_c = read_temperature_c()
    if current_c is None:
        return CoolingResult(None, 0.0, None, None)
    while current_c >= threshold_c and clock() - started < max_wait_s:
        sleep(poll_s)
        current_c = read_temperature_c()
        if current_c is None:
            return CoolingResult(None, clock() - started, start_c, None)
    return CoolingResult(current_c < threshold_c, clock() - started, start_c, current_c)
