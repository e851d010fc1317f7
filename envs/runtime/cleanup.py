"""Clean-up of runs whose engine died (killed, crashed, machine reset): the path taken at every start.

Owns: deciding that a run is dead (its engine's PID is gone or belongs to a newer process) and removing what it
left: processes (through its cgroups), the pool mount and its loop device, the run directory, its hold on ksmd's
tuning (``ksm.py``).
Every engine also registers its run in a machine-wide directory (``ENGINES``), whatever its state directory: a
``bunshin-*`` cgroup belongs to a live run if its engine is registered and alive, so engines with different state
directories (a test suite and a benchmark, say) never remove each other's cgroups.
Must never: touch a run whose engine is alive.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from . import ksm, syscalls
from .cgroups import Cgroup, CgroupLayout, CgroupUnavailable, remove_in_every_hierarchy


def process_start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks since boot


STAGING_GRACE_S = 60.0
ENGINES = Path("/run/bunshin/engines")  # tmpfs: emptied at boot, when every run is dead anyway


def engine_record(run_id: str, pid: int) -> str:
    return json.dumps({"pid": pid, "start_time": process_start_time(pid), "run_id": run_id})


def register(run_id: str, record: str) -> None:
    """Announce a live run to every engine on this machine (before its cgroups exist)."""
    ENGINES.mkdir(parents=True, exist_ok=True)
    staging = ENGINES / f".{run_id}"
    staging.write_text(record)
    staging.rename(ENGINES / run_id)


def unregister(run_id: str) -> None:
    (ENGINES / run_id).unlink(missing_ok=True)


def registered_live_runs() -> set[str]:
    """Run ids registered by engines that are still alive; records of dead engines are removed."""
    live = set()
    if ENGINES.is_dir():
        for entry in ENGINES.iterdir():
            try:
                if entry.name.startswith("."):  # being written by an engine starting now
                    if time.time() - entry.stat().st_mtime > STAGING_GRACE_S:
                        entry.unlink(missing_ok=True)
                    continue
                if _record_alive(entry):
                    live.add(entry.name)
                else:
                    entry.unlink(missing_ok=True)
            except FileNotFoundError:  # renamed or removed by another engine meanwhile
                continue
    return live


def _record_alive(path: Path) -> bool:
    try:
        info = json.loads(path.read_text())
        return process_start_time(int(info["pid"])) == info.get("start_time")
    except FileNotFoundError:
        return False
    except (ValueError, KeyError, TypeError):  # records are renamed into place whole: this one is corrupt
        return time.time() - path.stat().st_mtime < STAGING_GRACE_S


def _engine_alive(run_dir: Path) -> bool:
    try:
        info = json.loads((run_dir / "engine.json").read_text())
    except (FileNotFoundError, ValueError):
        # A run being staged (".<id>") has no engine.json for a moment: only an old one is dead.
        try:
            return time.time() - run_dir.stat().st_mtime < STAGING_GRACE_S
        except FileNotFoundError:
            return True
    return process_start_time(int(info["pid"])) == info.get("start_time")


def _mount_points() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def remove_stale_runs(state_dir: Path) -> list[str]:
    """Remove every dead run under ``state_dir`` and every ``bunshin-*`` cgroup without a live run."""
    removed: list[str] = []
    runs_dir = state_dir / "runs"
    live: set[str] = registered_live_runs()
    dead: list[Path] = []
    if runs_dir.is_dir():
        for run_dir in sorted(runs_dir.iterdir()):
            if _engine_alive(run_dir):
                live.add(run_dir.name)
            elif run_dir.name not in live:
                dead.append(run_dir)
    try:
        layout = CgroupLayout.detect()
    except CgroupUnavailable:
        layout = None
    if layout is not None:
        # every hierarchy, not only ours: a Docker run's containers' parent is in each (``docker_hosts.py``)
        roots = {*layout.hierarchies().values(), *(p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir())}
        names = {p.name for root in roots for p in root.glob("bunshin-*") if p.is_dir()}
        for name in sorted(names):
            run_id = name.removeprefix("bunshin-")
            # re-read the registry: an engine may have registered (then made its cgroups) since ``live`` was read
            if run_id not in live and run_id not in registered_live_runs():
                Cgroup(layout, name).remove()
                remove_in_every_hierarchy(name)  # a Docker run's: its containers' parents in the other ones
                removed.append(f"cgroup {name}")
    mounts = _mount_points()
    for run_dir in dead:
        for mnt in sorted((m for m in mounts if m.startswith(str(run_dir) + "/")), key=len, reverse=True):
            try:
                syscalls.umount(mnt, syscalls.MNT_DETACH)
                removed.append(f"mount {mnt}")
            except OSError:
                pass
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(f"run {run_dir.name}")
    if ksm.recover(registered_live_runs):  # a dead run held ksmd's tuning: the host's settings back
        removed.append("ksm tuning")
    return removed
