"""`pyllamaspec inspect`: describe a GGUF from its header, or judge a target + drafter pair.

    pyllamaspec inspect FILE [--json]
    pyllamaspec inspect TARGET --pair DRAFTER [--spec-type a,b] [--n-max N] [--json]

Exit status: 0 described / pair OK; 2 on every failure, a pair that cannot run included (the report on
stdout, the error line on stderr). A file with a tensor of
a ggml type the installed gguf package does not know is an error: its description would be wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ..config import SPEC_TYPE_ALIASES
from ..errors import ModelLoadError
from ..ggufinfo import GGUFSummary, PairingReport, check_pair, read_summary
from ..ggufinfo.reader import unknown_type_message

EXIT_OK = 0
EXIT_PAIR_REFUSED = 2  # a failure like any other (README: every failure is exit status 2)

# Per-tensor detail: thousands of entries on a large model, too much for one JSON object.
JSON_OMITTED_FIELDS = ("tensors",)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "inspect",
        help="describe a GGUF, or check that a drafter can run with a target",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE", help="GGUF to describe (the target, with --pair)")
    parser.add_argument("--pair", metavar="DRAFTER", help="drafter GGUF to check against FILE (default: none)")
    parser.add_argument(
        "--spec-type", metavar="TYPES",
        help="comma-separated speculative types (llama.cpp names) (default: detected from the drafter)",
    )
    parser.add_argument("--n-max", type=int, metavar="N",
                        help="draft tokens per step, checked as a session would and against the drafter's block "
                             "(default: not checked)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = _read(args.file)
    if args.pair is None:
        print(json.dumps(summary_json(target), indent=2) if args.json else format_summary(target))
        return EXIT_OK
    drafter = _read(args.pair)
    report = check_pair(target, drafter, _parse_spec_types(args.spec_type), args.n_max)
    print(json.dumps(pair_json(target, drafter, report), indent=2) if args.json
          else format_pair(target, drafter, report))
    if report.ok:
        return EXIT_OK
    from .output import error_line

    n = len(report.problems)
    print(error_line(f"{args.pair} cannot draft for {args.file}: {n} problem{'s' * (n != 1)} (reported on stdout)"),
          file=sys.stderr)
    return EXIT_PAIR_REFUSED


def _read(path: str) -> GGUFSummary:
    """The file's summary; a tensor type the gguf package does not know makes its sizes unknowable."""
    summary = read_summary(path)
    if summary.unknown_tensor_types:
        raise ModelLoadError(unknown_type_message(path, summary.unknown_tensor_types))
    return summary


def _parse_spec_types(value: str | None) -> list[str] | None:
    """Split the comma list and map the session API's short names; unknown names are check_pair's to report."""
    if value is None:
        return None
    names = (name.strip().lower() for name in value.split(","))
    return [SPEC_TYPE_ALIASES.get(name, name) for name in names if name]


def summary_json(summary: GGUFSummary) -> dict[str, Any]:
    data = dataclasses.asdict(summary)
    for name in JSON_OMITTED_FIELDS:
        del data[name]
    return data


def pair_json(target: GGUFSummary, drafter: GGUFSummary, report: PairingReport) -> dict[str, Any]:
    return {"target": target.path, "drafter": drafter.path, **dataclasses.asdict(report)}


def format_summary(summary: GGUFSummary) -> str:
    rows = [
        ("file", summary.path),
        ("arch", summary.arch + (f" ({summary.name})" if summary.name else "")),
        ("role", summary.role),
        ("quant", summary.file_type or _dominant_type(summary)),
        ("size", format_size(summary.size_bytes)),
        ("context", _or_dash(summary.n_ctx_train)),
        ("n_embd", _or_dash(summary.n_embd)),
        ("n_layer", _layers(summary)),
        ("n_vocab", _or_dash(summary.n_vocab)),
        ("tokenizer", " / ".join(v for v in (summary.tokenizer_model, summary.tokenizer_pre) if v) or "-"),
    ]
    if summary.arch in ("dflash", "eagle3"):
        rows += [
            ("block size", _or_dash(summary.block_size)),
            ("target layers", ", ".join(map(str, summary.target_layers)) or "-"),
            ("mask token", _or_dash(summary.mask_token_id)),
        ]
    if summary.swa_window:
        rows.append(("SWA window", str(summary.swa_window)))
    return _table(rows)


def format_pair(target: GGUFSummary, drafter: GGUFSummary, report: PairingReport) -> str:
    types = ", ".join(report.spec_types) or "none"
    if report.ok:
        lines = [f"OK: {drafter.path} can draft for {target.path} ({types})"]
    else:
        lines = [f"NOT OK: {drafter.path} cannot draft for {target.path} ({types}):"]
        lines += [f"  - {problem}" for problem in report.problems]
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def format_size(n_bytes: int) -> str:
    gib = n_bytes / 2**30
    return f"{gib:.2f} GiB" if gib >= 1 else f"{n_bytes / 2**20:.1f} MiB"


def _layers(summary: GGUFSummary) -> str:
    if summary.n_layer is None:
        return "-"
    extra = [f"{summary.n_layer_nextn} MTP"] if summary.n_layer_nextn else []
    extra += ["hybrid"] if summary.is_hybrid else []
    return str(summary.n_layer) + (f" ({', '.join(extra)})" if extra else "")


def _dominant_type(summary: GGUFSummary) -> str:
    """Without general.file_type, the most common tensor type says roughly what the quant is."""
    if not summary.tensor_types:
        return "-"
    return max(summary.tensor_types.items(), key=lambda item: item[1])[0] + " (most tensors)"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
