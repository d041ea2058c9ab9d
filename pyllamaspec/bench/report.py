"""The benchmark's outputs: a JSON document (the record), and Markdown and PNG plots rendered from it alone.

Everything needed to judge a figure travels in the JSON: the build, the exact model files (by SHA-256), the
parameters, co-tenant findings, the lock, and every run - so a report can be re-rendered, and re-checked,
without the machine it was measured on.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from pyllamaspec.bench.results import sum_by_position
from pyllamaspec.errors import PyllamaspecError
from pyllamaspec.paths import cache_root

SCHEMA_VERSION = 1
HASH_CHUNK_BYTES = 16 << 20


class ReportError(PyllamaspecError):
    """A recorded benchmark cannot be read, or its report cannot be written."""


def default_hash_cache() -> Path:
    return cache_root() / "sha256.json"


def file_sha256(path: str | Path, cache_path: Path | None = None) -> str:
    """SHA-256 of a (multi-GB) model file, streamed once and then cached by path, size and mtime."""
    path = Path(path).resolve()
    cache_path = cache_path or default_hash_cache()
    stat = path.stat()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(str(path))
    if entry and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
        return entry["sha256"]
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    cache[str(path)] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = cache_path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(cache, indent=1))
        os.replace(scratch, cache_path)  # atomic, so a concurrent reader never sees half a cache
    except OSError:
        pass  # a read-only home only costs re-hashing next time
    return digest.hexdigest()


def build_environment(
    *,
    build_info: Mapping,
    models: Mapping[str, str | Path],
    params: Mapping,
    cotenant: Mapping,
    locks: Sequence[Mapping],
    hash_cache: Path | None = None,
) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "build_info": dict(build_info),
        "backend": build_info.get("backends"),
        "device": [f"{device.get('name')}: {device.get('description')}" for device in build_info.get("devices") or []],
        "models": {label: {"path": str(path), "size": Path(path).stat().st_size,
                           "sha256": file_sha256(path, hash_cache)} for label, path in models.items()},
        "params": dict(params),
        "cotenant": dict(cotenant),
        "locks": [dict(lock) for lock in locks],
    }


def assemble(environment: Mapping, run_result: Mapping) -> dict:
    """The JSON document: the environment (co-tenant findings included), then the runner's results."""
    results = dict(run_result)
    environment = {**environment, "cotenant": {**environment.get("cotenant", {}), **results.pop("cotenant", {})}}
    return {"environment": environment, **results}


def write_json(document: Mapping, path: str | Path) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")


def load_json(path: str | Path) -> dict:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as error:
        raise ReportError(f"cannot read {path}: {error.strerror}") from error
    except ValueError as error:
        raise ReportError(f"{path} is not JSON: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("records"), list):
        raise ReportError(f"{path} is not a pyllamaspec bench record (no 'records' list)")
    return document


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _fmt_listing(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(item if isinstance(item, str) else json.dumps(item) for item in value) or "none"
    return "?" if value is None else str(value)


def _fmt_ratio(ratio: Mapping | None) -> str:
    if not ratio or "median" not in ratio:
        return "–"
    return f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})"


def _fmt_equivalence(equivalence: Mapping | None) -> str:
    if not equivalence:
        return "not checked"
    if equivalence["kind"] == "identical":
        return "identical"
    where = f"at token {equivalence['position']}, margin {_fmt(equivalence['margin'], 3)}"
    if equivalence.get("batch_shape_noise") is not None:
        where += (f" (tie below {_fmt(equivalence['tolerance'], 3)}; batch-shape noise "
                  f"{_fmt(equivalence['batch_shape_noise'], 3)})")
    if equivalence["kind"] == "near-tie":
        return f"near-tie {where}"
    return f"**DIVERGED** {where}"


def contaminated(document: Mapping) -> bool:
    return any(record.get("contaminated") for record in document["records"])


def render_markdown(document: Mapping) -> str:
    environment = document.get("environment", {})
    records = document["records"]
    lines = ["# pyllamaspec bench", ""]
    if contaminated(document):
        lines += ["> **Warning:** another process used the device or the CPUs during this benchmark. Rows marked "
                  "*contaminated* are not trustworthy; re-run on an idle machine.", ""]
    if document.get("mixed_modes"):
        lines += ["> **Warning:** arms were run in different prompt modes (forced). Their differences include the "
                  "mode, not only the drafter.", ""]
    if any(record.get("equal_to_plain", {}) and record["equal_to_plain"]["kind"] == "diverged"
           for record in records):
        lines += ["> **Warning:** an arm's greedy output diverged from plain decoding at a non-tie; that arm is "
                  "not exact, and its speed is not comparable.", ""]
    if any(record.get("synthetic") for record in records):
        lines += ["> **Synthetic acceptance:** speculative arms accepted drafts at drawn rates instead of checking "
                  "them; their speed is a what-if for that acceptance and their text is not the model's.", ""]
    for label, model in environment.get("models", {}).items():
        lines.append(f"- {label}: `{Path(model['path']).name}` sha256 `{model['sha256'][:16]}…`")
    if environment:
        upstream = environment.get("build_info", {}).get("upstream")
        lines += [f"- backend: {_fmt_listing(environment.get('backend'))}; "
                  f"device: {_fmt_listing(environment.get('device'))}",
                  f"- upstream llama.cpp: {json.dumps(upstream) if upstream is not None else '?'}",
                  f"- parameters: {json.dumps(environment.get('params', {}), sort_keys=True)}"]
        locks = environment.get("locks") or []
        lines.append("- device lock: " + (", ".join(f"{lock['device']} ({lock['path']})" for lock in locks)
                                          if locks else "not taken"))
        preflight = environment.get("cotenant", {}).get("preflight") or []
        lines.append(f"- co-tenants before the run: {len(preflight) or 'none'}")
    if document.get("parallel", 1) > 1:
        lines.append(f"- {document['parallel']} streams per run, decoded together: tok/s is their total, "
                     f"equality is checked on the first stream")
    lines += ["", "## Throughput (decode tok/s)", "",
              "| class | depth | arm | mode | median | min–max | spread % | n | acceptance | tokens/step "
              "| speedup vs plain | ratio to | equal to plain | contaminated |",
              "|---|---:|---|---|---:|---|---:|---:|---:|---:|---|---|---|---|"]
    for record in records:
        ratio_to = record.get("ratio_to")
        lines.append(
            f"| {record['class']} | {record['depth']} | {record['arm']} | {record.get('mode_label', '–')} "
            f"| {_fmt(record['median_tps'])} | {_fmt(record['min_tps'])}–{_fmt(record['max_tps'])} "
            f"| {_fmt(record['spread_pct'])} | {len(record['runs'])} | {_fmt(record.get('acceptance'), 3)} "
            f"| {_fmt(record.get('tokens_per_step'), 2)} | {_fmt_ratio(record.get('speedup_vs_plain'))} "
            f"| {(ratio_to['arm'] + ': ' + _fmt_ratio(ratio_to)) if ratio_to else '–'} "
            f"| {'synthetic acceptance' if record.get('synthetic') else _fmt_equivalence(record.get('equal_to_plain'))} "
            f"| {'**contaminated**' if record.get('contaminated') else 'no'} |")
    if any(record.get("cold_start_each_run") for record in records):
        lines += ["", "Upstream's llama-speculative-simple loads the model for every run, so each of its runs is a "
                  "first-after-load run."]
    breakeven = document.get("breakeven") or []
    if breakeven:
        lines += ["", "## Break-even (from forced zero-acceptance runs)", "",
                  "| arm | class | depth | step cost vs plain | tokens/step needed | acceptance needed "
                  "| measured tokens/step | equivalent acceptance | predicted speedup |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for analysis in breakeven:
            for point in analysis["points"]:
                lines.append(
                    f"| {analysis['arm']} | {analysis['content_class']} | {point['depth']} "
                    f"| {_fmt(point['cost_ratio'], 2)} | {_fmt(point['tokens_per_step_needed'], 2)} "
                    f"| {_fmt(point['acceptance_needed'], 3)} | {_fmt(point['tokens_per_step'], 2)} "
                    f"| {_fmt(point['equivalent_acceptance'], 3)} | {_fmt(point['predicted_speedup'], 2)} |")
        lines.append("")
        for analysis in breakeven:
            verdict = {"pays-throughout": "pays at every measured depth",
                       "never-pays": "does not pay even at the shallowest depth",
                       "unmeasured": "nothing was drafted, so no speculation cost was measured",
                       "stops-paying": f"stops paying at about depth {_fmt(analysis['breakeven_depth'], 0)}"}
            lines.append(f"- {analysis['arm']} on {analysis['content_class']}: {verdict[analysis['status']]}")
    warmups = [(record["arm"], value) for record in records for value in record.get("warmup_discarded", [])]
    if warmups:
        lines += ["", "Discarded warm-ups (first generation after load): "
                  + ", ".join(f"{arm} {value:.1f} tok/s" for arm, value in warmups)]
    return "\n".join(lines) + "\n"


def _new_figure(n_panels: int):
    from matplotlib.figure import Figure  # an explicit Figure: no pyplot state, no GUI backend

    figure = Figure(figsize=(max(6.0, 4.5 * n_panels), 4.5), layout="constrained")
    return figure, figure.subplots(1, n_panels, squeeze=False)[0]


def _plot_throughput(records: Sequence[Mapping], path: Path) -> None:
    depths = sorted({record["depth"] for record in records})
    classes = list(dict.fromkeys(record["class"] for record in records))
    arms = list(dict.fromkeys(record["arm"] for record in records))
    by_key = {(record["arm"], record["class"], record["depth"]): record for record in records}
    figure, axes = _new_figure(len(depths))
    width = 0.8 / len(arms)
    for axis, depth in zip(axes, depths, strict=True):
        for offset, arm in enumerate(arms):
            rows = [by_key.get((arm, cls, depth)) for cls in classes]
            positions = [index + offset * width for index, row in enumerate(rows) if row]
            present = [row for row in rows if row]
            medians = np.array([row["median_tps"] for row in present])
            errors = [medians - [row["min_tps"] for row in present], [row["max_tps"] for row in present] - medians]
            bars = axis.bar(positions, medians, width, yerr=errors, capsize=3, label=arm)
            for bar, row in zip(bars, present, strict=True):
                if row.get("contaminated"):
                    bar.set_hatch("//")
        axis.set_xticks([index + 0.4 - width / 2 for index in range(len(classes))], classes)
        axis.set_title(f"depth {depth}")
        axis.set_ylabel("decode tok/s (median, min–max)")
    axes[-1].legend(fontsize="small")
    if any(record.get("contaminated") for record in records):
        figure.suptitle("hatched bars: contaminated by a co-tenant", fontsize="small")
    figure.savefig(path, dpi=110)


def _plot_acceptance(records: Sequence[Mapping], path: Path) -> bool:
    """Accepted over drafted per draft position, pooled over depths, per speculative arm and class."""
    pooled: dict[tuple[str, str], list[Mapping]] = {}
    for record in records:
        if any(record.get("drafted_per_position") or []) and not record.get("force_reject"):
            pooled.setdefault((record["arm"], record["class"]), []).append(record)
    if not pooled:
        return False
    figure, axes = _new_figure(1)
    axis = axes[0]
    width = 0
    for (arm, cls), rows in pooled.items():
        drafted = np.asarray(sum_by_position([row["drafted_per_position"] for row in rows]), dtype=float)
        accepted = np.asarray(sum_by_position([row["accepted_per_position"] for row in rows]), dtype=float)
        accepted = np.pad(accepted, (0, drafted.size - accepted.size))  # nothing accepted past the last draft
        rate = np.divide(accepted, drafted, out=np.full(drafted.size, np.nan), where=drafted > 0)
        axis.plot(range(1, drafted.size + 1), rate, marker="o", label=f"{arm} · {cls}")
        width = max(width, drafted.size)
    axis.set_xticks(range(1, width + 1))
    axis.set_xlabel("draft position")
    axis.set_ylabel("accepted / drafted")
    axis.set_ylim(0, 1.05)
    axis.set_title("acceptance by draft position (all depths)")
    axis.legend(fontsize="small")
    figure.savefig(path, dpi=110)
    return True


def _plot_speedup(records: Sequence[Mapping], breakeven: Sequence[Mapping], path: Path) -> bool:
    series: dict[str, dict[str, list[Mapping]]] = {}
    for record in records:
        if record.get("speedup_vs_plain") and record.get("arm_kind") == "session" and not record.get("force_reject"):
            series.setdefault(record["arm"], {}).setdefault(record["class"], []).append(record)
    if not series:
        return False
    crossings = {(analysis["arm"], analysis["content_class"]): analysis["breakeven_depth"] for analysis in breakeven}
    figure, axes = _new_figure(len(series))
    for axis, (arm, by_class) in zip(axes, series.items(), strict=True):
        for cls, unordered in by_class.items():
            rows = sorted(unordered, key=lambda row: row["depth"])
            depths = [row["depth"] for row in rows]
            speedups = [row["speedup_vs_plain"] for row in rows]
            medians = [speedup["median"] for speedup in speedups]
            line, = axis.plot(depths, medians, marker="o", label=cls)
            axis.fill_between(depths, [s["min"] for s in speedups], [s["max"] for s in speedups],
                              color=line.get_color(), alpha=0.2)
            crossing = crossings.get((arm, cls))
            if crossing is not None:
                axis.axvline(crossing, color=line.get_color(), linestyle="--", linewidth=1)
                axis.annotate(f"break-even ≈ {crossing:.0f}", (crossing, 1.0), color=line.get_color(),
                              fontsize="small", rotation=90, va="bottom")
        axis.axhline(1.0, color="grey", linewidth=1)
        axis.set_title(arm)
        axis.set_xlabel("context depth (tokens)")
        axis.set_ylabel("speedup vs plain (median, min–max)")
        axis.legend(fontsize="small")
    figure.savefig(path, dpi=110)
    return True


def write_plots(document: Mapping, directory: str | Path) -> list[Path]:
    """PNG plots of a recorded benchmark; returns the files written. Needs matplotlib (pyllamaspec[bench])."""
    if find_spec("matplotlib") is None:
        raise ReportError("plots need matplotlib: pip install 'pyllamaspec[bench]'")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    records = document["records"]
    written = []
    if records:
        _plot_throughput(records, directory / "throughput.png")
        written.append(directory / "throughput.png")
    if _plot_acceptance(records, directory / "acceptance_by_position.png"):
        written.append(directory / "acceptance_by_position.png")
    if _plot_speedup(records, document.get("breakeven") or [], directory / "speedup_vs_depth.png"):
        written.append(directory / "speedup_vs_depth.png")
    return written
