"""The request combiner (rm_server/app/batching.py) without a database: how groups form."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from rm_server.app.batching import Combiner
from tests.support.waiting import wait_until


@dataclass(eq=False)
class FakeOp:
    rid: str

    @property
    def key(self) -> tuple[str, str, str]:
        return ("user:alice", "Apply", self.rid)


async def settle() -> None:
    for _ in range(5):  # the submitting tasks, then the group tasks they started
        await asyncio.sleep(0)


class Recorder:
    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.gate = asyncio.Event()

    async def run(self, ops):
        self.groups.append([op.rid for op in ops])
        await self.gate.wait()
        return [ValueError(op.rid) if op.rid.startswith("bad") else f"done {op.rid}" for op in ops]


async def test_a_lone_request_runs_at_once_and_the_others_form_the_next_group():
    rec = Recorder()
    combiner = Combiner(rec.run, max_batch=3)
    first = asyncio.ensure_future(combiner.submit(FakeOp("a")))
    await settle()
    assert rec.groups == [["a"]]  # did not wait for company
    rest = [asyncio.ensure_future(combiner.submit(FakeOp(r))) for r in "bcdef"]
    await settle()
    assert rec.groups == [["a"]]  # one group at a time: the others queue
    rec.gate.set()
    assert await first == "done a"
    assert [await f for f in rest] == [f"done {r}" for r in "bcdef"]
    assert rec.groups == [["a"], ["b", "c", "d"], ["e", "f"]]  # arrival order, max_batch
    assert (combiner.groups, combiner.requests) == (3, 6)


async def test_same_request_id_waits_for_the_next_group_and_errors_stay_per_request():
    rec = Recorder()
    combiner = Combiner(rec.run)
    futures = [asyncio.ensure_future(combiner.submit(FakeOp(r))) for r in ("x", "x", "bad", "y")]
    await settle()
    rec.gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert rec.groups == [["x"], ["x", "bad", "y"]] or rec.groups == [["x", "bad", "y"], ["x"]]
    assert results[0] == results[1] == "done x"
    assert isinstance(results[2], ValueError) and results[3] == "done y"


async def test_a_request_whose_caller_went_away_before_it_started_is_dropped():
    rec = Recorder()
    combiner = Combiner(rec.run)
    running = asyncio.ensure_future(combiner.submit(FakeOp("a")))
    await settle()
    gone = asyncio.ensure_future(combiner.submit(FakeOp("gone")))
    kept = asyncio.ensure_future(combiner.submit(FakeOp("kept")))
    await settle()
    gone.cancel()
    rec.gate.set()
    assert await running == "done a" and await kept == "done kept"
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert rec.groups == [["a"], ["kept"]]


async def test_requests_that_lingered_behind_a_running_group_leave_when_it_is_done():
    rec = Recorder()
    combiner = Combiner(rec.run, max_batch=8, linger=0.2)

    async def groups_are(expected: list[list[str]]) -> bool:
        return rec.groups == expected

    first = asyncio.ensure_future(combiner.submit(FakeOp("a")))
    await wait_until(lambda: groups_are([["a"]]), 5, interval=0.001)
    second = asyncio.ensure_future(combiner.submit(FakeOp("b")))
    # Let b's linger pass while a's group still runs (b cannot leave: no room in flight).
    await asyncio.sleep(0.25)
    assert rec.groups == [["a"]] and combiner.queued == 1
    rec.gate.set()
    # b leaves the moment a's group is done (the same step that answers a), with no
    # timer of its own: by the time a's caller has its answer, b is out of the queue.
    assert await first == "done a"
    assert combiner.queued == 0
    assert await second == "done b"
    assert rec.groups == [["a"], ["b"]]


async def test_a_crashing_group_answers_every_request_with_the_error():
    async def explode(ops):
        raise RuntimeError("boom")

    combiner = Combiner(explode)
    results = await asyncio.gather(
        *(combiner.submit(FakeOp(r)) for r in "ab"), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    await combiner.close()


async def test_linger_gathers_company_but_a_full_group_leaves_at_once():
    rec = Recorder()
    rec.gate.set()
    # A linger far longer than the test: whatever leaves, leaves because its group is full.
    combiner = Combiner(rec.run, max_batch=2, linger=600)
    first = asyncio.ensure_future(combiner.submit(FakeOp("a")))
    await settle()
    assert rec.groups == [] and combiner.queued == 1  # waits for company, not alone
    second = asyncio.ensure_future(combiner.submit(FakeOp("b")))
    assert list(await asyncio.wait_for(asyncio.gather(first, second), 30)) == ["done a", "done b"]
    assert rec.groups == [["a", "b"]]
    # Two (max_batch) at once: no waiting for the linger to end.
    full = [asyncio.ensure_future(combiner.submit(FakeOp(r))) for r in "cd"]
    await settle()
    assert rec.groups[-1] == ["c", "d"]
    assert [await f for f in full] == ["done c", "done d"]


async def test_a_lone_request_leaves_when_its_linger_ends():
    rec = Recorder()
    rec.gate.set()
    combiner = Combiner(rec.run, max_batch=8, linger=0.05)
    assert await asyncio.wait_for(combiner.submit(FakeOp("a")), 30) == "done a"
    assert rec.groups == [["a"]]
