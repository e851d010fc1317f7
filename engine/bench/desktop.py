"""``bunshin bench desktop``: what a real desktop workspace costs: start-up, memory, observations, actions, and
memory at 4, 8, 16 desktops at once.

Owns: the procedure and its tables. Every desktop is a workspace of ``XDesktopApp`` on the image ``desktop``
(Xvfb 1920x1080, D-Bus, openbox; ``docs/osworld.md``), driven through its VM API tool as OSWorld's controllers
drive it. Per desktop, ``--repeat`` times: the time from ``create`` to a session that answers; its memory idle
(PSS summed over its processes, and its cgroup's charge); a task's set-up (a CSV uploaded, LibreOffice Calc
launched on it, until its window shows: the time and the memory after); then ``--calls`` of each observation
(``/screenshot``, ``/accessibility`` with Calc open) and of an action (``/execute`` of OSWorld's pyautogui
command, a pointer move). Then ``--concurrency`` desktops at once, each set up the same way, first private, then
with KSM (every program of a desktop opted in, ksmd tuned by the run): the sum of their PSS and of their cgroups'
charges, sampled every second for ``--window`` seconds once all are up (peak, mean, last), ksmd's CPU seconds
and KSM's ``pages_sharing`` at the end. A cgroup's charge counts a shared file page (the image's libraries) in
the first cgroup that read it only: PSS is the fair per-desktop figure, the summed charge the machine's.
Leaves out: forks (a desktop cannot be forked live), the HTTP
hop of OSWorld's controllers (``envs/xdesktop/http.py``: the tool call is what it wraps).
Must never: tune what it measures; leave a workspace behind.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs import ToolCall, Workspace, WorkspaceRuntime
from bunshin.envs.records import Limits
from bunshin.envs.runtime import ksm
from bunshin.envs.xdesktop.app import desktop_app

from ..errors import EngineError
from ..report import markdown_table, percentile, pyplot, write_json
from .memory import ksmd_cpu_s

DESKTOP = desktop_app()
CSV = "\n".join(["item,price,quantity"] + [f"item {i},{i * 1.5:.2f},{i % 7 + 1}" for i in range(200)]) + "\n"
MIB = 1 << 20


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _vm(ws: Workspace, method: str, path: str, **request: Any) -> tuple[int, bytes, float]:
    started = time.monotonic()
    obs = await ws.execute(ToolCall(name="vm", args={"method": method, "path": path, **request}), timeout_s=240)
    took = time.monotonic() - started
    if obs.error is not None or obs.data.get("status") != 200:
        raise EngineError(f"bench desktop: {method} {path}: {obs.error or obs.data.get('body', b'')[:300]!r}")
    return obs.data["status"], obs.data["body"], took


async def _set_up(ws: Workspace) -> float:
    """A task's set-up: the CSV uploaded, Calc launched on it; seconds until its window shows."""
    started = time.monotonic()
    await _vm(ws, "POST", "/setup/upload", form={"file_path": "/home/agent/data.csv"}, files={"file_data": CSV.encode()})
    await _vm(ws, "POST", "/setup/launch", json={"command": ["soffice", "--calc", "--norestore", "/home/agent/data.csv"]})
    _, body, _ = await _vm(ws, "POST", "/execute_with_verification",
                           json={"command": ["true"], "verification": {"window_exists": "data.csv"},
                                 "max_wait_time": 180, "check_interval": 0.2})
    if json.loads(body).get("verification") != "passed":
        raise EngineError("bench desktop: Calc's window did not show")
    return time.monotonic() - started


async def _memory(ws: Workspace) -> tuple[int, int]:
    stats = await asyncio.to_thread(ws.memory)
    return stats.pss, stats.cgroup_charge


async def _one(rt: WorkspaceRuntime, calls: int, k: int, repeat: int) -> dict[str, Any]:
    started = time.monotonic()
    ws = await rt.create(DESKTOP)
    try:
        sample: dict[str, Any] = {"ready_s": time.monotonic() - started}
        await asyncio.sleep(1)  # the session's programs finish starting up
        sample["idle_pss"], sample["idle_charge"] = await _memory(ws)
        sample["setup_s"] = await _set_up(ws)
        await asyncio.sleep(2)
        sample["setup_pss"], sample["setup_charge"] = await _memory(ws)
        for name, method, path, request in (
                ("screenshot", "GET", "/screenshot", {}),
                ("a11y tree", "GET", "/accessibility", {}),
                ("pyautogui action", "POST", "/execute",
                 {"json": {"command": ["python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; "
                                                       "pyautogui.moveTo(400, 300)"]}})):
            times, sizes = [], []
            for _ in range(calls):
                _, body, took = await _vm(ws, method, path, **request)
                times.append(took)
                sizes.append(len(body))
            sample[name] = times
            sample[f"{name} bytes"] = sizes
        _log(f"[desktop {k + 1}/{repeat}] ready {sample['ready_s']:.2f} s, Calc {sample['setup_s']:.2f} s, "
             f"PSS idle {sample['idle_pss'] / MIB:.0f} MiB, after set-up {sample['setup_pss'] / MIB:.0f} MiB")
        return sample
    finally:
        await ws.close()


async def _concurrent(rt: WorkspaceRuntime, n: int, window_s: float, merge: bool) -> dict[str, Any]:
    workspaces: list[Workspace] = []
    app = desktop_app(ksm=merge)
    try:
        started = time.monotonic()
        cpu_before = ksmd_cpu_s()
        made = await asyncio.gather(*(rt.create(app) for _ in range(n)), return_exceptions=True)
        workspaces = [ws for ws in made if isinstance(ws, Workspace)]
        failed = [m for m in made if not isinstance(m, Workspace)]
        if failed:
            raise EngineError(f"bench desktop: {len(failed)} of {n} desktops did not start: {failed[0]!r}")
        await asyncio.gather(*(_set_up(ws) for ws in workspaces))
        up_s = time.monotonic() - started
        pss, charge = [], []
        for _ in range(max(1, int(window_s))):
            both = await asyncio.gather(*(_memory(ws) for ws in workspaces))
            pss.append(sum(p for p, _ in both))
            charge.append(sum(c for _, c in both))
            await asyncio.sleep(1)
        cpu_after = ksmd_cpu_s()
        sharing = ksm.read_counters().get("pages_sharing", 0) if ksm.available() else 0
        mode = "ksm" if merge else "private"
        _log(f"[{n} desktops, {mode}] up in {up_s:.1f} s; PSS peak {max(pss) / MIB:.0f} MiB, last {pss[-1] / MIB:.0f}")
        return {"desktops": n, "mode": mode, "up_s": up_s, "pss": pss, "charge": charge,
                "ksmd_cpu_s": (cpu_after - cpu_before) if cpu_before is not None and cpu_after is not None else None,
                "pages_sharing": sharing}
    finally:
        await asyncio.gather(*(ws.close() for ws in workspaces), return_exceptions=True)


def _stat(xs: list[float]) -> dict[str, float]:
    return {"p50": percentile(xs, 50), "min": min(xs), "max": max(xs)}


def _plot(per: list[dict[str, Any]], together: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["screenshot", "a11y tree", "pyautogui action"]
    p50 = [percentile([t * 1e3 for s in per for t in s[name]], 50) for name in names]
    p95 = [percentile([t * 1e3 for s in per for t in s[name]], 95) for name in names]
    left.bar(names, p50, label="p50")
    left.scatter(names, p95, marker="_", s=300, color="black", label="p95")
    left.set_ylabel("ms per call (through the runtime)")
    left.set_title("a desktop workspace: observations and an action")
    left.legend()
    left.grid(alpha=0.3, axis="y")
    for mode, marker in (("private", "o"), ("ksm", "s")):
        runs = [r for r in together if r["mode"] == mode]
        ns = [r["desktops"] for r in runs]
        right.plot(ns, [r["pss"][-1] / MIB / 1024 for r in runs], marker=marker, label=f"PSS at the end, {mode}")
        right.plot(ns, [max(r["charge"]) / MIB / 1024 for r in runs], marker=marker, linestyle="--",
                   label=f"cgroup charge, peak, {mode}")
    right.set_xlabel("desktops at once (each with LibreOffice Calc open)")
    right.set_ylabel("GiB, summed over the desktops")
    right.set_title("memory of concurrent desktops, private and with KSM")
    right.legend()
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(repeat: int, calls: int, concurrency: list[int], window_s: float, json_path: Path | None,
              plot_path: Path | None) -> dict[str, Any]:
    limits = Limits(memory_bytes=4 << 30, pids=2048, command_timeout_s=240)
    async with WorkspaceRuntime(limits=limits, start_timeout_s=240) as rt:
        per = [await _one(rt, calls, k, repeat) for k in range(repeat)]
        together = [await _concurrent(rt, n, window_s, merge) for n in concurrency for merge in (False, True)]
    rows = []
    for label, key, scale, unit in (("create to a session that answers", "ready_s", 1, "s"),
                                    ("set-up: CSV in, Calc's window shown", "setup_s", 1, "s"),
                                    ("PSS idle", "idle_pss", 1 / MIB, "MiB"), ("charge idle", "idle_charge", 1 / MIB, "MiB"),
                                    ("PSS after set-up", "setup_pss", 1 / MIB, "MiB"),
                                    ("charge after set-up", "setup_charge", 1 / MIB, "MiB")):
        stat = _stat([s[key] * scale for s in per])
        rows.append({"what": label, "unit": unit, **{k: round(v, 2) for k, v in stat.items()}, "n": len(per)})
    for name in ("screenshot", "a11y tree", "pyautogui action"):
        stat = _stat([t * 1e3 for s in per for t in s[name]])
        rows.append({"what": f"{name} (bytes p50 {percentile([b for s in per for b in s[f'{name} bytes']], 50):.0f})",
                     "unit": "ms", **{k: round(v, 2) for k, v in stat.items()},
                     "n": sum(len(s[name]) for s in per)})
    print(markdown_table(rows, [("what", "per desktop"), ("unit", "unit"), ("p50", "p50"), ("min", "min"),
                                ("max", "max"), ("n", "n")]))
    crowd = [{"desktops": r["desktops"], "mode": r["mode"], "up_s": round(r["up_s"], 1),
              "pss_mean_gib": round(sum(r["pss"]) / len(r["pss"]) / MIB / 1024, 2),
              "pss_last_gib": round(r["pss"][-1] / MIB / 1024, 2),
              "ksmd_cpu_s": round(r["ksmd_cpu_s"], 2) if r["ksmd_cpu_s"] is not None else None,
              "pages_sharing": r["pages_sharing"],
              "charge_peak_gib": round(max(r["charge"]) / MIB / 1024, 2),
              "charge_mean_gib": round(sum(r["charge"]) / len(r["charge"]) / MIB / 1024, 2),
              "pss_peak_gib": round(max(r["pss"]) / MIB / 1024, 2),
              "charge_per_desktop_mib": round(max(r["charge"]) / r["desktops"] / MIB)} for r in together]
    print()
    print(markdown_table(crowd, [("desktops", "desktops at once"), ("mode", "memory"), ("up_s", "all set up, s"),
                                 ("pss_peak_gib", "PSS peak GiB"), ("pss_mean_gib", "PSS mean GiB"),
                                 ("pss_last_gib", "PSS last GiB"), ("charge_peak_gib", "charge peak GiB"),
                                 ("charge_mean_gib", "charge mean GiB"), ("charge_per_desktop_mib", "charge/desktop MiB"),
                                 ("ksmd_cpu_s", "ksmd CPU s"), ("pages_sharing", "KSM pages_sharing")]))
    data = {"repeat": repeat, "calls": calls, "window_s": window_s, "per_desktop": rows, "concurrent": crowd,
            "samples": per, "concurrent_samples": together}
    if json_path:
        write_json(json_path, data)
    if plot_path:
        _plot(per, together, plot_path)
    return data
