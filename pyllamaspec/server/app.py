"""OpenAI-compatible HTTP endpoints (and llama-server's /health, /tokenize, /detokenize, /metrics) over one
Engine. The model loads in a thread after the port is open: /health answers 503 until it is ready.

The HTTP layer: it turns requests into jobs, the engine's conditions (busy, draining, a failed job) into status
codes, and results into the bodies responses.py shapes."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import threading
import time
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..config import UINT32_MAX, SequenceParams
from ..errors import ConfigError
from . import defaults
from .engine import STARTED, Delta, Engine, EngineBusy, EngineDraining, Final, Job, JobFailed
from .metrics import ServerMetrics
from .limits import DEFAULT_MAX_BODY_BYTES, RequestLimits, run_interruptible
from .responses import (APIError, CompletionBodies, embeddings_body, health_body, loading_error, merged_timings,
                        merged_usage, models_body, props_body, shutdown_error, slots_body, sse, token_pieces_body)
from .schemas import (OTHER_FIELDS, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest,
                      TokenizeRequest, other_field_problem, unknown_field_message)
from .tools import ToolPlan, call_opening, tool_settings

log = logging.getLogger("pyllamaspec.server")


@dataclass
class Loaded:
    """What a loader returns: the models, the session and (with --embeddings) the embedder the server owns (and
    closes) from then on."""

    target: Any
    drafter: Any
    session: Any
    embedder: Any = None


class ServerState:
    def __init__(self, loader: Callable[[], Loaded], *, alias: str | None = None, queue_size: int | None = None,
                 metrics_prefix: str = "pyllamaspec", chat_template: str | None = None,
                 enable_thinking: bool | None = None, on_fatal: Callable[[], None] | None = None,
                 n_predict: int = -1, slots_endpoint: bool = True, temperature: float = defaults.TEMPERATURE,
                 ignore_unknown_fields: bool = False) -> None:
        self.loader = loader
        # a request field no request of its kind has: a 400 naming it, or (serve --ignore-unknown-fields) logged
        self.ignore_unknown_fields = ignore_unknown_fields
        self.n_predict = n_predict          # a request's max_tokens when it sets none (-n; -1: no limit)
        self.temperature = temperature      # a request's temperature when it sets none (--temp)
        self.slots_endpoint = slots_endpoint
        self._caps: dict | None = None
        self.alias = alias
        self.queue_size = queue_size
        self.chat_template = chat_template
        self.enable_thinking = enable_thinking  # the server's default; a request's chat_template_kwargs wins
        self.on_fatal = on_fatal
        self.status = "loading"           # loading -> ready -> draining -> closed; or failed
        self.load_error: BaseException | None = None
        self.loaded: Loaded | None = None
        self.engine: Engine | None = None
        self.model_name = alias or ""
        self.model_names: set[str] = set()
        self.created = int(time.time())
        self.template: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._loader: threading.Thread | None = None
        self.metrics = ServerMetrics(metrics_prefix, running=lambda: self.engine.n_running if self.engine else 0,
                                     waiting=lambda: self.engine.n_waiting if self.engine else 0)

    # -- lifetime ----------------------------------------------------------------------------

    def start_loading(self) -> None:
        self._loader = threading.Thread(target=self._load, name="pyllamaspec-load", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        loaded = None
        try:
            loaded = self.loader()
            template = self._pick_template(loaded.target)
            n_parallel = loaded.session.info.n_parallel
            queue_size = self.queue_size if self.queue_size is not None else 4 * n_parallel
            engine = Engine(loaded.session, loaded.target, queue_size=queue_size, metrics=self.metrics)
        except BaseException as e:
            if loaded is not None:
                _close_loaded(loaded)
            self.load_error = e
            self.status = "failed"
            log.error("loading failed: %s", e)
            if self.on_fatal is not None:
                self.on_fatal()
            return
        with self._lock:
            self.loaded = loaded
            if self.status != "loading":  # shut down while loading
                _close_loaded(loaded)
                return
            self.template = template
            path = loaded.target.path
            self.model_name = self.alias or path.stem
            self.model_names = {self.model_name, path.name, path.stem}
            self.engine = engine
            engine.start()
            self.status = "ready"
        info = loaded.session.info
        log.info("model '%s' ready: %s, n_parallel=%d, n_ctx=%d, queue %d", self.model_name,
                 ",".join(info.spec_types) or "no drafting", info.n_parallel, info.n_ctx, queue_size)

    def _pick_template(self, target) -> str | None:
        """The model's own chat template, or llama-server's fallback (chatml) when it has none or llama.cpp's
        built-in formatter does not know it."""
        if self.chat_template is not None:
            target.apply_chat_template([{"role": "user", "content": "x"}], template=self.chat_template)
            return self.chat_template
        if target.chat_template is None:
            log.info("the model has no chat template: using chatml")
            return "chatml"
        try:
            target.apply_chat_template([{"role": "user", "content": "x"}])
        except ConfigError as e:
            log.warning("%s; using chatml", e)
            return "chatml"
        return None

    def begin_shutdown(self) -> None:
        """Stop admitting; requests in flight end with 503 (any thread except inside a signal handler)."""
        with self._lock:
            if self.status in ("loading", "ready"):
                self.status = "draining"
            engine = self.engine
        if engine is not None:
            engine.begin_shutdown()

    def close(self) -> None:
        """Drain, stop the engine thread, close the session and the models. Idempotent."""
        self.begin_shutdown()
        if self._loader is not None:
            self._loader.join()
        with self._lock:
            if self.status == "closed":
                return
            engine, loaded = self.engine, self.loaded
            self.status = "closed" if self.status != "failed" else "failed"
            self.engine = None
        if engine is not None:
            engine.close()
        if loaded is not None and engine is not None:
            _close_loaded(loaded)
            log.info("session closed")

    # -- what the handlers use ---------------------------------------------------------------

    def require_ready(self) -> Engine:
        status, engine = self.status, self.engine
        if status == "loading":
            raise loading_error()
        if status == "draining" or status == "closed":
            raise shutdown_error()
        if status == "failed" or engine is None:
            raise APIError(503, f"the model failed to load: {self.load_error}", "unavailable_error")
        if engine.unusable is not None:
            raise APIError(503, engine.unusable, "unavailable_error")
        return engine

    def template_caps(self) -> dict:
        """What the chat template supports (tools, parallel calls, a system role...), as upstream reads it."""
        if self._caps is None:
            try:
                self._caps = self.loaded.target.apply_chat([{"role": "user", "content": "x"}],
                                                           template=self.template).caps
            except ConfigError:
                self._caps = {}
        return self._caps

    def check_model(self, name: str | None) -> None:
        if name and name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model_name}`",
                           param="model", code="model_not_found")

    def check_tokens(self, tokens: list[int], param: str) -> None:
        n_vocab = self.loaded.target.info.n_vocab
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})", param=param)

    def chat_tokens(self, req: ChatCompletionRequest) -> tuple[list[int], ToolPlan | None]:
        """The prompt's tokens and, for a request with tools (or tool calls in its conversation), how to read
        the reply back."""
        target = self.loaded.target
        kwargs = req.chat_template_kwargs
        thinking = kwargs.enable_thinking if kwargs is not None and kwargs.enable_thinking is not None \
            else self.enable_thinking
        if req.uses_tools():
            # a reply read for tool calls is shaped by the template's call format: another format, or per-token
            # log-probabilities of text that becomes calls, cannot be honoured beside it
            shaped = req.shape_source()
            if shaped is not None:
                raise APIError(400, f"{shaped} and tools both set the reply's format: give one", param=shaped)
            if req.logprobs:
                raise APIError(400, "logprobs are not returned for a request with tools", param="logprobs")
            settings = tool_settings(req)
            messages = [m.openai() for m in req.messages]

            def render(msgs: list[dict], add_generation_prompt: bool, choice: str = "auto"):
                return target.apply_chat(msgs, tools=settings.tools, tool_choice=choice,
                                         parallel_tool_calls=settings.parallel, template=self.template,
                                         enable_thinking=thinking, add_generation_prompt=add_generation_prompt)

            try:
                plan = render(messages, True, settings.tool_choice)
                # a required call starts in the prompt: the reply opens as a call does in the template's format
                prefill = call_opening(lambda m, g: render(m, g).prompt, settings.function) \
                    if settings.tool_choice == "required" else ""
            except ConfigError as e:
                raise APIError(400, str(e), param="tools" if req.tools else "messages") from None
            tools = ToolPlan(plan, settings, target, prefill)
            return target.tokenize(plan.prompt + prefill), tools
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        try:
            text = target.apply_chat_template(messages, add_generation_prompt=True, template=self.template,
                                              enable_thinking=thinking)
        except ConfigError as e:
            raise APIError(400, str(e), param="messages") from None
        return target.tokenize(text), None

    def completion_tokens(self, req: CompletionRequest) -> list[int]:
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) > 1:
                raise APIError(400, f"{len(prompt)} prompts in one request: send one prompt per request",
                               param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        if isinstance(prompt, str):
            return self.loaded.target.tokenize(prompt)
        tokens = list(prompt)
        self.check_tokens(tokens, "prompt")
        return tokens


def _close_loaded(loaded: Loaded) -> None:
    if loaded.embedder is not None:
        loaded.embedder.close()
    loaded.session.close()
    for m in (loaded.drafter, loaded.target):
        if m is not None:
            m.close()


# -- from requests to jobs, from the engine's conditions to status codes ------------------------------


# a sequence setting's name in a request, where it differs from SequenceParams'
_REQUEST_FIELD = {"temp": "temperature", "n_predict": "max_tokens"}


def _sequence_params(req, default_n_predict: int = -1, default_temp: float = defaults.TEMPERATURE) -> SequenceParams:
    """The request's settings for its sequence; a value the sequence cannot take is a 400 naming the field."""
    # llama-server's n_predict first (as it reads them; -1: no limit), then OpenAI's
    n_predict = req.n_predict if req.n_predict is not None else \
        getattr(req, "max_completion_tokens", None) or req.max_tokens or default_n_predict
    temp = req.temperature if req.temperature is not None else default_temp
    seed = UINT32_MAX if req.seed == -1 else req.seed
    try:
        sampling = req.sampling_settings()
        n_probs = req.n_probs()
    except ValueError as e:
        param, message = e.args
        raise APIError(400, message, param=param) from None
    try:
        return SequenceParams(n_predict=n_predict, temp=temp, top_k=req.top_k, top_p=req.top_p,
                              min_p=req.min_p, seed=seed, n_probs=n_probs, **sampling, **req.draft_settings())
    except ConfigError as e:
        raise APIError(400, str(e), param=_request_field(req, getattr(e, "param", None))) from None


def _check_other_fields(state: ServerState, req) -> None:
    """The request's fields beyond the declared ones (schemas.OTHER_FIELDS): taken where they change nothing here,
    a 400 naming the field otherwise; a field no request of its kind has is a 400 too, or with
    --ignore-unknown-fields logged and left out."""
    unknown = []
    for name, value in (req.model_extra or {}).items():
        if name in OTHER_FIELDS:
            problem = other_field_problem(name, value)
            if problem is not None:
                raise APIError(400, problem, param=name)
        elif state.ignore_unknown_fields:
            unknown.append(name)
        else:
            known = {f.alias or k for k, f in type(req).model_fields.items()} | set(OTHER_FIELDS)
            raise APIError(400, unknown_field_message(name, known), param=name)
    if unknown:
        log.warning("fields left out of a request (--ignore-unknown-fields): %s", ", ".join(sorted(unknown)))


def _choice_params(params: SequenceParams, index: int, session_seed: int) -> SequenceParams:
    """Choice `index`'s settings: seed + index (modulo 2**32 - 1), so seeded choices differ and repeat; a random seed
    (none given and none on the command line, or -1) stays random for each."""
    seed = params.seed if params.seed is not None else session_seed
    if index == 0 or seed == UINT32_MAX:
        return params
    return dataclasses.replace(params, seed=(seed + index) % UINT32_MAX)


def _request_field(req, param: str | None) -> str | None:
    """The request's name of a SequenceParams field (a grammar's problem is the field that gave the grammar)."""
    if getattr(req, "tools", None) and param in ("grammar", "grammar_triggers"):
        return "tools"  # a request with tools has no grammar of its own: the tool-call grammar is the template's
    if param in ("grammar", "json_schema"):
        return req.shape_source() or param
    if param == "n_probs":
        return "top_logprobs" if hasattr(req, "top_logprobs") else "logprobs"
    return _REQUEST_FIELD.get(param, param)


def _refusal_error(e: EngineBusy | EngineDraining) -> APIError:
    if isinstance(e, EngineDraining):
        return shutdown_error()
    return APIError(429, str(e), "rate_limit_exceeded", code="rate_limit_exceeded", headers={"Retry-After": "1"})


def _job_error(failed: JobFailed) -> APIError:
    if failed.kind == "context":
        return APIError(400, failed.message, param=failed.param, code="context_length_exceeded")
    if failed.kind == "invalid":
        return APIError(400, failed.message, param=failed.param)
    if failed.kind == "shutdown":
        return shutdown_error()
    if failed.kind in ("no_slot", "unavailable"):
        return APIError(503, failed.message, "unavailable_error")
    return APIError(500, failed.message, "server_error")


class _SSEResponse(StreamingResponse):
    """Server-sent events; the generator is closed however the response ends (its finally cancels the job)."""

    media_type = "text/event-stream"

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


class ClientGone(Exception):
    pass


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(awaitable, request: Request):
    """Await `awaitable`; raise ClientGone if the client disconnects first."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            if not t.done():
                t.cancel()
    if task.done():
        return task.result()
    raise ClientGone()


class _Completion:
    """One chat or text completion of n choices (a job each): the jobs' results sent as one stream of chunks that
    name their choice by index, or as one body. A reply to a request with tools is read for tool calls (tools.py),
    each choice by its own reader, as it arrives."""

    def __init__(self, state: ServerState, req, kind: str, tools: ToolPlan | None = None) -> None:
        self.state = state
        self.return_tokens = req.return_tokens
        self.timings_per_token = req.timings_per_token
        self.tools = tools if tools is not None and tools.parses else None
        self.bodies = CompletionBodies(state.model_name, kind == "chat", return_tokens=req.return_tokens,
                                       include_usage=bool(req.stream_options and req.stream_options.include_usage),
                                       token_bytes=state.loaded.target.token_bytes)

    def _readers(self, n: int) -> list:
        return [self.tools.reader() if self.tools is not None else None for _ in range(n)]

    async def stream(self, jobs: list[Job]) -> AsyncIterator[bytes]:
        engine = self.state.engine
        b = self.bodies
        readers = self._readers(len(jobs))
        usages, timings = [], []
        try:
            if b.chat:
                for i in range(len(jobs)):
                    yield sse(b.chunk([b.delta_choice(None, [], None, role=True, index=i)]))
            async with aclosing(_merged(jobs)) as items:
                async for i, item in items:
                    reader = readers[i]
                    if isinstance(item, Delta) and reader is not None:
                        deltas = reader.feed(item.text)
                        for k, delta in enumerate(deltas):
                            yield sse(b.chunk([b.message_delta_choice(delta, index=i)],
                                              timings=item.timings if k == len(deltas) - 1 else None))
                    elif isinstance(item, Delta):
                        # text held back (a stop string may begin): no chunk, unless it carries tokens or logprobs
                        if item.text or self.return_tokens or item.logprobs:
                            yield sse(b.chunk([b.delta_choice(item.text, item.tokens, None, logprobs=item.logprobs,
                                                              index=i)], timings=item.timings))
                    elif isinstance(item, Final):
                        finish = item.finish_reason
                        so_far = item.timings if self.timings_per_token else None
                        if reader is not None:
                            for delta in reader.feed(item.text) + reader.finish():
                                yield sse(b.chunk([b.message_delta_choice(delta, index=i)], timings=so_far))
                            if reader.final.tool_calls and finish == "stop":
                                finish = "tool_calls"
                        elif item.text or (item.tokens and (self.return_tokens or item.logprobs)):
                            yield sse(b.chunk([b.delta_choice(item.text, item.tokens, None, logprobs=item.logprobs,
                                                              index=i)], timings=so_far))
                        yield sse(b.chunk([b.delta_choice(None, [], finish, index=i)], timings=item.timings))
                        usages.append(item.usage)
                        timings.append(item.timings)
                    elif isinstance(item, JobFailed):
                        yield sse(_job_error(item).body())
                        return
            if b.include_usage:
                yield sse(b.chunk([], usage=merged_usage(usages), timings=merged_timings(timings)))
            yield sse("[DONE]")
        finally:
            for job in jobs:
                engine.cancel(job)  # the client went away (or the stream ended: then a no-op)

    async def collect(self, jobs: list[Job]) -> dict:
        results = await asyncio.gather(*(self._collect_one(job) for job in jobs))
        readers = self._readers(len(jobs))
        choices = []
        for i, ((text, tokens, logprobs, final), reader) in enumerate(zip(results, readers)):
            finish, calls = final.finish_reason, None
            if reader is not None:
                reply, calls = reader.whole(text)
                text = reply.content
                if calls and finish == "stop":
                    finish = "tool_calls"
            choices.append(self.bodies.choice(i, text, tokens, finish, logprobs=logprobs, tool_calls=calls))
        finals = [r[3] for r in results]
        return self.bodies.whole(choices, merged_usage([f.usage for f in finals]),
                                 merged_timings([f.timings for f in finals]))

    @staticmethod
    async def _collect_one(job: Job) -> tuple[str, list[int], list | None, Final]:
        texts, tokens, logprobs = [], [], None
        while True:
            item = await job.queue.get()
            if isinstance(item, JobFailed):
                raise _job_error(item)
            texts.append(item.text)
            tokens.extend(item.tokens)
            if item.logprobs is not None:
                logprobs = (logprobs or []) + item.logprobs
            if isinstance(item, Final):
                break
        if logprobs is None and job.params.n_probs is not None:
            logprobs = []
        return "".join(texts), tokens, logprobs, item


async def _merged(jobs: list[Job]) -> AsyncIterator[tuple[int, Any]]:
    """The items of several jobs' queues as they arrive, each with its job's index, until every job has ended."""
    if len(jobs) == 1:
        while True:
            item = await jobs[0].queue.get()
            yield 0, item
            if isinstance(item, (Final, JobFailed)):
                return
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(i: int, job: Job) -> None:
        while True:
            item = await job.queue.get()
            merged.put_nowait((i, item))
            if isinstance(item, (Final, JobFailed)):
                return

    tasks = [asyncio.ensure_future(forward(i, job)) for i, job in enumerate(jobs)]
    try:
        left = len(jobs)
        while left:
            i, item = await merged.get()
            left -= isinstance(item, (Final, JobFailed))
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def _generate(state: ServerState, request: Request, req, kind: str, tokens: list[int],
                    tools: ToolPlan | None = None) -> Response:
    engine = state.require_ready()
    if req.n > engine.n_parallel:
        raise APIError(400, f"n={req.n} choices need as many slots, and this server has {engine.n_parallel} (-np)",
                       param="n")
    prompt_param = "messages" if kind == "chat" else "prompt"
    stops = tuple(req.stop_strings()) + (tools.stops if tools is not None else ())
    params = _sequence_params(req, state.n_predict, state.temperature)
    if tools is not None:
        params = dataclasses.replace(params, **tools.sampling())
    loop = asyncio.get_running_loop()
    jobs = [Job(tokens, _choice_params(params, i, state.loaded.session.config.seed), loop, prompt_param, stops,
                field_name=lambda param: _request_field(req, param),
                special_tokens=tools.special_tokens if tools is not None else frozenset(),
                timings_per_token=req.timings_per_token)
            for i in range(req.n)]
    try:
        engine.submit(*jobs)
    except (EngineBusy, EngineDraining) as e:
        raise _refusal_error(e) from None
    gen = _Completion(state, req, kind, tools)
    try:
        for job in jobs:
            first = await _unless_disconnected(job.queue.get(), request)
            if isinstance(first, JobFailed):
                raise _job_error(first)
            assert first is STARTED
        if req.stream:
            return _SSEResponse(gen.stream(jobs), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await _unless_disconnected(gen.collect(jobs), request))
    except ClientGone:
        for job in jobs:
            engine.cancel(job)
        return Response(status_code=499)
    except BaseException:
        for job in jobs:
            engine.cancel(job)
        raise


# -- the application --------------------------------------------------------------------------------


def _param(loc: tuple) -> str | None:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif not out:
            out = str(p)
        elif p in ("str", "list[str]", "list[int]", "int", "float", "bool") or "[" in str(p) or "-" in str(p):
            continue  # pydantic's name of a union member, not a field
        else:
            out += f".{p}"
    return out or None


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class _JSONBodies:
    """Read every POST body as JSON, whatever its Content-Type says (curl -d sends a form type), as
    llama-server does."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        await self.app(scope, receive, send)


class _APIKey:
    """`Authorization: Bearer KEY` (or `X-Api-Key: KEY`) on every endpoint but /health and the model list, as
    llama-server's --api-key asks."""

    PUBLIC = frozenset({"/health", "/v1/health", "/models", "/v1/models"})

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.PUBLIC:
            headers = dict(scope["headers"])
            given = headers.get(b"x-api-key") or headers.get(b"authorization", b"").removeprefix(b"Bearer ").strip()
            if not hmac.compare_digest(given, self.key):
                err = APIError(401, "Invalid API Key", "authentication_error", code="invalid_api_key")
                await _error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(loader: Callable[[], Loaded], *, alias: str | None = None, queue_size: int | None = None,
               metrics_prefix: str = "pyllamaspec", chat_template: str | None = None,
               enable_thinking: bool | None = None, api_key: str | None = None,
               on_fatal: Callable[[], None] | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               n_predict: int = -1, slots_endpoint: bool = True,
               temperature: float = defaults.TEMPERATURE, ignore_unknown_fields: bool = False) -> FastAPI:
    """The ASGI app. `loader` runs in a thread once the server starts and returns the models and session (and an
    embedder, which serves /v1/embeddings); `on_fatal` is called (from that thread) if it fails. temperature: a
    request's when it sets none. app.state.server is the ServerState."""
    state = ServerState(loader, alias=alias, queue_size=queue_size, metrics_prefix=metrics_prefix,
                        chat_template=chat_template, enable_thinking=enable_thinking, on_fatal=on_fatal,
                        n_predict=n_predict, slots_endpoint=slots_endpoint, temperature=temperature,
                        ignore_unknown_fields=ignore_unknown_fields)

    @asynccontextmanager
    async def lifespan(_app):
        state.loop = asyncio.get_running_loop()
        state.start_loading()
        try:
            yield
        finally:
            await asyncio.to_thread(state.close)

    app = FastAPI(title="pyllamaspec", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = state
    app.add_middleware(_JSONBodies)
    if api_key:
        app.add_middleware(_APIKey, key=api_key)
    app.add_middleware(RequestLimits, max_body_bytes=max_body_bytes)  # outermost: before anything reads the body
    _add_error_handlers(app)
    _add_server_routes(app, state)
    _add_generation_routes(app, state)
    _add_embedding_routes(app, state)
    _add_token_routes(app, state)
    return app


def _validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """A request body that does not validate, as OpenAI's 400 naming the parameter."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return _error_response(APIError(400, "the request body is not valid JSON: "
                                             f"{first.get('ctx', {}).get('error', first['msg'])}"))
    param = _param(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing" and param:
        msg = f"'{param}' is required"
    elif param:
        msg = f"{msg} ({param})"
    elif first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        msg = "the request body must be a JSON object"
    return _error_response(APIError(400, msg, param=param))


def _add_error_handlers(app: FastAPI) -> None:
    """Every failure answers with OpenAI's error object."""

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, exc: RequestValidationError):
        return _validation_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return _error_response(APIError(exc.status_code, str(exc.detail), kind))

    @app.exception_handler(Exception)
    async def _unexpected(_request, exc: Exception):
        log.exception("unexpected error")
        return _error_response(APIError(500, f"internal error: {exc}", "server_error"))


def _add_server_routes(app: FastAPI, state: ServerState) -> None:
    """/health, the model list and /metrics."""

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        engine = state.engine
        unusable = engine.unusable if state.status == "ready" and engine is not None else None
        body, status = health_body(unusable or state.status)
        return JSONResponse(body, status_code=status) if status != 200 else body

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        state.require_ready()
        return models_body(state.model_name, state.created, state.loaded.target.info, state.loaded.session.info)

    @app.get("/props")
    async def props():
        state.require_ready()
        return props_body(state)

    @app.get("/slots")
    async def slots():
        engine = state.require_ready()
        if not state.slots_endpoint:
            raise APIError(501, "This server does not support slots endpoint (start it with --slots).",
                           "not_supported_error")
        return slots_body(state, engine.slot_jobs())

    @app.get("/metrics")
    async def metrics():
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    """Chat and text completions."""

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        state.require_ready()
        _check_other_fields(state, req)
        state.check_model(req.model)
        tokens, tools = await run_interruptible(state, request, state.chat_tokens, req)
        return await _generate(state, request, req, "chat", tokens, tools)

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(req: CompletionRequest, request: Request):
        state.require_ready()
        _check_other_fields(state, req)
        state.check_model(req.model)
        tokens = await run_interruptible(state, request, state.completion_tokens, req)
        return await _generate(state, request, req, "text", tokens)


def _add_embedding_routes(app: FastAPI, state: ServerState) -> None:
    """OpenAI's /v1/embeddings, served when the loader gave an embedder (serve --embeddings)."""

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(req: EmbeddingRequest):
        state.require_ready()
        embedder = state.loaded.embedder
        if embedder is None:
            raise APIError(501, "This server does not support embeddings. Start it with `--embeddings`",
                           "not_supported_error")
        state.check_model(req.model)
        if req.dimensions is not None and req.dimensions != embedder.n_embd:
            raise APIError(400, f"dimensions={req.dimensions}: this model's embeddings have {embedder.n_embd} "
                                f"dimensions, and shortening them is not supported", param="dimensions")
        inputs = req.inputs()
        single = isinstance(req.input, str) or (bool(req.input) and isinstance(req.input[0], int))

        def work():
            seqs = []
            for i, x in enumerate(inputs):
                param = "input" if single else f"input[{i}]"
                tokens = embedder.tokenize(x) if isinstance(x, str) and x else x
                if not tokens:
                    raise APIError(400, f"{param} is empty: there is nothing to embed", param=param)
                if len(tokens) > embedder.n_ctx:
                    raise APIError(400, f"{param} has {len(tokens)} tokens; an input may have at most "
                                        f"{embedder.n_ctx} (the server's -ub)", param=param,
                                   code="context_length_exceeded")
                state.check_tokens(tokens, param)
                seqs.append(tokens)
            return seqs, embedder.embed_tokens(seqs)

        seqs, vectors = await run_in_threadpool(work)
        return embeddings_body(state.model_name, vectors, sum(len(t) for t in seqs), req.encoding_format == "base64")


def _add_token_routes(app: FastAPI, state: ServerState) -> None:
    """llama-server's /tokenize and /detokenize."""

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        state.require_ready()
        target = state.loaded.target

        def work():
            tokens = target.tokenize(req.content, add_special=req.add_special)
            return token_pieces_body(tokens, target.token_bytes) if req.with_pieces else {"tokens": tokens}

        return await run_in_threadpool(work)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        state.require_ready()
        state.check_tokens(req.tokens, "tokens")
        return {"content": await run_in_threadpool(state.loaded.target.detokenize, req.tokens)}
