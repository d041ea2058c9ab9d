"""What the server answers, in OpenAI's shapes (and llama-server's where it adds to them): each kind of result
owns its JSON here, as llama-server's result types each own theirs. The HTTP layer (app.py) sends these bodies;
the engine knows nothing of them."""

from __future__ import annotations

import json
import time
import uuid

from .. import __version__

FINGERPRINT = f"pyllamaspec-{__version__}"


class APIError(Exception):
    """An error answered with an HTTP status and OpenAI's error object
    ({"error": {"message", "type", "param", "code"}})."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", *, param: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def loading_error() -> APIError:
    """llama-server's answer while the model loads (its exact body: code 503, no param)."""
    return APIError(503, "Loading model", "unavailable_error", code=503)


def shutdown_error() -> APIError:
    return APIError(503, "the server is shutting down", "unavailable_error")


def health_body(status: str) -> tuple[dict, int]:
    """llama-server's /health: ok when ready, 503 with the reason otherwise."""
    if status == "loading":
        return {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503
    if status != "ready":
        return {"error": {"code": 503, "message": "Server is not available: " + status,
                          "type": "unavailable_error"}}, 503
    return {"status": "ok"}, 200


def models_body(name: str, created: int, target_info, session_info) -> dict:
    """/v1/models: the one model served, with llama-server's meta."""
    t = target_info
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": created, "owned_by": "pyllamaspec",
        "meta": {"n_vocab": t.n_vocab, "n_ctx_train": t.n_ctx_train, "n_embd": t.n_embd,
                 "n_params": t.n_params, "size": t.size_bytes, "n_ctx": session_info.n_ctx,
                 "n_parallel": session_info.n_parallel, "spec_types": list(session_info.spec_types),
                 "n_max": session_info.n_max_effective}}]}


def token_pieces_body(tokens: list[int], token_bytes) -> dict:
    """/tokenize with_pieces: each token with its text (or its bytes, when they are not UTF-8 on their own)."""
    pieces = []
    for t in tokens:
        b = token_bytes(t)
        try:
            piece = b.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(b)
        pieces.append({"id": t, "piece": piece})
    return {"tokens": pieces}


def sse(obj) -> bytes:
    """One server-sent event: a JSON object, or a bare string ("[DONE]")."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class CompletionBodies:
    """The bodies of one chat or text completion, streamed (chunks) or whole."""

    def __init__(self, model: str, chat: bool, *, include_usage: bool, return_tokens: bool) -> None:
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.return_tokens = return_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def chunk(self, choices: list, **extra) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
               "system_fingerprint": FINGERPRINT, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        out.update(extra)
        return out

    def delta_choice(self, text: str | None, tokens: list[int], finish: str | None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if self.return_tokens:
            c["tokens"] = tokens
        return c

    def message_delta_choice(self, delta: dict, finish: str | None = None) -> dict:
        """A chat chunk's choice carrying a delta as it is (content, or tool_calls pieces)."""
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def whole(self, text: str, tokens: list[int], finish: str, usage: dict, timings: dict,
              tool_calls: list[dict] | None = None) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": text}
            if tool_calls:
                message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if self.return_tokens:
            choice["tokens"] = tokens
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": FINGERPRINT,
                "choices": [choice], "usage": usage, "timings": timings}
