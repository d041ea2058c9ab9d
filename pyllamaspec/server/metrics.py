"""Prometheus metrics of the server, named as llama-server names them (with its `llamacpp:` prefix swapped for
`pyllamaspec:` by default) and, for speculative decoding, as vLLM and llama-server do (spec_decode_*)."""

from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()   # no `_created` series beside each counter: llama-server and vLLM show none

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)

# name (after the prefix) -> what it counts; README's table is made from the same words
METRICS = {
    "requests_processing": "Requests generating now (holding a slot)",
    "requests_deferred": "Requests waiting for a slot",
    "prompt_tokens_total": "Prompt tokens processed",
    "prompt_seconds_total": "Prompt processing time (from a request's admission to its first token)",
    "tokens_predicted_total": "Generated tokens (those returned to clients)",
    "tokens_predicted_seconds_total": "Generation time (from a request's first token to its last)",
    "n_decode_total": "Steps of the running batch (each one target batch)",
    "n_busy_slots_per_decode": "Average busy slots per step",
    "time_to_first_token_seconds": "Time from a request's arrival to its first token",
    "requests_finished_total": "Requests that ended, by finish_reason (stop, length, cancelled, error, shutdown)",
    "requests_rejected_total": "Requests refused before generating, by reason (queue_full, draining)",
    "spec_decode_num_drafts_total": "Drafts verified (one per sequence and step that drafted)",
    "spec_decode_num_draft_tokens_total": "Draft tokens verified",
    "spec_decode_num_accepted_tokens_total": "Draft tokens accepted",
    "spec_decode_num_accepted_tokens_per_pos_total": "Draft tokens accepted at each draft position (0 = first)",
}


class ServerMetrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self, prefix: str = "pyllamaspec", running: Callable[[], int] = lambda: 0,
                 waiting: Callable[[], int] = lambda: 0) -> None:
        self.prefix = prefix
        self.registry = r = CollectorRegistry()

        def name(key: str) -> str:
            return f"{prefix}:{key.removesuffix('_total')}"

        def counter(key: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name(key), METRICS[key], labelnames=labels, registry=r)

        self._lock = threading.Lock()
        self._busy_sum = 0
        self._steps = 0
        g = Gauge(name("requests_processing"), METRICS["requests_processing"], registry=r)
        g.set_function(lambda: running())
        g = Gauge(name("requests_deferred"), METRICS["requests_deferred"], registry=r)
        g.set_function(lambda: waiting())
        self.prompt_tokens = counter("prompt_tokens_total")
        self.prompt_seconds = counter("prompt_seconds_total")
        self.tokens_predicted = counter("tokens_predicted_total")
        self.tokens_predicted_seconds = counter("tokens_predicted_seconds_total")
        self.n_decode = counter("n_decode_total")
        g = Gauge(name("n_busy_slots_per_decode"), METRICS["n_busy_slots_per_decode"], registry=r)
        g.set_function(self._busy_per_decode)
        self.ttft = Histogram(name("time_to_first_token_seconds"), METRICS["time_to_first_token_seconds"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.finished = counter("requests_finished_total", ("finish_reason",))
        self.rejected = counter("requests_rejected_total", ("reason",))
        self.drafts = counter("spec_decode_num_drafts_total")
        self.draft_tokens = counter("spec_decode_num_draft_tokens_total")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens_total")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos_total", ("position",))

    def step(self, busy_slots: int) -> None:
        self.n_decode.inc()
        with self._lock:
            self._steps += 1
            self._busy_sum += busy_slots

    def _busy_per_decode(self) -> float:
        with self._lock:
            return self._busy_sum / self._steps if self._steps else 0.0

    def draft(self, n_drafted: int, n_accepted: int) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(n_drafted)
        self.accepted_tokens.inc(n_accepted)
        for pos in range(n_accepted):   # acceptance is a prefix of the draft
            self.accepted_per_pos.labels(position=str(pos)).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
