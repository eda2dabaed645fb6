"""The batching scheduler: one thread owns the model and decodes every request together.

Continuous batching over ``gptlab.generate.BatchSession`` (on CUDA with a static lane beside it,
``gptlab.generate.lanes``: CUDA graphs for the requests whose sampling runs inside them):

    loop:
        admit waiting jobs into free slots   (prefill: add(prompt_ids) -> logits)
        feed = {slot: last token}            for every active job whose client keeps up
        logits = session.step(feed)          one batched decode step, (n_active, vocab)
        per job: event = TokenStep.advance(logits) -> its channel

The scheduler manages slots, batching and channels only: each job's per-token step
(sampling with its own seed, penalties, stops, UTF-8-safe text, finish reason) is
``gptlab.generate.TokenStep``, the same step the library's decoding loop uses. Output goes to a bounded per-request ``Channel`` read by an asyncio
coroutine; a job whose channel is full is skipped by the decode step until its client
catches up, so one slow client never blocks the others. A cancelled job (the client
went away) leaves its slot at the next iteration. The KV cache is sized to the requests, not to
the model's context: it starts at ``KV_START_TOKENS`` positions per row, doubles when a row needs
more (up to the context) and shrinks back when the server is idle. Past the context a row's window slides
(a notice goes to the job's warnings once). Beam search (``beam_width > 1``) does not fit
the one-token-per-step batch and runs ``gptlab.generate.beam.beam_events`` on the job's
prompt ids on a worker thread instead.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_events
from gptlab.generate.lanes import Lanes
from gptlab.generate.step import TokenEvent, TokenStep

log = logging.getLogger("gptlab.serve")

#: Cache positions per row allocated before any request: the cache grows (doubling) to what requests need.
KV_START_TOKENS = 64


# ------------------------------------------------------------------ events
@dataclass
class EndEvent:
    """A choice is finished: ``finish_reason`` is ``"stop"``, ``"length"`` or ``"error"``.

    Text and tokens travel as ``gptlab.generate.TokenEvent`` (``index``: the choice).
    """

    index: int
    finish_reason: str
    completion_tokens: int
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    status: int = 500  # the HTTP status an error maps to: 400 for bad input, 500 for a bug


class Channel:
    """A bounded queue from the scheduler thread to one request's asyncio coroutine.

    ``put`` never blocks (the scheduler checks ``full`` before producing more); ``get``
    waits on the event loop for the next batch of events.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 64) -> None:
        self._loop = loop
        self._items: deque[TokenEvent | EndEvent] = deque()
        self._ready = asyncio.Event()
        self.limit = limit

    def full(self) -> bool:
        return len(self._items) >= self.limit

    def put(self, item: TokenEvent | EndEvent) -> None:
        self._items.append(item)  # deque.append is atomic
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> list[TokenEvent | EndEvent]:
        """Every event available now (waits for at least one)."""
        while not self._items:
            self._ready.clear()
            if self._items:
                break
            await self._ready.wait()
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out


class Job:
    """One choice of one request: a prompt, a ``SampleConfig`` and the channel its events go to."""

    _ids = itertools.count()

    def __init__(
        self,
        prompt_ids: list[int],
        config: Any,
        channel: Channel,
        index: int = 0,
        top_n: int | None = None,
    ) -> None:
        self.id = next(Job._ids)
        self.prompt_ids = list(prompt_ids)
        self.config = config
        self.channel = channel
        self.index = index
        self.top_n = top_n  # None: no probabilities; N: the chosen token's and the N most likely
        self.cancelled = threading.Event()
        self.ended = False
        # decoding state, owned by the scheduler thread
        self.slot: int | None = None
        self.step: TokenStep | None = None
        self.pending: int | None = None
        self.warnings: list[str] = []

    @property
    def generated(self) -> int:
        return self.step.sampled if self.step is not None else 0

    def cancel(self) -> None:
        self.cancelled.set()


# --------------------------------------------------------------- scheduler
class Scheduler:
    """Owns the model: admits jobs up to ``max_batch`` and runs one batched decode step per iteration."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 8, max_len: int | None = None) -> None:
        if max_batch < 1:
            raise GptlabError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_len = max_len or model.config.block_size
        from gptlab.generate import seq2seq

        self.seq2seq = seq2seq.is_seq2seq(model)  # each source has its own encoding: one job at a time
        # a BatchSession, plus on CUDA a static lane (CUDA graphs) for the requests it can sample
        # the cache starts at KV_START_TOKENS positions per row and doubles as requests need, up to max_len
        from gptlab.generate.step import vocab_size

        vocab = vocab_size(model, tokenizer)
        self._new_session = lambda: Lanes(
            model, max_batch, max_len=self.max_len, capacity=KV_START_TOKENS, vocab=vocab
        )
        self.session = self._new_session()
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._active: dict[int, Job] = {}  # slot -> job
        self._beam_jobs: set[Job] = set()
        self._starting: list[Job] = []  # taken from the queue, not yet in a slot
        self._closed = False
        self._beam_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gptlab-beam")
        self.steps = 0
        self.tokens = 0
        self._thread = threading.Thread(target=self._run, name="gptlab-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ public
    def submit(self, job: Job) -> None:
        """Queue a job; its events arrive on ``job.channel``."""
        with self._cond:
            if self._closed:
                raise GptlabError("the server is shutting down")
            self._waiting.append(job)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the scheduler thread between decode steps (one owner of the model)."""
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def stats(self) -> dict[str, int]:
        return {
            "active": len(self._active) + len(self._beam_jobs),
            "waiting": len(self._waiting),
            "max_batch": self.max_batch,
            "steps": self.steps,
            "tokens": self.tokens,
        }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
        self._beam_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._closed and not self._calls and not self._waiting and not self._active:
                        self._cond.wait()
                    if self._closed:
                        break
                    calls = list(self._calls)
                    self._calls.clear()
                try:
                    self._iteration(calls)
                except Exception as exc:  # never let the thread die: fail what was running, start afresh
                    log.exception("scheduler iteration failed")
                    self._fail_all(f"internal error during generation: {exc}")
        for job in list(self._active.values()) + list(self._waiting):
            self._end(job, "error", error="the server is shutting down")

    def _iteration(self, calls: list[tuple[Callable[[], Any], Future]]) -> None:
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)
        for job in list(self._active.values()):
            if job.cancelled.is_set():
                self._release(job)
        self._admit()
        feed = {
            slot: job.pending
            for slot, job in self._active.items()
            if job.pending is not None and not job.channel.full()
        }
        if not feed:
            if self._active:  # every active client is behind: let them catch up
                time.sleep(0.005)
            return
        out = self.session.step(feed)
        self.steps += 1
        for slot, logits in out.items():
            job = self._active.get(slot)
            if job is not None:
                self._advance(job, logits)

    def _admit(self) -> None:
        """Move waiting jobs into free slots; jobs admitted together share one prefill pass."""
        batch: list[Job] = []
        with self._cond:
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled.is_set():
                    self._waiting.popleft()
                elif job.config.beam_width > 1 or self.seq2seq:
                    self._waiting.popleft()
                    self._beam_jobs.add(job)
                    self._beam_pool.submit(self._run_beam, job)
                elif len(batch) < self.session.free_slots:
                    batch.append(self._waiting.popleft())
                else:
                    break
        if batch:
            self._starting = batch
            self._start(batch)
            self._starting = []

    def _start(self, jobs: list[Job]) -> None:
        ready = []
        for job in jobs:
            try:
                job.step = TokenStep(
                    job.config, self.tokenizer, self.model, job.prompt_ids, index=job.index, top_n=job.top_n
                )
            except GptlabError as exc:
                self._end(job, "error", error=str(exc), status=400)
                continue
            ready.append(job)
        if not ready:
            return
        try:
            added = self.session.add_many([job.prompt_ids for job in ready], [job.step for job in ready])
        except GptlabError:  # one bad prompt: prefill them one by one to find it
            added = []
            for job in ready:
                try:
                    added.append(self.session.add(job.prompt_ids, job.step))
                except GptlabError as exc:
                    self._end(job, "error", error=str(exc), status=400)
                    added.append(None)
        for job, result in zip(ready, added, strict=True):
            if result is None:
                continue
            slot, logits = result
            job.slot = slot
            self._active[slot] = job
            self._advance(job, logits)

    def _advance(self, job: Job, logits: torch.Tensor) -> None:
        """The job's per-token step on ``logits``: its event to the channel, then feed or finish."""
        full = self.session.window_notice() if self.session.full(job.slot) else None
        event = job.step.advance(logits, full)
        self.tokens += 1
        if event is not None:
            if event.notice:
                job.warnings.append(event.notice)
            job.channel.put(event)
        elif job.top_n is not None and job.step.stop_event is not None:
            job.channel.put(job.step.stop_event)  # reported in logprobs, never shown as text
        if job.step.reason is None:
            job.pending = job.step.token
            return
        tail = job.step.close()
        if tail.text:
            job.channel.put(TokenEvent(tail.text, index=job.index))
        self._end(job, tail.finish_reason)

    def _end(self, job: Job, reason: str, error: str | None = None, status: int = 500) -> None:
        self._release(job)
        if not job.ended:
            job.ended = True
            job.channel.put(EndEvent(job.index, reason, job.generated, job.warnings, error, status))

    def _release(self, job: Job) -> None:
        if job.slot is not None and self._active.get(job.slot) is job:
            del self._active[job.slot]
            self.session.remove(job.slot)
        job.slot = None
        job.pending = None

    def _fail_all(self, message: str) -> None:
        jobs = list(self._active.values()) + [j for j in self._starting if j.slot is None]
        self._active.clear()
        self._starting = []
        for job in jobs:
            job.slot = None
            self._end(job, "error", error=message)
        self.session = self._new_session()

    # ------------------------------------------------------------ beam search
    def _run_beam(self, job: Job) -> None:
        """Beam search (or an encoder–decoder's job: its prompt is the source) on a worker thread."""
        from gptlab.generate import seq2seq

        run = seq2seq.stream_ids if self.seq2seq else beam_events
        reason = "length"
        try:
            with torch.inference_mode():
                events = run(self.model, self.tokenizer, job.prompt_ids, job.config)
                n = 0
                try:
                    for event in events:
                        if job.cancelled.is_set():
                            break
                        while job.channel.full() and not job.cancelled.is_set():
                            time.sleep(0.005)
                        n += event.token_id is not None
                        reason = event.finish_reason or reason
                        if event.text:
                            event.index = job.index
                            job.channel.put(event)
                finally:
                    events.close()
            self._end_beam(job, reason, completion_tokens=n)
        except Exception as exc:  # noqa: BLE001 - reported to the client as an error event
            if isinstance(exc, GptlabError):
                self._end_beam(job, "error", str(exc), 400)
            else:
                log.exception("beam search failed")
                self._end_beam(job, "error", f"internal error during beam search: {exc}")

    def _end_beam(
        self, job: Job, reason: str, error: str | None = None, status: int = 500, completion_tokens: int = 0
    ) -> None:
        self._beam_jobs.discard(job)
        if not job.ended:
            job.ended = True
            job.channel.put(EndEvent(job.index, reason, completion_tokens, job.warnings, error, status))
