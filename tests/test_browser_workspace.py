"""Hostile pages in real workspaces: the agent serves them itself, from inside its workspace, with the ``shell``
tool (files under its home, ``python3 -m http.server`` in the background on the workspace's loopback), then
``goto``s them. The call answers within seconds, far inside the runtime's deadline, with a bounded page that says
it was cut (or with images shown as placeholders), the next call in the same workspace answers normally, and a
second workspace beside it answers while and after."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path

import pytest

from bunshin.envs import ToolCall
from bunshin.envs.records import Observation
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.envs.workspace import deadline_s

from .test_browser_hostile import HUGE, write_solid_png

pytestmark = pytest.mark.asyncio

PORT = 8123
FAST_S = 20.0  # the hostile goto must answer within this (it measures a few seconds); the deadline is 40 s
OBSERVE = ToolCall(name="observe", args={})


async def sh(ws, cmd: str) -> str:
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))
    assert obs.error is None and obs.exit_code == 0, obs
    return obs.output


async def serve_site(ws, script: str) -> str:
    """Run ``script`` (Python, writing the site under ~/site), serve ~/site on the workspace's loopback in the
    background, and wait (polling with a deadline, inside the workspace) until it answers."""
    await sh(ws, f"mkdir -p ~/site && cd ~/site && python3 - <<'EOF'\n{script}\nEOF")
    await sh(ws, f"nohup python3 -m http.server {PORT} --bind 127.0.0.1 --directory ~/site > /dev/null 2>&1 &")
    await sh(ws, "python3 - <<'EOF'\n"
                 "import time, urllib.request\n"
                 "deadline = time.monotonic() + 20\n"
                 "while True:\n"
                 "    try:\n"
                 f"        urllib.request.urlopen('http://127.0.0.1:{PORT}/', timeout=1).read(); break\n"
                 "    except OSError:\n"
                 "        if time.monotonic() > deadline: raise\n"
                 "        time.sleep(0.05)\n"
                 "EOF")
    return f"http://127.0.0.1:{PORT}"


def memory_peak(ws) -> int | None:
    """The workspace cgroup's peak memory charge, when the kernel keeps one (v1 max_usage, v2 memory.peak)."""
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        path = Path(ws.cgroup.path("memory")) / name
        if path.exists():
            return int(path.read_text())
    return None


async def hostile_goto_beside_another(runtime, ws, other, url: str) -> tuple[Observation, float, Observation]:
    """The hostile goto in ``ws`` and, at the same time, an observation in ``other``."""
    async def timed_goto() -> tuple[Observation, float]:
        started = time.monotonic()
        obs = await ws.execute(ToolCall(name="goto", args={"url": url}))
        return obs, time.monotonic() - started

    async with asyncio.TaskGroup() as group:
        hostile = group.create_task(timed_goto())
        beside = group.create_task(other.execute(OBSERVE))
    obs, took = hostile.result()
    deadline = deadline_s(runtime.limits.command_timeout_s, runtime.limits)  # when the runtime kills the host
    assert took < FAST_S and took < deadline / 4, (took, deadline)
    return obs, took, beside.result()


async def a_shop_pair(runtime) -> tuple[WebShopSuite, object, object]:
    suite = WebShopSuite(catalog_size=200, time_scale=0.0)
    ws, other = await runtime.create(suite.app()), await runtime.create(suite.app())
    for w in (ws, other):
        first = await w.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/"}))
        assert first.error is None and first.data["title"] == "Home Page"
    return suite, ws, other


async def test_nested_divs_served_by_the_agent_answer_fast_and_truncated(runtime) -> None:
    _, ws, other = await a_shop_pair(runtime)
    site = await serve_site(ws, "open('divs.html', 'w').write('<div>' * 200_000 + 'deep')")
    obs, took, beside = await hostile_goto_beside_another(runtime, ws, other, f"{site}/divs.html")
    print(f"200,000 nested divs: goto answered in {took:.2f}s")
    assert obs.error is None, obs.error
    assert "[page truncated: it has more than 50,000 elements and text runs" in obs.output
    assert len(obs.output) < 10_000 and obs.data["truncated"]
    assert beside.error is None and beside.data["title"] == "Home Page"
    home = await ws.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/"}))  # the next call
    assert home.error is None and home.data["title"] == "Home Page" and "[page truncated" not in home.output
    back = await ws.execute(ToolCall(name="go_back", args={}))
    assert back.error is None and back.data["truncated"]  # the cut page, from the back/forward cache
    after = await other.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/checkout/cart/"}))
    assert after.error is None and after.data["title"] == "Shopping Cart"


async def test_twenty_huge_pngs_served_by_the_agent_answer_fast(runtime) -> None:
    _, ws, other = await a_shop_pair(runtime)
    script = ("from __future__ import annotations\nimport os, struct, zlib\nfrom typing import BinaryIO\n\n"
              + inspect.getsource(write_solid_png) + "\n"
              f"write_solid_png('huge.png', {HUGE}, {HUGE})\n"
              "for i in range(20):\n"
              "    os.symlink('huge.png', f'huge{i}.png')\n"
              "open('images.html', 'w').write('<html><head><title>Pictures</title></head><body>' + ''.join(\n"
              "    f'<img src=\"huge{i}.png\" width=\"1\" height=\"1\" alt=\"huge {i}\">' for i in range(20)))\n")
    site = await serve_site(ws, script)
    assert "huge.png" in await sh(ws, "ls -l ~/site")
    peak_before = memory_peak(ws)
    obs, took, beside = await hostile_goto_beside_another(runtime, ws, other, f"{site}/images.html")
    print(f"20 PNGs of {HUGE}x{HUGE}: goto answered in {took:.2f}s")
    assert obs.error is None, obs.error
    assert obs.data["title"] == "Pictures" and "img 'huge 19'" in obs.output  # placeholders
    assert beside.error is None and beside.data["title"] == "Home Page"
    peak_after = memory_peak(ws)
    print(f"workspace memory peak: {peak_before} -> {peak_after} bytes")
    if peak_before is not None and peak_after is not None:  # one decoded image alone would be 576 MB
        assert peak_after - peak_before < 200 << 20, (peak_before, peak_after)
    again = await ws.execute(OBSERVE)
    assert again.error is None and again.output == obs.output
    home = await ws.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/"}))
    assert home.error is None and home.data["title"] == "Home Page"
    assert (await other.execute(OBSERVE)).error is None
