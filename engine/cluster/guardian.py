"""The guardian: one small process per node agent that removes the agent's run when the agent dies without closing it.

Owns: ``spawn_guardian`` (the agent starts it, detached: its own session, re-parented away from the agent, so
neither Ray killing the agent's process group or children nor the agent's death takes it along) and the process
itself (``python -m bunshin.engine.cluster.guardian PID START_TIME STATE_DIR RUN_ID``): it waits for the agent's
death on a pidfd, then runs the dead-run clean-up every engine runs at its start (``envs/runtime/cleanup.py``:
processes through the run's cgroups, the pool mount, the run directory) until nothing of that run is left. An
agent that closes its engine itself stops its guardian (SIGTERM) afterwards. This is what a real cluster needs too:
a raylet killed (node preempted, OOM) takes its workers with it, and nobody else on that machine would remove
their workspaces until the next bunshin run there.
Must never: touch a run whose engine is alive (``remove_stale_runs`` checks the engine's pid and start time), or
outlive the clean-up it waits for.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GIVE_UP_S = 60.0


def spawn_guardian(pid: int, state_dir: Path, run_id: str) -> int:
    """Start the guardian of the engine process ``pid``'s run ``run_id``; its pid (it is not our child: the
    launcher forks it and exits, so it is nobody's in Ray's process tree)."""
    from bunshin.envs.runtime.cleanup import process_start_time

    launcher = subprocess.run(
        [sys.executable, "-m", "bunshin.engine.cluster.guardian", str(pid), str(process_start_time(pid)),
         str(state_dir), run_id],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None, start_new_session=True, check=True,
        timeout=30)
    return int(launcher.stdout.split()[0])


def stop_guardian(pid: int) -> None:
    """The agent closed its run itself: the guardian has nothing to do."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGTERM)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


def leftovers(state_dir: Path, run_id: str) -> list[str]:
    found = []
    if (state_dir / "runs" / run_id).exists():
        found.append("run directory")
    cgroups = Path("/sys/fs/cgroup")
    if cgroups.is_dir():
        for root in cgroups.iterdir():
            if (root / f"bunshin-{run_id}").exists():
                found.append(f"cgroup {root.name}")
    return found


def guard(pid: int, start_time: int | None, state_dir: Path, run_id: str) -> None:
    from bunshin.envs.runtime.cleanup import process_start_time, remove_stale_runs

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = None
    if fd is not None:
        if process_start_time(pid) != start_time:  # the pid was reused: the agent is already gone
            os.close(fd)
        else:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
            os.close(fd)
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        removed = remove_stale_runs(state_dir)
        if removed:
            print(f"bunshin guardian: agent {pid} died; removed {', '.join(removed)}", file=sys.stderr, flush=True)
        if not leftovers(state_dir, run_id) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def main(argv: list[str]) -> None:
    pid, start_time, state_dir, run_id = int(argv[0]), argv[1], Path(argv[2]), argv[3]
    child = os.fork()
    if child:  # the launcher: say who the guardian is and go (the guardian is re-parented away from the agent)
        print(child, flush=True)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    guard(pid, None if start_time == "None" else int(start_time), state_dir, run_id)


if __name__ == "__main__":
    main(sys.argv[1:])
