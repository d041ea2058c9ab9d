"""Reports rendered from a recorded JSON alone: Markdown content, PNG plots, and the model fingerprint cache."""

import hashlib
import json
import os

import pytest

from pyllamaspec.bench.report import (ReportError, assemble, build_environment, file_sha256, load_json,
                                      render_markdown, write_json, write_plots)


def make_record(arm, content_class, depth, runs, **fields):
    ordered = sorted(runs)
    record = {
        "arm": arm, "arm_kind": "session", "spec_types": ["none"], "n_max": None, "drafter": None,
        "force_reject": False, "mode": {"chat_template": True, "reasoning": None},
        "mode_label": "chat template, reasoning template default", "class": content_class, "depth": depth,
        "runs": runs, "warmup_discarded": [], "median_tps": ordered[len(ordered) // 2], "min_tps": ordered[0],
        "max_tps": ordered[-1], "spread_pct": (ordered[-1] - ordered[0]) / ordered[len(ordered) // 2] * 100,
        "acceptance": None, "tokens_per_step": None, "accepted_per_position": [], "drafted_per_position": [],
        "equal_to_plain": {"equal": True, "kind": "identical", "position": None, "margin": None},
        "speedup_vs_plain": None, "ratio_to": None, "contaminated": False,
    }
    return {**record, **fields}


def recorded_document():
    draft = {"spec_types": ["draft-simple"], "n_max": 4, "drafter": "q4", "acceptance": 0.6,
             "tokens_per_step": 2.2, "accepted_per_position": [30, 20, 10, 5], "drafted_per_position": [40] * 4}
    records = [
        make_record("plain", "code", 0, [50.0, 51.0, 49.0], warmup_discarded=[44.0]),
        make_record("draft", "code", 0, [110.0, 100.0, 105.0], **draft,
                    speedup_vs_plain={"median": 2.1, "min": 2.0, "max": 2.2, "n": 3}),
        make_record("plain", "code", 8192, [30.0, 31.0, 29.0]),
        make_record("draft", "code", 8192, [28.0, 27.0, 29.0], **draft, contaminated=True,
                    speedup_vs_plain={"median": 0.93, "min": 0.9, "max": 0.97, "n": 3},
                    equal_to_plain={"equal": False, "kind": "diverged", "position": 17, "margin": 1.234}),
        make_record("plain", "prose", 0, [52.0, 50.0, 51.0]),
        make_record("draft", "prose", 0, [60.0, 61.0, 59.0], **draft,
                    speedup_vs_plain={"median": 1.18, "min": 1.1, "max": 1.2, "n": 3},
                    equal_to_plain={"equal": True, "kind": "near-tie", "position": 3, "margin": 0.012}),
    ]
    breakeven = [{"arm": "draft", "content_class": "code", "n_max": 4, "status": "stops-paying",
                  "breakeven_depth": 7021.7, "points": [
                      {"depth": 0, "cost_ratio": 1.25, "tokens_per_step_needed": 1.25, "acceptance_needed": 0.2,
                       "tokens_per_step": 2.2, "equivalent_acceptance": 0.6, "predicted_speedup": 1.76}]}]
    environment = {"models": {"target": {"path": "/m/target.gguf", "size": 3, "sha256": "ab" * 32}},
                   "backend": ["CUDA"], "device": ["CUDA0"], "build_info": {"upstream": {"commit": "0c1e570"}},
                   "params": {"repeats": 3}, "locks": [{"device": "CUDA0", "path": "/tmp/x/CUDA0.lock"}],
                   "cotenant": {"preflight": []}}
    return {"environment": environment, "records": records, "breakeven": breakeven, "mixed_modes": False}


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "bench.json"
    write_json(recorded_document(), path)
    return path


def test_markdown_from_recorded_json_has_every_row_and_the_warnings(recorded):
    markdown = render_markdown(load_json(recorded))
    rows = [line for line in markdown.splitlines() if line.startswith("| code") or line.startswith("| prose")]
    assert len(rows) == 6
    assert "| draft | code | 0 | 1.25 | 1.25 | 0.200 | 2.20 | 0.600 | 1.76 |" in markdown  # the break-even point
    assert "| code | 0 | draft |" in markdown and "2.10× (2.00–2.20)" in markdown
    assert "**DIVERGED** at token 17, margin 1.234" in markdown
    assert "near-tie at token 3, margin 0.012" in markdown
    assert "**contaminated**" in markdown and "Warning:** another process" in markdown
    assert "stops paying at about depth 7022" in markdown
    assert "plain 44.0 tok/s" in markdown  # the discarded warm-up is shown, not hidden
    assert "sha256 `abababababababab…`" in markdown and "0c1e570" in markdown


def test_clean_record_has_no_warnings():
    document = recorded_document()
    document["records"] = [record for record in document["records"]
                           if not record["contaminated"] and record["equal_to_plain"]["kind"] != "diverged"]
    markdown = render_markdown(document)
    assert "Warning" not in markdown


def test_plots_are_written_as_non_empty_pngs(recorded, tmp_path):
    pytest.importorskip("matplotlib")
    written = write_plots(load_json(recorded), tmp_path / "plots")
    assert sorted(path.name for path in written) == ["acceptance_by_position.png", "speedup_vs_depth.png",
                                                     "throughput.png"]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_only_plots_with_data_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    document = {"records": [make_record("plain", "code", 0, [50.0, 51.0])]}
    assert [path.name for path in write_plots(document, tmp_path)] == ["throughput.png"]


def test_load_json_rejects_what_is_not_a_bench_record(tmp_path):
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "broken.json").write_text("{")
    for name in ("other.json", "broken.json", "missing.json"):
        with pytest.raises(ReportError):
            load_json(tmp_path / name)


def test_model_hash_is_streamed_once_then_served_from_the_cache(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    cache = tmp_path / "cache" / "sha256.json"
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    assert file_sha256(model, cache) == expected
    # poison the cache: a hit returns the cached value, proving the file was not read again
    entries = json.loads(cache.read_text())
    entries[str(model.resolve())]["sha256"] = "cached"
    cache.write_text(json.dumps(entries))
    assert file_sha256(model, cache) == "cached"
    # a changed file (size and mtime) is hashed afresh
    model.write_bytes(b"GGUF changed")
    os.utime(model, ns=(1, 1))
    assert file_sha256(model, cache) == hashlib.sha256(b"GGUF changed").hexdigest()


def test_environment_and_assembly(tmp_path):
    model = tmp_path / "t.gguf"
    model.write_bytes(b"GGUF")
    environment = build_environment(build_info={"backends": ["CPU"], "devices": []}, models={"target": model},
                                    params={"repeats": 8}, cotenant={"ignored_names": []},
                                    locks=[{"device": "cpu", "held": True}], hash_cache=tmp_path / "c.json")
    assert environment["models"]["target"]["sha256"] == hashlib.sha256(b"GGUF").hexdigest()
    assert environment["backend"] == ["CPU"] and environment["locks"][0]["held"]
    document = assemble(environment, {"records": [], "cotenant": {"policy": "flag", "preflight": []}})
    assert document["environment"]["cotenant"] == {"ignored_names": [], "policy": "flag", "preflight": []}
    assert "cotenant" not in document and document["records"] == []
