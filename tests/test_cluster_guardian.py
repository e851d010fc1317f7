"""The guardian of a node agent's run, without Ray: a real engine process killed with SIGKILL has its run removed
(processes, cgroups, mounts, directory) by its guardian alone; a run whose engine is alive is never touched; an
agent that closes stops its guardian."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bunshin.engine.cluster.guardian import spawn_guardian, stop_guardian
from bunshin.envs.runtime.cleanup import process_start_time

from .conftest import leftovers
from .quiet import settled_sync

VICTIM = """
import asyncio, sys
from pathlib import Path
from bunshin.envs import AppSpec, ToolCall, WorkspaceRuntime

async def main():
    rt = WorkspaceRuntime(state_dir=Path(sys.argv[1]))
    await rt.start()
    ws = await rt.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 8 << 20}))
    await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 600 > /dev/null 2>&1 &"}))
    await ws.fork()
    print(rt.run_id, rt.run_dir, flush=True)
    await asyncio.Event().wait()  # alive until the test kills it

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


POLL_SYSCALLS = {"x86_64": {7, 271}, "aarch64": {73}}  # poll(2), ppoll(2)


def waits_for_the_engine(guardian: int) -> bool:
    """The guardian is blocked in poll(2) on the engine's pidfd: it found the engine alive (its pid and start time)
    and does nothing until it dies."""
    try:
        number = int(Path(f"/proc/{guardian}/syscall").read_text().split()[0])
    except (OSError, ValueError):  # gone, or running ("running" is not a number)
        return False
    return number in POLL_SYSCALLS[platform.machine()]


@pytest.fixture
def engine(state_dir: Path):
    proc = subprocess.Popen([sys.executable, "-c", VICTIM, str(state_dir)], stdout=subprocess.PIPE, text=True)
    try:
        run_id, run_dir = proc.stdout.readline().split()
        yield proc, run_id, Path(run_dir)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_engine_has_its_run_removed_by_its_guardian(engine, state_dir: Path) -> None:
    proc, run_id, run_dir = engine
    guardian = spawn_guardian(proc.pid, state_dir, run_id)
    ppid = int(Path(f"/proc/{guardian}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert alive(guardian) and ppid != os.getpid() and os.getsid(guardian) != os.getsid(0)  # detached
    assert settled_sync(lambda: not waits_for_the_engine(guardian), 30) is False  # (another process: polled)
    assert run_dir.exists() and alive(guardian)  # the engine lives: nothing touched
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert settled_sync(lambda: leftovers(run_id, run_dir), 30) == []
    assert settled_sync(lambda: alive(guardian), 10) is False


def test_a_closing_agent_stops_its_guardian_and_a_dead_pid_is_handled(engine, state_dir: Path) -> None:
    proc, run_id, run_dir = engine
    guardian = spawn_guardian(proc.pid, state_dir, run_id)
    stop_guardian(guardian)
    assert settled_sync(lambda: alive(guardian), 10) is False
    assert run_dir.exists()  # the engine is alive: its run is its own
    stop_guardian(guardian)  # twice: nothing happens
    # an engine already dead when its guardian starts (the pid gone, or reused: the start time differs)
    proc.kill()
    proc.wait()
    assert process_start_time(proc.pid) is None
    late = spawn_guardian(proc.pid, state_dir, run_id)
    assert settled_sync(lambda: leftovers(run_id, run_dir), 30) == []
    assert settled_sync(lambda: alive(late), 10) is False
