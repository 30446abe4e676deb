"""A page in real headless Chromium, driven over the DevTools protocol.

Chromium is started with ``--remote-debugging-pipe``: the protocol's JSON
messages go over its file descriptors 3 (in) and 4 (out), NUL-terminated,
so no WebSocket client is needed. ``open_page`` loads a file, collects what
the page reports as errors (uncaught exceptions, ``console.error``, failed
loads from the browser's log), evaluates an expression and takes a
full-page screenshot.

Locally a missing ``chromium`` skips the test with the reason; under CI
(``CI=true``, where ``.ci/run`` installs Debian's ``chromium``) it fails.
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

import pytest

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str:
    for name in BINARIES:
        if found := shutil.which(name):
            return found
    why = "no chromium on PATH (Debian: apt-get install -y chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why}; CI must install it (.ci/run)")
    pytest.skip(why)


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)
    value: Any = None  # what the expression evaluated to
    screenshot: bytes = b""


class _Pipe:
    """The protocol over Chromium's pipe: requests by id, events queued."""

    def __init__(self, proc: subprocess.Popen[bytes], out_fd: int, in_fd: int) -> None:
        self.proc, self._out, self._in = proc, out_fd, in_fd
        self._next, self._buf, self.events = 0, b"", []  # type: ignore[var-annotated]

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout_s: float = 30) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"no answer to {method} in {timeout_s} s")

    def wait_event(self, method: str, timeout_s: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} in {timeout_s} s")
            self.events.append(self._read(deadline))

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("Chromium said nothing in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ConnectionError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self._buf += chunk
        message, _, self._buf = self._buf.partition(b"\0")
        return json.loads(message)


def open_page(path: Path, expression: str, *, width: int = 1280, height: int = 900) -> Page:
    """Load ``path`` in headless Chromium; its errors, ``expression``'s value
    and a full-page PNG screenshot."""
    binary = chromium_binary()
    to_chromium_r, to_chromium_w = os.pipe()
    from_chromium_r, from_chromium_w = os.pipe()

    def pipes() -> None:  # the child's fds 3 and 4, as --remote-debugging-pipe expects
        os.dup2(to_chromium_r, 3)
        os.dup2(from_chromium_w, 4)

    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--no-first-run", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=pipes, pass_fds=(3, 4))
        os.close(to_chromium_r)
        os.close(from_chromium_w)
        pipe = _Pipe(proc, to_chromium_w, from_chromium_r)
        try:
            return _load(pipe, path, expression, width, height)
        finally:
            with contextlib.suppress(OSError, RuntimeError, TimeoutError, ConnectionError):
                pipe.call("Browser.close", timeout_s=5)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_chromium_w)
            os.close(from_chromium_r)


def _load(pipe: _Pipe, path: Path, expression: str, width: int, height: int) -> Page:
    target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True}
                        )["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        pipe.call(f"{domain}.enable", session=session)
    pipe.call("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        session=session)
    pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
    pipe.wait_event("Page.loadEventFired")
    page = Page()
    value = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True}, session=session)
    page.value = value.get("result", {}).get("value")
    shot = pipe.call("Page.captureScreenshot", {"format": "png",
                                                "captureBeyondViewport": True},
                     session=session)
    page.screenshot = base64.b64decode(shot["data"])
    for event in pipe.events:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            page.errors.append(params["exceptionDetails"].get("text", "exception"))
        elif event.get("method") == "Runtime.consoleAPICalled" and params["type"] == "error":
            page.errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                        for a in params.get("args", [])))
        elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
            page.errors.append(params["entry"].get("text", ""))
    return page
