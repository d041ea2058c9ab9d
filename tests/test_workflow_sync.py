"""The wheel workflow, the build scripts, the runtime check and the README tell the same story.

Cheap: reads files only (no network, no build). The ROCm job must run the same script as the local
GPU-less build, and the defaults (targets, version label, excluded ROCm sonames) must agree everywhere.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "wheels.yml"
SHARED = ROOT / "tools" / "rocm" / "build-and-verify.sh"
DRIVER = ROOT / "tools" / "rocm" / "build-gfx906-wheel.sh"
BUILD_WHEEL = ROOT / "tools" / "build_wheel.sh"
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(not WORKFLOW.exists(), reason="no .github/workflows/wheels.yml in this tree")


def shell_var(path: Path, name: str) -> str:
    m = re.search(rf'^{name}=("([^"]*)"|(\S*))', path.read_text(), re.M)
    assert m, f"{path.name} does not set {name}"
    return m.group(2) if m.group(2) is not None else m.group(3)


def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def job_runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def rocm_section() -> str:
    text = README.read_text()
    m = re.search(r"^## ROCm / gfx906 wheels\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "README.md has no '## ROCm / gfx906 wheels' section"
    return m.group(1)


def test_scripts_exist_and_are_executable():
    for p in (SHARED, DRIVER, BUILD_WHEEL, ROOT / "tools" / "rocm" / "sysroot-toolchain.cmake"):
        assert p.exists(), p
    for p in (SHARED, DRIVER, BUILD_WHEEL):
        assert os.access(p, os.X_OK), f"{p} is not executable"


def test_rocm_job_and_local_driver_run_the_same_shared_script():
    jobs = workflow()["jobs"]
    assert "tools/rocm/build-and-verify.sh all" in job_runs(jobs["rocm"])
    driver = DRIVER.read_text()
    assert re.search(r"bash /src/tools/rocm/build-and-verify\.sh all", driver), \
        "the local driver must run the shared script"


def test_cpu_and_cuda_jobs_use_build_wheel():
    jobs = workflow()["jobs"]
    assert "tools/build_wheel.sh cpu" in job_runs(jobs["cpu"])
    assert "tools/build_wheel.sh cuda" in job_runs(jobs["cuda"])
    assert str(jobs["cuda"]["env"]["CUDAARCHS"]) == shell_var(BUILD_WHEEL, "DEFAULT_CUDAARCHS")
    assert jobs["cuda"]["container"].startswith("nvidia/cuda:12.")


def test_default_targets_agree_everywhere():
    default = shell_var(SHARED, "DEFAULT_GPU_TARGETS")
    assert default == "gfx906"
    assert shell_var(DRIVER, "TARGETS") == default
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(rf'set\(GPU_TARGETS "{default}" CACHE', cmake), "CMakeLists.txt default GPU_TARGETS"
    matrix = workflow()["jobs"]["rocm"]["strategy"]["matrix"]["gpu_targets"]
    assert matrix[0] == default, "the ROCm matrix builds the default (gfx906) variant first"
    assert all(t.split(";")[0] == default for t in matrix)
    assert default in rocm_section()


def test_rocm_image_is_rocm6():
    image = workflow()["jobs"]["rocm"]["env"]["ROCM_IMAGE"]
    assert re.fullmatch(r"rocm/dev-ubuntu-22\.04:6(\.\d+)*", image), image
    assert shell_var(SHARED, "ROCM_LABEL") == "rocm6"


def test_excluded_rocm_sonames_match_the_runtime_check_and_the_readme():
    excludes = shlex.split(shell_var(SHARED, "ROCM_EXCLUDES"))
    needed = shell_var(SHARED, "ROCM_NEEDED").split()
    system = set(shell_var(SHARED, "SYSTEM_NEEDED_ALLOWED").split())
    native = (ROOT / "pyllamaspec" / "_native" / "loader.py").read_text()
    m = re.search(r"ROCM_LIBS = \(([^)]*)\)", native)
    assert m, "pyllamaspec/_native/loader.py has no ROCM_LIBS"
    runtime = re.findall(r'"([^"]+)"', m.group(1))
    # what _native checks at import == the ROCm sonames the wheel links == the first excludes
    assert runtime == excludes[:len(runtime)]
    assert runtime == needed, "the ROCm sonames the wheel may link are the ones _native checks"
    # only glibc / gcc runtime libraries that every manylinux system has may be left outside the wheel
    assert system <= {"ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0",
                      "librt.so.1", "libstdc++.so.6", "libgcc_s.so.1"}
    section = rocm_section()
    for soname in runtime:
        assert soname in section, f"README's ROCm section does not name {soname}"


def test_readme_names_the_command_label_and_glibc_floor():
    section = rocm_section()
    assert "tools/rocm/build-gfx906-wheel.sh" in section
    label = f"+{shell_var(SHARED, 'ROCM_LABEL')}.{shell_var(SHARED, 'DEFAULT_GPU_TARGETS')}"
    assert label in section, f"README does not show the version label {label}"
    assert re.search(r"manylinux_2_\d+", section), "README states the platform tag / glibc floor"
