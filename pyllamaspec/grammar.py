"""Grammars for constrained output: a JSON schema becomes GBNF through upstream's converter (llama.cpp's
--json-schema, llama-server's json_schema and response_format), and a sequence's effective sampling shape (its
grammar, penalties, logit biases, log-probabilities) is its own where given, else its session's."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from . import _native
from .config import SequenceParams, SessionConfig, check_sampling_shape
from .errors import ParamError


def json_schema_to_grammar(schema: Any) -> str:
    """GBNF for a JSON schema (a dict, True/False, or its JSON text). ParamError('json_schema') names what the
    converter refuses."""
    return _convert(check_sampling_shape("json_schema", schema))


@functools.lru_cache(maxsize=64)
def _convert(text: str) -> str:
    ffi, lib = _native.load()
    err = _native.ErrorBuffer(ffi)
    n_out = ffi.new("int32_t *")
    rc = lib.pls_json_schema_to_grammar(text.encode(), ffi.NULL, 0, n_out, err.buf, err.SIZE)
    if rc != 0:
        raise ParamError("json_schema", err.text or "the JSON schema cannot be converted to a grammar")
    buf = ffi.new("char[]", n_out[0] + 1)
    rc = lib.pls_json_schema_to_grammar(text.encode(), buf, n_out[0] + 1, n_out, err.buf, err.SIZE)
    if rc != 0:
        raise ParamError("json_schema", err.text or "the JSON schema cannot be converted to a grammar")
    return ffi.string(buf, n_out[0]).decode()


@dataclass(frozen=True)
class SamplingShape:
    """What a sequence samples with beyond temperature and truncation."""

    grammar: str | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    n_probs: int = -1                 # -1: no log-probabilities
    triggers: tuple[tuple[str, str, int], ...] = ()  # lazy: the grammar applies from the first (config.py)

    @classmethod
    def of(cls, config: SessionConfig, params: SequenceParams | None = None) -> "SamplingShape":
        """The sequence's own settings where given, the session's for the rest; a JSON schema converted."""
        own = params if params is not None else SequenceParams()
        if own.grammar is not None or own.json_schema is not None:
            grammar, schema = own.grammar, own.json_schema
        else:
            grammar, schema = config.grammar, config.json_schema
        if schema is not None:
            grammar = json_schema_to_grammar(schema)

        def pick(name: str):
            value = getattr(own, name)
            return getattr(config, name) if value is None else value

        bias = own.logit_bias if own.logit_bias is not None else config.logit_bias
        return cls(grammar=grammar or None, repeat_penalty=pick("repeat_penalty"), repeat_last_n=pick("repeat_last_n"),
                   frequency_penalty=pick("frequency_penalty"), presence_penalty=pick("presence_penalty"),
                   logit_bias=tuple(bias or ()), n_probs=-1 if own.n_probs is None else own.n_probs,
                   triggers=own.grammar_triggers or ())

    def native(self, ffi):
        """pls_sampling_params, and the C buffers it points into (keep them alive)."""
        p = ffi.new("pls_sampling_params *")
        keep = [p]
        if self.grammar:
            g = ffi.new("char[]", self.grammar.encode())
            keep.append(g)
            p.grammar = g
        p.penalty_repeat = self.repeat_penalty
        p.penalty_freq = self.frequency_penalty
        p.penalty_present = self.presence_penalty
        p.penalty_last_n = self.repeat_last_n
        if self.logit_bias:
            arr = ffi.new("pls_logit_bias[]", len(self.logit_bias))
            for i, (token, bias) in enumerate(self.logit_bias):
                arr[i].token = token
                arr[i].bias = bias if math.isfinite(bias) else -math.inf
            keep.append(arr)
            p.logit_bias = arr
            p.n_logit_bias = len(self.logit_bias)
        p.n_probs = self.n_probs
        if self.triggers:
            arr = ffi.new("pls_grammar_trigger[]", len(self.triggers))
            const = _native.constants()
            for i, (kind, text, token) in enumerate(self.triggers):
                arr[i].type = const["PLS_TRIGGER_" + kind.upper()]
                if kind != "token":
                    buf = ffi.new("char[]", text.encode())
                    keep.append(buf)
                    arr[i].value = buf
                arr[i].token = token
            keep.append(arr)
            p.triggers = arr
            p.n_triggers = len(self.triggers)
        return p, keep
