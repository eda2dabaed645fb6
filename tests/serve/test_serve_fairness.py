"""Fair admission: a small request is not stuck behind a large one (issue #33).

Free slots go round-robin between requests and no request holds all of them
(``serve/admission.py``); beam search is stepped in the same loop with its own fair queue.
"""

from __future__ import annotations

import asyncio

import pytest

from gptlab import GPT
from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig
from gptlab.serve.admission import FairQueue, per_request_cap
from gptlab.serve.jobs import Channel, EndEvent, Job
from gptlab.serve.scheduler import Scheduler
from gptlab.tokenizers import CharTokenizer

TEXT = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,;!?'"


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(TEXT)


@pytest.fixture(scope="module")
def model(tok, tiny_model) -> GPT:
    return tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16, pos="rope")


class _Loop:
    """A stand-in event loop for channels nobody reads (the queue tests)."""

    def call_soon_threadsafe(self, *_):
        pass


def jobs_of(n: int, index0: int = 0) -> list[Job]:
    channel = Channel(_Loop(), limit=1 << 20)  # one request: one channel
    return [Job([1], SampleConfig(max_new_tokens=1), channel, index=index0 + i) for i in range(n)]


# ------------------------------------------------------------------ the queue
def test_slots_go_round_robin_between_requests():
    big, small = jobs_of(10), jobs_of(1)
    q = FairQueue(per_request=8)
    for job in [*big, *small]:
        q.put(job)
    taken = q.take(4, holding=[])
    assert [job.request for job in taken] == [
        big[0].request,
        small[0].request,
        big[0].request,
        big[0].request,
    ]
    assert [job.index for job in taken if job.request == big[0].request] == [0, 1, 2]  # in order
    assert len(q) == 7


def test_a_request_holding_its_share_waits_and_others_go_first():
    big, small = jobs_of(10), jobs_of(2)
    q = FairQueue(per_request=3)
    for job in big:
        q.put(job)
    running = q.take(8, holding=[])
    assert len(running) == 3  # its cap, though 8 slots were free
    assert q.take(5, holding=running) == []
    for job in small:
        q.put(job)
    assert q.take(5, holding=running) == small


def test_cancelled_jobs_never_start():
    jobs = jobs_of(4)
    q = FairQueue(per_request=4)
    for job in jobs:
        q.put(job)
    jobs[0].cancel()
    jobs[2].cancel()
    assert q.take(4, holding=[]) == [jobs[1], jobs[3]] and len(q) == 0


def test_per_request_cap_keeps_a_slot_for_others():
    assert [per_request_cap(n) for n in (1, 2, 4, 8, 16, 64)] == [1, 1, 3, 7, 14, 56]
    with pytest.raises(GptlabError):
        FairQueue(per_request=0)


# ------------------------------------------------------------------ the scheduler
async def _ends(jobs: list[Job], timeout: float = 60) -> list[EndEvent]:
    """Wait for the end of each job (each on a channel of its own) → the ends in the order they came."""
    order: list[EndEvent] = []

    async def end(job: Job) -> None:
        while not any(isinstance(e, EndEvent) and order.append(e) is None for e in await job.channel.get()):
            pass

    await asyncio.wait_for(asyncio.gather(*(end(job) for job in jobs)), timeout)
    return order


def test_a_small_request_finishes_while_a_large_one_runs(model, tok):
    async def scenario() -> tuple[list[EndEvent], int]:
        sched = Scheduler(model, tok, max_batch=4)
        loop = asyncio.get_running_loop()
        big_channel = Channel(loop)
        big = [Job([1, 2], SampleConfig(max_new_tokens=300), big_channel, index=i) for i in range(8)]
        for job in big:
            sched.submit(job)
        while sched.stats()["active"] < 3:
            await asyncio.sleep(0.005)
        small = Job([3], SampleConfig(max_new_tokens=1), Channel(loop), index=100)
        sched.submit(small)
        order = await _ends([small], timeout=30)
        big_tokens = sum(job.generated for job in big)
        for job in big:
            job.cancel()
        sched.close()
        return order, big_tokens

    order, big_tokens = asyncio.run(scenario())
    assert order[0].index == 100 and order[0].completion_tokens == 1
    assert big_tokens < 3 * 300  # the large request was still running


def test_beam_search_shares_the_loop_and_its_queue_is_fair(model, tok):
    async def scenario() -> tuple[list[int], int, dict]:
        sched = Scheduler(model, tok, max_batch=4, beam_slots=2)
        loop = asyncio.get_running_loop()
        beam = SampleConfig(max_new_tokens=40, beam_width=4)
        shared = Channel(loop)  # one request of four beam jobs
        first = [Job([1, 2], beam, shared, index=i) for i in range(4)]
        for job in first:
            sched.submit(job)
        second = Job([5], SampleConfig(max_new_tokens=3, beam_width=2), Channel(loop), index=10)
        sampled = Job([6], SampleConfig(max_new_tokens=2), Channel(loop), index=20)
        sched.submit(second)
        sched.submit(sampled)
        done = await _ends([second, sampled], timeout=60)
        running = sum(1 for job in first if not job.ended)
        for job in first:
            job.cancel()
        await asyncio.sleep(0.1)
        left = sched.stats()
        sched.close()
        return [e.index for e in done], running, left

    done, running, left = asyncio.run(scenario())
    assert sorted(done) == [10, 20]
    assert running >= 1  # both finished while the first beam request was still searching
    assert left["active"] == 0 and left["waiting"] == 0  # cancelled beams left within a step


# ------------------------------------------------------------------ live, with an API key
def test_one_token_beside_64_choices_of_1024_tokens_is_served_within_2_s(tmp_path):
    from bench import serve_robustness as robustness

    ckpt = robustness.tiny_checkpoint(tmp_path)
    extra = ["--api-key", robustness.KEY, "--device", "cpu"]
    with robustness.serve_load.serve(str(ckpt), max_batch=8, extra=extra, timeout=120) as url:
        result = asyncio.run(robustness.fairness(url))
    assert result["small_status"] == 200 and result["small_s"] <= 2.0, result
    assert result["big_active"] == per_request_cap(8) and result["big_waiting"] == 64 - per_request_cap(8)
    assert result["left_active"] == 0, result
