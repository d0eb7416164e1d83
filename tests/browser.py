"""Open a page in headless Chromium over the DevTools protocol: its console errors and a screenshot.

    page = open_page(Path("report.html"))
    page.errors      console.error / console.assert calls, uncaught exceptions, and the browser's
                     own error log entries (a resource that failed to load, a CSP violation, ...)
    page.png         a full-page PNG screenshot
    page.boxes       the CSS-pixel boxes of the elements matching `selector`

The protocol runs over a pipe (`--remote-debugging-pipe`: commands on fd 3, events on fd 4,
each message JSON ended by a NUL byte), so no port and no websocket library are needed.
Used by tests/test_report.py; None from `chromium()` when the browser is not installed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)
    png: bytes = b""
    boxes: list[dict[str, float]] = field(default_factory=list)


class _Pipe:
    def __init__(self, binary: str, profile: Path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # in the child: the protocol's fds are 3 (commands in) and 4 (events out)
            high_r, high_w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)  # dup2 leaves 3 and 4 inheritable; every other fd is close-on-exec
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no reply in {timeout} s")

    def wait_for(self, method: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} in {timeout} s")
            self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:300])
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return out


def open_page(html_file: Path, profile: Path, width: int = 1200, selector: str = "figure[data-plot]") -> Page:
    binary = chromium()
    assert binary is not None, "chromium is not installed"
    pipe = _Pipe(binary, profile)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        pipe.send("Page.navigate", {"url": html_file.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired")
        script = (f"JSON.stringify(Array.from(document.querySelectorAll({json.dumps(selector)})).map(e => {{"
                  "const r = e.getBoundingClientRect(); return {x: r.x + scrollX, y: r.y + scrollY, "
                  "width: r.width, height: r.height}; }))")
        boxes = json.loads(pipe.send("Runtime.evaluate", {"expression": script, "returnByValue": True},
                                     session=session)["result"]["value"])
        shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=session)
        return Page(_errors(pipe.events), base64.b64decode(shot["data"]), boxes)
    finally:
        pipe.close()
