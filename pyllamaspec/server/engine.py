"""One thread owns the session and steps its running batch; requests join and leave through it.

HTTP handlers (on the asyncio loop) only touch Python state here: submit() queues a Job, cancel() flags one.
The engine thread admits queued jobs into free slots (SpecSession.submit), steps the batch
(SpecSession.step_sequences, the GIL released inside), turns each step's tokens into UTF-8-safe text cut at
stop strings, and hands the results to each job's asyncio queue with loop.call_soon_threadsafe. With
nothing to run it sleeps on a condition variable.

The engine speaks of conditions, not of HTTP: a job it cannot take raises EngineBusy or EngineDraining, and a
job that ends without a result receives a JobFailed naming what went wrong; the HTTP layer (app.py) maps each to
its status code and body.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..config import SequenceParams
from ..errors import ConfigError, ContextOverflowError, PyllamaspecError, RemoteDeviceError, SessionBusyError

log = logging.getLogger("pyllamaspec.server")

# the session's finish reasons as OpenAI names them ('stopped' is a cancel: the engine names that itself)
FINISH_REASONS = {"eog": "stop", "length": "length", "context": "length"}


class EngineBusy(PyllamaspecError):
    """Every slot is busy and the queue is full: the job is refused (try again later)."""

    def __init__(self, n_parallel: int, queue_size: int) -> None:
        super().__init__(f"all {n_parallel} slots are busy and {queue_size} requests are waiting; retry later")


class EngineDraining(PyllamaspecError):
    """The engine is shutting down: it admits nothing more, and what it ran ends."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


@dataclass(frozen=True)
class JobFailed:
    """A job ended without a result. kind: 'invalid' (a setting or the prompt, named by param), 'context' (the
    prompt does not fit), 'shutdown', 'no_slot', 'unavailable' (a remote device of the model went away: the model is
    unusable), or 'internal'."""

    kind: str
    message: str
    param: str | None = None


class Started:
    """The job holds a slot: its prompt is being processed."""


STARTED = Started()


@dataclass(frozen=True)
class Delta:
    text: str
    tokens: list[int]
    logprobs: list | None = None   # TokenLogprob per token, when the request asked for them
    timings: dict | None = None    # the timings so far, when the request asked for them per token


@dataclass(frozen=True)
class Final:
    finish_reason: str            # stop, length
    text: str                     # the last piece of text (may be empty)
    tokens: list[int]
    usage: dict
    timings: dict
    logprobs: list | None = None


class StopMatcher:
    """Cuts text at the first stop string, also when one spans several pieces: text that could still grow
    into a stop string is held back until it cannot."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that is safe to send now, whether a stop string was found)."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        keep = 0
        for k in range(min(len(self.pending), self.longest - 1), 0, -1):
            tail = self.pending[-k:]
            if any(s.startswith(tail) for s in self.stops):
                keep = k
                break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


_ids = itertools.count(1)


class Job:
    """One request's generation, from its arrival to its end. The engine thread alone changes it once it is
    admitted; the asyncio side reads what arrives on `queue`."""

    def __init__(self, tokens: list[int], params: SequenceParams, loop: asyncio.AbstractEventLoop,
                 prompt_param: str = "prompt", stop: tuple[str, ...] = (), field_name=None,
                 special_tokens: frozenset[int] = frozenset(), timings_per_token: bool = False) -> None:
        self.id = next(_ids)
        self.tokens = tokens
        self.special_tokens = special_tokens  # sent as their text (a tool call's markup), not dropped
        self.params = params
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_param = prompt_param
        self.slot: int | None = None
        self.done = False
        self.cancel_requested = False
        self.shutdown = False
        self.t_arrival = time.perf_counter()
        self.t_admitted: float | None = None
        self.t_first: float | None = None
        self.n_generated = 0
        self.n_processed = 0        # prompt tokens processed (the rest came from a slot's memory of an earlier one)
        self.n_drafted = 0
        self.n_accepted = 0
        self.timings_per_token = timings_per_token  # llama-server's: the timings so far with every piece
        self.prompt_counted = False
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = StopMatcher(stop)
        # the request's name of a sequence setting the session refuses (a grammar: the field that gave it)
        self.field_name = field_name or (lambda param: {"temp": "temperature"}.get(param, param))

    def push(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass
class _Step:
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list | None = None


class Engine:
    def __init__(self, session, target, *, queue_size: int, metrics=None) -> None:
        if queue_size < 0:
            raise ConfigError(f"queue_size={queue_size} must be >= 0")
        self.session = session
        self.target = target
        self.n_parallel = session.info.n_parallel
        self.queue_size = queue_size
        self.metrics = metrics
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: dict[int, Job] = {}     # slot -> job; a slot is held until the session reports its end
        self._cancels: list[Job] = []
        self._draining = False
        self.unusable: str | None = None       # why the model cannot run any more (a remote device went away)
        self._pieces: dict[int, bytes] = {}
        self._step_s = 0.0           # how long the last step took
        self._thread = threading.Thread(target=self._run, name="pyllamaspec-engine", daemon=True)

    # -- any thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def slot_jobs(self) -> dict[int, "Job"]:
        """The running jobs by slot (a snapshot)."""
        with self._cv:
            return dict(self._running)

    @property
    def draining(self) -> bool:
        return self._draining

    def submit(self, *jobs: Job) -> None:
        """Queue jobs (a request's choices) together, or refuse them all: EngineDraining while shutting down,
        EngineBusy when the queue cannot take them all."""
        with self._cv:
            if self._draining:
                reason, err = "draining", EngineDraining()
            elif len(self._waiting) + len(self._running) + len(jobs) > self.n_parallel + self.queue_size:
                reason, err = "queue_full", EngineBusy(self.n_parallel, self.queue_size)
            else:
                self._waiting.extend(jobs)
                self._cv.notify()
                return
        if self.metrics is not None:
            self.metrics.rejected.labels(reason=reason).inc()
        raise err

    def cancel(self, job: Job) -> None:
        """The client has gone: end the job at the next step (a no-op for a finished job)."""
        with self._cv:
            if job.done or job.cancel_requested:
                return
            job.cancel_requested = True
            if job in self._waiting:
                self._waiting.remove(job)
                job.done = True
            else:
                self._cancels.append(job)
                self._cv.notify()
                return
        self._count_finished("cancelled")

    def begin_shutdown(self) -> None:
        """Stop admitting; end what waits and what runs (JobFailed 'shutdown'). The thread exits once the slots
        are free."""
        with self._cv:
            if self._draining:
                return
            self._draining = True
            waiting = list(self._waiting)
            self._waiting.clear()
            for job in self._running.values():
                job.shutdown = True
                self._cancels.append(job)
            self._cv.notify_all()
        for job in waiting:
            self._fail(job, _shutdown_error(), "shutdown")

    def close(self, timeout: float = 60.0) -> None:
        """Drain, join the thread, close the session."""
        self.begin_shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the engine thread did not stop within %.0f s; closing the session anyway", timeout)
        self.session.close()

    # -- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self._running or self._cancels or self._draining):
                    self._cv.wait()
                if self._draining and not self._running and not self._waiting and not self._cancels:
                    return
                cancels, self._cancels = self._cancels, []
                admit = []
                while self._waiting and len(self._running) + len(admit) < self.n_parallel:
                    admit.append(self._waiting.popleft())
            try:
                for job in cancels:
                    self._cancel_running(job)
                for job in admit:
                    self._admit(job)
                if self._running:
                    self._step()
            except Exception as e:  # a bug here must not leave clients waiting forever
                log.exception("engine step failed")
                self._abort_all(JobFailed("internal", f"internal error: {e}"), slots_freed=False)

    def _admit(self, job: Job) -> None:
        if job.cancel_requested:
            job.done = True
            self._count_finished("cancelled")
            return
        if self._draining:
            self._fail(job, _shutdown_error(), "shutdown")
            return
        if self.unusable is not None:
            self._fail(job, JobFailed("unavailable", self.unusable), "error")
            return
        try:
            slot = self.session.submit_params(job.tokens, job.params)
        except RemoteDeviceError as e:
            self._unusable(e)
            self._fail(job, JobFailed("unavailable", self.unusable), "error")
            return
        except ContextOverflowError as e:
            self._fail(job, JobFailed("context", str(e), job.prompt_param), "error")
            return
        except SessionBusyError:
            if self._running:    # a slot not yet reported free: try again after the next step
                with self._cv:
                    self._waiting.appendleft(job)
                return
            self._fail(job, JobFailed("no_slot", "no free slot"), "error")
            return
        except ConfigError as e:
            param = getattr(e, "param", None)  # ParamError: the request field at fault, as the API names it
            self._fail(job, JobFailed("invalid", str(e), (job.field_name(param) if param else None) or job.prompt_param),
                       "error")
            return
        job.slot = slot
        job.t_admitted = time.perf_counter()
        with self._cv:
            self._running[slot] = job
        job.push(STARTED)

    def _cancel_running(self, job: Job) -> None:
        if self._running.get(job.slot) is not job:
            return  # already ended (its slot may hold another job now)
        self.session.cancel(job.slot)
        if job.shutdown and not job.done:
            self._fail(job, _shutdown_error(), "shutdown")

    def _step(self) -> None:
        busy = len(self._running)
        t0 = time.perf_counter()
        try:
            events, _left = self.session.step_sequences()
            self._step_s = time.perf_counter() - t0
        except RemoteDeviceError as e:
            # the model cannot run any more: every job ends with 503, and so does every request after
            self._unusable(e)
            self._abort_all(JobFailed("unavailable", self.unusable), slots_freed=True)
            return
        except PyllamaspecError as e:
            # a failed step ends every sequence and frees every slot
            log.error("generation failed: %s", e)
            self._abort_all(JobFailed("internal", f"generation failed: {e}"), slots_freed=True)
            return
        if self.metrics is not None:
            self.metrics.step(busy)
        for e in events:
            job = self._running.get(e.slot)
            if job is None:
                continue
            self._on_event(job, e)
            if e.finish_reason is not None:
                with self._cv:
                    del self._running[e.slot]

    def _piece(self, token: int, special: bool = False) -> bytes:
        if special:
            return self.target.token_bytes(token, special=True)
        b = self._pieces.get(token)
        if b is None:
            b = self._pieces[token] = self.target.token_bytes(token)
        return b

    def _on_event(self, job: Job, e) -> None:
        m = self.metrics
        now = time.perf_counter()
        if job.done:
            return  # ended by a stop string or shutdown: its slot frees when this event says so
        job.n_processed += e.n_prompt
        if e.n_drafted:
            job.n_drafted += e.n_drafted
            job.n_accepted += e.n_accepted
            if m is not None:
                m.draft(e.n_drafted, e.n_accepted)
        if e.tokens and job.t_first is None:
            job.t_first = now
            job.n_processed += 1  # the prompt's last token, processed with the step that gave the first token
            self._count_prompt(job, now)
            if m is not None:
                m.ttft.observe(now - job.t_arrival)
        step = _Step(logprobs=[] if e.logprobs is not None else None)
        finish = None
        for i, t in enumerate(e.tokens):
            job.n_generated += 1
            step.tokens.append(t)
            if step.logprobs is not None and i < len(e.logprobs):
                step.logprobs.append(e.logprobs[i])
            text, hit = job.stops.feed(job.decoder.decode(self._piece(t, t in job.special_tokens)))
            step.text.append(text)
            if hit:
                finish = "stop"
                break
        if m is not None and step.tokens:
            m.tokens_predicted.inc(len(step.tokens))
        if finish is None and e.finish_reason is not None:
            if e.finish_reason == "stopped":
                job.done = True     # cancelled by its client
                self._count_finished("cancelled")
                return
            if e.finish_reason == "error" or e.finish_reason not in FINISH_REASONS:
                self._fail(job, JobFailed("internal", "generation failed"), "error")
                return
            text, hit = job.stops.feed(job.decoder.decode(b"", final=True))
            step.text.append(text)
            if not hit:
                step.text.append(job.stops.flush())
            finish = "stop" if hit else FINISH_REASONS[e.finish_reason]
        if finish is not None:
            if e.finish_reason is None:
                self.session.cancel(job.slot)   # a stop string ended it: free the slot at the next step
            self._complete(job, finish, "".join(step.text), step.tokens, now, step.logprobs)
        elif step.tokens:
            job.push(Delta("".join(step.text), step.tokens, step.logprobs,
                           self._timings(job, now) if job.timings_per_token else None))

    def _count_prompt(self, job: Job, now: float) -> None:
        if job.prompt_counted:
            return
        job.prompt_counted = True
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(job.tokens))
            self.metrics.prompt_seconds.inc(now - (job.t_admitted or now))

    def _timings(self, job: Job, now: float) -> dict:
        """llama-server's timings of the job up to now."""
        t_first = job.t_first if job.t_first is not None else now
        prompt_ms = (t_first - (job.t_admitted or t_first)) * 1000.0
        predicted_ms = (now - t_first) * 1000.0
        if predicted_ms <= 0.0 and job.n_generated:
            # the whole reply came in one verify step (with the prompt's last chunk): that step's time
            predicted_ms = self._step_s * 1000.0
        n_prompt = len(job.tokens)
        # as llama-server: prompt_n counts what was processed, cache_n what a slot's memory already held
        n_done = min(job.n_processed, n_prompt)
        timings = {
            "cache_n": n_prompt - n_done,
            "prompt_n": n_done,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / n_done if n_done else 0.0,
            "prompt_per_second": n_done / prompt_ms * 1000.0 if prompt_ms > 0 else 0.0,
            "predicted_n": job.n_generated,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / job.n_generated if job.n_generated else 0.0,
            "predicted_per_second": job.n_generated / predicted_ms * 1000.0 if predicted_ms > 0 else 0.0,
            "draft_n": job.n_drafted,
            "draft_n_accepted": job.n_accepted,
        }
        return timings

    def _complete(self, job: Job, finish: str, text: str, tokens: list[int], now: float, logprobs=None) -> None:
        self._count_prompt(job, now)
        timings = self._timings(job, now)
        predicted_ms = timings["predicted_ms"]
        n_prompt, n_done = len(job.tokens), timings["prompt_n"]
        usage = {"prompt_tokens": n_prompt, "completion_tokens": job.n_generated,
                 "total_tokens": n_prompt + job.n_generated,
                 "prompt_tokens_details": {"cached_tokens": n_prompt - n_done}}
        job.done = True
        if self.metrics is not None:
            self.metrics.tokens_predicted_seconds.inc(predicted_ms / 1000.0)
        self._count_finished(finish)
        job.push(Final(finish, text, tokens, usage, timings, logprobs))

    def _fail(self, job: Job, err: JobFailed, reason: str) -> None:
        job.done = True
        self._count_finished(reason)
        job.push(err)

    def _count_finished(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.finished.labels(finish_reason=reason).inc()

    def _unusable(self, e: RemoteDeviceError) -> None:
        log.error("the model is unusable: %s", e)
        self.unusable = f"the model is unusable: {e}"

    def _abort_all(self, err: JobFailed, slots_freed: bool) -> None:
        """Fail every running job. When the session still holds their sequences, cancel them: the slots free
        at the next steps, as the session reports each end."""
        with self._cv:
            jobs = list(self._running.values())
            if slots_freed:
                self._running.clear()
        for job in jobs:
            if not job.done:
                self._fail(job, err, "error")
            if not slots_freed:
                try:
                    self.session.cancel(job.slot)
                except PyllamaspecError:
                    pass


def _shutdown_error() -> JobFailed:
    return JobFailed("shutdown", "the server is shutting down")
