"""Co-tenant detection against a faked machine: GPU users, CPU hogs, the policy, telemetry and the cooling gate."""

import os

import pytest

from pyllamaspec.bench.cotenant import (CotenantDetector, CotenantError, Finding, GpuTelemetry, LinuxProcessTable,
                                        ProcessSample, enforce, wait_until_cool)

OWN = 100  # the harness; 101 is a server it started


class FakeTable:
    ticks_per_second = 100.0

    def __init__(self, snapshots, device_paths=None, loadavg=(0.1, 0.1, 0.1)):
        self.snapshots = list(snapshots)
        self.paths = device_paths or {}
        self._loadavg = loadavg

    def processes(self):
        rows = self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]
        return {pid: ProcessSample(pid, ppid, name, ticks) for pid, ppid, name, ticks in rows}

    def device_paths(self, pid):
        return self.paths.get(pid, [])

    def loadavg(self):
        return self._loadavg


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def fake_runner(outputs):
    return lambda argv: outputs.get(argv[0])


BASE = [(1, 0, "init", 0), (OWN, 1, "python", 0), (101, OWN, "llama-server", 0)]


def detector(table, outputs=None, **options):
    clock = FakeClock()
    return CotenantDetector(table, fake_runner(outputs or {}), own_pid=OWN, clock=clock, sleep=clock.sleep,
                            **options)


def test_nvidia_smi_reports_other_gpu_processes_but_not_our_process_tree():
    table = FakeTable([BASE + [(200, 1, "trainer", 0)]])
    nvidia = "100, /usr/bin/python, 900 MiB\n101, /opt/llama-server, 800 MiB\n200, /usr/bin/trainer, 20000 MiB\n"
    findings = detector(table, {"nvidia-smi": nvidia}).gpu_findings(table.processes())
    assert [(f.pid, f.name, f.source) for f in findings] == [(200, "trainer", "nvidia-smi")]
    assert "20000 MiB" in findings[0].detail


def test_proc_fd_scan_counts_per_gpu_nodes_only_and_skips_ignored_daemons():
    rows = BASE + [(300, 1, "render", 0), (301, 1, "monitor", 0), (302, 1, "nvidia-persistenced", 0),
                   (303, 1, "secret", 0), (304, 1, "compositor", 0), (305, 1, "rocm-job", 0)]
    table = FakeTable([rows], device_paths={
        OWN: ["/dev/nvidia0"],
        300: ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"],
        301: ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/null"],  # CUDA-aware tool without a GPU context
        302: ["/dev/nvidia0"],
        303: None,  # another user's process: cannot be inspected
        304: ["/dev/dri/renderD128"],
        305: ["/dev/kfd"],
    })
    probe = detector(table)
    findings = probe.gpu_findings(table.processes())
    assert sorted(f.pid for f in findings) == [300, 304, 305]
    assert all(f.source == "proc-fd" for f in findings)
    assert probe.uninspectable == {303}


def test_rocm_smi_pids_are_parsed():
    table = FakeTable([BASE + [(400, 1, "hip-app", 0)]])
    rocm = ("======= ROCm System Management Interface =======\nKFD process information:\n"
            "PID\tPROCESS NAME\tGPU(s)\tVRAM USED\tSDMA USED\tCU OCCUPANCY\n"
            "400\thip-app\t1\t123456\t0\t0\n101\tllama-server\t1\t1000\t0\t0\n")
    findings = detector(table, {"rocm-smi": rocm}).gpu_findings(table.processes())
    assert [(f.pid, f.source) for f in findings] == [(400, "rocm-smi")]


def test_pids_from_another_namespace_count_only_beyond_our_own_gpu_users():
    # In a container nvidia-smi shows host pids: ours among them, unrecognisable.
    nvidia_one = "9001, python, 900 MiB\n"
    nvidia_two = "9001, python, 900 MiB\n9002, trainer, 20000 MiB\n"
    table = FakeTable([BASE], device_paths={OWN: ["/dev/nvidia0"]})
    assert detector(table, {"nvidia-smi": nvidia_one}).gpu_findings(table.processes()) == []
    findings = detector(table, {"nvidia-smi": nvidia_two}).gpu_findings(table.processes())
    assert len(findings) == 1 and findings[0].pid is None and "9002" in findings[0].detail
    # before our model is loaded we hold no GPU node, so one unknown pid is already a tenant
    idle_table = FakeTable([BASE])
    assert len(detector(idle_table, {"nvidia-smi": nvidia_one}).gpu_findings(idle_table.processes())) == 1


def test_cpu_window_flags_busy_processes_outside_our_tree():
    before = BASE + [(200, 1, "compiler", 1000), (201, 1, "idle-daemon", 50)]
    after = [(1, 0, "init", 0), (OWN, 1, "python", 500), (101, OWN, "llama-server", 900),
             (200, 1, "compiler", 1150), (201, 1, "idle-daemon", 51), (202, 1, "new-job", 50)]
    probe = detector(FakeTable([before, after]))
    probe.begin_window()
    probe.clock.sleep(1.0)
    findings = probe.end_window()
    assert {f.pid: f.kind for f in findings} == {200: "cpu-process", 202: "cpu-process"}
    assert "150% of one core" in next(f.detail for f in findings if f.pid == 200)


def test_preflight_sleeps_over_a_window_and_judges_load_only_when_asked():
    quiet = [BASE, BASE]
    gpu_run = detector(FakeTable(quiet, loadavg=(3.5, 2.0, 1.0)))
    assert gpu_run.preflight(window_s=1.0) == []
    assert gpu_run.clock.now == 1.0
    cpu_run = detector(FakeTable(quiet, loadavg=(3.5, 2.0, 1.0)), load_threshold=1.0)
    [finding] = cpu_run.preflight(window_s=1.0)
    assert finding.kind == "load-average" and "3.50" in finding.detail
    calm_cpu_run = detector(FakeTable(quiet, loadavg=(0.4, 0.3, 0.2)), load_threshold=1.0)
    assert calm_cpu_run.preflight(window_s=1.0) == []


def test_ignored_names_are_not_tenants():
    table = FakeTable([BASE + [(200, 1, "Xorg", 0)], BASE + [(200, 1, "Xorg", 500)]],
                      device_paths={200: ["/dev/nvidia0"]})
    probe = detector(table, ignored_names={"Xorg"})
    assert probe.preflight(window_s=1.0) == []


def test_policy_refuse_raises_and_flag_marks_contaminated():
    finding = Finding("gpu-process", "nvidia-smi", "trainer", 200, "20000 MiB in use")
    with pytest.raises(CotenantError, match="trainer .pid 200."):
        enforce([finding], "refuse", "before the run")
    assert enforce([finding], "flag", "before the run") is True
    assert enforce([], "refuse", "before the run") is False


def test_end_window_without_begin_is_an_error():
    with pytest.raises(RuntimeError):
        detector(FakeTable([BASE])).end_window()


def test_gpu_telemetry_parses_nvidia_smi_and_falls_back_to_rocm_smi():
    nvidia = GpuTelemetry(fake_runner({"nvidia-smi": "0, 71, 1755, 1980, 301.25\n1, 45, [N/A], 1980, [N/A]\n"}))
    first, second = nvidia.sample()
    assert (first.index, first.temperature_c, first.sm_clock_mhz, first.max_sm_clock_mhz, first.power_w) == \
        (0, 71.0, 1755.0, 1980.0, 301.25)
    assert second.sm_clock_mhz is None and second.power_w is None
    assert nvidia.hottest_c() == 71.0
    rocm_json = ('{"card0": {"Temperature (Sensor edge) (C)": "52.0", "Current Socket Graphics Package Power (W)":'
                 ' "110.0", "sclk clock speed:": "(2100Mhz)"}, "system": {"x": "y"}}')
    [card] = GpuTelemetry(fake_runner({"rocm-smi": rocm_json})).sample()
    assert (card.index, card.temperature_c, card.sm_clock_mhz, card.power_w) == (0, 52.0, 2100.0, 110.0)
    assert GpuTelemetry(fake_runner({})).sample() == []
    assert GpuTelemetry(fake_runner({})).hottest_c() is None


def test_cooling_gate_waits_until_below_threshold_and_is_bounded():
    clock = FakeClock()
    temperatures = iter([85.0, 80.0, 70.0])
    cooled = wait_until_cool(lambda: next(temperatures), 75.0, 60.0, poll_s=5.0, clock=clock, sleep=clock.sleep)
    assert cooled.reached is True and cooled.waited_s == 10.0 and (cooled.start_c, cooled.end_c) == (85.0, 70.0)

    clock = FakeClock()
    hot = wait_until_cool(lambda: 90.0, 75.0, 20.0, poll_s=5.0, clock=clock, sleep=clock.sleep)
    assert hot.reached is False and hot.waited_s == 20.0

    assert wait_until_cool(lambda: None, 75.0, 20.0).reached is None


def test_real_process_table_sees_this_process():
    table = LinuxProcessTable()
    me = table.processes()[os.getpid()]
    assert me.ppid == os.getppid() and me.cpu_ticks >= 0
    assert isinstance(table.device_paths(os.getpid()), list)
    assert len(table.loadavg()) == 3
