"""The batching scheduler: one thread owns the model and decodes every request together.

Continuous batching over ``gptlab.generate.BatchSession``:

    loop:
        admit waiting jobs into free slots   (prefill: add(prompt_ids) -> logits)
        feed = {slot: last token}            for every active job whose client keeps up
        logits = session.step(feed)          one batched decode step, (n_active, vocab)
        per job: token = Sampler(logits), text = TextStream.push(token) -> its channel

Each job samples with its own ``Sampler`` (its own seed and penalties), so requests never
share randomness. Output goes to a bounded per-request ``Channel`` read by an asyncio
coroutine; a job whose channel is full is skipped by the decode step until its client
catches up, so one slow client never blocks the others. A cancelled job (the client
went away) leaves its slot at the next iteration. Beam search (``beam_width > 1``) does
not fit the one-token-per-step batch and runs through ``gptlab.generate.stream_events`` on a
worker thread instead.
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

log = logging.getLogger("gptlab.serve")


# ------------------------------------------------------------------ events
@dataclass
class TokenEvent:
    """Text released by one generated token (``text`` may be ``""`` while UTF-8 or a stop string is pending)."""

    index: int  # which choice of the request
    text: str
    token_id: int | None = None
    prob: float | None = None  # the model's probability of the token (softmax of the raw logits)
    top: list[tuple[str, float]] | None = None  # the most likely alternatives, best first


@dataclass
class EndEvent:
    """A choice is finished: ``finish_reason`` is ``"stop"``, ``"length"`` or ``"error"``."""

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
        top_n: int = 0,
        prompt_text: str | None = None,
    ) -> None:
        self.id = next(Job._ids)
        self.prompt_ids = list(prompt_ids)
        self.prompt_text = prompt_text
        self.config = config
        self.channel = channel
        self.index = index
        self.top_n = top_n
        self.cancelled = threading.Event()
        self.ended = False
        # decoding state, owned by the scheduler thread
        self.slot: int | None = None
        self.sampler: Any = None
        self.stream: Any = None
        self.history: list[int] = []
        self.generated = 0
        self.pending: int | None = None
        self.warnings: list[str] = []

    def cancel(self) -> None:
        self.cancelled.set()


# --------------------------------------------------------------- scheduler
class Scheduler:
    """Owns the model: admits jobs up to ``max_batch`` and runs one batched decode step per iteration."""

    def __init__(self, model: Any, tokenizer: Any, max_batch: int = 8, max_len: int | None = None) -> None:
        from gptlab.generate import BatchSession

        if max_batch < 1:
            raise GptlabError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_len = max_len or model.config.block_size
        self.vocab_size = min(tokenizer.vocab_size, model.config.vocab_size)
        from gptlab.generate import seq2seq

        self.seq2seq = seq2seq.is_seq2seq(model)  # each source has its own encoding: one job at a time
        self._new_session = lambda: BatchSession(model, max_batch, max_len=self.max_len)
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
                self._next_token(job, logits)

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
        from gptlab.generate import Sampler, TextStream

        ready = []
        for job in jobs:
            try:
                job.sampler = Sampler(job.config, self.vocab_size)
                job.stream = TextStream(self.tokenizer, list(job.config.stop))
            except GptlabError as exc:
                self._end(job, "error", error=str(exc), status=400)
                continue
            job.history = list(job.prompt_ids)
            ready.append(job)
        if not ready:
            return
        try:
            added = self.session.add_many([job.prompt_ids for job in ready])
        except GptlabError:  # one bad prompt: prefill them one by one to find it
            added = []
            for job in ready:
                try:
                    added.append(self.session.add(job.prompt_ids))
                except GptlabError as exc:
                    self._end(job, "error", error=str(exc), status=400)
                    added.append(None)
        for job, result in zip(ready, added):
            if result is None:
                continue
            slot, logits = result
            job.slot = slot
            self._active[slot] = job
            self._next_token(job, logits)

    def _next_token(self, job: Job, logits: torch.Tensor) -> None:
        """Sample the job's next token from ``logits``, emit its text, and finish the job if it is done."""
        processed = job.sampler.process(logits.reshape(-1)[: self.vocab_size], job.history)
        token = job.sampler.choose(processed)
        prob, top = None, None
        if job.top_n:  # the distribution the token was drawn from (after temperature, top-k, ...)
            probs = torch.softmax(processed, dim=-1)
            prob = float(probs[token])
            values, ids = probs.topk(min(job.top_n, probs.numel()))
            top = [(token_text(self.tokenizer, int(i)), float(v)) for v, i in zip(values, ids)]
        self.tokens += 1
        if token in job.config.stop_tokens:
            job.generated += 1
            self._finish(job, "stop")
            return
        job.history.append(token)
        job.generated += 1
        text = job.stream.push(token)
        job.channel.put(TokenEvent(job.index, text, token, prob, top))
        if job.stream.stopped:
            self._finish(job, "stop")
        elif job.generated >= job.config.max_new_tokens:
            self._finish(job, "length")
        elif self.session.full(job.slot):
            job.warnings.append(
                f"generation reached the end of the context (block_size={self.max_len}) "
                f"after {job.generated} tokens"
            )
            self._finish(job, "length")
        else:
            job.pending = token

    def _finish(self, job: Job, reason: str) -> None:
        tail = job.stream.finish()
        if tail:
            job.channel.put(TokenEvent(job.index, tail))
        self._end(job, reason)

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
        """Beam search (or an encoder–decoder's job) through the non-batched ``stream_events`` on a worker thread."""
        from gptlab.generate import seq2seq, stream_events

        if self.seq2seq:
            stream_events = seq2seq.stream_events  # noqa: F811 - the source is encoded once, then decoded

        reason = "length"
        try:
            prompt = job.prompt_text if job.prompt_text is not None else self.tokenizer.decode(job.prompt_ids)
            with torch.inference_mode():
                events = stream_events(self.model, self.tokenizer, prompt, job.config, want_probs=False)
                try:
                    for event in events:
                        if job.cancelled.is_set():
                            break
                        while job.channel.full() and not job.cancelled.is_set():
                            time.sleep(0.005)
                        if event.token_id is not None:
                            job.generated += 1
                        if event.finish_reason is not None:
                            reason = event.finish_reason
                        if event.text:
                            job.channel.put(TokenEvent(job.index, event.text, event.token_id))
                finally:
                    events.close()
            if reason == "context":
                job.warnings.append(f"generation reached the end of the context (block_size={self.max_len})")
                reason = "length"
            self._end_beam(job, reason)
        except Exception as exc:  # noqa: BLE001 - reported to the client as an error event
            if isinstance(exc, GptlabError):
                self._end_beam(job, "error", str(exc), 400)
            else:
                log.exception("beam search failed")
                self._end_beam(job, "error", f"internal error during beam search: {exc}")

    def _end_beam(self, job: Job, reason: str, error: str | None = None, status: int = 500) -> None:
        self._beam_jobs.discard(job)
        if not job.ended:
            job.ended = True
            job.channel.put(EndEvent(job.index, reason, job.generated, job.warnings, error, status))


def token_text(tokenizer: Any, token_id: int) -> str:
    """A token's text for display (bytes that are not whole UTF-8 characters show as U+FFFD)."""
    try:
        return tokenizer.decode_bytes([token_id]).decode("utf-8", errors="replace")
    except (GptlabError, AttributeError):
        return tokenizer.decode([token_id])
