"""Control groups for workspaces: one parent per run, one child per workspace, on cgroup v1 or v2.

Owns: finding the controllers this host mounts, creating and removing the run's parent and each workspace's
group in every hierarchy we use (memory, pids, freezer), limits, the charge and limit-hit counters that say a
workspace was stopped by its limits, and killing every process in a group.
Must never: touch a group it did not create (every directory it makes is named ``bunshin-*``), or leave one behind
on any path that reaches ``remove``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HostUnsupported

CONTROLLERS = ("memory", "pids", "freezer")


@dataclass(frozen=True)
class CgroupLayout:
    """Where this host mounts the controllers we use. ``version`` is 2 when one unified hierarchy has them all."""

    version: int
    roots: dict[str, Path]  # controller -> hierarchy root (v2: the same path for every controller)

    @classmethod
    def detect(cls, mountinfo: str | None = None) -> CgroupLayout:
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        v1: dict[str, Path] = {}
        v2_root: Path | None = None
        for line in mountinfo.splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) < 3:
                continue
            fstype, mount_point, super_opts = rfields[0], Path(fields[4]), rfields[2].split(",")
            if fstype == "cgroup":
                for ctrl in CONTROLLERS:
                    if ctrl in super_opts:
                        v1.setdefault(ctrl, mount_point)
            elif fstype == "cgroup2" and v2_root is None:
                v2_root = mount_point
        if v2_root is not None:
            try:
                available = (v2_root / "cgroup.controllers").read_text().split()
            except OSError:
                available = []
            if "memory" in available and "pids" in available and "memory" not in v1:
                return cls(version=2, roots={c: v2_root for c in CONTROLLERS})
        if "memory" not in v1 or "pids" not in v1:
            raise CgroupUnavailable(f"no usable memory and pids cgroup controllers (v1 found: {sorted(v1)})")
        return cls(version=1, roots=v1)

    @property
    def has_freezer(self) -> bool:
        return self.version == 2 or "freezer" in self.roots

    def hierarchies(self) -> dict[str, Path]:
        """Distinct hierarchy roots by controller (v2: a single entry)."""
        if self.version == 2:
            return {"unified": self.roots["memory"]}
        return dict(self.roots)


class CgroupUnavailable(HostUnsupported):
    pass


@dataclass(frozen=True)
class Cgroup:
    """One group present in every hierarchy of ``layout``; ``rel`` is its path below each root."""

    layout: CgroupLayout
    rel: str

    def path(self, controller: str) -> Path:
        key = "unified" if self.layout.version == 2 else controller
        return self.layout.hierarchies()[key] / self.rel

    def dirs(self) -> list[Path]:
        return [root / self.rel for root in self.layout.hierarchies().values()]

    def child(self, name: str) -> Cgroup:
        return Cgroup(self.layout, f"{self.rel}/{name}")

    # -- lifecycle -------------------------------------------------------------------------------------------
    def create(self, delegate: bool = False) -> Cgroup:
        """Make the group. ``delegate``: its children get memory and pids controllers (cgroup v2), which also
        means it may hold no process itself (v2's no-internal-process rule): only the run's parent delegates."""
        for d in self.dirs():
            d.mkdir(exist_ok=True)
        if delegate and self.layout.version == 2:
            _write(self.path("memory") / "cgroup.subtree_control", "+memory +pids")
        return self

    def remove(self, timeout: float = 10.0) -> None:
        """Kill everything inside, then remove the group and its descendants. Safe to call twice."""
        self.kill_all(timeout)
        for d in self.dirs():
            if not d.exists():
                continue
            for sub in _subgroups(d, deepest_first=True):
                _rmdir_retry(sub, timeout)
            _rmdir_retry(d, timeout)

    # -- processes -------------------------------------------------------------------------------------------
    def procs(self, recursive: bool = True) -> list[int]:
        pids: set[int] = set()
        base = self.path("memory")
        dirs = [base] + (_subgroups(base) if recursive else [])
        for d in dirs:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(pids)

    def kill_all(self, timeout: float = 10.0) -> None:
        if not self.path("memory").exists() or not self.procs():  # nothing to kill: no freeze and thaw to write
            return
        if self.layout.version == 2 and (self.path("memory") / "cgroup.kill").exists():
            _write(self.path("memory") / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout
        self.freeze(True)
        try:
            while pids := self.procs():
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.freeze(False)  # a frozen task dies only once thawed
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cgroup {self.rel}: processes {pids} survive SIGKILL")
                time.sleep(0.005)
        finally:
            self.freeze(False)

    def freeze(self, frozen: bool) -> None:
        """Freeze this group (and so its descendants), or thaw it and every descendant: a descendant frozen on
        its own (a workspace's agents, mid-fork) would otherwise stay frozen, and a frozen task cannot die."""
        if not self.layout.has_freezer:
            return
        if not frozen:
            base = self.path("freezer") if self.layout.version == 1 else self.path("memory")
            if base.exists():
                for sub in _subgroups(base, deepest_first=True):
                    self._set_frozen(sub, False)
        self._set_frozen(self.path("freezer") if self.layout.version == 1 else self.path("memory"), frozen)

    def is_frozen(self) -> bool:
        """Whether every task of the group is frozen now (v2 ``frozen 1`` in cgroup.events, v1 ``FROZEN``)."""
        if self.layout.version == 2:
            return "frozen 1" in (self.path("memory") / "cgroup.events").read_text().splitlines()
        return (self.path("freezer") / "freezer.state").read_text().strip() == "FROZEN"

    def _set_frozen(self, group: Path, frozen: bool) -> None:
        target = group / ("cgroup.freeze" if self.layout.version == 2 else "freezer.state")
        # the group gone (removed, or never had a freezer file): nothing to freeze or thaw
        with contextlib.suppress(FileNotFoundError):
            _write(target, ("1" if frozen else "0") if self.layout.version == 2 else
                   ("FROZEN" if frozen else "THAWED"))

    # -- limits and counters ---------------------------------------------------------------------------------
    def set_limits(self, memory_bytes: int | None, pids: int | None) -> None:
        if self.layout.version == 2:
            base = self.path("memory")
            if memory_bytes is not None:
                _write(base / "memory.max", str(memory_bytes))
                if (base / "memory.swap.max").exists():
                    _write(base / "memory.swap.max", "0")
            if pids is not None:
                _write(base / "pids.max", str(pids))
            return
        if memory_bytes is not None:
            _write(self.path("memory") / "memory.limit_in_bytes", str(memory_bytes))
            swap = self.path("memory") / "memory.memsw.limit_in_bytes"
            if swap.exists():
                _write(swap, str(memory_bytes))
        if pids is not None:
            _write(self.path("pids") / "pids.max", str(pids))

    def memory_charge(self) -> int:
        name = "memory.current" if self.layout.version == 2 else "memory.usage_in_bytes"
        try:
            return int((self.path("memory") / name).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def shmem(self) -> int:
        """tmpfs and shared-memory pages charged to this group's subtree (``memory.stat``), bytes."""
        key = "shmem" if self.layout.version == 2 else "total_shmem"
        try:
            for line in (self.path("memory") / "memory.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (FileNotFoundError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        """OOM kills in this group's subtree (a counter that only grows; compare two readings)."""
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        return self._subtree_counter("memory", name, "oom_kill")

    def pids_limit_hits(self) -> int:
        """Forks refused at a pids limit in this group's subtree (only grows; compare two readings)."""
        return self._subtree_counter("pids", "pids.events", "max")

    def _subtree_counter(self, controller: str, name: str, key: str) -> int:
        # Kernels count some events where they happened (an agent's subgroup), some where the limit is, some
        # hierarchically: the sum over the subtree grows whenever any of them does.
        base = self.path(controller)
        groups = [base, *_subgroups(base)]
        return sum(_counter(g / name, key) for g in groups)


def remove_in_every_hierarchy(name: str, timeout: float = 10.0) -> None:
    """Remove the group ``name`` and its descendants, which hold no process any more, from every mounted hierarchy,
    those this project does not use too: Docker makes a container's parent group in each of them."""
    base = Path("/sys/fs/cgroup")
    for root in [base, *sorted(p for p in base.iterdir() if p.is_dir())] if base.is_dir() else []:
        group = root / name
        if group.is_dir() and group != root:
            for sub in _subgroups(group, deepest_first=True):
                _rmdir_retry(sub, timeout)
            _rmdir_retry(group, timeout)


def _subgroups(group: Path, deepest_first: bool = False) -> list[Path]:
    """The groups below ``group`` (none if it is gone). Another engine may be removing the same tree (two runs
    cleaning up one dead run): directories vanishing while we walk are simply not there."""
    found: list[Path] = []
    for root, dirs, _ in os.walk(group):  # directory entries' types, no stat of the many control files; a
        found.extend(Path(root, d) for d in dirs)  # directory gone meanwhile is skipped (os.walk's default)
    return sorted(found, key=lambda p: -len(p.parts)) if deepest_first else found


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except FileNotFoundError:
        pass
    return 0


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _rmdir_retry(path: Path, timeout: float) -> None:
    # A group whose last task just died stays busy until the kernel finishes tearing the task down.
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


AGENT_GROUP = "agent"  # a workspace's agent processes, frozen while the workspace forks


def freeze_by_fds(hierarchy_fds: list[int], rel: str, frozen: bool, timeout: float = 2.0) -> None:
    """Freeze or thaw group ``rel`` from inside a workspace, and wait until it is frozen (v1 freezer.state,
    v2 cgroup.freeze); a hierarchy without a freezer is skipped."""
    for fd in hierarchy_fds:
        for control, state, want in (("freezer.state", "freezer.state", "FROZEN" if frozen else "THAWED"),
                                     ("cgroup.freeze", "cgroup.events", "1" if frozen else "0")):
            try:
                handle = os.open(f"{rel}/{control}", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                continue
            try:
                os.write(handle, want.encode())
            finally:
                os.close(handle)
            if frozen:
                _wait_frozen(fd, f"{rel}/{state}", "FROZEN" if control == "freezer.state" else "frozen 1",
                             timeout)


def _wait_frozen(dir_fd: int, path: str, marker: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        handle = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            text = os.read(handle, 4096).decode()
        finally:
            os.close(handle)
        if marker in text.splitlines() or text.strip() == marker:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"cgroup {path}: not frozen after {timeout}s ({text.strip()!r})")
        time.sleep(0.0002)


def join_by_fds(hierarchy_fds: list[int], rel: str) -> None:
    """Move the calling process into group ``rel`` below each hierarchy's open directory (used inside a
    workspace, where the cgroup file systems are not mounted)."""
    for fd in hierarchy_fds:
        procs = os.open(f"{rel}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)
        try:
            os.write(procs, b"0")  # "0" is the writing process itself
        finally:
            os.close(procs)


def kill_by_fds(hierarchy_fds: list[int], rel: str, timeout: float = 10.0) -> None:
    """SIGKILL every process of group ``rel`` (below the first hierarchy that has it), from inside a workspace,
    until none is left (one that forks meanwhile is caught on the next pass), thawing it if it was frozen (a frozen
    v1 task dies only once thawed), and reaping those that are the caller's children (a zombie stays listed).
    Raises TimeoutError if processes remain after ``timeout``."""
    deadline = time.monotonic() + timeout
    for fd in hierarchy_fds:
        try:
            pids = _procs_by_fd(fd, rel)
        except FileNotFoundError:
            continue
        seen: set[int] = set()
        while pids:
            seen.update(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            freeze_by_fds([fd], rel, False)
            time.sleep(0.001)
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {rel}: {len(pids)} processes left after {timeout:g}s")
            pids = _procs_by_fd(fd, rel)
        for pid in seen:  # gone from the group: exited, so a child of ours among them is a zombie to reap now
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        return


def _procs_by_fd(dir_fd: int, rel: str) -> list[int]:
    """The pids in ``rel/cgroup.procs`` below ``dir_fd``, read afresh (v1 keeps one list per open file)."""
    procs = os.open(f"{rel}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return [int(x) for x in os.read(procs, 1 << 20).split()]
    finally:
        os.close(procs)
