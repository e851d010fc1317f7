"""Fast cgroup moves for a run: the kernel's ``favordynmods`` mode, held while the run lives.

Owns: ``FastMoves``, a named cgroup v1 hierarchy with no controller mounted with the ``favordynmods`` option in the
run's directory (``<run>/favordynmods``) from the run's start to its close, and what it says of itself
(``detail``). A run killed before its close has it unmounted with its other mounts (``cleanup.remove_stale_runs``:
every mount below a dead run's directory).
Why: moving a process into a cgroup (a clone joining its workspace's cgroups, a host started into its own) takes
the kernel's global threadgroup rwsem for writing; in the default mode that waits for an RCU grace period, 11 to
15 ms on this machine for a move after a quiet spell, and every fork's clone paid it (the clone's "cgroup" step:
14.4 ms p50 of a 32 ms fork-to-ready at 1 GiB). Once any hierarchy is mounted ``favordynmods`` (Linux 6.0;
mounting one is enough, for every hierarchy), the rwsem stays in its reader-slow mode: a move takes 0.1 ms, and
forks and exits take it as a plain shared reader (one shared counter: nothing measurable on two cores). The mode is
the kernel's, machine-wide (two runs mount the same named hierarchy), and it outlives the mount: the kernel (6.18
here) keeps it after a v1 hierarchy that had it is gone, until the machine reboots (docs/fork.md).
Must never: fail the run (a kernel or a cgroup setup without the option: the run goes on without it, ``detail``
says why), or leave its mount behind the run's directory.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from . import syscalls

HIERARCHY = "bunshin-favordynmods"
OPTIONS = f"none,name={HIERARCHY},favordynmods"


class FastMoves:
    def __init__(self, run_dir: Path):
        self.target = run_dir / "favordynmods"
        self.held = False
        self.detail = "not asked"

    def hold(self) -> bool:
        """Mount the hierarchy; whether the kernel took it (``detail`` says what happened)."""
        try:
            self.target.mkdir(exist_ok=True)
            syscalls.mount("cgroup", str(self.target), "cgroup", 0, OPTIONS)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.target.rmdir()
            self.detail = f"not available ({os.strerror(exc.errno) if exc.errno else exc}): cgroup moves wait for RCU"
            return False
        self.held = True
        self.detail = f"held ({OPTIONS} at {self.target})"
        return True

    def give_back(self) -> None:
        if not self.held:
            return
        self.held = False
        syscalls.umount(str(self.target), syscalls.MNT_DETACH)
        with contextlib.suppress(OSError):
            self.target.rmdir()
