"""An aiohttp application served on 127.0.0.1 from a thread with its own event loop, so that a whole
run (which owns its own loop) can talk to it: fake_openrouter.py (the tests' fake provider),
slow_provider.py and the OpenRouter-docs tests. Stopped and its thread joined on exit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


@contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT/v1`) while `app` is served."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
