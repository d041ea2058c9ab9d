"""The package's layering (ARCHITECTURE.md) and its one source of constants: imports and native includes point
down the layers, without cycles; the core never pulls in tools, server, cli or bench; and what the header declares
(speculative types, finish reasons, limits) is read from it, needing no build."""

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
    "pyllamaspec.chat", "pyllamaspec.native_params", "pyllamaspec.grammar", "pyllamaspec.costcache", "pyllamaspec.paths",
    "pyllamaspec.progress",
    "pyllamaspec.controller", "pyllamaspec.embedding",
]
UPPER_LAYERS = ("pyllamaspec.tools", "pyllamaspec.server", "pyllamaspec.cli", "pyllamaspec.bench")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=120)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_tool_server_cli_or_bench_module(module: str) -> None:
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


# -- the import graph, read from the sources (lazy imports inside functions included) ---------------------------
# Layers, lowest first. A module imports modules of its own layer or of a lower one; the three middle layers stand
# side by side and do not import each other. ARCHITECTURE.md draws the same map.
PACKAGE_LAYERS = {"core": 0, "tools": 1, "server": 1, "bench": 1, "cli": 2}
# Inside the core, lowest first: a core module imports only modules of a lower rank (or its own package's).
CORE_RANKS = {
    "errors": 0, "paths": 0, "progress": 0,
    "_native": 1, "atomicfile": 1, "textfiles": 1, "templateguard": 1,
    "config": 2, "chat": 2,
    "ggufinfo": 3, "grammar": 3, "rpc": 3,
    "native_params": 4, "native_tools": 4, "costcache": 4, "buildinfo": 4, "controller": 4,
    "model": 5, "memory": 5, "placement": 5,
    "session": 6, "embedding": 6,
    "": 7,  # the package itself: the public names
}
# what any module may read from the package itself: its version
ROOT_NAMES_ANYONE_MAY_IMPORT = {"__version__"}


def package_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((ROOT / "pyllamaspec").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that this one imports anywhere in it (a `from X import name` of a submodule counts as
    the submodule)."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = {alias.name for alias in node.names}
            submodules = {f"{source}.{n}" for n in names if f"{source}.{n}" in modules}
            found.update(submodules)
            plain_names = {n for n in names if f"{source}.{n}" not in modules}
            if source == "pyllamaspec" and plain_names <= ROOT_NAMES_ANYONE_MAY_IMPORT:
                continue
            if plain_names:
                found.add(source)
    return {m for m in found if m == "pyllamaspec" or m.startswith("pyllamaspec.")}


def package_layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGE_LAYERS else "core"


def core_rank(module: str) -> int:
    parts = module.split(".")
    return CORE_RANKS[parts[1] if len(parts) > 1 else ""]


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(name, path, modules) - {name} for name, path in modules.items()}


def test_every_core_module_has_a_rank() -> None:
    unranked = sorted(m for m in import_graph() if package_layer(m) == "core" and
                      (m.split(".") + [""])[1] not in CORE_RANKS)
    assert unranked == [], f"place these core modules in CORE_RANKS (and in ARCHITECTURE.md): {unranked}"


def test_imports_point_down_the_layers() -> None:
    upward = []
    for module, imports in import_graph().items():
        for target in imports:
            mine, theirs = package_layer(module), package_layer(target)
            if mine != theirs and PACKAGE_LAYERS[theirs] >= PACKAGE_LAYERS[mine]:
                upward.append(f"{module} -> {target}")
            elif mine == theirs == "core" and module.split(".")[:2] != target.split(".")[:2] and \
                    core_rank(target) >= core_rank(module):
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports that point up or sideways:\n" + "\n".join(sorted(upward))


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            # a package's __init__ gathering its own submodules is not a cycle of the package with them
            if target.startswith(module + "."):
                continue
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_no_command_imports_another_command() -> None:
    graph = import_graph()
    commands = {m for m in graph if m.startswith("pyllamaspec.cli.") and
                "def register(" in package_modules()[m].read_text()}
    crossing = sorted(f"{m} -> {t}" for m in commands for t in graph[m] if t in commands)
    assert len(commands) >= 9
    assert crossing == []


# -- the native sources: one direction for every include ---------------------------------------------------------
# Units (a header and the source of the same name), lowest first: a unit includes only units listed before it.
NATIVE_UNITS = [
    "pyllamaspec",                                    # the C API header (pyllamaspec/include)
    "shim_common",                                    # errors, logging, devices, model handles
    "info", "model", "chat_tools", "quantize",        # C API of build info, models, chat requests, the quantizer,
    "embed",                                          # embeddings,
    "synth",                                          # synthetic models
    "rpc", "placement",                               # remote devices (rpc-servers), where a placement puts the head
    "adaptive",                                       # the draft-length controller (no llama.cpp state)
    "sampling_ext",                                   # grammars, penalties, biases, log-probabilities
    "session_plan",                                   # a session's parameters and contexts, before any model
    "memory",                                         # the memory estimate
    "session",                                        # a session's state
    "device_greedy",                                  # greedy rows sampled on the target's output device
    "session_open", "loop", "slots",                  # open, the speculative loop, slot choice
    "drafter",                                        # the draft model driven by the loop
    "api_guard",                                      # what the C API files share
    "session_api", "session_seqs", "controller_api",  # the C API of sessions, sequences, the controller
    "trace",                                          # the C API of a session's per-step trace
    "sampling_api",                                   # the C API of grammars, a begin's sampling, log-probabilities
]


def native_includes() -> dict[str, set[str]]:
    files = list((ROOT / "native").glob("*.h")) + list((ROOT / "native").glob("*.cpp"))
    files.append(ROOT / "pyllamaspec" / "include" / "pyllamaspec.h")
    units = {f.stem for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        included = {Path(m).stem for m in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(), re.M)}
        graph.setdefault(f.stem, set()).update(included & units - {f.stem})
    return graph


def test_every_native_unit_has_a_place() -> None:
    unplaced = sorted(set(native_includes()) - set(NATIVE_UNITS))
    assert unplaced == [], f"place these native files in NATIVE_UNITS (and in ARCHITECTURE.md): {unplaced}"


def test_native_includes_point_down() -> None:
    rank = {unit: i for i, unit in enumerate(NATIVE_UNITS)}
    upward = sorted(f"{unit} includes {target}" for unit, targets in native_includes().items() for target in targets
                    if unit in rank and target in rank and rank[target] >= rank[unit])
    assert upward == [], "native includes that point up (or a header and a source reaching each other):\n" + \
        "\n".join(upward)


def test_only_the_core_calls_the_binding() -> None:
    """tools, server, bench and cli go through the typed API (model, session, native_tools), never the binding."""
    reaching = sorted(f"{m} -> {t}" for m, targets in import_graph().items() if package_layer(m) != "core"
                      for t in targets if t == "pyllamaspec._native" or t.startswith("pyllamaspec._native."))
    assert reaching == []


def test_stats_are_read_from_the_headers_stats_struct() -> None:
    import dataclasses

    from pyllamaspec.session import Stats

    ffi = _native.ffi()
    s = ffi.new("pls_stats *")
    for i, (name, cfield) in enumerate(ffi.typeof("pls_stats").fields):
        if cfield.type.kind == "array":
            continue
        setattr(s, name, i + 1)
    s.drafted_per_pos[0], s.drafted_per_pos[1], s.drafted_per_pos[2] = 5, 3, 1
    s.accepted_per_pos[0], s.accepted_per_pos[1] = 4, 2
    s.k_hist[0], s.k_hist[3] = 7, 2
    stats = Stats.from_native(s[0])
    # every field of the struct lands in Stats, and Stats has no field the struct lacks
    header_fields = [name for name, cfield in ffi.typeof("pls_stats").fields if cfield.type.kind != "array"]
    assert [getattr(stats, name) for name in header_fields] == [getattr(s, name) for name in header_fields]
    assert len(dataclasses.fields(Stats)) == len(ffi.typeof("pls_stats").fields)
    assert stats.drafted_per_position == [5, 3, 1] and stats.accepted_per_position == [4, 2, 0]
    assert stats.k_histogram == [7, 0, 0, 2]
