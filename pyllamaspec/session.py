"""Speculative sessions: the Python face of the native draft/verify/rollback loop.

Everything per token happens in native code; Python hears once per verify step (1..n_max+1 tokens),
with the GIL released in between. generate() runs the whole loop in one native call; stream() steps
it from a Python iterator and yields UTF-8-safe text pieces. generate_batch() and stream_batch() run
up to n_parallel prompts together: every step drafts for all of them and verifies their drafts in one
target batch.
"""

from __future__ import annotations

import codecs
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

from . import _native
from .config import KV_CACHE_TYPES, MAX_DRAFT, SPEC_TYPES, SessionConfig, spec_type_id
from .errors import (ConfigError, ContextOverflowError, GenerationError, PairingError, PlacementError,
                     PyllamaspecError)
from .ggufmeta import read_summary
from .model import Model
from .pairing import require_pair

FINISH_REASONS = {0: None, 1: "length", 2: "eog", 3: "stopped", 4: "context", 5: "error"}
ROLLBACK_KINDS = {0: "none", 1: "kv", 2: "ring", 3: "checkpoint"}


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
                 rollback_paths=self.rollback_paths)
        return d

    @classmethod
    def from_native(cls, s) -> "Stats":
        n_pos = max((i + 1 for i in range(MAX_DRAFT) if s.drafted_per_pos[i]), default=0)
        return cls(
            n_prompt=s.n_prompt, n_generated=s.n_generated, n_steps=s.n_steps, n_drafts=s.n_drafts,
            n_drafted=s.n_drafted, n_accepted=s.n_accepted,
            accepted_per_position=[s.accepted_per_pos[i] for i in range(n_pos)],
            drafted_per_position=[s.drafted_per_pos[i] for i in range(n_pos)],
            n_rollback_kv=s.n_rollback_kv, n_rollback_ring=s.n_rollback_ring,
            n_rollback_checkpoint=s.n_rollback_checkpoint, n_replayed=s.n_replayed,
            t_prefill_ms=s.t_prefill_ms, t_draft_ms=s.t_draft_ms, t_verify_ms=s.t_verify_ms,
            t_rollback_ms=s.t_rollback_ms, t_sample_ms=s.t_sample_ms, t_decode_ms=s.t_decode_ms)


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


def _error_for(message: str) -> PyllamaspecError:
    if message.startswith("pairing:"):
        return PairingError(message)
    if message.startswith("placement:"):
        return PlacementError(message)
    return ConfigError(message)


def native_session_params(ffi, config: SessionConfig):
    """pls_session_params for a config (spec types already resolved)."""
    p = ffi.new("pls_session_params *")
    types = list(config.spec_types or ())
    p.n_spec_types = len(types)
    for i, t in enumerate(types):
        p.spec_types[i] = spec_type_id(t)
    for name in ("n_max", "n_min", "p_min", "n_ctx", "n_batch", "n_ubatch", "n_parallel", "n_threads",
                 "n_threads_batch", "n_threads_draft", "temp", "top_k", "top_p", "min_p", "seed",
                 "ngram_size_n", "ngram_size_m", "ngram_min_hits", "ngram_mod_n_match", "ngram_mod_n_min",
                 "ngram_mod_n_max"):
        setattr(p, name, getattr(config, name))
    p.type_k = KV_CACHE_TYPES[config.cache_type_k.lower()]
    p.type_v = KV_CACHE_TYPES[config.cache_type_v.lower()]
    p.type_k_draft = KV_CACHE_TYPES[config.cache_type_k_draft.lower()]
    p.type_v_draft = KV_CACHE_TYPES[config.cache_type_v_draft.lower()]
    p.flash_attn = -1 if config.flash_attn is None else int(config.flash_attn)
    p.n_rs_seq = -1 if config.n_rs_seq is None else config.n_rs_seq
    p.draft_backend_sampling = int(config.draft_backend_sampling)
    p.collect_margins = int(config.margins)
    p.force_reject = int(config.force_reject)
    return p


class SpecSession:
    """A target (and optionally a drafter) with a context, sampler and speculative engine.

    One generation at a time; reusable after a generation ends, is stopped, or fails.
    """

    def __init__(self, target: Model, drafter: Model | None = None, config: SessionConfig | None = None,
                 **overrides) -> None:
        if config is not None and overrides:
            raise ConfigError("pass either a SessionConfig or keyword settings, not both")
        config = config or SessionConfig(**overrides)
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
        handle = self._lib.pls_session_open(target.handle, drafter.handle if drafter else ffi.NULL, p,
                                            err.buf, err.SIZE)
        if handle == ffi.NULL:
            raise _error_for(err.text)
        self._handle = handle
        self._busy = False
        self.info = self._read_info()

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self._lib.pls_session_close(self._handle)
            self._handle = None

    def __enter__(self) -> "SpecSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def handle(self):
        if self._handle is None:
            raise GenerationError("the session was closed")
        return self._handle

    def _read_info(self) -> SessionInfo:
        ffi = self._ffi
        o = ffi.new("pls_session_info *")
        self._lib.pls_session_get_info(self._handle, o)
        return SessionInfo(
            spec_types=tuple(SPEC_TYPES[o.spec_types[i]] for i in range(o.n_spec_types) if o.spec_types[i] != 0),
            n_max_requested=o.n_max_requested, n_max_effective=o.n_max_effective, block_size=o.block_size,
            is_dflash2=bool(o.is_dflash2), n_rs_seq=o.n_rs_seq, ring_bytes=o.ring_bytes,
            rollback_target=ROLLBACK_KINDS[o.rollback_target], rollback_draft=ROLLBACK_KINDS[o.rollback_draft],
            n_ctx=o.n_ctx, n_batch=o.n_batch, n_ubatch=o.n_ubatch, n_parallel=o.n_parallel,
            target_layers=tuple(o.target_layers[i] for i in range(o.n_target_layers)),
            target_head_device=ffi.string(o.target_head_device).decode(),
            draft_device=ffi.string(o.draft_device).decode())

    # -- text helpers ------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.target.tokenize(text, add_special=add_special)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            template: str | None = None, enable_thinking: bool | None = None) -> str:
        return self.target.apply_chat_template(messages, add_generation_prompt, template=template,
                                               enable_thinking=enable_thinking)

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        tokens = list(prompt)
        if not all(isinstance(t, int) for t in tokens):
            raise ConfigError("a prompt is a string or a sequence of token ids")
        return tokens

    # -- stats -------------------------------------------------------------------------------

    def stats(self) -> Stats:
        s = self._ffi.new("pls_stats *")
        self._lib.pls_get_stats(self.handle, s)
        return Stats.from_native(s)

    def stream_stats(self, index: int) -> Stats:
        """Counters of one stream of the last generation. Streams share every step, so the timings (and with
        them tokens_per_second) are the session's wall times: a stream's share of the joint throughput."""
        s = self._ffi.new("pls_stats *")
        if self._lib.pls_get_stream_stats(self.handle, index, s) != 0:
            raise ConfigError(f"no stream {index} in the last generation")
        shared = self._ffi.new("pls_stats *")
        self._lib.pls_get_stats(self.handle, shared)
        for name in ("t_prefill_ms", "t_draft_ms", "t_verify_ms", "t_rollback_ms", "t_sample_ms", "t_decode_ms"):
            setattr(s, name, getattr(shared, name))
        return Stats.from_native(s)

    def reset_stats(self) -> None:
        self._lib.pls_reset_stats(self.handle)

    def request_stop(self) -> None:
        """Thread-safe: ends the running generation after the step in flight."""
        if self._handle is not None:
            self._lib.pls_request_stop(self._handle)

    # -- generation --------------------------------------------------------------------------

    def _claim(self) -> None:
        if self._busy:
            raise GenerationError("this session is already generating; run several prompts together with "
                                  "generate_batch (n_parallel), or open another session")
        self._busy = True

    @staticmethod
    def _raise_native(rc: int, err) -> None:
        if rc == -2:
            raise ContextOverflowError(err.text.removeprefix("context: "))
        if rc == -3:
            raise ConfigError(err.text)
        if rc < 0:
            raise GenerationError(err.text)

    def generate(self, prompt: str | Sequence[int], n_predict: int = 128, *, reset_stats: bool = True,
                 on_tokens: Callable[[list[int]], bool | None] | None = None) -> GenerationResult:
        """Run the whole loop natively. on_tokens(tokens) per verify step may return True to stop."""
        tokens = self._prompt_tokens(prompt)
        if n_predict < 0:
            raise ConfigError("n_predict must be >= 0")
        if reset_stats:
            self.reset_stats()
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
            rc = self._lib.pls_generate(self.handle, prompt_arr, len(tokens), n_predict, cb, ffi.NULL,
                                        err.buf, err.SIZE)
        finally:
            self._busy = False
        if pending:
            raise pending[0]
        self._raise_native(rc, err)
        return GenerationResult(text=self.target.detokenize(out_tokens), tokens=out_tokens, margins=out_margins,
                                finish_reason=FINISH_REASONS[rc], stats=self.stats())

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
        if reset_stats:
            self.reset_stats()
        ffi = self._ffi
        err = _native.ErrorBuffer(ffi)
        self._claim()
        try:
            rc = self._lib.pls_begin(self.handle, ffi.new("int32_t[]", tokens), len(tokens), n_predict,
                                     err.buf, err.SIZE)
            self._raise_native(rc, err)
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            buf = ffi.new("int32_t[]", MAX_DRAFT + 1)
            finish = ffi.new("int32_t *")
            try:
                while True:
                    n = self._lib.pls_step(self.handle, buf, ffi.NULL, MAX_DRAFT + 1, finish, err.buf, err.SIZE)
                    if n < 0:
                        raise GenerationError(err.text)
                    if n:
                        toks = list(buf[0:n])
                        data = b"".join(self.target.token_bytes(t) for t in toks)
                        yield decoder.decode(data), toks
                    if finish[0] != 0:
                        tail = decoder.decode(b"", final=True)
                        if tail:
                            yield tail, []
                        return
            finally:
                if finish[0] == 0:  # closed early (break, exception, Ctrl-C): end the native generation
                    self._lib.pls_request_stop(self.handle)
                    while finish[0] == 0 and self._lib.pls_step(self.handle, buf, ffi.NULL, MAX_DRAFT + 1, finish,
                                                                err.buf, err.SIZE) > 0:
                        pass
        finally:
            self._busy = False

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
        self._claim()
        try:
            rc = self._lib.pls_score_margins(self.handle, ffi.new("int32_t[]", tokens), len(tokens),
                                             ffi.new("int32_t[]", cont), len(cont), chunk, out, err.buf, err.SIZE)
        finally:
            self._busy = False
        self._raise_native(rc, err)
        return list(out)

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
        if n_predict < 0:
            raise ConfigError("n_predict must be >= 0")
        if reset_stats:
            self.reset_stats()
        ffi = self._ffi
        err = _native.ErrorBuffer(ffi)
        cap = MAX_DRAFT + 1
        flat = ffi.new("int32_t[]", [t for toks in token_lists for t in toks] or [0])
        lengths = ffi.new("int32_t[]", [len(toks) for toks in token_lists])
        self._claim()
        try:
            rc = self._lib.pls_begin_streams(self.handle, flat, lengths, n, n_predict, err.buf, err.SIZE)
            self._raise_native(rc, err)
            buf = ffi.new("int32_t[]", n * cap)
            margins = ffi.new("float[]", n * cap) if self.config.margins else ffi.NULL
            counts = ffi.new("int32_t[]", n)
            finish = ffi.new("int32_t[]", n)
            reported = [False] * n
            left = n
            try:
                while left > 0:
                    left = self._lib.pls_step_streams(self.handle, buf, margins, cap, counts, finish, err.buf, err.SIZE)
                    if left < 0:
                        raise GenerationError(err.text)
                    for i in range(n):
                        done = finish[i] != 0 and not reported[i]
                        if counts[i] or done:
                            reported[i] = reported[i] or done
                            toks = list(buf[i * cap:i * cap + counts[i]])
                            mrg = list(margins[i * cap:i * cap + counts[i]]) if margins != ffi.NULL else []
                            yield i, toks, mrg, FINISH_REASONS[finish[i]] if done else None
            finally:
                if left > 0:  # closed early: end the native generation of every stream
                    self._lib.pls_request_stop(self.handle)
                    while self._lib.pls_step_streams(self.handle, buf, margins, cap, counts, finish,
                                                      err.buf, err.SIZE) > 0:
                        pass
        finally:
            self._busy = False

    def stream_batch(self, prompts: Sequence[str | Sequence[int]], n_predict: int = 128, *,
                     reset_stats: bool = True) -> Iterator[tuple[int, str]]:
        """Yield (stream index, text piece) as each stream's tokens are verified; pieces never split a UTF-8
        character. Closing the iterator stops every stream."""
        decoders: dict[int, codecs.IncrementalDecoder] = {}
        steps = self.stream_batch_tokens(prompts, n_predict, reset_stats=reset_stats)
        try:
            for i, toks, _margins, reason in steps:
                dec = decoders.setdefault(i, codecs.getincrementaldecoder("utf-8")("replace"))
                piece = dec.decode(b"".join(self.target.token_bytes(t) for t in toks), final=reason is not None)
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
        return [GenerationResult(text=self.target.detokenize(tokens.get(i, [])), tokens=tokens.get(i, []),
                                 margins=margins.get(i, []), finish_reason=reasons.get(i, "error"),
                                 stats=self.stream_stats(i))
                for i in range(len(prompts))]
