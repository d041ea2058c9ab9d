"""The package's layering and its one source of constants: the core never pulls in tools, cli or bench, and
what the header declares (speculative types, finish reasons, limits) is read from it, needing no build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyllamaspec import _native

ROOT = Path(__file__).resolve().parent.parent
HEADER_TEXT = (ROOT / "pyllamaspec" / "include" / "pyllamaspec.h").read_text()

CORE_MODULES = [
    "pyllamaspec", "pyllamaspec._native", "pyllamaspec._native.header", "pyllamaspec._native.loader",
    "pyllamaspec.config", "pyllamaspec.model", "pyllamaspec.session", "pyllamaspec.memory", "pyllamaspec.errors",
    "pyllamaspec.buildinfo", "pyllamaspec.atomicfile", "pyllamaspec.ggufinfo", "pyllamaspec.ggufinfo.reader",
    "pyllamaspec.ggufinfo.summary", "pyllamaspec.ggufinfo.pairing", "pyllamaspec.textfiles", "pyllamaspec.templateguard",
]
UPPER_LAYERS = ("pyllamaspec.tools", "pyllamaspec.cli", "pyllamaspec.bench")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=120)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_tool_cli_or_bench_module(module: str) -> None:
    p = run_python(f"import importlib, json, sys; importlib.import_module({module!r}); "
                   f"print(json.dumps(sorted(sys.modules)))")
    assert p.returncode == 0, p.stderr
    loaded = json.loads(p.stdout)
    assert module in loaded
    above = [name for name in loaded if name.startswith(UPPER_LAYERS)]
    assert above == [], f"importing {module} loads {above}"


def test_the_public_api_is_where_it_was() -> None:
    import pyllamaspec
    from pyllamaspec import GenerationResult, Model, SessionConfig, SpecSession, Stats, errors, info

    assert {Model, SpecSession, SessionConfig, Stats, GenerationResult, info} <= {
        getattr(pyllamaspec, name) for name in pyllamaspec.__all__}
    assert errors.PairingError.__module__ == "pyllamaspec.errors"


def header_enum(prefix: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(rf"\b({prefix}\w+)\s*=\s*(\d+)", HEADER_TEXT)}


def test_speculative_type_names_are_the_headers_enumerators_in_llama_cpp_spelling() -> None:
    enum = {name: value for name, value in header_enum("PLS_SPEC_").items() if name != "PLS_SPEC_COUNT"}
    assert len(_native.SPEC_TYPES) == header_enum("PLS_SPEC_")["PLS_SPEC_COUNT"] == len(enum)
    for name, value in enum.items():
        assert _native.SPEC_TYPES[value] == name.removeprefix("PLS_SPEC_").lower().replace("_", "-")
    # the spellings llama.cpp's --spec-type takes
    assert _native.SPEC_TYPES[enum["PLS_SPEC_DRAFT_SIMPLE"]] == "draft-simple"
    assert _native.SPEC_TYPES[enum["PLS_SPEC_NGRAM_MAP_K4V"]] == "ngram-map-k4v"
    assert _native.SPEC_TYPE_IDS["draft-dflash"] == enum["PLS_SPEC_DRAFT_DFLASH"]


def test_finish_reasons_limits_and_rollback_kinds_follow_the_header() -> None:
    finish = header_enum("PLS_FINISH_")
    assert _native.FINISH_REASONS == {value: None if name == "PLS_FINISH_NONE" else name[11:].lower()
                                      for name, value in finish.items()}
    limits = header_enum("PLS_MAX_")
    assert (_native.MAX_DRAFT, _native.MAX_STREAMS, _native.MAX_SPEC_TYPES) == (
        limits["PLS_MAX_DRAFT"], limits["PLS_MAX_STREAMS"], limits["PLS_MAX_SPEC_TYPES"])
    # the header states the rollback kinds in the comment of pls_session_info.rollback_target
    comment = re.search(r"rollback_target;\s*/\*(.*?)\*/", HEADER_TEXT).group(1)
    assert _native.ROLLBACK_KINDS == {int(v): k for v, k in re.findall(r"(\d+) (\w+)", comment)}


def test_configuration_is_validated_without_a_native_build(tmp_path: Path) -> None:
    p = run_python(
        "import sys\n"
        "from pyllamaspec import SessionConfig, ConfigError\n"
        "from pyllamaspec._native import MAX_DRAFT\n"
        "SessionConfig(spec_types='draft-simple,ngram-mod', n_max=MAX_DRAFT, n_ubatch=MAX_DRAFT + 1)\n"
        "try:\n"
        "    SessionConfig(n_max=MAX_DRAFT + 1)\n"
        "except ConfigError as e:\n"
        "    print('refused:', e)\n"
        "print('native loaded:', any(m.endswith('loader') and 'pyllamaspec' in m for m in sys.modules)"
        " and sys.modules['pyllamaspec._native.loader'].load.cache_info().currsize > 0)\n",
        PYLLAMASPEC_LIB_DIR=str(tmp_path))  # no library there
    assert p.returncode == 0, p.stderr
    assert f"n_max={_native.MAX_DRAFT + 1} must be within 0..{_native.MAX_DRAFT}" in p.stdout
    assert "native loaded: False" in p.stdout
