"""The agent as an adversary of a Chromium workspace: pages it serves itself from inside its workspace (``shell``:
files under its home, ``python3 -m http.server`` on another port of the workspace's loopback) and makes Chromium
load. Every call answers well inside the runtime's deadline, the next call in the same workspace answers normally,
nothing lands on disk, and nothing outside the workspace is reachable. An engine killed with SIGKILL leaves no
Chromium behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.chromium.browser import MAX_TABS, OPEN_LIMIT, PAGE_S

from .conftest import leftovers
from .quiet import settled
from .test_browser_workspace import serve_site, sh
from .test_chromium_shop import SHOP, act, chromium_processes, shop

pytestmark = pytest.mark.asyncio


async def timed(ws, name: str, **args: object):
    started = time.monotonic()
    obs = await ws.execute(ToolCall(name=name, args=args))
    return obs, time.monotonic() - started


async def still_serves(ws) -> None:
    home = await act(ws, "goto", url=f"{SHOP}/")
    assert home.data["title"] == "Home Page"


async def test_an_endless_script_is_stopped_and_the_workspace_goes_on(runtime) -> None:
    _, ws, _ = await shop(runtime)
    site = await serve_site(ws, "open('loop.html', 'w').write('<title>Loop</title><p>before</p>"
                                "<script>for (;;) {}</script><p>after</p>')")
    obs, took = await timed(ws, "goto", url=f"{site}/loop.html")
    assert obs.error and "did not finish loading" in obs.error and "scripts were stopped" in obs.error, obs
    assert took < PAGE_S + 5
    await still_serves(ws)
    await ws.close()


async def test_a_huge_dom_answers_bounded(runtime) -> None:
    _, ws, _ = await shop(runtime)
    site = await serve_site(ws, "open('divs.html', 'w').write('<title>Deep</title>' + '<div>x' * 200_000)")
    obs, took = await timed(ws, "goto", url=f"{site}/divs.html")
    limit = runtime.limits.command_timeout_s
    assert took < limit, (took, obs.error)
    assert obs.error or len(obs.output) < 2_000_000
    await still_serves(ws)
    await ws.close()


async def test_downloads_are_refused_and_local_files_unreachable(runtime) -> None:
    _, ws, _ = await shop(runtime)
    script = ("open('big.bin', 'wb').write(b'x' * (1 << 20))\n"
              "open('dl.html', 'w').write('<title>Download</title><a href=\"/big.bin\" download>get it</a>"
              "<a href=\"file:///etc/passwd\">local</a>')")
    site = await serve_site(ws, script)
    page = await act(ws, "goto", url=f"{site}/dl.html")
    for name in ("get it", "local"):
        link = next(int(line.strip()[1:line.strip().index("]")]) for line in page.output.splitlines()
                    if f"link '{name}'" in line)
        obs = await ws.execute(ToolCall(name="click", args={"element_id": link}))
        assert obs.error is None and obs.data["url"] == f"{site}/dl.html", (name, obs.data.get("url"))
    refused = await ws.execute(ToolCall(name="goto", args={"url": "file:///etc/passwd"}))
    assert refused.error and "only http(s) URLs" in refused.error
    # nothing was written anywhere the agent or the workspace's layer sees (the browser's /tmp is its own tmpfs)
    found = await sh(ws, "find / -xdev -name 'big.bin*' -newer /etc/hostname 2>/dev/null | grep -v '/site/' || true")
    assert found.strip() == ""
    await ws.close()


async def test_another_port_is_the_workspace_own_and_nothing_outside(runtime) -> None:
    _, ws, _ = await shop(runtime)
    site = await serve_site(ws, "open('hi.html', 'w').write('<title>Own port</title>')")
    own = await act(ws, "goto", url=f"{site}/hi.html")
    assert own.data["title"] == "Own port"  # a port of the workspace's own loopback: the agent's to use
    outside = await ws.execute(ToolCall(name="goto", args={"url": "http://10.0.2.2:80/"}))
    assert outside.error is None and outside.data["status"] == 0  # Chromium's error page: no route off lo
    await ws.close()


async def test_an_engine_killed_leaves_no_chromium(state_dir: Path) -> None:
    victim = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.chromium_victim", str(state_dir),
                                                  stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        assert victim.stdout is not None
        _, run_id, run_dir_text = (await asyncio.wait_for(victim.stdout.readline(), 120)).decode().split()
        assert (await asyncio.wait_for(victim.stdout.readline(), 120)).decode().strip() == "forked"
        assert len({uid for _, uid, _ in chromium_processes(run_id)}) == 1 and len(chromium_processes(run_id)) >= 2
    finally:
        victim.kill()
        await victim.wait()
    assert await settled(lambda: chromium_processes(run_id), 10) == []  # every Chromium died with its host
    rt = WorkspaceRuntime(state_dir=state_dir)
    await rt.start()  # and the next start cleans the rest of the run (cgroups, mounts, directories)
    try:
        assert leftovers(run_id, Path(run_dir_text), ignore=frozenset({rt.nursery.pid})) == []
    finally:
        await rt.close()


async def test_a_popup_storm_opens_a_few_windows_and_the_workspace_goes_on(runtime) -> None:
    _, ws, _ = await shop(runtime)
    script = ("open('storm.html', 'w').write('<title>Storm</title><button onclick=\"for (let i = 0; i < 200; i++) "
              "window.open(\\'/p\\' + i)\">storm</button>')")
    site = await serve_site(ws, script)
    page = await act(ws, "goto", url=f"{site}/storm.html")
    button = next(int(line.strip()[1:line.strip().index("]")]) for line in page.output.splitlines()
                  if "button 'storm'" in line)
    obs, took = await timed(ws, "click", element_id=button)
    assert obs.error is None and took < PAGE_S, (took, obs.error)
    assert 1 < len(obs.data["tabs"]) <= 1 + OPEN_LIMIT <= MAX_TABS, obs.data["tabs"]
    await act(ws, "tab_focus", tab_index=0)
    await still_serves(ws)
    await ws.close()
