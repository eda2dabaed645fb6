"""Fair admission: which waiting jobs take the free slots.

Jobs wait grouped by request. Each free slot goes to the request that holds the fewest slots
(ties: the request that came first), one job at a time, so the slots go round-robin between
requests, and no request holds more than ``per_request`` slots. With ``per_request`` below the
number of slots, a request that arrives while a large one runs finds a slot at the next step:
a one-token request is not queued behind a 64-choice one. Within a request, jobs keep their order.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable

from gptlab.errors import GptlabError
from gptlab.serve.jobs import Job


def per_request_cap(slots: int) -> int:
    """Slots one request may hold: all but ``slots // 8`` (at least one) kept for other requests.

    >>> per_request_cap(1), per_request_cap(4), per_request_cap(8), per_request_cap(16)
    (1, 3, 7, 14)
    """
    return slots if slots == 1 else slots - max(1, slots // 8)


class FairQueue:
    """Waiting jobs, grouped by request; ``take`` hands free slots out round-robin between requests."""

    def __init__(self, per_request: int) -> None:
        if per_request < 1:
            raise GptlabError(f"per_request must be at least 1, got {per_request}")
        self.per_request = per_request
        self._requests: OrderedDict[int, deque[Job]] = OrderedDict()  # request -> its waiting jobs

    def __len__(self) -> int:
        return sum(len(q) for q in self._requests.values())

    def put(self, job: Job) -> None:
        self._requests.setdefault(job.request, deque()).append(job)

    def drain(self) -> list[Job]:
        """Every waiting job, removed (the server is closing)."""
        jobs = [job for q in self._requests.values() for job in q]
        self._requests.clear()
        return jobs

    def take(self, free: int, holding: Iterable[Job]) -> list[Job]:
        """Up to ``free`` jobs to admit now, given the jobs ``holding`` slots; cancelled jobs are dropped."""
        if not self._requests:  # the usual case once every request has started: nothing to do
            return []
        for key, q in list(self._requests.items()):
            kept = deque(job for job in q if not job.cancelled.is_set())  # its client has gone: never starts
            if kept:
                self._requests[key] = kept
            else:
                del self._requests[key]
        if free <= 0:
            return []
        held = Counter(job.request for job in holding)
        out: list[Job] = []
        while len(out) < free:
            ready = [key for key in self._requests if held[key] < self.per_request]
            if not ready:
                break
            key = min(ready, key=lambda k: held[k])  # min keeps the first of equals: arrival order
            out.append(self._requests[key].popleft())
            held[key] += 1
            if not self._requests[key]:
                del self._requests[key]
        return out
