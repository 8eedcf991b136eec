"""index.html as a reader sees it: a report opened in headless Chromium, driven over the DevTools
protocol."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from conformance.report import render as report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """The smallest Chrome DevTools Protocol client that a test of a static page needs."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)  # Chromium refuses an Origin it was not told to allow
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str):
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out["result"].get("value")


def open_report(chromium: DevTools, results_dir: Path, out: Path, fragment: str = "") -> None:
    """Render ``results_dir`` to ``out`` and load its index.html at 1600 x 1000, waiting until the
    page is ready."""
    report.render(results_dir, out)
    chromium.call("Runtime.enable")
    chromium.call("Page.enable")
    chromium.call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
    chromium.call("Page.navigate", url=(out / "index.html").as_uri() + fragment)
    for _ in range(100):
        if chromium.js("document.readyState === 'complete' && !!document.getElementById('levels')"):
            break
        time.sleep(0.1)


def page_errors(chromium: DevTools) -> list[dict]:
    return [e for e in chromium.events if e.get("method") == "Runtime.exceptionThrown"
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")]


def in_view(chromium: DevTools, selector: str) -> bool:
    """Whether the element is drawn, whole, inside the 1600 x 1000 viewport."""
    return chromium.js(f"(() => {{const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                       "return r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight"
                       " && r.right <= innerWidth;})()")
