"""``pyllamaspec bench``: speculative-decoding benchmarks built to survive an adversarial re-measurement.

Modules, one job each: lock (per-device exclusive lock), cotenant (other work on the machine, GPU telemetry),
stats (robust summaries), plan (arms and the interleaved schedule), workloads (prompt sets, context depth),
equivalence (exactness against plain greedy decoding), breakeven (cost model), backends and external (what
generates tokens), runner (orchestration), results (records), report (JSON, Markdown, plots), command (what
the command does with its options; the command line itself is pyllamaspec.cli.bench).
"""
