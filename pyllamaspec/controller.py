"""The draft-length controller alone: the one a session runs natively, driven step by step from Python.

No models: whoever drives it says what each step cost and what was accepted (an injected clock), and it chooses the
next step's draft length per stream - the way tests and ``pyllamaspec.bench.replay`` exercise it against scripted
acceptance and recorded costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import _native
from .config import MAX_DRAFT, MAX_STREAMS, check_kv_window
from .errors import ConfigError

DRAFTER_KINDS = {"model": 1, "autoregressive": 2, "block": 3, "ngram": 4}


@dataclass
class Observation:
    """One step as the loop tells it: per stream, the draft length chosen, tokens drafted, accepted and caught up,
    depth and whether it took part (lists of the controller's n_streams), and what the step cost in ms."""

    k: Sequence[int]
    drafted: Sequence[int]
    accepted: Sequence[int]
    depth: Sequence[int]
    active: Sequence[int]
    catchup: Sequence[int] | None = None
    source: Sequence[int] | None = None  # 1: a free draft (an n-gram match beside a draft model)
    t_draft_first: float = 0.0
    t_draft_rest: float = 0.0
    draft_iters: int = 0
    t_draft_call: float = 0.0
    t_target: float = 0.0
    t_step: float = 0.0


def cost_point_array(ffi, points: Sequence[Sequence[float]]):
    """(table, bucket, n_tokens, count, ms) points as a pls_cost_point array and its length; a malformed point raises
    ConfigError (a session's seed_costs() and a controller's take the same)."""
    try:
        pts = list(points)
    except TypeError as e:
        raise ConfigError(f"cost points must be a list of (table, bucket, n_tokens, count, ms), not {points!r}") from e
    buf = ffi.new("pls_cost_point[]", max(1, len(pts)))
    for i, p in enumerate(pts):
        try:
            table, bucket, n_tokens, count, ms = p
            buf[i].table, buf[i].bucket, buf[i].n_tokens, buf[i].count, buf[i].ms = table, bucket, n_tokens, count, ms
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"cost point {i} {p!r} must be (table, bucket, n_tokens, count, ms) numbers") from e
    return buf, len(pts)


def cost_point_tuples(buf, n: int) -> list[tuple[int, int, int, int, float]]:
    return [(p.table, p.bucket, p.n_tokens, p.count, p.ms) for p in buf[0:n]]


class Controller:
    def __init__(self, n_max: int, n_streams: int = 1, kind: str = "model", adaptive: bool = True, seed: int = 1,
                 kv_window: int = 256) -> None:
        if kind not in DRAFTER_KINDS:
            raise ConfigError(f"kind={kind!r} must be one of {', '.join(DRAFTER_KINDS)}")
        if not 0 <= n_max <= MAX_DRAFT:
            raise ConfigError(f"n_max={n_max} must be within 0..{MAX_DRAFT}")
        if not 1 <= n_streams <= MAX_STREAMS:
            raise ConfigError(f"n_streams={n_streams} must be within 1..{MAX_STREAMS}")
        check_kv_window(kv_window, "Controller")
        self.n_max, self.n_streams = n_max, n_streams
        self._ffi, self._lib = _native.load()
        ffi = self._ffi
        p = ffi.new("pls_controller_params *")
        p.n_max, p.n_streams, p.drafter_kind, p.adaptive, p.seed = n_max, n_streams, DRAFTER_KINDS[kind], int(adaptive), seed
        p.kv_window = kv_window
        slot = ffi.new("pls_controller **")
        err = _native.ErrorBuffer(ffi)
        _native.check(self._lib.pls_controller_new(p, slot, err.buf, err.SIZE), err)
        self._ctl = ffi.gc(slot[0], self._lib.pls_controller_free)
        self._k = ffi.new("int32_t[]", n_streams)

    def _ints(self, values: Sequence[int] | None, default: int = 0):
        """One int per stream (the native side reads n_streams of each): a list of another length is refused."""
        if values is None:
            return self._ffi.new("int32_t[]", [default] * self.n_streams)
        values = [int(v) for v in values]
        if len(values) != self.n_streams:
            raise ConfigError(f"{len(values)} values given for a controller of {self.n_streams} streams: one per stream")
        return self._ffi.new("int32_t[]", values)

    def choose(self, caps: Sequence[int], depth: Sequence[int], active: Sequence[int] | None = None,
               pending: Sequence[int] | None = None, free: Sequence[int] | None = None) -> list[int]:
        """Each stream's draft length for the next step (caps bound them; pending: tokens a draft model would catch
        up first; free: the length of a draft that exists at no cost, an n-gram match)."""
        rc = self._lib.pls_controller_choose(self._ctl, self._ints(caps), self._ints(depth), self._ints(active, 1),
                                            self._ints(pending), self._ints(free), self._k)
        if rc != 0:
            raise ConfigError(f"pls_controller_choose failed ({rc})")
        return list(self._k[0:self.n_streams])

    def observe(self, o: Observation) -> None:
        ffi = self._ffi
        obs = ffi.new("pls_step_observation *")
        keep = [self._ints(v) for v in (o.k, o.drafted, o.accepted, o.catchup, o.depth, o.active, o.source)]
        obs.n_streams = self.n_streams
        obs.k, obs.n_drafted, obs.n_accepted, obs.n_catchup, obs.depth, obs.active, obs.source = keep
        obs.t_draft_first_ms, obs.t_draft_rest_ms, obs.n_draft_iters = o.t_draft_first, o.t_draft_rest, o.draft_iters
        obs.t_draft_call_ms, obs.t_target_ms, obs.t_step_ms = o.t_draft_call, o.t_target, o.t_step
        if self._lib.pls_controller_observe(self._ctl, obs) != 0:
            raise ConfigError("pls_controller_observe refused the observation")

    def reset_stream(self, stream: int = 0) -> None:
        """A new prompt in the stream (a prompt was processed in between); costs and acceptance evidence stay."""
        if self._lib.pls_controller_reset_stream(self._ctl, stream) != 0:
            raise ConfigError(f"no stream {stream}")

    def learnt_costs(self) -> list[tuple[int, int, int, int, float]]:
        """What it measured, as (table, depth bucket, tokens, count, ms) points - a session's learnt_costs(), which
        its cost cache keeps for the next session of the same setup."""
        n = self._lib.pls_controller_export_costs(self._ctl, self._ffi.NULL, 0)
        if n < 0:
            raise ConfigError(f"pls_controller_export_costs failed ({n})")
        buf = self._ffi.new("pls_cost_point[]", max(1, n))
        got = self._lib.pls_controller_export_costs(self._ctl, buf, n)
        if got < 0:
            raise ConfigError(f"pls_controller_export_costs failed ({got})")
        return cost_point_tuples(buf, min(got, n))

    def seed_costs(self, points: Sequence[Sequence[float]]) -> None:
        """Start from costs another controller (or session) learnt, as a session does from its cost cache. A
        malformed point raises ConfigError and nothing is imported."""
        buf, n = cost_point_array(self._ffi, points)
        err = _native.ErrorBuffer(self._ffi)
        _native.check(self._lib.pls_controller_import_costs(self._ctl, buf, n, err.buf, err.SIZE), err, ConfigError)

    def info(self):
        """pls_adaptive_info: the costs and acceptance it has learnt (native struct)."""
        o = self._ffi.new("pls_adaptive_info *")
        self._lib.pls_controller_info(self._ctl, o)
        return o

    def stats(self):
        """pls_stats with its counters: k_hist, n_probes, n_guard, est_plain_ms (native struct)."""
        o = self._ffi.new("pls_stats *")
        self._lib.pls_controller_stats(self._ctl, o)
        return o
