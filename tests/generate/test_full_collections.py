"""Full garbage collections on the sending loop's schedule (jobs/generate/sending/full_collections.py): inside the
loop CPython never starts one by itself, the loop's own do free what only a full collection frees, they are spaced
by what they cost, and CPython's thresholds come back when the last loop ends."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from eyrie.jobs.generate.sending import full_collections
from eyrie.jobs.generate.sending.actor import run_loop
from eyrie.jobs.generate.sending.full_collections import NEVER, FullCollections, full_collections_scheduled


class Node:
    """A cycle's member (a weakref tells when it is freed)."""

    def __init__(self) -> None:
        self.other: Any = self


def old_cycle() -> weakref.ref[Node]:
    """A cycle that has survived a full collection (so it sits in the oldest generation, where only a full
    collection looks), now unreachable."""
    node = Node()
    gc.collect()
    return weakref.ref(node)


def test_run_loop_leaves_full_collections_to_the_loop_and_gives_cpython_its_thresholds_back():
    before = gc.get_threshold()

    async def inside() -> tuple[int, int, int]:
        return gc.get_threshold()

    assert run_loop(inside()) == (full_collections.YOUNG, full_collections.MIDDLE, NEVER)
    assert gc.get_threshold() == before


def test_what_only_a_full_collection_frees_is_freed_on_the_loops_schedule():
    async def main() -> tuple[bool, bool, int]:
        with full_collections_scheduled(min_interval=0.05, max_share=1.0) as policy:
            freed = old_cycle()
            alive = freed() is not None
            for _ in range(200):  # young collections run meanwhile; none looks at the oldest generation
                _ = [[] for _ in range(500)]
                gc.collect(1)
            young_only = freed() is not None
            for _ in range(100):
                if freed() is None:
                    break
                await asyncio.sleep(0.02)
            return alive and young_only, freed() is None, policy.collections

    held_by_young_collections, freed, collections = asyncio.run(main())
    assert held_by_young_collections  # the cycle needs a full collection ...
    assert freed and collections >= 1  # ... and the loop ran one


class Handle:
    def cancel(self) -> None:
        pass


class FakeLoop:
    """Records when each collection is scheduled."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def call_later(self, delay: float, fn: Any) -> Handle:
        self.delays.append(delay)
        return Handle()


def test_full_collections_are_spaced_by_what_they_cost(monkeypatch):
    # a collection of 0.5 s, then one of 1 ms: the clock moves only when a collection runs, so any other caller of
    # perf_counter meanwhile reads the same time and changes nothing
    now, takes = [0.0], iter([0.5, 0.001])

    def collect(*_: object) -> int:
        now[0] += next(takes)
        return 0

    monkeypatch.setattr(full_collections.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(full_collections.gc, "collect", collect)
    loop = FakeLoop()
    policy = FullCollections(loop, min_interval=10.0, max_share=0.02)  # type: ignore[arg-type]
    policy.start()
    try:
        policy._collect()
        policy._collect()
    finally:
        policy.stop()
    assert loop.delays == [10.0, pytest.approx(25.0), 10.0]  # 0.5 s at 2% of the time: the next 25 s on
    assert policy.collections == 2 and policy.seconds == pytest.approx(0.501)


def test_cpythons_thresholds_come_back_with_the_last_of_overlapping_loops():
    before = gc.get_threshold()
    first, second = FullCollections(FakeLoop()), FullCollections(FakeLoop())  # type: ignore[arg-type]
    first.start()
    second.start()
    first.stop()
    assert gc.get_threshold()[2] == NEVER  # the second loop still schedules its own
    second.stop()
    second.stop()  # twice: nothing more
    assert gc.get_threshold() == before


def test_what_the_process_held_before_the_loop_is_left_out_of_its_full_collections():
    """The process's start (modules, the spec, the tokenizer: ~100,000 objects) is frozen while the loop runs, so
    each full collection looks only at what the run made since; frozen again to CPython when the last loop ends."""
    node = Node()  # a cycle the process made before the loop
    held = weakref.ref(node)

    async def inside() -> tuple[int, bool]:
        gc.collect()  # a full collection inside the loop does not look at what was there before it
        return gc.get_freeze_count(), held() is not None

    gc.disable()  # no automatic collection frees the cycle before the loop starts
    try:
        del node
        frozen, kept = run_loop(inside())
    finally:
        gc.enable()
    assert frozen > 1000 and kept
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert held() is None  # given back to CPython's collections with the last loop
