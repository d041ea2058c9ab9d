"""Bounds on what a client can make the server do: the size of a request body, text that cannot be encoded,
and prompt tokenization that a disconnect or a shutdown does not have to wait for.

RequestLimits is an ASGI middleware. It refuses a body over the limit with 413 (by its Content-Length before
reading anything, or as soon as a chunked body passes the limit), a JSON string holding a lone UTF-16 surrogate
("\\ud800", which no text encoding can carry) with 400 naming the field, and answers a request that the server's
shutdown cancels before its response began with 503, all in OpenAI's error shape. Importing this module needs
no server extra (`serve --help` reads its defaults).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .responses import APIError

log = logging.getLogger("pyllamaspec.server")

DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # a prompt of ~2M tokens; 0 turns the limit off
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_size(text: str) -> int:
    """'8M', '512k', '1048576' -> bytes (binary multiples); 0 means no limit. ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with K, M or G (e.g. 8M)")
    return int(m.group(1)) * _SUFFIXES[m.group(2).lower()]


def lone_surrogate_field(body: bytes) -> str | None:
    """Where a JSON body holds a string with a lone surrogate (as 'messages[0].content'), or None."""
    if not _SURROGATE_ESCAPE.search(body):
        return None  # the common case costs one scan; a pair (an escaped emoji) is checked below
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the endpoint's own validation says so
    return _find_unencodable(value, "")


def _find_unencodable(value: Any, path: str) -> str | None:
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if not _encodable(v):
                return p or "body"
        elif isinstance(v, dict):
            for k, item in v.items():
                name = f"{p}.{k}" if p else str(k)
                if not _encodable(k):
                    return p or "body"
                stack.append((item, name))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v))
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _api_error(*args, **kwargs) -> "APIError":
    from .responses import APIError

    return APIError(*args, **kwargs)


def _error(err: "APIError", close: bool = False) -> tuple[dict, dict]:
    headers = [(b"content-type", b"application/json")] + [(k.encode(), v.encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    body = json.dumps(err.body()).encode()
    headers.append((b"content-length", str(len(body)).encode()))
    return ({"type": "http.response.start", "status": err.status, "headers": headers},
            {"type": "http.response.body", "body": body})


class RequestLimits:
    """The body-size limit, lone-surrogate refusal and shutdown answer (see the module docstring)."""

    def __init__(self, app, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if not isinstance(max_body_bytes, int) or isinstance(max_body_bytes, bool) or max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be an int >= 0 (0: no limit), not {max_body_bytes!r}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> "APIError":
        return _api_error(413, f"the request body is larger than this server's limit of {self.max_body_bytes} bytes "
                             "(pyllamaspec serve --max-body-size)", code="request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def answer(err: "APIError", close: bool = False) -> None:
            for message in _error(err, close):
                await tracked_send(message)

        try:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                limit = self.max_body_bytes
                length = dict(scope["headers"]).get(b"content-length")
                if limit and length is not None and length.isdigit() and int(length) > limit:
                    await answer(self._too_large(), close=True)
                    return
                body = bytearray()
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    if limit and len(body) > limit:
                        await answer(self._too_large(), close=True)
                        return
                    if not message.get("more_body", False):
                        break
                field = lone_surrogate_field(bytes(body))
                if field is not None:
                    await answer(_api_error(400, f"{field} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                                               "escape), which is not text: send valid Unicode", param=field))
                    return
                receive = _replay(bytes(body), receive)
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            # the server's shutdown cancelled a request still in flight: answer it, instead of a bare 500 and
            # a traceback in the log
            if started:
                raise
            log.info("request %s %s ended by the shutdown", scope.get("method"), scope.get("path"))
            try:
                await answer(_api_error(503, "the server is shutting down", "unavailable_error"), close=True)
            except Exception:
                pass


def _replay(body: bytes, receive):
    """A receive() that hands the body read already, then the connection's own messages (a disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def run_interruptible(state, request, fn: Callable, *args):
    """fn(*args) in a worker thread (prompt tokenization: seconds for a long prompt), awaited in a way that a
    client's disconnect (499) or the server's shutdown (503) ends at once; the thread finishes on its own."""
    from starlette.concurrency import run_in_threadpool

    task = asyncio.ensure_future(run_in_threadpool(fn, *args))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved" warning

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        while True:
            await asyncio.wait({task, watcher}, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            if watcher.done():
                raise _api_error(499, "the client closed the request")
            if state.status in ("draining", "closed"):
                raise _api_error(503, "the server is shutting down", "unavailable_error")
    finally:
        if not watcher.done():
            watcher.cancel()
