"""The batching scheduler: one thread owns the model and decodes every request together.

Continuous batching over ``gptlab.generate.BatchSession`` (on CUDA with a static lane beside it,
``gptlab.serve.lanes``: CUDA graphs for the requests whose sampling runs inside them):

    loop:
        admit waiting jobs into free slots   (prefill: add_many(prompts) -> a Row each)
        step_rows(rows)                      one batched decode step for every active job whose
                                             client keeps up: each row's chosen token in, its logits out
        per job: advance_row(row) -> event   its RequestState draws the next token -> its channel

``Row``, ``advance_row`` and ``step_rows`` are the library's driver (``gptlab.generate.driver``, whose
``decode_rows`` is the same loop without threads): the scheduler adds only what is the server's.

Admission is fair (``admission.py``): free slots go round-robin between requests, and one
request holds at most all but ``max(1, max_batch // 8)`` of them (one request alone: all), so a small request
starts at the next step beside a large one. Anything a job's own step raises (a bad option that
slipped past validation, a bug in sampling) ends that job alone with an error event; only a
failure of the shared batched forward pass fails the jobs in the batch.

The scheduler manages slots, batching and channels only: each job's per-token step
(sampling with its own seed, penalties, stops, UTF-8-safe text, finish reason) is
``gptlab.generate.RequestState``, the same step the library's decoding loop uses. Output goes to a
bounded per-request ``Channel`` (``jobs.py``) read by an asyncio coroutine; a job whose channel is full is skipped by the decode step until its client
catches up, so one slow client never blocks the others. A cancelled job (the client
went away) leaves its slot at the next iteration. The KV cache is sized to the requests, not to
the model's context: it starts at ``KV_START_TOKENS`` positions per row, doubles when a row needs
more (up to the context) and shrinks back once the server has been idle for ``kv_keep_s`` seconds
(``--kv-keep-s``, default ``KV_KEEP_S``): a request that comes within that grace period finds the
cache already grown, as llama.cpp's slots keep theirs, instead of paying to allocate and fill it
again (for SmolLM2 at 8 rows and 1,024 positions, 360 MB: most of the time to the first token of a
request whose prefix is cached). Past the context a row's window slides
(a notice goes to the job's warnings once). Beam search (``beam_width > 1``, and every job of an
encoder–decoder model) does not fit the one-token-per-step batch: each such job is an iterator
(``gptlab.generate.beam.beam_steps``, then its text) advanced by one step per iteration of the
same loop, with its own fair queue of ``beam_slots`` places, so it is cancelled within one step
and never runs beside the loop on another thread.

A prefix cache (``prefix_cache_bytes`` > 0; ``gptlab.generate.prefix_cache``) lives as long as the
scheduler: every prompt the dynamic lane prefills first copies the keys and values of its longest
cached prefix and runs only the rest, and leaves its own blocks once its first token is out (storing them
is not part of the time to it); a finished (or cancelled) job's
row leaves its prompt and generated text, so a chat's next turn finds its history. ``stats()``
carries its counters (``/health``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_steps, beam_stream
from gptlab.generate.driver import Row, advance_row, route, step_rows
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.request import RequestState, TokenEvent
from gptlab.hardware import hand_threads_over
from gptlab.serve.admission import FairQueue, per_request_cap
from gptlab.serve.jobs import Channel, EndEvent, Job
from gptlab.serve.lanes import Lanes

if TYPE_CHECKING:
    from gptlab.generate import SampleConfig
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

__all__ = ["KV_KEEP_S", "KV_START_TOKENS", "PREFIX_CACHE_MB", "Channel", "EndEvent", "Job", "Scheduler"]

log = logging.getLogger("gptlab.serve")
T = TypeVar("T")  # what a call on the scheduler thread returns

#: Cache positions per row allocated before any request: the cache grows (doubling) to what requests need.
KV_START_TOKENS = 64
#: Seconds an idle server keeps the KV cache its requests grew before giving the memory back
#: (``--kv-keep-s``): long enough for a chat's next turn or a client's next call, short enough that a
#: burst of long requests does not hold its memory for good; 0 gives it back as soon as the server is idle.
KV_KEEP_S = 60.0
#: The prefix cache's default budget (MiB, ``--prefix-cache-mb``): about the weights of a 100M-parameter
#: model, ~5,800 tokens of SmolLM2-135M's keys and values in the float32 CPU cache (9 prompts of 600
#: tokens), small beside a machine that runs such a model; 0 turns it off.
PREFIX_CACHE_MB = 256


# --------------------------------------------------------------- scheduler
class Scheduler:
    """Owns the model: admits jobs fairly up to ``max_batch`` and runs one batched decode step per iteration.

    ``beam_slots`` (default ``max(2, max_batch // 4)``) beam-search jobs advance one step each per
    iteration beside the batch.
    """

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        max_batch: int = 8,
        max_len: int | None = None,
        beam_slots: int | None = None,
        prefix_cache_bytes: int = 0,
        kv_keep_s: float = KV_KEEP_S,
    ) -> None:
        if max_batch < 1:
            raise GptlabError(f"max_batch must be at least 1, got {max_batch}")
        if not kv_keep_s >= 0:  # (NaN too)
            raise GptlabError(f"kv_keep_s must be 0 or more seconds, got {kv_keep_s}")
        #: seconds the idle server keeps a grown KV cache before shrinking it back
        self.kv_keep_s = float(kv_keep_s)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_len = max_len or model.config.block_size
        self.beam_slots = beam_slots or max(2, max_batch // 4)
        # a BatchSession, plus on CUDA a static lane (CUDA graphs) for the requests it can sample
        # the cache starts at KV_START_TOKENS positions per row and doubles as requests need, up to max_len
        from gptlab.generate.request import vocab_size

        vocab = vocab_size(model, tokenizer)
        #: kept across sessions (a session rebuilt after a failure finds the same prefixes)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._new_session = lambda: Lanes(
            model,
            max_batch,
            max_len=self.max_len,
            capacity=KV_START_TOKENS,
            vocab=vocab,
            prefix_cache=self.prefix_cache,
            shrink_when_idle=False,  # the loop shrinks it after kv_keep_s idle seconds
            remember_at_add=False,  # _start stores the prompts' blocks once their first tokens are out
        )
        self.session = self._new_session()
        # from here the scheduler's thread does the parallel work: the thread that built the model and
        # this session (the server's main thread) lets its idle OpenMP workers go, which would
        # otherwise slow every decode step of the scheduler's (gptlab.hardware.hand_threads_over)
        hand_threads_over()
        self._cond = threading.Condition()
        self._waiting = FairQueue(per_request_cap(max_batch))
        self._beam_waiting = FairQueue(per_request_cap(self.beam_slots))
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._active: dict[int, Job] = {}  # slot -> job
        self._beams: dict[Job, Iterator[TokenEvent | None]] = {}  # beam job -> its steps
        self._starting: list[Job] = []  # taken from the queue, not yet in a slot
        self._closed = False
        self.steps = 0
        self.tokens = 0
        self._thread = threading.Thread(target=self._run, name="gptlab-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ public
    def submit(self, job: Job) -> None:
        """Queue a job; its events arrive on ``job.channel``."""
        stepped = route(self.model, job.config) != "rows"  # beam search, or an encoder–decoder's source
        with self._cond:
            if self._closed:
                raise GptlabError("the server is shutting down")
            (self._beam_waiting if stepped else self._waiting).put(job)
            self._cond.notify()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn()`` on the scheduler thread between decode steps (one owner of the model)."""
        fut: Future[T] = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._cond.notify()
        return fut

    def stats(self) -> dict[str, Any]:
        with self._cond:  # the queues change on the scheduler thread, under this lock
            waiting = len(self._waiting) + len(self._beam_waiting)
        return {
            "active": len(self._active) + len(self._beams),
            "waiting": waiting,
            "max_batch": self.max_batch,
            "steps": self.steps,
            "tokens": self.tokens,
            "prefix_cache": self.prefix_cache.stats(),
            "kv_capacity": self.session.dynamic.capacity,
            "decode_plan": str(self.session.plan),
        }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------ the loop
    def _idle(self) -> bool:
        return not (self._calls or self._waiting or self._beam_waiting or self._active or self._beams)

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    idle_since = None
                    while not self._closed and self._idle():
                        if idle_since is None:
                            idle_since = time.monotonic()
                        self._cond.wait(self._keep_left(idle_since))
                    if self._closed:
                        break
                    calls = list(self._calls)
                    self._calls.clear()
                try:
                    self._iteration(calls)
                except Exception as exc:  # never let the thread die: fail what was running, start afresh
                    log.exception("scheduler iteration failed")
                    self._fail_all(f"internal error during generation: {exc}")
        with self._cond:
            left = [*self._active.values(), *self._beams, *self._waiting.drain(), *self._beam_waiting.drain()]
        for job in left:
            self._end(job, "error", error="the server is shutting down")

    def _keep_left(self, idle_since: float) -> float | None:
        """Seconds the idle loop may wait before it must shrink the grown KV cache (None: nothing to
        shrink, wait for work); once ``kv_keep_s`` idle seconds have passed, shrink it now."""
        if not self.session.grown:
            return None
        left = idle_since + self.kv_keep_s - time.monotonic()
        if left > 0:
            return left
        self.session.shrink()  # every slot is free (idle): back to KV_START_TOKENS positions per row
        return None

    def _iteration(self, calls: list[tuple[Callable[[], Any], Future]]) -> None:
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)
        for job in [*self._active.values(), *self._beams]:
            if job.cancelled.is_set():
                self._end(job, "cancelled")  # the client has gone: nobody reads the event
        self._admit()
        stepped = self._step_beams()
        ready = [job for job in self._active.values() if job.pending and not job.channel.full()]
        if not ready:
            if (self._active or self._beams) and not stepped:  # every client is behind: let them catch up
                time.sleep(0.005)
            return
        step_rows(self.session, [job.row for job in ready if job.row is not None])
        self.steps += 1
        for job in ready:
            self._guarded(job, self._advance)

    def _guarded(self, job: Job, fn: Callable[..., None], *args: Any) -> None:
        """``fn(job, *args)``; what it raises ends ``job`` alone (400 for bad input, else 500)."""
        try:
            fn(job, *args)
        except GptlabError as exc:
            self._end(job, "error", error=str(exc), status=400)
        except Exception as exc:  # noqa: BLE001 - this job's failure is this job's alone
            log.exception("job %s failed", job.id)
            self._end(job, "error", error=f"internal error during generation: {type(exc).__name__}: {exc}")

    def _admit(self) -> None:
        """Give free slots to waiting jobs, fairly; jobs admitted together share one prefill pass."""
        with self._cond:
            batch = self._waiting.take(self.session.free_slots, self._active.values())
            beams = self._beam_waiting.take(self.beam_slots - len(self._beams), self._beams)
        for job in beams:
            self._guarded(job, self._start_beam)
        if batch:
            if self.session.adopt_kept_step():  # a background `gptlab compile` has kept the step (or pass)
                log.info("decode: the compile cache keeps the compiled step now; %s", self.session.plan)
            self._starting = batch
            self._start(batch)
            self._starting = []

    def _start(self, jobs: list[Job]) -> None:
        ready = []
        for job in jobs:
            self._guarded(job, self._new_step)
            if job.state is not None and not job.ended:
                ready.append(job)
        if not ready:
            return
        added: list[tuple[int, torch.Tensor | int] | None]
        try:
            steps = [job.state for job in ready if job.state is not None]  # (every ready job has its step)
            added = list(self.session.add_many([job.prompt_ids for job in ready], steps))
        except GptlabError:  # one bad prompt: prefill them one by one to find it
            added = []
            for job in ready:
                try:
                    added.append(self.session.add(job.prompt_ids, job.state))
                except GptlabError as exc:
                    self._end(job, "error", error=str(exc), status=400)
                    added.append(None)
        for job, result in zip(ready, added, strict=True):
            if result is None:
                continue
            slot, logits = result
            assert job.state is not None
            job.row = Row(slot, job.state, logits)
            self._active[slot] = job
            self._guarded(job, self._advance)
        # the prompts' blocks, for the requests that come while these decode: after the first tokens,
        # which the clients get meanwhile (a job that ended already left its row's blocks)
        self.session.remember_prompts()

    def _new_step(self, job: Job) -> None:
        job.state = RequestState(
            job.config, self.tokenizer, self.model, job.prompt_ids, index=job.index, top_n=job.top_n
        )

    def _advance(self, job: Job) -> None:
        """The job's next token from its row's logits (the driver's ``advance_row``, as the library's
        loop does): its event to the channel, then feed or finish."""
        row = job.row
        assert row is not None  # set by _start before any step
        step = row.state
        event = advance_row(self.session, row)
        self.tokens += 1
        if event is not None:
            if event.notice:
                job.warnings.append(event.notice)
            job.channel.put(event)
        elif job.top_n is not None and step.stop_event is not None:
            job.channel.put(step.stop_event)  # reported in logprobs, never shown as text
        reason = step.reason
        job.pending = reason is None
        if reason is None:
            return
        tail = step.close()  # its finish_reason is ``reason``
        if tail.text:
            job.channel.put(TokenEvent(tail.text, index=job.index))
        self._end(job, reason)

    def _end(self, job: Job, reason: str, error: str | None = None, status: int = 500) -> None:
        self._release(job)
        if not job.ended:
            job.ended = True
            job.channel.put(EndEvent(job.index, reason, job.generated, job.warnings, error, status))

    def _release(self, job: Job) -> None:
        row = job.row
        if row is not None and self._active.get(row.slot) is job:
            del self._active[row.slot]
            self.session.remove(row.slot)
        job.row = None
        job.pending = False
        steps = self._beams.pop(job, None)
        if steps is not None and hasattr(steps, "close"):
            steps.close()

    def _fail_all(self, message: str) -> None:
        jobs = list(self._active.values()) + [j for j in self._starting if j.row is None]
        self._active.clear()
        self._starting = []
        for job in jobs:
            job.row = None
            self._end(job, "error", error=message)
        self.session = self._new_session()

    # ------------------------------------------------------------ beam search, one step per iteration
    def _start_beam(self, job: Job) -> None:
        self._beams[job] = stepped_events(
            self.model, self.tokenizer, job.prompt_ids, job.config, route(self.model, job.config)
        )

    def _step_beams(self) -> int:
        """One step of every beam job whose client keeps up → how many stepped."""
        ready = [(job, steps) for job, steps in self._beams.items() if not job.channel.full()]
        for job, steps in ready:
            self._guarded(job, self._step_beam, steps)
        return len(ready)

    def _step_beam(self, job: Job, steps: Iterator[TokenEvent | None]) -> None:
        event = next(steps)
        if event is None:  # a step of the search, nothing to show yet
            return
        job.beam_tokens += event.token_id is not None
        if event.text:
            event.index = job.index
            job.channel.put(event)
        if event.finish_reason is not None:
            self._beams.pop(job, None)
            if not job.ended:
                job.ended = True
                job.channel.put(EndEvent(job.index, event.finish_reason, job.beam_tokens, job.warnings))


def stepped_events(
    model: GPT, tokenizer: Tokenizer, prompt: list[int], config: SampleConfig, how: str
) -> Iterator[TokenEvent | None]:
    """A beam-search job (or an encoder–decoder's) as an iterator: None per search step, then its
    events; each ``next`` runs the model at most once."""
    if how == "source":  # the plan's route: an encoder–decoder binds its source
        from gptlab.generate import driver as s2s
        from gptlab.model import EncoderDecoder

        assert isinstance(model, EncoderDecoder)  # seq2seq: is_seq2seq(model)
        yield from s2s.stream_ids(model, tokenizer, prompt, config)
        return
    tokens, reason = yield from beam_steps(model, prompt, config, tokenizer)
    yield from beam_stream(tokenizer, tokens, reason, config)
