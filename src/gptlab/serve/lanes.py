"""The server's session: ``BatchSession``'s interface over two lanes, static and dynamic.

    a request whose plan is static  → the static lane (CUDA graphs, sampler inside)
    one whose plan is dynamic        → the dynamic lane (``BatchSession``): logprobs, a grammar, beam…

Which lane a request takes is its own ``plan_decoding`` (its options, whether it wants probabilities),
asked of the model's ``PreparedDecoding``: the lanes decide nothing themselves.

Slots ``[0, B)`` are the dynamic lane's and ``[B, 2B)`` the static lane's, so the scheduler keeps
one slot → job map. ``free_slots`` is the smaller of the two lanes' free slots: whatever mix a
batch of admitted requests is, it fits. Where the model's decode plan for ``max_batch`` rows is
not static (``gptlab.generate.plan``) there is no static lane and every call goes straight to the
``BatchSession``.

A prefix cache (``gptlab.generate.prefix_cache``) belongs to the dynamic lane: the requests it
prefills reuse and leave their keys and values there. The static lane bypasses it (its rows are
prefilled in full), so which lane a request takes is decided as before and each is correct.

A server started before its model's one-row step was kept (``--compile auto`` decodes layer by layer
and compiles the step in a background process for later ones) takes that step up once the compile
cache keeps it: ``adopt_kept_step``, which the scheduler calls as it admits requests, asks the plan
again (at most every ``RECHECK_S`` seconds) and from then on a step that feeds one row runs it.

A request in the static lane keeps its ``RequestState`` (stops, text, finish reason), which is handed
the token chosen inside the graph; the seed its ``Sampler`` drew seeds the row there.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from gptlab.generate.plan import Decoder
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.prepared import prepared_of
from gptlab.generate.session import BatchSession
from gptlab.generate.static import StaticSession

if TYPE_CHECKING:
    from gptlab.generate.request import RequestState

#: how often (seconds) lanes without the one-row step look for it in the compile cache again
RECHECK_S = 1.0


class Lanes:
    """A ``BatchSession`` and, on CUDA, a ``StaticSession`` behind one slot numbering."""

    def __init__(
        self,
        model: Decoder,
        max_batch: int,
        max_len: int | None = None,
        capacity: int | None = None,
        vocab: int | None = None,
        prefix_cache: PrefixCache | None = None,
        shrink_when_idle: bool = True,
        remember_at_add: bool = True,
    ) -> None:
        """``shrink_when_idle=False``: the dynamic lane keeps what its cache grew to once every slot
        is free, until ``shrink()`` (the server calls it after an idle grace period).
        ``remember_at_add=False``: prompts leave their blocks in the prefix cache at ``remember_prompts()``
        (the server calls it once their first tokens are out), not during ``add_many``."""
        engine = self._engine = prepared_of(model)
        #: how these lanes decode (printed at the server's start)
        self.plan = engine.plan(max_batch)
        # capacity: the dynamic lane's starting cache length, grown as rows need (the static lane's is fixed)
        dynamic_plan = engine.plan(max_batch, want_probs=True)  # what a request wanting logprobs gets
        self.dynamic = engine.dynamic_session(
            dynamic_plan, max_batch, max_len, capacity=capacity, prefix_cache=prefix_cache
        )
        self._checked = time.monotonic()  # when the compile cache was last asked for the one-row step
        self.dynamic.shrink_when_idle = shrink_when_idle
        self.dynamic.remember_at_add = remember_at_add
        self.max_batch, self.max_len = max_batch, self.dynamic.max_len
        self.static: StaticSession | None = None
        if self.plan.session == "static":
            # vocab: the tokenizer's, where it is smaller: the sampler never picks beyond it
            self.static = engine.new_static_session(
                self.plan, max_batch, self.max_len, None, vocab, max_batch
            )

    def adopt_kept_step(self, now: float | None = None) -> bool:
        """Where the dynamic lane runs no one-row step and the plan now gives it one (the compile
        cache has come to keep the step since these lanes started), give it → whether it did.

        Asks at most once every ``RECHECK_S`` seconds (``now``: ``time.monotonic()``)."""
        now = time.monotonic() if now is None else now
        lane = self.dynamic
        if (lane.one_token is not None and lane.prompt is not None) or now - self._checked < RECHECK_S:
            return False
        self._checked = now
        plan = self._engine.plan(self.max_batch, want_probs=True)
        step, prompt = self._engine.one_row_step(plan), self._engine.prompt_pass(plan)
        adopted = (lane.one_token is None and step is not None) or (
            lane.prompt is None and prompt is not None
        )
        if not adopted:
            return False
        lane.one_token, lane.prompt = lane.one_token or step, lane.prompt or prompt
        self.plan = self._engine.plan(self.max_batch)
        return True

    @property
    def free_slots(self) -> int:
        if self.static is None:
            return self.dynamic.free_slots
        return min(self.dynamic.free_slots, self.static.free_slots)

    def _lane(self, slot: int) -> BatchSession | StaticSession:
        return self.static if self.static is not None and slot >= self.max_batch else self.dynamic

    def full(self, slot: int) -> bool:
        return self._lane(slot).full(slot)

    def fit(self, ids: Sequence[int]) -> list[int]:
        return self.dynamic.fit(ids)  # both lanes hold rows of the same length

    def window_notice(self) -> str:
        return self.dynamic.window_notice()  # both lanes slide by the same rule

    def remove(self, slot: int) -> None:
        self._lane(slot).remove(slot)

    @property
    def grown(self) -> bool:
        """Whether the dynamic lane's cache holds more than its starting capacity (the static lane's is fixed)."""
        return self.dynamic.grown

    def remember_prompts(self) -> None:
        """The dynamic lane's ``remember_prompts`` (the static lane keeps no prefixes)."""
        self.dynamic.remember_prompts()

    def shrink(self) -> bool:
        """Give back what the dynamic lane's cache grew to, if every slot of it is free → whether it did."""
        return self.dynamic.shrink()

    def add(
        self, prompt_ids: Sequence[int], step: RequestState | None = None
    ) -> tuple[int, torch.Tensor | int]:
        return self.add_many([prompt_ids], None if step is None else [step])[0]

    def add_many(
        self, prompts: Sequence[Sequence[int]], steps: Sequence[RequestState] | None = None
    ) -> list[tuple[int, torch.Tensor | int]]:
        """Prefill each prompt in its lane → ``(slot, logits)`` (dynamic) or ``(slot, token)`` (static).

        ``steps`` are the requests' ``RequestState``s; without them everything goes to the dynamic lane.
        """
        with warnings.catch_warnings():  # every prompt checked before any slot is taken
            warnings.simplefilter("ignore")
            for p in prompts:
                self.dynamic.fit(p)
        fast = []
        if self.static is not None and steps is not None:
            # the lane each request's own plan names (its options, whether it wants probabilities)
            fast = [i for i, s in enumerate(steps) if self._session_of(s) == "static"]
        slow = [i for i in range(len(prompts)) if i not in fast]
        out: list[Any] = [None] * len(prompts)
        if slow:
            for i, result in zip(slow, self.dynamic.add_many([prompts[i] for i in slow]), strict=True):
                out[i] = result
        if fast:
            assert self.static is not None and steps is not None
            configs = [steps[i].config for i in fast]
            seeds = [steps[i].sampler.seed for i in fast]
            for i, chosen in zip(
                fast, self.static.add_many([prompts[i] for i in fast], configs, seeds), strict=True
            ):
                out[i] = chosen
        return out

    def _session_of(self, state: RequestState) -> str:
        plan = self._engine.plan(self.max_batch, config=state.config, want_probs=state.top_n is not None)
        return plan.session

    def step(self, feed: dict[int, int]) -> dict[int, torch.Tensor | int]:
        """One decode step of each lane that has fed slots."""
        out: dict[int, Any] = {}
        for lane in (self.dynamic, self.static):
            part = {s: t for s, t in feed.items() if lane is not None and self._lane(s) is lane}
            if part:
                assert lane is not None
                out.update(lane.step(part))
        return out
