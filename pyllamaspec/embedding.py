"""Embeddings of a loaded model: a pooled, embeddings-only context of its own (apart from every session, so
generation is unaffected), one vector per input, scaled to unit L2 norm as llama-server's /v1/embeddings does."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from . import _native
from .config import MAX_THREADS
from .errors import ConfigError, ConfigTypeError, ModelLoadError
from .model import Model, flag, token_ids

# pooling names -> the header's PLS_POOLING_* values (None: the model's own, mean when its GGUF names none)
POOLINGS = {None: "PLS_POOLING_MODEL", "mean": "PLS_POOLING_MEAN", "cls": "PLS_POOLING_CLS", "last": "PLS_POOLING_LAST"}


class Embedder(_native.NativeOwner):
    """Embeds texts or token ids with a model: `embed(["a", "b"])` is a float32 array of one unit-norm row per
    input. n_ctx is the longest input in tokens (each input is decoded in one batch); pooling is None (the model's
    own: its GGUF's pooling_type, mean for a causal LM that names none), "mean", "cls" or "last". Safe to share
    between threads (calls run one at a time); holds its model natively, so closing the Model first is safe."""

    def __init__(self, model: Model, n_ctx: int = 512, *, pooling: str | None = None, normalize: bool = True,
                 n_threads: int = 0) -> None:
        if not isinstance(model, Model):
            raise ConfigTypeError(f"an Embedder needs a Model, not {type(model).__name__}")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
            raise ConfigError(f"Embedder n_ctx={n_ctx!r} must be an int >= 1 (the longest input in tokens)")
        if n_ctx > model.info.n_ctx_train > 0:
            raise ConfigError(f"Embedder n_ctx={n_ctx} is above the model's training context ({model.info.n_ctx_train})")
        if pooling not in POOLINGS:
            raise ConfigError(f"Embedder pooling={pooling!r} must be one of None (the model's), 'mean', 'cls', 'last'")
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or not 0 <= n_threads <= MAX_THREADS:
            raise ConfigError(f"Embedder n_threads={n_threads!r} must be within 0..{MAX_THREADS} (0: the CPU cores "
                              f"useful for math)")
        self.model = model
        self._ffi, self._lib = _native.load()
        ffi = self._ffi
        p = ffi.new("pls_embed_params *", {"n_ctx": n_ctx, "n_threads": n_threads,
                                           "pooling": _native.constants()[POOLINGS[pooling]],
                                           "normalize": flag(normalize, "normalize")})
        err = _native.ErrorBuffer(ffi)
        slot = ffi.new("pls_embedder **")
        with model._use() as m:
            _native.check(self._lib.pls_embedder_open(m, p, slot, err.buf, err.SIZE), err, ModelLoadError)
        self._handle = _native.NativeHandle(slot[0], self._lib.pls_embedder_free,
                                            ConfigError("this Embedder was closed"))
        info = ffi.new("pls_embedder_info *")
        self._lib.pls_embedder_get_info(slot[0], info)
        self.n_embd: int = info.n_embd
        self.n_ctx: int = info.n_ctx
        names = {_native.constants()[v]: k for k, v in POOLINGS.items() if k is not None}
        self.pooling: str = names[info.pooling]
        self.n_vocab = model.info.n_vocab

    # -- embedding ---------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """An input text's tokens, as embed() reads them (the model's special tokens added)."""
        return self.model.tokenize(text)

    def embed(self, inputs: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]) -> np.ndarray:
        """One vector per input, as a float32 array (n_inputs, n_embd). inputs: a text, a list of texts, a list of
        token ids (one input) or a list of lists of token ids."""
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple, np.ndarray)):
            raise ConfigTypeError(f"embed takes a text, texts or token ids, not {type(inputs).__name__}")
        items = list(inputs)
        if items and not isinstance(items[0], (str, list, tuple, np.ndarray)):
            items = [items]      # one input of token ids
        tokens = [self.tokenize(x) if isinstance(x, str) else x for x in items]
        return self.embed_tokens(tokens)

    def embed_tokens(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One vector per token sequence, as a float32 array (n_inputs, n_embd). An empty input, a token outside
        the vocabulary (ConfigError) or one longer than n_ctx (ContextOverflowError) is refused, naming the input,
        before anything is decoded."""
        seqs = []
        for i, x in enumerate(inputs):
            if isinstance(x, (str, bytes, bytearray)):
                raise ConfigTypeError(f"input {i} must be token ids, not {type(x).__name__}")
            try:
                seqs.append(token_ids(x, self.n_vocab))
            except ConfigError as e:
                raise type(e)(f"input {i}: {e}") from None
        out = np.empty((len(seqs), self.n_embd), dtype=np.float32)
        if not seqs:
            return out
        ffi = self._ffi
        flat = ffi.new("int32_t[]", [t for s in seqs for t in s] or [0])
        counts = ffi.new("int32_t[]", [len(s) for s in seqs])
        err = _native.ErrorBuffer(ffi)
        with self._handle.use() as e:
            rc = self._lib.pls_embed(e, flat, counts, len(seqs), ffi.from_buffer("float[]", out, require_writable=True),
                                     err.buf, err.SIZE)
        _native.check(rc, err)
        return out
