"""KSM for Chromium workspaces (``envs/runtime/ksm.py``, the web shop's ``ksm`` knob): the browsers of two
workspaces that opt in end up sharing physical pages merged by ksmd (the same page frames, flagged KSM by the
kernel, mapped in both), a workspace that does not opt in is never scanned, ksmd is tuned while the run lives and
the host's settings come back when it closes, after an engine killed with SIGKILL too (at the next start); the
bookkeeping of several runs holding the tuning at once."""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bunshin.envs import WorkspaceRuntime
from bunshin.envs.runtime import ksm
from bunshin.envs.webshop.suite import WebShopSuite

from .test_chromium_shop import SHOP, act, chromium_processes

KSM_BIT = 1 << 21  # KPF_KSM in /proc/kpageflags
PRESENT, PFN_MASK = 1 << 63, (1 << 55) - 1

needs_ksm = pytest.mark.skipif(not ksm.available(), reason="this kernel has no KSM")


def merged_frames(pid: int) -> set[int]:
    """The page frames of ``pid``'s memory that KSM merged: every present page of a mapping whose smaps counts KSM
    pages (``/proc/PID/pagemap``), kept when ``/proc/kpageflags`` flags its frame KSM."""
    ranges, start = [], None
    try:
        smaps = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return set()
    for line in smaps.splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            a, b = head.split("-")
            start = (int(a, 16), int(b, 16))
        elif head == "KSM:" and int(line.split()[1]) > 0 and start is not None:
            ranges.append(start)
    frames: set[int] = set()
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap, open("/proc/kpageflags", "rb") as flags:
            for a, b in ranges:
                pagemap.seek(a // 4096 * 8)
                data = pagemap.read((b - a) // 4096 * 8)
                for (entry,) in struct.iter_unpack("<Q", data):
                    if entry & PRESENT and (pfn := entry & PFN_MASK):
                        flags.seek(pfn * 8)
                        (bits,) = struct.unpack("<Q", flags.read(8))
                        if bits & KSM_BIT:
                            frames.add(pfn)
    except OSError:
        return set()
    return frames


def workspace_frames(ws) -> set[int]:
    return set().union(*(merged_frames(pid) for pid in ws.cgroup.procs()))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "<gone>"


def has_memory(pid: int) -> bool:
    """Whether ``pid`` still has an address space: not gone, not exiting (its memory already dropped) and not a zombie
    its parent has yet to reap (Chromium reaps its own helpers a moment after they exit; such a process has no
    cmdline and no pages to merge)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


def merge_any(pid: int) -> bool:
    """Whether ``pid`` opted into KSM (``PR_SET_MEMORY_MERGE``: ``ksm_merge_any: yes`` in its ksm_stat)."""
    try:
        return "ksm_merge_any: yes" in Path(f"/proc/{pid}/ksm_stat").read_text()
    except OSError:
        return False


@needs_ksm
@pytest.mark.asyncio
async def test_two_chromium_workspaces_share_merged_pages_and_the_settings_come_back(make_runtime) -> None:
    before = ksm.read_settings()
    rt = await make_runtime(warm_pool=0)
    assert ksm.read_settings() == before  # nothing opted in yet: ksmd untouched
    merging = WebShopSuite(catalog_size=200, time_scale=0.0, browser="chromium", ksm=True).app()
    plain = WebShopSuite(catalog_size=200, time_scale=0.0, browser="chromium").app()
    a, b = await rt.create(merging), await rt.create(merging)
    c = await rt.create(plain)
    assert ksm.read_settings() == ksm.KsmTuning().settings()  # tuned while the run holds it
    for ws in (a, b, c):
        await act(ws, "goto", url=f"{SHOP}/")
    browsers = {ws.id: {pid for pid, _, _ in chromium_processes(rt.run_id)} & set(ws.cgroup.procs())
                for ws in (a, b, c)}
    assert all(browsers.values()), browsers
    assert all(merge_any(pid) for ws in (a, b) for pid in browsers[ws.id])  # every browser process opted in
    assert not any(merge_any(pid) for pid in browsers[c.id])  # the workspace that did not never is scanned

    deadline, shared = time.monotonic() + 120, set()
    while len(shared) <= 100 and time.monotonic() < deadline:  # ksmd's work in another process: polled
        await asyncio.sleep(2.0)
        shared = await asyncio.to_thread(lambda: workspace_frames(a) & workspace_frames(b))
    assert len(shared) > 100, f"ksmd merged {len(shared)} pages across the two workspaces in 120 s"
    assert not (await asyncio.to_thread(workspace_frames, c))  # nothing of the plain workspace was merged
    await rt.close()
    assert ksm.read_settings() == before  # the host's settings back once the run closed
    assert not (ksm.STATE_DIR / ksm.RECORD).exists()


VICTIM = """
import asyncio, sys
from pathlib import Path
from bunshin.envs import WorkspaceRuntime
from bunshin.envs.records import AppSpec

async def main():
    rt = WorkspaceRuntime(state_dir=Path(sys.argv[1]), warm_pool=0)
    await rt.start()
    await rt.create(AppSpec(merge_memory=True))
    print("held", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@needs_ksm
@pytest.mark.asyncio
async def test_an_engine_killed_holding_the_tuning_gives_it_back_at_the_next_start(state_dir: Path) -> None:
    before = ksm.read_settings()
    victim = await asyncio.create_subprocess_exec(sys.executable, "-c", VICTIM, str(state_dir),
                                                  stdout=subprocess.PIPE)
    try:
        assert victim.stdout is not None
        assert (await asyncio.wait_for(victim.stdout.readline(), 120)).decode().strip() == "held"
        assert ksm.read_settings() == ksm.KsmTuning().settings()
    finally:
        victim.kill()
        await victim.wait()
    assert ksm.read_settings() == ksm.KsmTuning().settings()  # nobody gave them back: the engine died
    rt = WorkspaceRuntime(state_dir=state_dir)
    await rt.start()  # its clean-up of dead runs gives the host's settings back
    try:
        assert ksm.read_settings() == before
    finally:
        await rt.close()


# -- the bookkeeping, on a directory standing for ksmd's sysfs directory ----------------------------------------------

@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    d = tmp_path / "ksm"
    d.mkdir()
    for name, value in (("run", "0"), ("pages_to_scan", "100"), ("sleep_millisecs", "20"), ("pages_sharing", "7")):
        (d / name).write_text(f"{value}\n")
    return d


def test_the_last_of_several_holders_gives_the_settings_back(sysfs: Path, tmp_path: Path) -> None:
    state, live = tmp_path / "state", {"r1", "r2"}
    tuning = ksm.KsmTuning(pages_to_scan=777, sleep_millisecs=10)
    original = ksm.read_settings(sysfs)
    ksm.hold("r1", lambda: live, tuning, ksm_dir=sysfs, state_dir=state)
    assert ksm.read_settings(sysfs) == {"run": "1", "pages_to_scan": "777", "sleep_millisecs": "10"}
    (sysfs / "pages_to_scan").write_text("999")  # someone else's change meanwhile is not saved as the host's
    ksm.hold("r2", lambda: live, tuning, ksm_dir=sysfs, state_dir=state)
    assert not ksm.release("r1", lambda: live, ksm_dir=sysfs, state_dir=state)  # r2 still holds it
    assert ksm.read_settings(sysfs)["run"] == "1"
    assert ksm.release("r2", lambda: live, ksm_dir=sysfs, state_dir=state)
    assert ksm.read_settings(sysfs) == original
    assert not (state / ksm.RECORD).exists()
    assert not ksm.release("r2", lambda: live, ksm_dir=sysfs, state_dir=state)  # twice: nothing to give back


def test_dead_holders_are_dropped_at_recovery_and_at_the_next_hold(sysfs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    original = ksm.read_settings(sysfs)
    ksm.hold("dead", lambda: {"dead"}, ksm.KsmTuning(), ksm_dir=sysfs, state_dir=state)
    assert not ksm.recover(lambda: {"dead"}, ksm_dir=sysfs, state_dir=state)  # alive: kept
    assert ksm.recover(lambda: set(), ksm_dir=sysfs, state_dir=state)  # its engine died: settings back
    assert ksm.read_settings(sysfs) == original
    ksm.hold("dead", lambda: {"dead"}, ksm.KsmTuning(), ksm_dir=sysfs, state_dir=state)
    ksm.hold("new", lambda: {"new"}, ksm.KsmTuning(), ksm_dir=sysfs, state_dir=state)  # "dead" died meanwhile
    assert ksm.release("new", lambda: {"new"}, ksm_dir=sysfs, state_dir=state)  # so "new" was the last
    assert ksm.read_settings(sysfs) == original


def test_a_corrupt_record_is_set_aside_and_a_hold_without_ksm_does_nothing(sysfs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / ksm.RECORD).write_text("{not json")
    ksm.hold("r1", lambda: {"r1"}, ksm.KsmTuning(), ksm_dir=sysfs, state_dir=state)
    assert (state / "ksm.corrupt").exists()
    assert ksm.release("r1", lambda: {"r1"}, ksm_dir=sysfs, state_dir=state)
    absent = ksm.KsmHold("r1", lambda: {"r1"}, ksm_dir=tmp_path / "no-ksm", state_dir=state)
    assert not absent.take() and not absent.held
    absent.give_back()
    assert sorted(os.listdir(state)) == ["ksm.corrupt", "ksm.lock"]  # nothing held, nothing written


@needs_ksm
@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["cow", "restore"])
async def test_what_opts_in_is_what_the_fork_cannot_share(make_runtime, backend: str) -> None:
    """A workspace that opts in has every program merged under the private restore (its clones share nothing),
    and under the live fork only its app's own programs (the host's pages are its clones' already)."""
    rt = await make_runtime(backend=backend, warm_pool=0)
    ws = await rt.create(WebShopSuite(catalog_size=50, time_scale=0.0, browser="chromium", ksm=True).app())
    clone = await ws.fork()
    try:
        for w in (ws, clone):
            # Chromium's own (the browser's processes, its crash handler) and ours; each read, then kept only if it
            # still had memory after the reads (a helper Chromium is reaping has no cmdline and nothing to merge)
            seen = {pid: (cmdline(pid), merge_any(pid)) for pid in w.cgroup.procs()}
            seen = {pid: read for pid, read in seen.items() if has_memory(pid)}
            browsers = {pid for pid, (line, _) in seen.items() if line.startswith("/usr/lib/chromium/")}
            others = set(seen) - browsers
            assert browsers and all(seen[pid][1] for pid in browsers)
            assert w.pid in others and len(others) >= 2  # the host and the shop's server worker
            wrong = [seen[pid][0] for pid in others if seen[pid][1] != (backend == "restore")]
            assert not wrong, (backend, w.id, wrong)
    finally:
        await clone.close()
    await ws.close()
