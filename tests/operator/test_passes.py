"""The pass gate: a bound on passes at once, urgent passes (new objects, spec edits) before polls."""

from __future__ import annotations

import asyncio

import pytest

from eyrie.operator.passes import PassGate


async def _hold(gate: PassGate, name: str, urgent: bool, order: list[str], release: asyncio.Event) -> None:
    async with gate.slot(urgent):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_no_more_than_the_limit_run_and_urgent_passes_overtake_waiting_polls() -> None:
    gate = PassGate(2)
    order: list[str] = []
    gates = {n: asyncio.Event() for n in ("p1", "p2", "p3", "p4", "u1", "u2")}
    tasks = [asyncio.create_task(_hold(gate, n, n.startswith("u"), order, gates[n]))
             for n in ("p1", "p2", "p3", "p4")]
    await _settle()
    assert (order, gate.running, gate.waiting) == (["p1", "p2"], 2, 2)
    tasks += [asyncio.create_task(_hold(gate, n, True, order, gates[n])) for n in ("u1", "u2")]
    await _settle()
    assert gate.waiting == 4
    for name in ("p1", "p2", "u1", "u2"):  # each end lets exactly one more in: urgent first, in order
        gates[name].set()
        await _settle()
        assert gate.running == 2
    assert order == ["p1", "p2", "u1", "u2", "p3", "p4"]
    gates["p3"].set()
    gates["p4"].set()
    await asyncio.gather(*tasks)
    assert (gate.running, gate.waiting) == (0, 0)


async def test_a_cancelled_waiter_gives_up_its_place_and_a_cancelled_holder_its_slot() -> None:
    gate = PassGate(1)
    order: list[str] = []
    hold, never, later = asyncio.Event(), asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(_hold(gate, "first", False, order, hold))
    await _settle()
    waiter = asyncio.create_task(_hold(gate, "cancelled", True, order, never))
    third = asyncio.create_task(_hold(gate, "third", False, order, later))
    await _settle()
    waiter.cancel()
    await _settle()
    assert gate.waiting == 1
    hold.set()
    await _settle()
    assert order == ["first", "third"] and gate.running == 1
    third.cancel()  # a pass cancelled while it holds its slot (operator shutdown) frees it
    await asyncio.gather(first, third, waiter, return_exceptions=True)
    assert (gate.running, gate.waiting) == (0, 0)
    async with gate.slot(False):
        assert gate.running == 1


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        PassGate(0)
