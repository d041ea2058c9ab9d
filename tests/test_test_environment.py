"""The environments that run this suite install what it imports, from one list: pyproject's `test` extra.

The ROCm wheel's verify step (tools/rocm/build-and-verify.sh) installs the wheel with that extra and nothing
of its own, and every third-party module a test imports unconditionally comes from the package's
dependencies or the extra (or what they require). Cheap: reads files and installed metadata only.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SCRIPT = ROOT / "tools" / "rocm" / "build-and-verify.sh"


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared() -> set[str]:
    project = pyproject()["project"]
    return {dist_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}


def with_requirements(names: set[str]) -> set[str]:
    """The distributions and everything they require, as installed here."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [dist_name(r) for r in requires if "extra ==" not in r]
    return seen


def unconditional_imports() -> dict[str, set[str]]:
    """Top-level modules the test files import outright (not through pytest.importorskip), -> the files."""
    local = {p.stem for p in TESTS.glob("*.py")} | {"pyllamaspec", "vendor"}  # vendor: tools/vendor.py
    out: dict[str, set[str]] = {}
    for path in TESTS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    out.setdefault(top, set()).add(path.name)
    return out


def test_the_rocm_verify_step_installs_the_test_extra_and_nothing_of_its_own():
    text = SCRIPT.read_text()
    verify = re.search(r"^verify\(\) \{\n(.*?)^\}", text, re.S | re.M).group(1)
    installs = [line.strip() for line in verify.splitlines() if re.search(r"pip\"? install", line)]
    assert installs == ['"$TEST_VENV/bin/pip" install -q "$whl[test]"'], installs


def test_the_test_extra_holds_the_server_extra():
    extras = pyproject()["project"]["optional-dependencies"]
    assert {dist_name(r) for r in extras["server"]} <= {dist_name(r) for r in extras["test"]}


def test_every_module_the_tests_import_comes_from_the_declared_environment():
    allowed = with_requirements(declared())
    providers = metadata.packages_distributions()
    missing = {}
    for module, files in sorted(unconditional_imports().items()):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists:
            pytest.fail(f"{module} (imported by {sorted(files)}) is not installed here: add it to the test extra")
        if not dists & allowed:
            missing[module] = (sorted(dists), sorted(files))
    assert not missing, f"imported by the tests but in neither dependencies nor the test extra: {missing}"
    assert "scipy" in unconditional_imports()  # the guard sees what broke the ROCm verify step once
