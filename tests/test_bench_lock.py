"""The device lock: exclusive across processes, and never kept alive by a child the harness started."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pyllamaspec.bench.lock import DeviceLock, LockBusyError, lock_path_for, read_holder

REPO_ROOT = Path(__file__).resolve().parents[1]

# A process that takes the lock, says so, and releases it when told (one line on stdin), then waits again.
HOLDER = """
import sys
from pathlib import Path
from pyllamaspec.bench.lock import DeviceLock
lock = DeviceLock("dev0", "refuse", lock_dir=Path(sys.argv[1])).acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
sys.stdin.readline()
"""

# A harness that takes the lock, starts a long-lived server by fork+exec (close_fds=False, so only close-on-exec
# keeps the lock descriptor out of it), prints the server's pid and exits without releasing anything.
EXEC_CHILD = """
import subprocess, sys
from pathlib import Path
from pyllamaspec.bench.lock import DeviceLock
DeviceLock("dev0", "refuse", lock_dir=Path(sys.argv[1])).acquire()
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], close_fds=False,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(server.pid, flush=True)
"""

# The same with a plain fork and no exec: the child shares the lock's open file description.
FORK_CHILD = """
import os, sys, time
from pathlib import Path
from pyllamaspec.bench.lock import DeviceLock
lock = DeviceLock("dev0", "refuse", lock_dir=Path(sys.argv[1])).acquire()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_RDWR), 1)  # let go of the test's pipe
    time.sleep(120)
    os._exit(0)
print(pid, flush=True)
"""


def _python(script: str, lock_dir: Path, **popen_args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", script, str(lock_dir)], env=env, text=True,
                            stdout=subprocess.PIPE, **popen_args)


@pytest.fixture
def holder(tmp_path):
    process = _python(HOLDER, tmp_path, stdin=subprocess.PIPE)
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def _release(holder_process):
    holder_process.stdin.write("\n")
    holder_process.stdin.flush()
    assert holder_process.stdout.readline().strip() == "released"


def _orphan_kill(pid: int):
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_second_process_is_refused_and_told_the_holder(tmp_path, holder):
    with pytest.raises(LockBusyError) as refused:
        DeviceLock("dev0", "refuse", lock_dir=tmp_path).acquire()
    assert refused.value.holder_pid == holder.pid
    assert str(holder.pid) in str(refused.value) and "\n" not in str(refused.value)  # HOLDER's argv spans lines
    assert refused.value.waited_s is None


def test_waiting_acquire_times_out_while_held_then_gets_the_lock_once_released(tmp_path, holder):
    with pytest.raises(LockBusyError) as timed_out:
        DeviceLock("dev0", "wait", timeout_s=0.3, poll_interval_s=0.05, lock_dir=tmp_path).acquire()
    assert timed_out.value.waited_s is not None and timed_out.value.holder_pid == holder.pid

    waiter = DeviceLock("dev0", "wait", timeout_s=60, poll_interval_s=0.05, lock_dir=tmp_path)
    thread = threading.Thread(target=waiter.acquire)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "the waiter got the lock while another process held it"
    _release(holder)
    thread.join(60)
    assert waiter.held
    waiter.release()


def test_lock_belongs_to_the_open_file_description_not_the_process(tmp_path):
    # Classic POSIX locks would let the same process lock twice, and would drop the lock when any other
    # descriptor of the file is closed; an OFD (or flock) lock does neither.
    with DeviceLock("dev0", "refuse", lock_dir=tmp_path) as first:
        open(first.path).close()
        with pytest.raises(LockBusyError):
            DeviceLock("dev0", "refuse", lock_dir=tmp_path).acquire()
    with DeviceLock("dev0", "refuse", lock_dir=tmp_path):
        pass


def test_holder_record_is_written_while_held_and_cleared_on_release(tmp_path):
    lock = DeviceLock("cuda:0", "refuse", lock_dir=tmp_path)
    with lock:
        holder = read_holder(lock.path)
        assert holder["pid"] == os.getpid() and holder["device"] == "cuda:0" and holder["cmdline"]
        assert lock.describe()["held"] is True
    assert read_holder(lock.path) is None
    assert not lock.held


def test_exec_child_does_not_keep_the_lock_after_the_harness_exits(tmp_path):
    harness = _python(EXEC_CHILD, tmp_path)
    server_pid = int(harness.stdout.readline())
    harness.wait(timeout=60)
    try:
        os.kill(server_pid, 0)  # the server still runs...
        with DeviceLock("dev0", "refuse", lock_dir=tmp_path):  # ...and a third process gets the lock
            pass
    finally:
        _orphan_kill(server_pid)


def test_forked_child_does_not_keep_the_lock_after_the_harness_exits(tmp_path):
    harness = _python(FORK_CHILD, tmp_path)
    child_pid = int(harness.stdout.readline())
    harness.wait(timeout=60)
    try:
        os.kill(child_pid, 0)
        with DeviceLock("dev0", "refuse", lock_dir=tmp_path):
            pass
    finally:
        _orphan_kill(child_pid)


def test_forked_child_sees_the_lock_as_not_its_own(tmp_path):
    lock = DeviceLock("dev0", "refuse", lock_dir=tmp_path).acquire()
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            lock.release()  # must be a no-op in the child: releasing would free the parent's lock
            os.write(write_end, json.dumps(lock.held).encode())
            os._exit(0)
        os.close(write_end)
        held_in_child = json.loads(os.read(read_end, 100))
        os.close(read_end)
        os.waitpid(pid, 0)
        assert held_in_child is False
        assert lock.held
        with pytest.raises(LockBusyError):
            DeviceLock("dev0", "refuse", lock_dir=tmp_path).acquire()
    finally:
        lock.release()


def test_lock_file_name_is_derived_safely_from_the_device_name(tmp_path):
    assert lock_path_for("CUDA0", tmp_path) == tmp_path / "CUDA0.lock"
    assert lock_path_for("../etc/passwd", tmp_path).parent == tmp_path
    assert lock_path_for("rocm:0 (gfx1100)", tmp_path).name == "rocm_0_gfx1100.lock"
