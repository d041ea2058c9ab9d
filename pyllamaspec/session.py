"""Speculative sessions: the Python face of the native draft/verify/rollback loop.

Everything per token happens in native code; Python hears once per verify step (1..n_max+1 tokens),
with the GIL released in between. generate() runs the whole loop in one native call; stream() steps
it from a Python iterator and yields UTF-8-safe text pieces. generate_batch() and stream_batch() run
up to n_parallel prompts together: every step drafts for all of them and verifies their drafts in one
target batch.
"""

from __future__ import annotations

import codecs
import operator
import threading
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

from . import _native
from ._native import FINISH_REASONS, ROLLBACK_KINDS, constants
from .config import INT32_MAX, MAX_DRAFT, SPEC_TYPES, SequenceParams, SessionConfig
from .controller import cost_point_array, cost_point_tuples
from .errors import ConfigError, ConfigTypeError, GenerationError, ParamError, SessionBusyError
from .ggufinfo import read_summary, require_pair
from .grammar import SamplingShape
from .model import Model, token_bytes, token_ids, tokenize
from .native_params import native_seq_params, native_session_params

# how the controller prices a draft (PLS_DRAFTER_*)
DRAFTER_KINDS = {value: name.removeprefix("PLS_DRAFTER_").lower().replace("_", " ").replace("ngram", "n-gram")
                 .replace("model", "draft model") for name, value in constants().items() if name.startswith("PLS_DRAFTER_")}


@dataclass
class Stats:
    """Counted in native code. AL (mean accepted length) = 1 + accepted / steps."""

    n_prompt: int = 0
    n_generated: int = 0
    n_steps: int = 0
    n_drafts: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    n_rollback_kv: int = 0
    n_rollback_ring: int = 0
    n_rollback_checkpoint: int = 0
    n_replayed: int = 0
    t_prefill_ms: float = 0.0
    t_draft_ms: float = 0.0
    t_verify_ms: float = 0.0
    t_rollback_ms: float = 0.0
    t_sample_ms: float = 0.0
    t_decode_ms: float = 0.0
    t_process_ms: float = 0.0
    t_sync_ms: float = 0.0            # waiting for the device to finish the target's batch (part of t_verify_ms)
    n_graph_captures: int = 0         # CUDA/HIP graphs captured during the run (process-wide; 0 on the CPU)
    n_graph_resets: int = 0           # graphs dropped because a batch of another shape came
    n_graph_reused: int = 0           # batches (target and draft model) that ran a graph built earlier
    k_histogram: list[int] = field(default_factory=list)  # stream-steps per draft length k (index 0: plain steps)
    n_probes: int = 0
    n_guard: int = 0
    n_catchup: int = 0
    n_free_drafts: int = 0            # drafts taken from an n-gram lookup beside a draft model
    est_plain_ms: float = 0.0         # what plain decoding would have taken for the same tokens (cost model)

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.n_accepted / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: generated tokens over the loop's wall time after prefill."""
        return self.n_generated / (self.t_decode_ms / 1000.0) if self.t_decode_ms > 0 else 0.0

    @property
    def estimated_plain_tokens_per_second(self) -> float:
        """Plain decoding's throughput for the same tokens at the same depths, from the costs measured in this run."""
        return self.n_generated / (self.est_plain_ms / 1000.0) if self.est_plain_ms > 0 else 0.0

    @property
    def speedup_vs_plain(self) -> float:
        """Estimated plain time over real time: > 1 when speculation bought speed."""
        return self.est_plain_ms / self.t_decode_ms if self.t_decode_ms > 0 and self.est_plain_ms > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def rollback_paths(self) -> list[str]:
        return [k for k, n in (("kv", self.n_rollback_kv), ("ring", self.n_rollback_ring),
                               ("checkpoint", self.n_rollback_checkpoint)) if n > 0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance=self.acceptance, mean_accepted_length=self.mean_accepted_length,
                 tokens_per_second=self.tokens_per_second, acceptance_by_position=self.acceptance_by_position,
                 rollback_paths=self.rollback_paths,
                 estimated_plain_tokens_per_second=self.estimated_plain_tokens_per_second,
                 speedup_vs_plain=self.speedup_vs_plain)
        return d

    @classmethod
    def from_native(cls, s) -> "Stats":
        """From a pls_stats, field by field as the header declares them (read through cffi): per-position arrays
        end after the last drafted position, the draft-length histogram after its last non-zero entry."""
        drafted = list(s.drafted_per_pos)
        n_pos = max((i + 1 for i, n in enumerate(drafted) if n), default=0)
        values = {}
        for name, cfield in _native.ffi().typeof("pls_stats").fields:
            value = getattr(s, name)
            if cfield.type.kind == "array":
                items = list(value)
                n = n_pos if name in _PER_POSITION else max((i + 1 for i, x in enumerate(items) if x), default=0)
                value = items[:n]
            values[_STATS_FIELD.get(name, name)] = value
        return cls(**values)


def _sampling_param(message: str, params: SequenceParams) -> str | None:
    """The SequenceParams field a native refusal of a sequence's sampling names (its message starts with it)."""
    for name in ("grammar_triggers", "grammar", "logit_bias", "repeat_penalty", "repeat_last_n", "frequency_penalty",
                 "presence_penalty", "n_probs"):
        if message.startswith(name):
            return "json_schema" if name == "grammar" and params.json_schema is not None else name
    return None


# Stats' names of the pls_stats fields whose names differ (the per-position arrays share one length)
_STATS_FIELD = {"accepted_per_pos": "accepted_per_position", "drafted_per_pos": "drafted_per_position",
                "k_hist": "k_histogram"}
_PER_POSITION = frozenset({"accepted_per_pos", "drafted_per_pos"})


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    margins: list[float]          # target top-1 minus top-2 logit per token (config.margins)
    finish_reason: str
    stats: Stats

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, "margins": self.margins,
                "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class SessionInfo:
    spec_types: tuple[str, ...]
    n_max_requested: int
    n_max_effective: int
    block_size: int
    is_dflash2: bool
    n_rs_seq: int
    ring_bytes: int
    rollback_target: str
    rollback_draft: str
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_parallel: int
    target_layers: tuple[int, ...]
    target_head_device: str
    draft_device: str
    adaptive: bool
    synthetic: bool               # synthetic acceptance: the output is not the model's (speed measurement only)
    drafter_kind: str             # how a draft is priced: draft model, autoregressive, block, n-gram
    n_threads: int                # CPU threads for generation (n_threads 0: the cores useful for math)
    n_threads_batch: int          # and for prompt processing
    catchup_rows: int = 0         # rows a feature-reading drafter takes in per pass after skipped steps (0: none)
    feature_rows: int = 0         # rows per sequence the target keeps such a drafter's features in on its device
    backend_sampling: bool = False  # greedy rows are sampled on the target's output device
    kv_window: int = 256          # the target's KV cache view grows in steps of this many cells


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target's distribution at its position (the softmax of its
    raw logits, before any sampler: what a grammar or a bias changes is the choice, not this), and the most likely
    tokens there, most likely first."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token, logprob)


@dataclass(frozen=True)
class SequenceEvent:
    """What one step did for one sequence of a running batch (SpecSession.step_sequences)."""

    slot: int
    tokens: list[int]             # committed in this step
    finish_reason: str | None     # None while the sequence goes on
    n_drafted: int
    n_accepted: int
    n_prompt: int                 # prompt tokens processed in this step
    logprobs: list[TokenLogprob] | None = None  # one per token, for a sequence submitted with n_probs


@dataclass(frozen=True)
class AdaptiveInfo:
    """What the draft-length controller has learnt so far: costs measured on this machine (ms) and
    acceptance estimates. target_ms[i] is a target batch of i + 1 tokens at the last step's depth."""

    enabled: bool
    n_max: int
    depth_bucket: int
    target_ms: list[float]
    draft_first_ms: float
    draft_token_ms: float
    draft_call_ms: float
    catchup_token_ms: float
    overhead_ms: float
    cold_ms: float                # a target batch of a size not run in the two steps before: its extra cost
    hazards: list[float]          # P(draft position i accepted | the positions before it were)
    plain_ms_per_token: float
    last_k: list[int]             # the draft length chosen per stream in the last step

    def to_dict(self) -> dict:
        return asdict(self)


class SpecSession(_native.NativeOwner):
    """A target (and optionally a drafter) with a context, sampler and speculative engine.

    One generation at a time; reusable after a generation ends, is stopped, or fails. Safe to use from
    several threads: a second generation while one runs raises SessionBusyError; request_stop(), stats(),
    info and close() may be called from any thread at any time (close() stops what runs, then frees).
    The session keeps its models alive: closing a Model it uses does not disturb it.
    """

    def __init__(self, target: Model, drafter: Model | None = None, config: SessionConfig | None = None,
                 **overrides) -> None:
        if config is not None and overrides:
            raise ConfigError("pass either a SessionConfig or keyword settings, not both")
        config = config or SessionConfig(**overrides)
        if not isinstance(target, Model) or (drafter is not None and not isinstance(drafter, Model)):
            raise ConfigError("target (and drafter) must be pyllamaspec.Model objects")
        if drafter is not None:
            # every pairing problem at once, named, before the native side allocates a context
            report = require_pair(read_summary(target.path), read_summary(drafter.path), config.spec_types, config.n_max)
            if config.spec_types is None:
                config = config.replace(spec_types=report.spec_types)
        elif config.spec_types is None:
            config = config.replace(spec_types=())
        self.config = config
        self.target = target
        self.drafter = drafter
        self._ffi, self._lib = _native.load()
        ffi = self._ffi
        p = native_session_params(ffi, config)
        err = _native.ErrorBuffer(ffi)
        slot = ffi.new("pls_session **")
        with target._use() as t_ptr:
            if drafter is not None:
                with drafter._use() as d_ptr:
                    rc = self._lib.pls_session_open(t_ptr, d_ptr, p, slot, err.buf, err.SIZE)
            else:
                rc = self._lib.pls_session_open(t_ptr, ffi.NULL, p, slot, err.buf, err.SIZE)
            _native.check(rc, err, ConfigError)
            # the session holds the model natively from here on: text helpers use it through the session
            self._model_ptr = t_ptr
        self._handle = _native.NativeHandle(slot[0], self._lib.pls_session_close,
                                            GenerationError("the session was closed"))
        self._state = threading.Lock()   # guards _busy and stop requests against claim/release
        self._busy = False
        self.info = self._read_info()
        self._logprob_slots: set[int] = set()  # slots whose sequence asked for log-probabilities
        shape = SamplingShape.of(config)
        if shape != SamplingShape():
            # the sampling of what begin-style generation starts (generate, stream, the batch forms)
            keep = shape.native(ffi)
            with self._handle.use() as h:
                rc = self._lib.pls_session_set_sampling(h, keep[0], err.buf, err.SIZE)
            if rc != 0:
                self.close()
                _native.check(rc, err, ConfigError)
        self._cost_file = None
        if config.cost_cache and self.info.adaptive and self.info.drafter_kind != "none":
            self._open_cost_cache()

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop a generation in flight (any thread), wait for it to end, free the session."""
        if self._handle is not None:
            self._save_cost_cache()
            self._handle.close(before=self._lib.pls_request_stop)

    # -- costs measured on this machine ------------------------------------------------------

    def learnt_costs(self) -> list[tuple[int, int, int, int, float]]:
        """What the draft-length controller measured, as (table, depth bucket, tokens, count, ms) points
        (tables: the header's PLS_COST_*); seed_costs() gives them to another session of the same setup."""
        ffi = self._ffi
        err = _native.ErrorBuffer(ffi)
        room = 0
        while True:  # another thread may generate between the calls: ask again until the room holds them all
            buf = ffi.new("pls_cost_point[]", max(1, room))
            with self._handle.use() as h:
                n = self._lib.pls_session_export_costs(h, buf if room else ffi.NULL, room, err.buf, err.SIZE)
            self._raise_native(n, err)
            if n <= room:
                return cost_point_tuples(buf, n)
            room = n + 16

    def seed_costs(self, points: Sequence[Sequence[float]]) -> None:
        """Start the controller from costs measured earlier (learnt_costs() of a session of the same setup).
        A malformed point raises ConfigError and nothing is imported."""
        buf, n = cost_point_array(self._ffi, points)
        err = _native.ErrorBuffer(self._ffi)
        with self._handle.use() as h:
            rc = self._lib.pls_session_import_costs(h, buf, n, err.buf, err.SIZE)
        _native.check(rc, err, ConfigError)

    def _open_cost_cache(self) -> None:
        try:
            from . import costcache

            directory = costcache.cache_dir()
            if directory is None:
                return
            setup = costcache.setup_of(self)
            path = costcache.path_for(setup, directory)
            self._cost_file = (path, setup)
            points = costcache.load(path, setup)
            if points:
                self.seed_costs(points)
        except Exception:  # a cache is an optimisation: nothing about it may fail a session
            pass

    def _save_cost_cache(self) -> None:
        if getattr(self, "_cost_file", None) is None or self._handle.closed:
            return
        try:
            from . import costcache

            points = self.learnt_costs()
            if points:
                costcache.save(self._cost_file[0], self._cost_file[1], [list(p) for p in points])
        except Exception:  # busy (closed from another thread mid-generation), shutting down, read-only disk
            pass

    def _read_info(self) -> SessionInfo:
        ffi = self._ffi
        o = ffi.new("pls_session_info *")
        with self._handle.use() as h:
            self._lib.pls_session_get_info(h, o)
        return SessionInfo(
            spec_types=tuple(SPEC_TYPES[o.spec_types[i]] for i in range(o.n_spec_types) if o.spec_types[i] != 0),
            n_max_requested=o.n_max_requested, n_max_effective=o.n_max_effective, block_size=o.block_size,
            is_dflash2=bool(o.is_dflash2), n_rs_seq=o.n_rs_seq, ring_bytes=o.ring_bytes,
            rollback_target=ROLLBACK_KINDS[o.rollback_target], rollback_draft=ROLLBACK_KINDS[o.rollback_draft],
            n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=o.n_ubatch, n_parallel=o.n_parallel,
            target_layers=tuple(o.target_layers[i] for i in range(o.n_target_layers)),
            target_head_device=ffi.string(o.target_head_device).decode(),
            draft_device=ffi.string(o.draft_device).decode(), adaptive=bool(o.adaptive), synthetic=bool(o.synthetic),
            drafter_kind=DRAFTER_KINDS.get(o.drafter_kind, "none"), n_threads=o.n_threads,
            n_threads_batch=o.n_threads_batch, catchup_rows=o.catchup_rows, feature_rows=o.feature_rows,
            backend_sampling=bool(o.backend_sampling), kv_window=o.kv_window)

    # -- text helpers ------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        with self._handle.use():  # the session keeps the target's native model alive
            return tokenize(self._ffi, self._lib, self._model_ptr, text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        ids = token_ids(tokens, self.target.info.n_vocab)
        return b"".join(self._token_bytes(t) for t in ids).decode("utf-8", "replace")

    def _token_bytes(self, token: int) -> bytes:
        with self._handle.use():
            return token_bytes(self._ffi, self._lib, self._model_ptr, token)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            template: str | None = None, enable_thinking: bool | None = None) -> str:
        return self.target.apply_chat_template(messages, add_generation_prompt, template=template,
                                               enable_thinking=enable_thinking)

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        if isinstance(prompt, (bytes, bytearray, memoryview)):  # not token ids: decode text first
            raise ConfigError("a prompt is a string or a sequence of token ids, not bytes: decode the text first")
        try:
            tokens = list(prompt)
        except TypeError:
            raise ConfigError(f"a prompt is a string or a sequence of token ids, not {type(prompt).__name__}") from None
        if not tokens:
            raise ConfigError("the prompt is empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in tokens):
            try:  # numpy integers (a prompt given as an array) are token ids too
                tokens = [operator.index(t) if not isinstance(t, bool) else None for t in tokens]
            except TypeError:
                tokens = [None]
            if not all(t is not None and 0 <= t <= INT32_MAX for t in tokens):
                raise ConfigError("a prompt is a string or a sequence of token ids (32-bit ints within the "
                                  "vocabulary)")
        return tokens

    @staticmethod
    def _check_n_predict(n_predict) -> None:
        if not isinstance(n_predict, int) or isinstance(n_predict, bool) or not 0 <= n_predict < 2 ** 31:
            raise ConfigError(f"n_predict must be an int >= 0, not {n_predict!r}")

    # -- stats -------------------------------------------------------------------------------

    def stats(self) -> Stats:
        """The counters as of the last completed step (any thread, also while generating)."""
        s = self._ffi.new("pls_stats *")
        with self._handle.use() as h:
            self._lib.pls_get_stats(h, s)
        return Stats.from_native(s)

    def adaptive_info(self) -> AdaptiveInfo:
        """What the draft-length controller has learnt (costs, acceptance), as of the last step."""
        o = self._ffi.new("pls_adaptive_info *")
        with self._handle.use() as h:
            self._lib.pls_get_adaptive_info(h, o)
        return AdaptiveInfo(
            enabled=bool(o.enabled), n_max=o.n_max, depth_bucket=o.depth_bucket,
            target_ms=list(o.target_ms[0:o.n_target_points]), draft_first_ms=o.draft_first_ms,
            draft_token_ms=o.draft_token_ms, draft_call_ms=o.draft_call_ms, catchup_token_ms=o.catchup_token_ms,
            overhead_ms=o.overhead_ms, cold_ms=o.cold_ms, hazards=list(o.hazard[0:o.n_hazard]), plain_ms_per_token=o.plain_ms_per_token,
            last_k=list(o.last_k[0:o.n_streams]))

    def stream_stats(self, index: int) -> Stats:
        """Counters of one stream of the last generation. Streams share every step, so the timings (and with
        them tokens_per_second) are the session's wall times: a stream's share of the joint throughput."""
        s = self._ffi.new("pls_stats *")
        shared = self._ffi.new("pls_stats *")
        try:
            index = operator.index(index) if not isinstance(index, bool) else None
        except TypeError:
            index = None
        if index is None:
            raise ConfigTypeError("a stream index is an int")
        if not 0 <= index <= INT32_MAX:
            raise ConfigError(f"no stream {index} in the last generation")
        with self._handle.use() as h:
            if self._lib.pls_get_stream_stats(h, index, s) != 0:
                raise ConfigError(f"no stream {index} in the last generation")
            self._lib.pls_get_stats(h, shared)
        for name in ("t_prefill_ms", "t_draft_ms", "t_verify_ms", "t_rollback_ms", "t_sample_ms", "t_decode_ms",
                     "t_process_ms", "t_sync_ms", "est_plain_ms", "n_graph_captures", "n_graph_resets",
                     "n_graph_reused"):
            setattr(s, name, getattr(shared, name))
        return Stats.from_native(s)

    def reset_stats(self) -> None:
        with self._handle.use() as h:
            self._lib.pls_reset_stats(h)

    def take_trace(self) -> list[dict]:
        """The steps recorded since the last take (config.trace_steps > 0), oldest first, and forgets them: per
        step what the controller saw - per stream slot whether it took part, the draft length chosen, tokens drafted
        (and a hash of them, draft_hash: two runs that drafted alike show the same hashes), accepted and caught up, its
        depth - and what the step cost (ms). A session opened without trace_steps
        records nothing; steps beyond trace_steps between two takes are dropped (a warning names how many)."""
        if self.config.trace_steps <= 0:
            raise ConfigError("this session records no trace: open it with SessionConfig(trace_steps=N)")
        ffi = self._ffi
        buf = ffi.new("pls_trace_step[]", min(self.config.trace_steps, 1024))
        dropped = ffi.new("int64_t *")
        steps: list[dict] = []
        lost = 0
        with self._handle.use() as h:
            while True:
                n = self._lib.pls_take_trace(h, buf, len(buf), dropped)
                lost += dropped[0]
                for t in buf[0:n]:
                    m = t.n_streams
                    steps.append({
                        "active": list(t.active[0:m]), "k": list(t.k[0:m]), "drafted": list(t.n_drafted[0:m]),
                        "accepted": list(t.n_accepted[0:m]), "catchup": list(t.n_catchup[0:m]),
                        "draft_hash": list(t.draft_hash[0:m]),
                        "depth": list(t.depth[0:m]), "n_tokens": t.n_tokens, "n_prompt": t.n_prompt,
                        "draft_iters": t.n_draft_iters, "captures": t.n_graph_captures,
                        "t_draft_first": t.t_draft_first_ms, "t_draft_rest": t.t_draft_rest_ms,
                        "t_draft_call": t.t_draft_call_ms, "t_target": t.t_target_ms, "t_step": t.t_step_ms})
                if n < len(buf):
                    break
        if lost:
            warnings.warn(f"{lost} steps were not recorded: more than trace_steps={self.config.trace_steps} steps ran "
                          f"between two take_trace() calls", stacklevel=2)
        return steps

    def health(self) -> str | None:
        """None while the session can run; otherwise why not (a remote device it uses went away): it is then
        unusable, and every generating call raises RemoteDeviceError. Safe beside a call in flight."""
        from .errors import RemoteDeviceError

        err = _native.ErrorBuffer(self._ffi)
        with self._handle.use() as h:
            rc = self._lib.pls_session_health(h, err.buf, err.SIZE)
        if rc == 0:
            return None
        try:
            _native.check(rc, err, RemoteDeviceError)
        except RemoteDeviceError as e:
            return str(e)
        return None

    @property
    def usable(self) -> bool:
        return self.health() is None

    def request_stop(self) -> None:
        """Any thread: end the generation that runs now (or is about to begin) after the step in flight.
        With no generation running it does nothing."""
        with self._state:
            if self._busy:
                self._handle.signal(self._lib.pls_request_stop)

    # -- generation --------------------------------------------------------------------------

    def _claim(self) -> None:
        with self._state:
            if self._handle.closed:
                raise GenerationError("the session was closed")
            if self._busy:
                raise SessionBusyError("this session is already generating; run several prompts together with "
                                       "generate_batch (n_parallel), or open another session")
            self._busy = True

    def _release(self) -> None:
        with self._state:
            self._busy = False
            # a stop that arrived after the generation's last step must not stop the next one
            self._handle.signal(self._lib.pls_clear_stop)

    @staticmethod
    def _raise_native(rc: int, err) -> None:
        _native.check(rc, err, GenerationError)

    def generate(self, prompt: str | Sequence[int], n_predict: int = 128, *, reset_stats: bool = True,
                 on_tokens: Callable[[list[int]], bool | None] | None = None) -> GenerationResult:
        """Run the whole loop natively. on_tokens(tokens) per verify step may return True to stop."""
        tokens = self._prompt_tokens(prompt)
        self._check_n_predict(n_predict)
        ffi = self._ffi
        out_tokens: list[int] = []
        out_margins: list[float] = []
        pending: list[BaseException] = []

        def on_step(_ud, toks, margins, n):
            new = list(toks[0:n])
            out_tokens.extend(new)
            if margins != ffi.NULL:
                out_margins.extend(margins[0:n])
            if on_tokens is not None:
                return 1 if on_tokens(new) else 0
            return 0

        def on_error(exc_type, exc, _tb):
            pending.append(exc)  # KeyboardInterrupt included: stop cleanly, re-raise after the native call
            return 1

        cb = ffi.callback("pls_emit_cb", on_step, onerror=on_error)
        prompt_arr = ffi.new("int32_t[]", tokens)
        err = _native.ErrorBuffer(ffi)
        self._claim()
        try:
            with self._handle.use() as h:
                if reset_stats:
                    self._lib.pls_reset_stats(h)
                rc = self._lib.pls_generate(h, prompt_arr, len(tokens), n_predict, cb, ffi.NULL, err.buf, err.SIZE)
                text = b"".join(token_bytes(ffi, self._lib, self._model_ptr, t) for t in out_tokens)
                stats = ffi.new("pls_stats *")
                self._lib.pls_get_stats(h, stats)
        finally:
            self._release()
        if pending:
            raise pending[0]
        self._raise_native(rc, err)
        return GenerationResult(text=text.decode("utf-8", "replace"), tokens=out_tokens, margins=out_margins,
                                finish_reason=FINISH_REASONS[rc], stats=Stats.from_native(stats))

    def stream(self, prompt: str | Sequence[int], n_predict: int = 128, *,
               reset_stats: bool = True) -> Iterator[str]:
        """Yield text as it is verified; pieces never split a UTF-8 character. Closing the iterator stops."""
        steps = self.stream_tokens(prompt, n_predict, reset_stats=reset_stats)
        try:
            for piece, _tokens in steps:
                if piece:
                    yield piece
        finally:
            steps.close()  # closing this iterator must end the native generation now, not when steps is collected

    def stream_tokens(self, prompt: str | Sequence[int], n_predict: int = 128, *,
                      reset_stats: bool = True) -> Iterator[tuple[str, list[int]]]:
        """Like stream(), also yielding the token ids of each verify step."""
        tokens = self._prompt_tokens(prompt)
        self._check_n_predict(n_predict)
        ffi = self._ffi
        err = _native.ErrorBuffer(ffi)
        self._claim()
        try:
            with self._handle.use() as h:
                if reset_stats:
                    self._lib.pls_reset_stats(h)
                rc = self._lib.pls_begin(h, ffi.new("int32_t[]", tokens), len(tokens), n_predict, err.buf, err.SIZE)
            self._raise_native(rc, err)
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            buf = ffi.new("int32_t[]", MAX_DRAFT + 1)
            finish = ffi.new("int32_t *")
            try:
                while True:
                    # each step holds the session only while it runs: close() from another thread between
                    # steps frees it, and the next step raises instead of touching freed memory
                    with self._handle.use() as h:
                        n = self._lib.pls_step(h, buf, ffi.NULL, MAX_DRAFT + 1, finish, err.buf, err.SIZE)
                        self._raise_native(n, err)
                        toks = list(buf[0:n])
                        data = b"".join(token_bytes(ffi, self._lib, self._model_ptr, t) for t in toks)
                    if n:
                        yield decoder.decode(data), toks
                    if finish[0] != 0:
                        tail = decoder.decode(b"", final=True)
                        if tail:
                            yield tail, []
                        return
            finally:
                if finish[0] == 0 and not self._handle.closed:  # closed early (break, exception, Ctrl-C)
                    with self._handle.use() as h:
                        self._lib.pls_request_stop(h)
                        while finish[0] == 0 and self._lib.pls_step(h, buf, ffi.NULL, MAX_DRAFT + 1, finish,
                                                                    err.buf, err.SIZE) > 0:
                            pass
        finally:
            self._release()

    def score_margins(self, prompt: str | Sequence[int], continuation: Sequence[int], chunk: int = 1) -> list[float]:
        """The target's top-1 minus top-2 logit margin at each token of ``continuation`` after ``prompt``,
        teacher-forced in batches of ``chunk`` tokens. chunk=1 is plain decoding's batch shape (it reproduces a
        plain generation's margins); a verify batch has n_max + 1 tokens. The difference between the two is the
        batch-shape noise of the target's logits: a divergence from plain output at a margin within it is a tie."""
        tokens = self._prompt_tokens(prompt)
        cont = list(continuation)
        if not cont:
            return []
        ffi = self._ffi
        out = ffi.new("float[]", len(cont))
        err = _native.ErrorBuffer(ffi)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31 for t in cont):
            raise ConfigError("a continuation is a sequence of token ids (ints within the vocabulary)")
        if not isinstance(chunk, int) or isinstance(chunk, bool) or not -2 ** 31 <= chunk < 2 ** 31:
            raise ConfigError(f"chunk must be an int (a batch size), not {chunk!r}")
        self._claim()
        try:
            with self._handle.use() as h:
                rc = self._lib.pls_score_margins(h, ffi.new("int32_t[]", tokens), len(tokens),
                                                 ffi.new("int32_t[]", cont), len(cont), chunk, out, err.buf, err.SIZE)
        finally:
            self._release()
        self._raise_native(rc, err)
        return list(out)

    # -- continuous batching ------------------------------------------------------------------

    def submit(self, prompt: str | Sequence[int], n_predict: int = 128, *, temp: float | None = None,
               top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
               seed: int | None = None, n_max: int | None = None, n_min: int | None = None,
               p_min: float | None = None, **sampling) -> int:
        """Queue a sequence to join the running batch (any thread); returns its slot. Its prompt is processed in
        chunks alongside the other sequences at the next step_sequences() calls. Settings left None are the
        session's; n_max may only lower the session's draft ceiling; `sampling` takes SequenceParams' other
        fields (grammar, json_schema, grammar_triggers, penalties, logit_bias, n_probs). The settings are checked
        as SequenceParams checks them (ConfigTypeError for a wrong type, ConfigError for a value out of range)."""
        params = SequenceParams(n_predict=n_predict, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                n_max=n_max, n_min=n_min, p_min=p_min, **sampling)
        return self.submit_params(prompt, params)

    def submit_params(self, prompt: str | Sequence[int], params: SequenceParams) -> int:
        """submit() with the sequence's settings in one SequenceParams."""
        if not isinstance(params, SequenceParams):
            raise ConfigTypeError(f"params must be a SequenceParams, not {type(params).__name__}")
        tokens = self._prompt_tokens(prompt)
        ffi = self._ffi
        p = native_seq_params(ffi, params, self.config)
        shape = SamplingShape.of(self.config, params)
        keep = shape.native(ffi)
        slot = ffi.new("int32_t *")
        err = _native.ErrorBuffer(ffi)
        with self._handle.use() as h:
            rc = self._lib.pls_seq_add_sampling(h, ffi.new("int32_t[]", tokens), len(tokens), p, keep[0], slot,
                                                err.buf, err.SIZE)
        param = _sampling_param(err.text, params) if rc != 0 else None
        if param is not None:
            raise ParamError(param, err.text)
        self._raise_native(rc, err)
        if shape.n_probs >= 0:
            self._logprob_slots.add(slot[0])
        else:
            self._logprob_slots.discard(slot[0])
        return slot[0]

    def cancel(self, slot: int) -> bool:
        """End a submitted sequence at the next step (any thread). False if the slot holds no sequence."""
        try:
            slot = operator.index(slot) if not isinstance(slot, bool) else None
        except TypeError:
            slot = None
        if slot is None:
            raise ConfigTypeError("a slot is an int") from None
        if not 0 <= slot <= INT32_MAX:
            return False  # no such slot
        with self._handle.use() as h:
            return self._lib.pls_seq_cancel(h, slot) == 0

    def step_sequences(self) -> tuple[list[SequenceEvent], int]:
        """One step of the running batch: (events, sequences still running or queued). One thread steps."""
        ffi = self._ffi
        n_par = self.info.n_parallel
        events = ffi.new("pls_seq_event[]", n_par)
        n_events = ffi.new("int32_t *")
        err = _native.ErrorBuffer(ffi)
        with self._handle.use() as h:
            left = self._lib.pls_step_seqs(h, events, n_par, n_events, err.buf, err.SIZE)
            out = [SequenceEvent(slot=e.slot, tokens=list(e.tokens[0:e.n_tokens]), finish_reason=FINISH_REASONS[e.finish],
                                 n_drafted=e.n_drafted, n_accepted=e.n_accepted, n_prompt=e.n_prompt,
                                 logprobs=self._step_logprobs(h, e.slot, e.n_tokens)
                                 if e.slot in self._logprob_slots else None)
                   for e in (events[i] for i in range(n_events[0]))]
        if left < 0:
            raise _native.error_for(left, err.text, GenerationError)
        return out, left

    def _step_logprobs(self, h, slot: int, n_tokens: int) -> list[TokenLogprob]:
        """The log-probabilities of the tokens a slot committed in the last step (the session held by the caller)."""
        if n_tokens == 0:
            return []
        buf = self._ffi.new("pls_token_logprob[]", n_tokens)
        n = self._lib.pls_step_logprobs(h, slot, buf, n_tokens)
        if n < 0:
            raise _native.error_for(n, "the log-probabilities of the step cannot be read", GenerationError)
        return [TokenLogprob(r.token, r.logprob, [(r.top_token[k], r.top_logprob[k]) for k in range(r.n_top)])
                for r in buf[0:min(n, n_tokens)]]

    # -- several streams ---------------------------------------------------------------------

    def stream_batch_tokens(self, prompts: Sequence[str | Sequence[int]], n_predict: int = 128, *,
                            reset_stats: bool = True) -> Iterator[tuple[int, list[int], list[float], str | None]]:
        """Step up to n_parallel prompts together. Yields (stream index, token ids, margins, finish reason)
        for every stream that committed tokens or finished in a step; closing the iterator stops them all."""
        if isinstance(prompts, str):
            raise ConfigError("generate_batch/stream_batch take a list of prompts")
        token_lists = [self._prompt_tokens(p) for p in prompts]
        n = len(token_lists)
        if not 1 <= n <= self.info.n_parallel:
            raise ConfigError(f"{n} prompts for a session of n_parallel={self.info.n_parallel}; open the session "
                              f"with n_parallel >= {max(n, 1)}")
        self._check_n_predict(n_predict)
        ffi = self._ffi
        err = _native.ErrorBuffer(ffi)
        cap = MAX_DRAFT + 1
        flat = ffi.new("int32_t[]", [t for toks in token_lists for t in toks] or [0])
        lengths = ffi.new("int32_t[]", [len(toks) for toks in token_lists])
        self._claim()
        try:
            with self._handle.use() as h:
                if reset_stats:
                    self._lib.pls_reset_stats(h)
                rc = self._lib.pls_begin_streams(h, flat, lengths, n, n_predict, err.buf, err.SIZE)
            self._raise_native(rc, err)
            buf = ffi.new("int32_t[]", n * cap)
            margins = ffi.new("float[]", n * cap) if self.config.margins else ffi.NULL
            counts = ffi.new("int32_t[]", n)
            finish = ffi.new("int32_t[]", n)
            reported = [False] * n
            left = n
            try:
                while left > 0:
                    with self._handle.use() as h:
                        left = self._lib.pls_step_streams(h, buf, margins, cap, counts, finish, err.buf, err.SIZE)
                    self._raise_native(left, err)
                    for i in range(n):
                        done = finish[i] != 0 and not reported[i]
                        if counts[i] or done:
                            reported[i] = reported[i] or done
                            toks = list(buf[i * cap:i * cap + counts[i]])
                            mrg = list(margins[i * cap:i * cap + counts[i]]) if margins != ffi.NULL else []
                            yield i, toks, mrg, FINISH_REASONS[finish[i]] if done else None
            finally:
                if left > 0 and not self._handle.closed:  # closed early: end the native generation of every stream
                    with self._handle.use() as h:
                        self._lib.pls_request_stop(h)
                        while self._lib.pls_step_streams(h, buf, margins, cap, counts, finish, err.buf, err.SIZE) > 0:
                            pass
        finally:
            self._release()

    def stream_batch(self, prompts: Sequence[str | Sequence[int]], n_predict: int = 128, *,
                     reset_stats: bool = True) -> Iterator[tuple[int, str]]:
        """Yield (stream index, text piece) as each stream's tokens are verified; pieces never split a UTF-8
        character. Closing the iterator stops every stream."""
        decoders: dict[int, codecs.IncrementalDecoder] = {}
        steps = self.stream_batch_tokens(prompts, n_predict, reset_stats=reset_stats)
        try:
            for i, toks, _margins, reason in steps:
                dec = decoders.setdefault(i, codecs.getincrementaldecoder("utf-8")("replace"))
                piece = dec.decode(b"".join(self._token_bytes(t) for t in toks), final=reason is not None)
                if piece:
                    yield i, piece
        finally:
            steps.close()

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], n_predict: int = 128, *,
                       reset_stats: bool = True) -> list[GenerationResult]:
        """Generate for several prompts together (at most n_parallel); one result per prompt, in order.
        Each result's stats are its stream's counters; session.stats() holds the totals."""
        prompts = list(prompts) if not isinstance(prompts, str) else prompts
        tokens: dict[int, list[int]] = {}
        margins: dict[int, list[float]] = {}
        reasons: dict[int, str] = {}
        for i, toks, mrg, reason in self.stream_batch_tokens(prompts, n_predict, reset_stats=reset_stats):
            tokens.setdefault(i, []).extend(toks)
            margins.setdefault(i, []).extend(mrg)
            if reason is not None:
                reasons[i] = reason
        return [GenerationResult(text=self.detokenize(tokens.get(i, [])), tokens=tokens.get(i, []),
                                 margins=margins.get(i, []), finish_reason=reasons.get(i, "error"),
                                 stats=self.stream_stats(i))
                for i in range(len(prompts))]
