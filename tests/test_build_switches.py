"""Build switches are settled by each configure: from -D, CMAKE_ARGS or the environment, never left over
in the persistent build tree from an earlier `pip install`.

Configure-only runs of the real CMakeLists.txt, nothing is compiled. One build tree serves the module, the
way build/<wheel tag>/ serves every pip install (a new tree takes a few seconds, a re-configure about one),
so each test also starts from whatever the one before left in it. A CUDA or HIP configure may stop further
on where this machine has no (complete) toolkit; the switches are settled and cached before that point,
which is what these tests read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
# set in a developer's shell they would leak into every configure below
SWITCH_ENV = ("PYLLAMASPEC_BACKEND", "PYLLAMASPEC_NATIVE", "GPU_TARGETS", "AMDGPU_TARGETS", "CUDAARCHS",
              "CMAKE_ARGS", "CMAKE_GENERATOR", "SOURCE_DATE_EPOCH")
GENERATOR = "Ninja" if shutil.which("ninja") else "Unix Makefiles"


@pytest.fixture(scope="module")
def cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        pytest.skip("no cmake on PATH: these tests run the project's CMake configure")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    version = tuple(int(x) for x in re.search(r"(\d+)\.(\d+)", out).groups())
    if version < (3, 21):
        pytest.skip(f"cmake {version} on PATH is older than the 3.21 the project needs")
    return exe


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCH_ENV}
    # GPU configures stop right after the switches are settled, whether this machine has a toolkit or not
    env["CUDACXX"] = env["HIPCXX"] = str(ROOT / "no-such-dir" / "gpu-compiler")
    env.update(extra)
    return env


def pip_defines() -> list[str]:
    """The -D arguments scikit-build-core passes on every pip build (tool.scikit-build.cmake.define)."""
    defines = tomllib.loads(PYPROJECT.read_text())["tool"]["scikit-build"]["cmake"]["define"]
    return [f"-D{k}={v}" for k, v in defines.items()]


def read_cache(build: Path) -> dict[str, str]:
    cache = {}
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*):[A-Z]+=(.*)", line)
        if m:
            cache[m.group(1)] = m.group(2)
    return cache


def is_on(value: str) -> bool:
    return value.upper() in ("ON", "1", "TRUE", "YES", "Y")


class Tree:
    """One build tree, configured again and again like build/<wheel tag>/ is."""

    def __init__(self, cmake: str, path: Path):
        self.cmake = cmake
        self.path = path

    def configure(self, *args: str, env: dict[str, str] | None = None, pip: bool = True,
                  expect_ok: bool | None = True) -> subprocess.CompletedProcess:
        """pip=True configures the way every `pip install .` does; pip=False as a person running cmake."""
        cmd = [self.cmake, "-S", str(ROOT), "-B", str(self.path), "-G", GENERATOR,
               *(pip_defines() if pip else []), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(**(env or {})))
        r.output = r.stdout + r.stderr
        r.text = " ".join(r.output.split())   # CMake wraps its error messages
        if expect_ok is True:
            assert r.returncode == 0, r.output[-4000:]
        elif expect_ok is False:
            assert r.returncode != 0, r.output[-4000:]
        return r

    def cache(self) -> dict[str, str]:
        return read_cache(self.path)


@pytest.fixture(scope="module")
def tree(cmake, tmp_path_factory) -> Tree:
    return Tree(cmake, tmp_path_factory.mktemp("switches") / "build")


def test_native_comes_from_the_environment_and_does_not_stick(tree):
    tree.configure(env={"PYLLAMASPEC_NATIVE": "True"})
    c = tree.cache()
    assert c["GGML_NATIVE"] == "ON"
    assert not is_on(c["GGML_AVX2"])                       # native: ggml leaves the per-ISA options off
    tree.configure(env={"PYLLAMASPEC_NATIVE": "0"})
    c = tree.cache()
    assert c["GGML_NATIVE"] == "OFF"
    assert is_on(c["GGML_AVX2"]) and is_on(c["GGML_FMA"])  # ... and portable gets them back
    tree.configure(env={"PYLLAMASPEC_NATIVE": "on"})
    assert tree.cache()["GGML_NATIVE"] == "ON"
    tree.configure()                                       # not given: portable, the default
    c = tree.cache()
    assert c["GGML_NATIVE"] == "OFF" and is_on(c["GGML_AVX2"])


def test_bad_switch_values_fail_naming_the_variable(tree):
    r = tree.configure(env={"PYLLAMASPEC_NATIVE": "maybe"}, expect_ok=False)
    assert "PYLLAMASPEC_NATIVE='maybe' (environment variable PYLLAMASPEC_NATIVE)" in r.text
    assert "use ON, OFF, 1, 0, TRUE or FALSE" in r.text
    r = tree.configure("-DPYLLAMASPEC_NATIVE=yes please", expect_ok=False)
    assert "PYLLAMASPEC_NATIVE='yes please' (-DPYLLAMASPEC_NATIVE)" in r.text
    r = tree.configure(env={"PYLLAMASPEC_BACKEND": "metal"}, expect_ok=False)
    assert "PYLLAMASPEC_BACKEND='metal'" in r.text and "use cpu, cuda or hip" in r.text
    # the short form and a GGML_* switch given together must agree
    r = tree.configure("-DGGML_CUDA=on", env={"PYLLAMASPEC_BACKEND": "cpu"}, expect_ok=False)
    assert "PYLLAMASPEC_BACKEND=cpu (environment variable PYLLAMASPEC_BACKEND) disagrees with " \
           "-DGGML_CUDA=on" in r.text
    r = tree.configure("-DGGML_NATIVE=OFF", env={"PYLLAMASPEC_NATIVE": "ON"}, expect_ok=False)
    assert "PYLLAMASPEC_NATIVE=ON (environment variable PYLLAMASPEC_NATIVE) disagrees with " \
           "-DGGML_NATIVE=OFF" in r.text


def test_rpc_is_in_every_build(tree):
    for env in ({"PYLLAMASPEC_BACKEND": "cpu"}, {"PYLLAMASPEC_BACKEND": "cuda"}, {"PYLLAMASPEC_BACKEND": "hip"}):
        tree.configure(env=env, expect_ok=None)   # a GPU configure stops at its compiler; the switches are settled
        assert is_on(tree.cache()["GGML_RPC"]), env
    r = tree.configure("-DGGML_RPC=OFF", expect_ok=False)
    assert "-DGGML_RPC=OFF: every pyllamaspec build has the RPC backend" in r.text
    tree.configure()
    assert is_on(tree.cache()["GGML_RPC"])


def test_what_the_build_machine_happens_to_have_is_linked_only_when_asked(tree):
    # NCCL and RPC's RDMA transport (libibverbs) are found on some build machines: linked, a package would need them
    # wherever it is installed
    for env in ({"PYLLAMASPEC_BACKEND": "cpu"}, {"PYLLAMASPEC_BACKEND": "cuda"}):
        tree.configure(env=env, expect_ok=None)
        cache = tree.cache()
        assert not is_on(cache["GGML_RPC_RDMA"]) and not is_on(cache["GGML_CUDA_NCCL"]), env
    tree.configure("-DGGML_RPC_RDMA=ON", "-DGGML_CUDA_NCCL=ON", env={"PYLLAMASPEC_BACKEND": "cuda"}, expect_ok=None)
    cache = tree.cache()
    assert is_on(cache["GGML_RPC_RDMA"]) and is_on(cache["GGML_CUDA_NCCL"])
    tree.configure()
    cache = tree.cache()
    assert not is_on(cache["GGML_RPC_RDMA"]) and not is_on(cache["GGML_CUDA_NCCL"])


def test_backend_does_not_stick_across_pip_builds(tree):
    tree.configure(env={"PYLLAMASPEC_BACKEND": "CUDA"}, expect_ok=None)   # stops at enable_language(CUDA)
    assert tree.cache()["GGML_CUDA"] == "ON"
    r = tree.configure(env={"PYLLAMASPEC_BACKEND": "cpu"})
    assert tree.cache()["GGML_CUDA"] == "OFF"
    assert "pyllamaspec: backend cpu from environment variable PYLLAMASPEC_BACKEND" in r.output
    # the llama-cpp-python way, CMAKE_ARGS="-DGGML_CUDA=on ...": as given, and not kept either
    tree.configure("-DGGML_CUDA=on", "-DGGML_CPU_REPACK=OFF", expect_ok=None)
    c = tree.cache()
    assert is_on(c["GGML_CUDA"]) and c["GGML_CPU_REPACK"] == "OFF"
    r = tree.configure()
    c = tree.cache()
    assert c["GGML_CUDA"] == "OFF" and c["GGML_CPU_REPACK"] == "ON"    # back to upstream's default
    dropped = re.search(r"back to default: (\S+)", r.output)
    assert dropped and set(dropped.group(1).split(";")) == {"GGML_CPU_REPACK", "GGML_CUDA"}, r.output


def test_cuda_architectures_given_on_the_command_line_apply_and_do_not_stick(tree):
    """CMake gives CMAKE_CUDA_ARCHITECTURES its own help string on every -D: still told apart from a cached
    value (left unread, the build fell back to upstream's list of seven architectures)."""
    cuda = {"PYLLAMASPEC_BACKEND": "cuda"}
    r = tree.configure("-DCMAKE_CUDA_ARCHITECTURES=90", env=cuda, expect_ok=None)
    assert tree.cache().get("CMAKE_CUDA_ARCHITECTURES") == "90", r.output[-3000:]
    assert "given: CMAKE_CUDA_ARCHITECTURES" in r.output
    tree.configure("-DCMAKE_CUDA_ARCHITECTURES=89", env=cuda, expect_ok=None)   # given again: the new value
    assert tree.cache().get("CMAKE_CUDA_ARCHITECTURES") == "89"
    r = tree.configure(env=cuda, expect_ok=None)         # a later pip build without it: upstream's default
    assert "CMAKE_CUDA_ARCHITECTURES" not in tree.cache()
    assert re.search(r"back to default: \S*CMAKE_CUDA_ARCHITECTURES", r.output), r.output[-3000:]
    tree.configure("-DCMAKE_CUDA_ARCHITECTURES=90", env=cuda, pip=False, expect_ok=None)
    tree.configure(env=cuda, pip=False, expect_ok=None)  # cmake by hand keeps it
    assert tree.cache().get("CMAKE_CUDA_ARCHITECTURES") == "90"
    tree.configure(expect_ok=None)


def test_cmake_by_hand_keeps_what_it_is_not_told(tree):
    tree.configure("-DGGML_CPU_REPACK=OFF", env={"PYLLAMASPEC_NATIVE": "ON"}, pip=False)
    c = tree.cache()
    assert c["GGML_CPU_REPACK"] == "OFF" and c["GGML_NATIVE"] == "ON"
    # kept by a later configure (and by CMake's own re-runs during a build) ...
    tree.configure(pip=False)
    c = tree.cache()
    assert c["GGML_CPU_REPACK"] == "OFF" and c["GGML_NATIVE"] == "ON"
    # ... until a pip build, which states everything afresh
    tree.configure()
    c = tree.cache()
    assert c["GGML_CPU_REPACK"] == "ON" and c["GGML_NATIVE"] == "OFF"


def test_hip_targets_default_to_gfx906_and_follow_each_build(tree):
    hip = {"PYLLAMASPEC_BACKEND": "hip"}
    tree.configure(env=hip, expect_ok=None)                # stops at enable_language(HIP)
    c = tree.cache()
    assert c["GGML_HIP"] == "ON" and c["GGML_CUDA"] == "OFF" and c["GPU_TARGETS"] == "gfx906"
    tree.configure(env={**hip, "GPU_TARGETS": "gfx906;gfx90a"}, expect_ok=None)
    assert tree.cache()["GPU_TARGETS"] == "gfx906;gfx90a"
    tree.configure("-DAMDGPU_TARGETS=gfx1100", env=hip, expect_ok=None)
    assert tree.cache()["GPU_TARGETS"] == "gfx1100"
    tree.configure(env=hip, expect_ok=None)
    assert tree.cache()["GPU_TARGETS"] == "gfx906"


def test_a_pip_build_takes_its_switches_from_the_environment_and_cmake_args(tree):
    """The whole path: environment -> scikit-build-core -> CMake, through the PEP 517 hook pip calls, in the
    same tree. The build step is pointed at a target that does not exist, so it stops after configuring."""
    pytest.importorskip("scikit_build_core", reason="scikit-build-core (the build backend, in the test "
                                                   "extra) runs this build")
    hook = ("import sys, scikit_build_core.build as b\n"
            "b.build_wheel(sys.argv[1], {'build-dir': sys.argv[2], 'build.targets': 'configure-only'})\n")

    def pip_build(**env):
        r = subprocess.run([sys.executable, "-c", hook, str(tree.path.parent / "wheel"), str(tree.path)],
                           cwd=ROOT, capture_output=True, text=True,
                           env=clean_env(CMAKE_GENERATOR=GENERATOR, **env))
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "Build files have been written" in out, out[-4000:]
        return tree.cache()

    c = pip_build(PYLLAMASPEC_NATIVE="ON", CMAKE_ARGS="-DGGML_CPU_REPACK=OFF")
    assert c["GGML_NATIVE"] == "ON" and c["GGML_CPU_REPACK"] == "OFF"
    c = pip_build()
    assert c["GGML_NATIVE"] == "OFF" and c["GGML_CPU_REPACK"] == "ON"
