"""The shard worker as a Ray actor, and the event loop a sending process runs.

Under Ray the driver starts one `ShardWorkerActor` per worker (`driver._run_ray`): in the actor's own process it
builds the worker's sender from the plain `SenderConfig` (`Session.actor_sender`: the coordinator is the run's
named actor, the API key the process's own environment, never an argument Ray would record) and runs the shard
loop (`worker.ShardWorker`) on a loop of its own. Nothing here decides anything: it only adapts the shard loop to
Ray (the process title `ray::ShardWorkerActor...` is how tests and benchmarks find a worker's process).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.sending.full_collections import full_collections_scheduled
from eyrie.jobs.generate.sending.sender import Call, SenderConfig
from eyrie.jobs.generate.sending.session import Session
from eyrie.jobs.generate.sending.worker import ShardWorker


def actor_call(handle: Any) -> Call:
    """How a sender in an actor calls the run coordinator's actor (`Session.start_actor`): `await method.remote()`."""

    async def call(method: str, *args: Any) -> Any:
        return await getattr(handle, method).remote(*args)

    return call


def run_loop(coro: Any) -> Any:
    """Run a coroutine on uvloop where available (~20% less CPU per request than asyncio's loop), with full
    garbage collections on the loop's schedule (full_collections.py: CPython's own come every few thousand answers
    at scale)."""

    async def scheduled() -> Any:
        with full_collections_scheduled():
            return await coro

    try:
        import uvloop  # optional: not on every platform
    except ImportError:  # e.g. Windows
        return asyncio.run(scheduled())
    return uvloop.run(scheduled())


class ShardWorkerActor:
    """A shard worker in a Ray actor of its own (`ray.remote(ShardWorkerActor)`)."""

    def __init__(self, config: SenderConfig, coordinator: Any, plan: ShardPlan):
        self.worker = ShardWorker(Session.actor_sender(config, actor_call(coordinator)), plan)

    def run_blocking(self) -> int:
        """The actor's entry: the worker's own (uv)loop, on a thread of its own because Ray already runs an
        asyncio loop in an actor that has async methods."""
        with ThreadPoolExecutor(1, thread_name_prefix="eyrie-worker") as pool:
            return pool.submit(run_loop, self.worker.run()).result()
