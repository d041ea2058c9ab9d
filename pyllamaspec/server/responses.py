"""What the server answers, in OpenAI's shapes (and llama-server's where it adds to them): each kind of result
owns its JSON here, as llama-server's result types each own theirs. The HTTP layer (app.py) sends these bodies;
the engine knows nothing of them."""

from __future__ import annotations

import base64
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


def _slot_params(state, job) -> dict:
    p = job.params if job is not None else None
    get = (lambda name, default=None: getattr(p, name, None) if p is not None and getattr(p, name, None) is not None
           else default)
    return {"n_predict": get("n_predict", state.n_predict), "temperature": get("temp", state.temperature), "top_k": get("top_k"),
            "top_p": get("top_p"), "min_p": get("min_p"), "seed": get("seed"),
            "stop": list(job.stops.stops) if job is not None else [],
            "speculative.n_max": get("n_max", state.loaded.session.info.n_max_effective),
            "speculative.n_min": get("n_min"), "speculative.p_min": get("p_min")}


def _slot(state, slot: int, job) -> dict:
    info = state.loaded.session.info
    return {"id": slot, "id_task": job.id if job is not None else -1,
            "n_ctx": info.n_ctx // max(1, info.n_parallel), "speculative": bool(info.spec_types),
            "is_processing": job is not None, "params": _slot_params(state, job),
            "next_token": {"has_next_token": job is not None and not job.done,
                           "n_decoded": job.n_generated if job is not None else 0}}


def slots_body(state, jobs: dict) -> list[dict]:
    """/slots, in llama-server's shape: each slot, idle or with the request it runs."""
    return [_slot(state, i, jobs.get(i)) for i in range(state.loaded.session.info.n_parallel)]


def props_body(state) -> dict:
    """/props, in llama-server's shape (llama.cpp's web UI reads it): the default generation settings, the slot
    count, the model and its chat template."""
    target, info = state.loaded.target, state.loaded.session.info
    template = state.template if state.template not in (None, "chatml") else None
    source = template or target.chat_template or ""
    return {"default_generation_settings": _slot(state, 0, None), "total_slots": info.n_parallel,
            "model_alias": state.model_name, "model_path": str(target.path), "chat_template": source,
            "chat_template_caps": state.template_caps(), "modalities": {"vision": False, "audio": False},
            "bos_token": "", "eos_token": "", "build_info": FINGERPRINT, "webui": False,
            "is_sleeping": False}


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


def merged_usage(usages: list[dict]) -> dict:
    """One request's usage over its choices: the prompt counted once (its cached tokens: what every choice's slot
    held), the completion tokens summed."""
    n_prompt = usages[0]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for u in usages)
    cached = min(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def merged_timings(timings: list[dict]) -> dict:
    """llama-server's timings over a request's choices: counts summed (a choice whose slot copied the prompt that
    another processed counts it as cached), times the longest choice's (they ran together), rates from those."""
    if len(timings) == 1:
        return timings[0]
    out = {k: sum(t[k] for t in timings) for k in ("cache_n", "prompt_n", "predicted_n", "draft_n",
                                                   "draft_n_accepted")}
    out["prompt_ms"] = max(t["prompt_ms"] for t in timings)
    out["predicted_ms"] = max(t["predicted_ms"] for t in timings)
    for what, n_key, ms_key in (("prompt", "prompt_n", "prompt_ms"), ("predicted", "predicted_n", "predicted_ms")):
        n, ms = out[n_key], out[ms_key]
        out[f"{what}_per_token_ms"] = ms / n if n else 0.0
        out[f"{what}_per_second"] = n / ms * 1000.0 if ms > 0 else 0.0
    return out


class CompletionBodies:
    """The bodies of one chat or text completion, streamed (chunks) or whole; each choice is named by its index."""

    def __init__(self, model: str, chat: bool, *, include_usage: bool, return_tokens: bool,
                 token_bytes=None) -> None:
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.return_tokens = return_tokens
        self.token_bytes = token_bytes    # token id -> its bytes (log-probabilities name tokens by text and bytes)
        self.text_offset: dict[int, int] = {}   # per choice: where the next token's text starts (text completions)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def chunk(self, choices: list, **extra) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
               "system_fingerprint": FINGERPRINT, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        out.update((k, v) for k, v in extra.items() if v is not None)  # timings only where there are some
        return out

    def delta_choice(self, text: str | None, tokens: list[int], finish: str | None, role: bool = False,
                     logprobs: list | None = None, index: int = 0) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            c = {"index": index, "delta": delta, "logprobs": self.logprobs(logprobs, index), "finish_reason": finish}
        else:
            c = {"index": index, "text": text or "", "logprobs": self.logprobs(logprobs, index),
                 "finish_reason": finish}
        if self.return_tokens:
            c["tokens"] = tokens
        return c

    def _token(self, token: int) -> tuple[str, list[int]]:
        b = self.token_bytes(token)
        return b.decode("utf-8", "replace"), list(b)

    def logprobs(self, records: list | None, index: int = 0) -> dict | None:
        """OpenAI's logprobs object for these tokens of a choice (pyllamaspec.session.TokenLogprob records); None:
        not asked. Chat: content entries with token, logprob, bytes and top_logprobs; text: the legacy parallel
        lists."""
        if records is None:
            return None
        if self.chat:
            content = []
            for r in records:
                text, b = self._token(r.token)
                top = []
                for t, lp in r.top:
                    t_text, t_b = self._token(t)
                    top.append({"token": t_text, "logprob": lp, "bytes": t_b})
                content.append({"token": text, "logprob": r.logprob, "bytes": b, "top_logprobs": top})
            return {"content": content, "refusal": None}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self.text_offset.get(index, 0)
        for r in records:
            text, _b = self._token(r.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(r.logprob)
            top: dict[str, float] = {}
            for t, lp in r.top:
                top.setdefault(self._token(t)[0], lp)
            out["top_logprobs"].append(top)
            out["text_offset"].append(offset)
            offset += len(text)
        self.text_offset[index] = offset
        return out

    def message_delta_choice(self, delta: dict, finish: str | None = None, index: int = 0) -> dict:
        """A chat chunk's choice carrying a delta as it is (content, or tool_calls pieces)."""
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def choice(self, index: int, text: str, tokens: list[int], finish: str, logprobs: list | None = None,
               tool_calls: list[dict] | None = None) -> dict:
        """One choice of a whole (not streamed) answer."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            if tool_calls:
                message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
            choice = {"index": index, "message": message, "logprobs": self.logprobs(logprobs, index),
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": self.logprobs(logprobs, index), "finish_reason": finish}
        if self.return_tokens:
            choice["tokens"] = tokens
        return choice

    def whole(self, choices: list[dict], usage: dict, timings: dict) -> dict:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "system_fingerprint": FINGERPRINT,
                "choices": choices, "usage": usage, "timings": timings}


def embeddings_body(model: str, vectors, n_tokens: int, as_base64: bool) -> dict:
    """/v1/embeddings, in OpenAI's shape: one `embedding` object per input, in order (a list of floats, or with
    encoding_format "base64" the little-endian float32 bytes in base64), and the input tokens as usage."""
    data = []
    for i, v in enumerate(vectors):
        embedding = base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
