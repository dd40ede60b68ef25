"""A minimal Chrome DevTools Protocol client over `--remote-debugging-pipe`, for testing the pages
eyrie writes in a real browser (Debian's headless `chromium`; no browser download, no Node).

The pipe protocol: Chromium reads NUL-terminated JSON commands on fd 3 and writes responses and
events on fd 4. One page target is attached in flat mode; console errors, uncaught exceptions and
error log entries are collected while it loads.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((p for b in BROWSERS if (p := shutil.which(b))), None)


class CDPError(RuntimeError):
    pass


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, error log entries
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    value: Any = None  # what the probe expression returned
    screenshot: bytes = b""


class Browser:
    """One headless Chromium, started here and stopped by its own PID."""

    def __init__(self, binary: str, width: int = 1400, height: int = 900):
        self._cmd_r, self._cmd_w = os.pipe()
        self._resp_r, self._resp_w = os.pipe()
        self._tmp = tempfile.mkdtemp(prefix="eyrie-chromium-")
        self.width, self.height = width, height
        cmd_r, resp_w = self._cmd_r, self._resp_w

        def child_fds() -> None:  # Chromium expects its pipe at fds 3 and 4
            # through fresh copies: the pipe may already sit at 3 or 4, and dup2(fd, fd) would keep
            # its close-on-exec flag
            r, w = os.dup(cmd_r), os.dup(resp_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-pipe", f"--user-data-dir={self._tmp}", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--metrics-recording-only", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(resp_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(CDPError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._resp_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._resp_r], [], [], left)
            if ready:
                chunk = os.read(self._resp_r, 1 << 20)
                if not chunk:
                    raise CDPError("Chromium closed its debugging pipe")
                self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        self._next += 1
        mid = self._next
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == mid:
                if "error" in m:
                    raise CDPError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("method") == method:
                return m
            self.events.append(m)

    def open(self, url: str, probe: str, ready: str, timeout: float = 60, clip: str | None = None,
             scale: float = 1.0) -> PageResult:
        """Load `url`, wait until the JS expression `ready` is true, return `probe`'s value, every
        error the page reported, and a PNG screenshot: the full page, or the rectangle the JS
        expression `clip` returns ({x, y, width, height}) at `scale`."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=s)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=s)
        self.send("Page.navigate", {"url": url}, session=s)
        self.wait_event("Page.loadEventFired", timeout=timeout)
        deadline = time.monotonic() + timeout
        while not self._eval(ready, s):
            if time.monotonic() > deadline:
                raise CDPError(f"page never became ready ({ready})")
            time.sleep(0.2)
        result = PageResult(value=self._eval(probe, s))
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip is not None:
            params["clip"] = {**self._eval(clip, s), "scale": scale}
        shot = self.send("Page.captureScreenshot", params, session=s)
        result.screenshot = base64.b64decode(shot["data"])
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                result.errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                result.errors.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif e.get("method") == "Network.requestWillBeSent":
                result.requests.append(p.get("request", {}).get("url", ""))
            elif e.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                result.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return result

    def _eval(self, expression: str, session: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
        if "exceptionDetails" in r:
            raise CDPError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")


def open_page(path: Path, probe: str, ready: str, clip: str | None = None, scale: float = 1.0) -> PageResult:
    binary = find_browser()
    if binary is None:
        raise CDPError("no chromium on PATH (apt-get install chromium)")
    with Browser(binary) as b:
        return b.open(path.resolve().as_uri(), probe, ready, clip=clip, scale=scale)
