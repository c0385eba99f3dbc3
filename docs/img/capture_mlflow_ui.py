"""Screenshots of the real MLflow UI for docs/results.md, rendered by headless Chromium.

    python docs/img/capture_mlflow_ui.py --tracking-uri sqlite:////abs/mlflow.db --experiment smoke

Starts `mlflow ui` on the store (127.0.0.1, a free port), drives headless Chromium through the
DevTools protocol (aiohttp's websocket client; aiohttp comes with ray[default]) the way the
walk-through in docs/results.md tells a person to, and writes docs/img/mlflow_ui_*.png:
  mlflow_ui_runs.png          the experiment's runs table, the sweep's trials nested under it
  mlflow_ui_loss_by_hook.png  chart view, runs grouped by param `hook`, charts filtered to loss
  mlflow_ui_loss_chart.png    that `loss` chart full screen: loss against step per hook
Not a test: a documentation tool, run by hand after a real sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except Exception:
            time.sleep(1)
    raise SystemExit(f"capture_mlflow_ui: {url} did not answer within {timeout:.0f} s")


class Page:
    """A Chromium page driven over the DevTools protocol."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=120)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def js(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                                 returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 120, what: str = "") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if await self.js(f"!!({expression})"):
                return
            await asyncio.sleep(0.5)
        debug = Path(tempfile.gettempdir()) / "capture_mlflow_ui_debug.png"
        await self.screenshot(debug)
        text = await self.js("document.body.innerText")
        raise RuntimeError(f"timed out waiting for {what or expression}; page text: "
                           f"{text[:1500]!r}; screenshot: {debug}")

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await asyncio.sleep(2)
        await self.wait_for("document.readyState === 'complete'", what="page load")

    async def click(self, element_js: str, what: str = "") -> None:
        """A real mouse click (DevTools Input events) at the centre of the element that the
        JavaScript expression `element_js` returns."""
        rect = await self.js(f"""(() => {{
          const el = {element_js};
          if (!el) return null;
          el.scrollIntoView({{block: 'center', inline: 'center'}});
          const r = el.getBoundingClientRect();
          return {{x: r.x + r.width / 2, y: r.y + r.height / 2}};
        }})()""")
        if rect is None:
            raise RuntimeError(f"nothing to click: {what or element_js}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=rect["x"], y=rect["y"],
                            button="left", clickCount=1)
        await asyncio.sleep(1.5)

    async def screenshot(self, path: Path) -> None:
        result = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(result["data"]))
        print(f"wrote {path}")


async def capture(base: str, experiment_id: str, debug_port: int, out: Path, width: int,
                  height: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/json/list") as r:
        target = next(t for t in json.load(r) if t["type"] == "page")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            await page.call("Runtime.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                            deviceScaleFactor=1, mobile=False)
            # 1. The runs table, the sweep's parent run expanded: its trials nested under it.
            await page.goto(f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning")
            in_table = (f"Array.from(document.querySelectorAll('.ag-cell span')).find(s => "
                        f"s.innerText === {json.dumps(parent_name[0])})")
            await page.wait_for(in_table, what="the parent run in the runs table")
            await asyncio.sleep(2)
            if await page.js("!!document.querySelector("
                             "'[data-component-id=\"mlflow.assistant.chat_panel.close\"]')"):
                await page.click("document.querySelector("
                                 "'[data-component-id=\"mlflow.assistant.chat_panel.close\"]')",
                                 "the assistant panel's close button")
            await page.click(f"{in_table}.closest('.ag-cell').querySelector('button')",
                             "the parent run's expand button")
            await page.wait_for(f"document.body.innerText.includes({json.dumps(run_names[-1][:12])})",
                                what="the nested trials")
            await asyncio.sleep(2)
            await page.screenshot(out / "mlflow_ui_runs.png")
            # 2. Chart view, grouped by the `hook` param, charts filtered to `loss`.
            await page.click("document.querySelector('input[value=CHART]').closest('label')",
                             "the Chart view toggle")
            await page.wait_for("document.querySelector('[data-component-id*=groupbyselector]')",
                                what="the Group by control")
            await page.click("document.querySelector('[data-component-id*=groupbyselector]')",
                             "Group by")
            await page.wait_for("Array.from(document.querySelectorAll('[role^=menuitem]'))"
                                ".some(e => e.innerText.trim() === 'hook')", what="the hook param")
            await page.click("Array.from(document.querySelectorAll('[role^=menuitem]'))"
                             ".find(e => e.innerText.trim() === 'hook')", "Group by: hook")
            for kind in ("keyDown", "keyUp"):
                await page.call("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape",
                                windowsVirtualKeyCode=27)
            await page.click("document.querySelector('input[placeholder=\"Search metric charts\"]')",
                             "the chart search box")
            await page.call("Input.insertText", text="loss")
            await page.wait_for("Array.from(document.querySelectorAll("
                                "'[data-component-id=fullscreen_button_chartcard]')).length >= 2",
                                what="the loss charts")
            await asyncio.sleep(4)
            await page.screenshot(out / "mlflow_ui_loss_by_hook.png")
            # 3. The `loss` chart full screen: loss against step, one line (and band) per hook.
            await page.click("Array.from(document.querySelectorAll('[data-component-id="
                             "fullscreen_button_chartcard]')).find(b => { let card = b; "
                             "while (card.parentElement && card.parentElement.querySelectorAll("
                             "'[data-component-id=fullscreen_button_chartcard]').length === 1) "
                             "card = card.parentElement; "
                             "return card.innerText.trim().split('\\n')[0] === 'loss'; })",
                             "the loss chart's full-screen button")
            await asyncio.sleep(5)
            await page.screenshot(out / "mlflow_ui_loss_chart.png")


run_names: list[str] = []
parent_name: list[str] = []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", required=True, help="sqlite:////abs/path/mlflow.db")
    parser.add_argument("--experiment", required=True, help="experiment name (the config's name)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--ui-url", default=None,
                        help="use an `mlflow ui` already serving this store instead of starting one")
    args = parser.parse_args()

    from mlflow import MlflowClient

    client = MlflowClient(args.tracking_uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"capture_mlflow_ui: no experiment {args.experiment!r}")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    run_names.extend(r.info.run_name for r in children)
    parent_name.append(parent.info.run_name)

    ui_port, debug_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="mlflow-ui-shot-"))
    # One worker and no background job runner: only the UI is needed, on a shared machine.
    ui = None if args.ui_url else subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", args.tracking_uri,
         "--host", "127.0.0.1", "--port", str(ui_port), "--workers", "1"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=open(tmp / "ui.log", "w"), stderr=subprocess.STDOUT)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}",
                                f"--remote-debugging-port={debug_port}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = args.ui_url.rstrip("/") if args.ui_url else f"http://127.0.0.1:{ui_port}"
        wait_http(base + "/health", 600)
        wait_http(f"http://127.0.0.1:{debug_port}/json/version", 60)
        asyncio.run(capture(base, experiment.experiment_id, debug_port, args.out, args.width,
                            args.height))
    finally:
        procs = [p for p in (browser, ui) if p is not None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
