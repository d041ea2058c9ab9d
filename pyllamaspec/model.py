"""A loaded GGUF model: load once, share between sessions. Tokenizer and chat template live here."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from . import _native, templateguard
from .chat import ChatPlan, chat_request_json
from .textfiles import encode_text
from .config import ModelConfig
from .errors import ChatTemplateError, ConfigError, ConfigTypeError, ModelLoadError
from .ggufinfo import check_model_file
from .native_params import native_model_params


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    desc: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_layer_nextn: int
    n_ctx_train: int
    n_head: int
    n_head_kv: int
    n_swa: int
    is_recurrent: bool
    is_hybrid: bool
    supports_rs_rollback: bool
    has_encoder: bool
    has_output: bool
    token_bos: int
    token_eos: int
    token_eot: int
    token_mask: int
    add_bos: bool
    dflash_block_size: int
    dflash_selector_top_k: int
    target_layers: tuple[int, ...]
    size_bytes: int
    n_params: int
    head_device: str

    @property
    def is_dflash2(self) -> bool:
        return self.dflash_selector_top_k > 0


def token_bytes(ffi, lib, handle, token: int, special: bool = False) -> bytes:
    """Bytes of one token of the model behind a native handle (a partial UTF-8 sequence is possible)."""
    buf = ffi.new("char[]", 256)
    n = lib.pls_token_to_piece(handle, token, buf, 256, int(special))
    if n < 0:
        buf = ffi.new("char[]", -n)
        n = lib.pls_token_to_piece(handle, token, buf, -n, int(special))
    return bytes(ffi.buffer(buf, n))


def token_id(value, n_vocab: int, what: str = "token id") -> int:
    """A token id (Python or numpy integer) within the vocabulary, as an int; ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigTypeError(f"{what} {value!r} is a bool, not a token id")
    try:
        t = operator.index(value)
    except TypeError:
        raise ConfigTypeError(f"{what} {value!r} is not an integer") from None
    if not 0 <= t < n_vocab:
        raise ConfigError(f"{what} {t} is outside the vocabulary (0..{n_vocab - 1})")
    return t


def token_ids(tokens: Sequence[int], n_vocab: int) -> list[int]:
    """A sequence of token ids (a list, or a numpy array) as ints of the vocabulary; ConfigTypeError for text or a
    non-sequence, ConfigError for an id outside the vocabulary."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise ConfigTypeError(f"detokenize takes a sequence of token ids, not {type(tokens).__name__}")
    try:
        items = list(tokens)
    except TypeError:
        raise ConfigTypeError(f"detokenize takes a sequence of token ids, not {type(tokens).__name__}") from None
    return [token_id(t, n_vocab) for t in items]


def flag(value, name: str) -> int:
    """A yes/no argument (bool, numpy bool, 0 or 1) as 0 or 1; ConfigTypeError otherwise."""
    numpy_bool = getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0
    if isinstance(value, bool) or numpy_bool or (isinstance(value, int) and value in (0, 1)):
        return int(bool(value))
    raise ConfigTypeError(f"{name} must be True or False, not {value!r}")


def tokenize(ffi, lib, handle, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    if not isinstance(text, str):
        raise ConfigTypeError(f"text to tokenize must be a str, not {type(text).__name__}")
    add_special, parse_special = flag(add_special, "add_special"), flag(parse_special, "parse_special")
    data = encode_text(text, "the text to tokenize")
    cap = len(data) + 16
    for _ in range(2):
        out = ffi.new("int32_t[]", cap)
        n = lib.pls_tokenize(handle, data, len(data), out, cap, int(add_special), int(parse_special))
        if n >= 0:
            return list(out[0:n])
        if n == -(2 ** 31):
            break
        cap = -n
    raise ModelLoadError("tokenization failed")


def _one_line(engine_error: str) -> str:
    """The Jinja engine's multi-line report (a source excerpt with a caret) as one line: what and where."""
    lines = [line.strip() for line in engine_error.splitlines() if line.strip().strip("-")]
    what = next((line.removeprefix("Error:").strip() for line in lines if line.startswith("Error:")), None)
    if what is None:
        return " ".join(lines)
    head = next((line for line in lines if not line.startswith(("While executing", "Error:", "..."))), "")
    where = next((line for line in lines if line.startswith("While executing") and " at line " in line), None)
    if where is not None:
        what += " (" + where[where.index(" at line ") + 1:].removesuffix(":").removesuffix(" in source") + ")"
    return f"{head} {what}" if head else what


class Model(_native.NativeOwner):
    """A GGUF loaded by llama.cpp. Safe to share between threads and sessions; free with close() or a
    with-block. A session keeps the native model alive after close(): close() ends this object's use of it."""

    def __init__(self, path: str | os.PathLike, config: ModelConfig | None = None, **overrides) -> None:
        if config is not None and overrides:
            raise ConfigError("pass either a ModelConfig or keyword settings, not both")
        self.config = config or ModelConfig(**overrides)
        self.path = Path(path)
        check_model_file(self.path)  # missing, a directory or a FIFO: refused before llama.cpp opens it
        self._ffi, self._lib = _native.load()
        ffi = self._ffi
        if self.config.rpc:
            from .rpc import add_servers  # remote devices join the device list before placement reads it

            add_servers(self.config.rpc, self.config.rpc_timeout)
        p, _keep = native_model_params(ffi, self.path, self.config)
        err = _native.ErrorBuffer(ffi)
        slot = ffi.new("pls_model **")
        _native.check(self._lib.pls_model_load(p, slot, err.buf, err.SIZE), err, ModelLoadError)
        handle = slot[0]
        self._handle = _native.NativeHandle(handle, self._lib.pls_model_free,
                                            ModelLoadError(f"model '{self.path}' was closed"))
        out = ffi.new("pls_model_info *")
        self._lib.pls_model_get_info(handle, out)
        self.info = ModelInfo(
            arch=ffi.string(out.arch).decode(), desc=ffi.string(out.desc).decode(),
            n_vocab=out.n_vocab, n_embd=out.n_embd, n_layer=out.n_layer, n_layer_nextn=out.n_layer_nextn,
            n_ctx_train=out.n_ctx_train, n_head=out.n_head, n_head_kv=out.n_head_kv, n_swa=out.n_swa,
            is_recurrent=bool(out.is_recurrent), is_hybrid=bool(out.is_hybrid),
            supports_rs_rollback=bool(out.supports_rs_rollback), has_encoder=bool(out.has_encoder),
            has_output=bool(out.has_output), token_bos=out.token_bos, token_eos=out.token_eos,
            token_eot=out.token_eot, token_mask=out.token_mask, add_bos=bool(out.add_bos),
            dflash_block_size=out.dflash_block_size, dflash_selector_top_k=out.dflash_selector_top_k,
            target_layers=tuple(out.target_layers[i] for i in range(out.n_target_layers)),
            size_bytes=out.size_bytes, n_params=out.n_params, head_device=ffi.string(out.head_device).decode())

    # -- lifetime ----------------------------------------------------------------------------

    def _use(self):
        """The native model for the length of one call (close() waits for it)."""
        return self._handle.use()

    def __repr__(self) -> str:
        return f"Model('{self.path}', arch={self.info.arch}, n_layer={self.info.n_layer})"

    # -- metadata and tokenizer --------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A metadata value as text, of any length; None when the key is absent."""
        if not isinstance(key, str):
            raise ConfigTypeError(f"a metadata key is a str, not {type(key).__name__}")
        if "\0" in key:
            raise ConfigError("a metadata key cannot contain a NUL character")
        ckey = encode_text(key, "the metadata key")
        size = 4096
        for _ in range(2):
            buf = self._ffi.new("char[]", size)
            # the value's length, -1 when absent, or -(length + 1) when buf cannot hold it and its terminator
            with self._use() as h:
                n = self._lib.pls_model_meta(h, ckey, buf, size)
            if n >= 0:
                return bytes(self._ffi.buffer(buf, n)).decode("utf-8", "replace")
            if n == -1:
                return None
            size = -n
        raise ModelLoadError(f"metadata key '{key}' changed size while being read")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        with self._use() as h:
            return tokenize(self._ffi, self._lib, h, text, add_special, parse_special)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        token, special = token_id(token, self.info.n_vocab), flag(special, "special")
        with self._use() as h:
            return token_bytes(self._ffi, self._lib, h, token, special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """The text of token ids (a list, or a numpy array); an id outside the vocabulary is a ConfigError."""
        ids = token_ids(tokens, self.info.n_vocab)
        special = flag(special, "special")
        with self._use() as h:
            return b"".join(token_bytes(self._ffi, self._lib, h, t, special) for t in ids).decode("utf-8", "replace")

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
                            template: str | None = None, enable_thinking: bool | None = None) -> str:
        """Format [{'role': ..., 'content': ...}] with the model's chat template (or `template`, Jinja source)
        through llama.cpp's Jinja engine, as llama-server does. enable_thinking switches a template's reasoning
        (thinking) mode on or off; None keeps llama.cpp's default (enable_thinking true). Raises
        ChatTemplateError when there is no template or it cannot be rendered."""
        ffi = self._ffi
        roles, contents = [], []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ConfigError(f"message {i} is not a {{'role': str, 'content': str}} mapping")
            for field in ("role", "content"):
                if "\0" in m[field]:
                    raise ConfigError(f"message {i}: its {field} contains a NUL character")
            roles.append(ffi.new("char[]", encode_text(m["role"], f"message {i}: its role")))
            contents.append(ffi.new("char[]", encode_text(m["content"], f"message {i}: its content")))
        if template is not None and (not isinstance(template, str) or "\0" in template or not template.strip()):
            raise ConfigError("template must be non-empty Jinja source text")
        if template is not None:
            encode_text(template, "the chat template")
        r_arr = ffi.new("char *[]", roles) if roles else ffi.NULL
        c_arr = ffi.new("char *[]", contents) if contents else ffi.NULL
        tmpl = ffi.new("char[]", template.encode("utf-8")) if template is not None else ffi.NULL
        thinking = -1 if enable_thinking is None else flag(enable_thinking, "enable_thinking")
        add_generation_prompt = flag(add_generation_prompt, "add_generation_prompt")
        cap = sum(len(m["content"].encode("utf-8")) for m in messages) * 2 + (len(template) if template else 0) + 8192
        n_out = ffi.new("int32_t *")
        err = _native.ErrorBuffer(ffi)
        with self._use() as h:  # a template is a program: its first run here is in a child, under budgets
            def probe(cap=cap):
                out = ffi.new("char[]", cap)
                rc = self._lib.pls_chat_format(h, tmpl, r_arr, c_arr, len(roles), int(add_generation_prompt),
                                               thinking, out, cap, n_out, err.buf, err.SIZE)
                return rc, err.text

            which = "the given chat template" if template is not None else f"the chat template of '{self.path.name}'"
            templateguard.check(int(ffi.cast("uintptr_t", h)), template, probe, which)
        for _ in range(3):
            buf = ffi.new("char[]", cap)
            with self._use() as h:
                rc = self._lib.pls_chat_format(h, tmpl, r_arr, c_arr, len(roles), int(add_generation_prompt),
                                               thinking, buf, cap, n_out, err.buf, err.SIZE)
            if rc == self._lib.PLS_OK:
                if n_out[0] < cap:
                    return bytes(ffi.buffer(buf, n_out[0])).decode("utf-8", "replace")
                cap = n_out[0] + 4096  # a template may print the time, so leave room for a re-render
                continue
            if rc == self._lib.PLS_ERR_NO_TEMPLATE:
                raise ChatTemplateError(f"'{self.path.name}' has no chat template; pass one (template=..., "
                                        f"--chat-template) or format the prompt yourself (--raw)")
            if rc == self._lib.PLS_ERR_TEMPLATE:
                which = "the given chat template" if template is not None else f"the chat template of '{self.path.name}'"
                raise ChatTemplateError(f"{which} cannot be applied: {_one_line(err.text)}")
            _native.check(rc, err, ChatTemplateError)
        raise ChatTemplateError("chat template formatting failed: its output kept growing")

    def apply_chat(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None,
                   tool_choice: str = "auto", parallel_tool_calls: bool = False, add_generation_prompt: bool = True,
                   template: str | None = None, enable_thinking: bool | None = None) -> ChatPlan:
        """A chat request in OpenAI's shapes (messages with tool_calls and role 'tool', function tools) through the
        model's chat template (or `template`), as llama-server renders it: a ChatPlan with the prompt, the
        reply's parser and the tool-call grammar. tool_choice: auto, none or required. Raises ChatTemplateError
        when there is no template or it cannot render these messages or tools, ConfigError for malformed ones."""
        if template is not None and (not isinstance(template, str) or "\0" in template or not template.strip()):
            raise ConfigError("template must be non-empty Jinja source text")
        request = chat_request_json(list(messages), list(tools) if tools else None, tool_choice,
                                    flag(parallel_tool_calls, "parallel_tool_calls"),
                                    flag(add_generation_prompt, "add_generation_prompt"),
                                    None if enable_thinking is None else flag(enable_thinking, "enable_thinking"))
        ffi = self._ffi
        c_request = ffi.new("char[]", request.encode("utf-8"))
        tmpl = ffi.new("char[]", template.encode("utf-8")) if template is not None else ffi.NULL
        n_out = ffi.new("int32_t *")
        err = _native.ErrorBuffer(ffi)
        cap = 4 * len(request) + (len(template) if template else 0) + 65536
        which = "the given chat template" if template is not None else f"the chat template of '{self.path.name}'"
        with self._use() as h:  # a template is a program: its first run here is in a child, under budgets
            def probe(cap=cap):
                out = ffi.new("char[]", cap)
                rc = self._lib.pls_chat_apply(h, tmpl, c_request, out, cap, n_out, err.buf, err.SIZE)
                return rc, err.text

            templateguard.check(int(ffi.cast("uintptr_t", h)), template, probe, which)
        for _ in range(3):
            buf = ffi.new("char[]", cap)
            with self._use() as h:
                rc = self._lib.pls_chat_apply(h, tmpl, c_request, buf, cap, n_out, err.buf, err.SIZE)
            if rc == self._lib.PLS_OK:
                if n_out[0] < cap:
                    text = bytes(ffi.buffer(buf, n_out[0])).decode("utf-8", "replace")
                    return ChatPlan.from_json(text, tools=bool(tools) and tool_choice != "none")
                cap = n_out[0] + 4096
                continue
            if rc == self._lib.PLS_ERR_NO_TEMPLATE:
                raise ChatTemplateError(f"'{self.path.name}' has no chat template; pass one (template=..., "
                                        f"--chat-template) or format the prompt yourself (--raw)")
            if rc == self._lib.PLS_ERR_TEMPLATE:
                raise ChatTemplateError(f"{which} cannot be applied: {_one_line(err.text)}")
            _native.check(rc, err, ChatTemplateError)
        raise ChatTemplateError("chat template formatting failed: its output kept growing")
